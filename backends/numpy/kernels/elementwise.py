"""Elementwise kernels: unary activations and math, broadcasting binary and variadic ops,
comparisons, logic and bitwise ops, Where, Clip, Cast, CastLike and Identity.

Every kernel here but Cast, CastLike and Identity is declared `inplace`: `run(*inputs,
out=None)` writes into `out` when the executor hands over a dying input buffer of the
result's shape and dtype (so `out` may be the buffer of one of the inputs), and otherwise
returns a fresh array. Results always have the node's declared dtype; float16 math that
NumPy or SciPy would lose precision on (or lacks loops for) runs in float32.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import scipy.special

from ....graph.errors import UnsupportedOpError, where
from ....graph.registry import with_defaults
from ..registry import KernelSpec, Run, kernel
from .common import as_array, check_dtypes, view_of_first

Unary = Callable[[np.ndarray, "np.ndarray | None"], Any]

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# erf as the rational function on [-4, 4] that Eigen and XLA evaluate for float32 (a few ulp
# from the exact value). scipy.special.erf evaluates per element in double: about ten times
# slower than these SIMD ufunc passes, which made BERT's Gelu layers cost 20% of its time.
_ERF_NUMERATOR = tuple(np.float32(c) for c in (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02,
))
_ERF_DENOMINATOR = tuple(np.float32(c) for c in (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02,
))


def _horner(x2: np.ndarray, coefficients: Sequence[np.float32], out: np.ndarray | None = None) -> np.ndarray:
    acc = np.multiply(x2, coefficients[0], out=out)
    for c in coefficients[1:-1]:
        acc += c
        acc *= x2
    acc += coefficients[-1]
    return acc


def erf_float32(x: np.ndarray, out: np.ndarray | None = None, scale: float = 1.0) -> np.ndarray:
    """scale * erf(x) for a float32 array, within a few ulp (see above); `out` may be `x`. A
    power-of-two scale is exact: it scales the numerator's coefficients."""
    clipped = np.clip(x, np.float32(-4), np.float32(4))
    x2 = np.multiply(clipped, clipped)
    numerator = _horner(x2, [np.float32(c * scale) for c in _ERF_NUMERATOR])
    numerator *= clipped
    denominator = _horner(x2, _ERF_DENOMINATOR, out=clipped)  # four buffers in all, not six
    return np.divide(numerator, denominator, out=out)


def _computed_in(wide: type, fn: Unary, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """fn computed on x cast to `wide`, the result cast back (into `out` if given)."""
    result = fn(x.astype(wide), None).astype(x.dtype)
    if out is None:
        return result
    out[...] = result
    return out


def _in_float32(fn: Unary, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """fn computed in float32 on a float16 input, the result cast back (into `out` if given)."""
    return _computed_in(np.float32, fn, x, out)


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf in the dtype of `x`: the float32 rational function, scipy's double one for float64."""
    if x.dtype == np.float64:
        return scipy.special.erf(x, out=out)
    if x.dtype == np.float32:
        return erf_float32(x, out)
    return _in_float32(erf_float32, x, out)


def _negative(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """-x as x * -1: NumPy 2.4's np.negative writes wrong values into a strided `out` (every
    4th float32 or int32, every 8th float64 or int64: a column sliced off a conv result and
    negated in place) on this AVX-512 machine; multiply has no such bug."""
    return np.multiply(x, x.dtype.type(-1), out=out)


def _sigmoid(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """1 / (1 + exp(-x)): four SIMD passes, relatively accurate for very negative x too
    (scipy's expit is as accurate but several times slower on float32)."""
    if x.dtype == np.float64:
        return scipy.special.expit(x, out=out)
    if x.dtype != np.float32:
        return _in_float32(_sigmoid, x, out)
    y = _negative(x, out if out is not None else np.empty_like(x))  # a 0-d result stays an array
    with np.errstate(over="ignore"):  # exp overflows to inf for x < -88: 1 / inf = 0
        np.exp(y, out=y)
    y += 1
    return np.reciprocal(y, out=y)


def _leaky_relu(alpha: float) -> Unary:
    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        scaled = np.multiply(x, alpha)
        if 0.0 <= alpha <= 1.0:  # max(x, alpha*x) is x for x >= 0 and alpha*x below
            return np.maximum(x, scaled, out=out)
        return _select(np.less(x, 0), scaled, x, out)

    return run


def _hard_sigmoid(alpha: float, beta: float) -> Unary:
    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        y = np.multiply(x, alpha, out=out)
        y += beta
        return np.clip(y, 0, 1, out=y)

    return run


def _hard_swish(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    gate = _hard_sigmoid(1.0 / 6.0, 0.5)(x, None)
    return np.multiply(x, gate, out=gate if out is None else out)


def _gelu(approximate: str) -> Unary:
    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        if approximate == "tanh":
            inner = np.multiply(x, x)
            inner *= x
            inner *= 0.044715
            inner += x
            inner *= _SQRT_2_OVER_PI
            gate = np.tanh(inner, out=inner)
            gate += 1
            gate *= 0.5
        elif x.dtype == np.float32:  # 0.5 + 0.5 erf: two passes fewer, the same bits
            scaled = np.multiply(x, _SQRT_HALF)
            gate = erf_float32(scaled, scaled, scale=0.5)
            gate += 0.5
        else:
            gate = erf(np.multiply(x, _SQRT_HALF))
            gate += 1
            gate *= 0.5
        return np.multiply(x, gate, out=gate if out is None else out)

    return run


def _elu(alpha: float, inner: float | None = None) -> Unary:
    """max(0, x) + alpha * expm1(min(0, x)), or with min(0, x) / `inner` in the expm1 (Celu)."""
    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        negative = np.minimum(x, 0)
        if inner is not None:
            negative /= inner
        np.expm1(negative, out=negative)
        negative *= alpha
        y = np.maximum(x, 0, out=out)
        y += negative  # expm1(0) = 0 where x > 0
        return y

    return run


def _selu(alpha: float, gamma: float) -> Unary:
    """gamma * (x for x > 0, alpha * expm1(x) else): Elu scaled."""
    elu = _elu(alpha)

    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        y = elu(x, out)
        y *= gamma
        return y

    return run


def _softsign(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """x / (1 + |x|)."""
    denominator = np.absolute(x)
    denominator += 1
    return np.divide(x, denominator, out=out)


def _mish(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """x * tanh(softplus(x)), in float32 for float16 (softplus would round before the tanh)."""
    if x.dtype == np.float16:
        return _in_float32(_mish, x, out)
    gate = np.logaddexp(x, 0)
    np.tanh(gate, out=gate)
    return np.multiply(x, gate, out=out)


def _thresholded_relu(alpha: float) -> Unary:
    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        return _select(np.greater(x, alpha), x, x.dtype.type(0), out)

    return run


def _shrink(bias: float, lambd: float) -> Unary:
    """x + bias below -lambd, x - bias above lambd, 0 between. Integers and float16 compute
    in a wider float and cast back (integers truncate toward zero, as onnxruntime's cast)."""
    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        if x.dtype.kind != "f" or x.dtype == np.float16:
            return _computed_in(np.float64 if x.dtype.kind != "f" else np.float32, run, x, out)
        b, limit, zero = x.dtype.type(bias), x.dtype.type(lambd), x.dtype.type(0)
        inner = np.where(np.greater(x, limit), np.subtract(x, b), zero)
        return _select(np.less(x, -limit), np.add(x, b), inner, out)

    return run


def _is_inf(positive: bool, negative: bool) -> Unary:
    def run(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        if positive and negative:
            return np.isinf(x, out=out)
        if positive:
            return np.isposinf(x, out=out)
        if negative:
            return np.isneginf(x, out=out)
        y = np.zeros(x.shape, bool) if out is None else out
        y[...] = False
        return y

    return run


def _relu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """max(x, 0); on floats a clip to [0, inf], the same values (NaN stays NaN, -inf gives 0):
    NumPy's maximum against a scalar misses its SIMD loop, 3x slower than clip (0.34 against
    0.10 ms on 800k float32 here)."""
    if x.dtype.kind == "f":
        return np.clip(x, 0, np.inf, out=out)
    return np.maximum(x, 0, out=out)


def _ufunc(fn: np.ufunc) -> Callable[[dict], Unary]:
    return lambda attrs: lambda x, out: fn(x, out=out)


UNARY: dict[str, Callable[[dict[str, Any]], Unary]] = {
    "Relu": lambda a: _relu,
    "LeakyRelu": lambda a: _leaky_relu(a["alpha"]),
    "Sigmoid": lambda a: _sigmoid,
    "HardSigmoid": lambda a: _hard_sigmoid(a["alpha"], a["beta"]),
    "HardSwish": lambda a: _hard_swish,
    "Tanh": _ufunc(np.tanh),
    "Erf": lambda a: erf,
    "Gelu": lambda a: _gelu(a["approximate"]),
    "Softplus": lambda a: lambda x, out: np.logaddexp(x, 0, out=out),
    "Elu": lambda a: _elu(a["alpha"]),
    "Sqrt": _ufunc(np.sqrt),
    "Exp": _ufunc(np.exp),
    "Log": _ufunc(np.log),
    "Neg": lambda a: _negative,
    "Abs": _ufunc(np.absolute),
    "Reciprocal": _ufunc(np.reciprocal),
    "Floor": _ufunc(np.floor),
    "Ceil": _ufunc(np.ceil),
    "Round": _ufunc(np.rint),  # round half to even, as ONNX specifies
    "Sin": _ufunc(np.sin),
    "Cos": _ufunc(np.cos),
    "Sign": _ufunc(np.sign),
    "Tan": _ufunc(np.tan),
    "Asin": _ufunc(np.arcsin),
    "Acos": _ufunc(np.arccos),
    "Atan": _ufunc(np.arctan),
    "Sinh": _ufunc(np.sinh),
    "Cosh": _ufunc(np.cosh),
    "Asinh": _ufunc(np.arcsinh),
    "Acosh": _ufunc(np.arccosh),
    "Atanh": _ufunc(np.arctanh),
    "Softsign": lambda a: _softsign,
    "Mish": lambda a: _mish,
    "Selu": lambda a: _selu(a["alpha"], a["gamma"]),
    "Celu": lambda a: _elu(a["alpha"], inner=a["alpha"]),  # max(0, x) + min(0, alpha * expm1(x / alpha))
    "ThresholdedRelu": lambda a: _thresholded_relu(a["alpha"]),
    "Shrink": lambda a: _shrink(a["bias"], a["lambd"]),
    "Not": _ufunc(np.logical_not),
    "BitwiseNot": _ufunc(np.invert),
    "IsNaN": _ufunc(np.isnan),
    "IsInf": lambda a: _is_inf(bool(a["detect_positive"]), bool(a["detect_negative"])),
}


def _register_unary(op: str, make: Callable[[dict[str, Any]], Unary]) -> None:
    @kernel(op, inplace=True)
    def build(spec: KernelSpec) -> Run:
        check_dtypes(spec)
        attrs = with_defaults(op, spec.attrs)  # a node built by hand may leave them out
        if op == "Gelu" and attrs["approximate"] not in ("none", "tanh"):
            raise UnsupportedOpError(
                f"{where(spec.node)}: Gelu approximate={attrs['approximate']!r} is not 'none' or 'tanh'"
            )
        fn = make(attrs)

        def run(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            return as_array(fn(x, out))

        return run


for _op, _make in UNARY.items():
    _register_unary(_op, _make)


# ---- binary ----------------------------------------------------------------------------
def same(out: np.ndarray, x: Any) -> bool:
    """Whether `out` is the buffer of input `x` (the executor's in-place hand-over), by
    memory rather than identity, so a caller may pass matching views of both."""
    return out is x or (isinstance(x, np.ndarray) and x.shape == out.shape and np.may_share_memory(out, x))


def _select(mask: np.ndarray, a: Any, b: Any, out: np.ndarray | None) -> np.ndarray:
    """`where(mask, a, b)` written into `out`, which may be the buffer of a, b or mask."""
    if out is None:
        return np.where(mask, a, b)
    if same(out, a):
        np.copyto(out, b, where=np.logical_not(mask))
    elif same(out, b):
        np.copyto(out, a, where=mask)
    else:
        out[...] = np.where(mask, a, b)
    return out


def _trunc_divide(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Signed integer division rounding toward zero (C semantics, as ONNX Div specifies)."""
    wrong_sign = np.not_equal(np.remainder(a, b), 0)
    wrong_sign &= np.less(a, 0) ^ np.less(b, 0)
    q = np.floor_divide(a, b, out=out)
    q += wrong_sign.astype(q.dtype)
    return q


def _divide(dtype: np.dtype) -> Callable:
    if dtype.kind == "i":
        return _trunc_divide
    if dtype.kind == "u":
        return lambda a, b, out: np.floor_divide(a, b, out=out)
    return lambda a, b, out: np.divide(a, b, out=out)


def _power(dtype: np.dtype) -> Callable:
    """Pow keeps the base's dtype whatever the exponent's (ONNX T, T1)."""

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        if b.dtype == dtype:
            return np.power(a, b, out=out)
        if dtype.kind == "f":
            return np.power(a, b.astype(dtype), out=out)
        result = np.power(a.astype(np.float64), b).astype(dtype)
        if out is None:
            return result
        out[...] = result
        return out

    return run


def _prelu(x: np.ndarray, slope: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    negative = np.less(x, 0)
    if out is not None and same(out, x):
        return np.multiply(x, slope, out=out, where=negative)
    return _select(negative, np.multiply(x, slope), x, out)


BINARY: dict[str, Callable[[dict[str, Any], np.dtype], Callable]] = {
    "Add": lambda a, t: lambda x, y, out: np.add(x, y, out=out),
    "Sub": lambda a, t: lambda x, y, out: np.subtract(x, y, out=out),
    "Mul": lambda a, t: lambda x, y, out: np.multiply(x, y, out=out),
    "Div": lambda a, t: _divide(t),
    "Pow": lambda a, t: _power(t),
    "Mod": lambda a, t: (
        (lambda x, y, out: np.fmod(x, y, out=out)) if a.get("fmod", 0)
        else (lambda x, y, out: np.mod(x, y, out=out))
    ),
    "Equal": lambda a, t: lambda x, y, out: np.equal(x, y, out=out),
    "Less": lambda a, t: lambda x, y, out: np.less(x, y, out=out),
    "LessOrEqual": lambda a, t: lambda x, y, out: np.less_equal(x, y, out=out),
    "Greater": lambda a, t: lambda x, y, out: np.greater(x, y, out=out),
    "GreaterOrEqual": lambda a, t: lambda x, y, out: np.greater_equal(x, y, out=out),
    "And": lambda a, t: lambda x, y, out: np.logical_and(x, y, out=out),
    "Or": lambda a, t: lambda x, y, out: np.logical_or(x, y, out=out),
    "Xor": lambda a, t: lambda x, y, out: np.logical_xor(x, y, out=out),
    "BitwiseAnd": lambda a, t: lambda x, y, out: np.bitwise_and(x, y, out=out),
    "BitwiseOr": lambda a, t: lambda x, y, out: np.bitwise_or(x, y, out=out),
    "BitwiseXor": lambda a, t: lambda x, y, out: np.bitwise_xor(x, y, out=out),
    # NumPy shifts by a negative amount or by the width or more give the sign fill, as ONNX 28
    "BitShift": lambda a, t: (
        (lambda x, y, out: np.left_shift(x, y, out=out)) if a.get("direction") == "LEFT"
        else (lambda x, y, out: np.right_shift(x, y, out=out))
    ),
    "PRelu": lambda a, t: _prelu,
}


def _register_binary(op: str, make: Callable[[dict[str, Any], np.dtype], Callable]) -> None:
    @kernel(op, inplace=True)
    def build(spec: KernelSpec) -> Run:
        check_dtypes(spec)
        in_dtype = spec.in_types[0].dtype if spec.in_types[0] is not None else spec.out_types[0].dtype
        fn = make(spec.attrs, in_dtype)

        def run(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            return as_array(fn(a, b, out))

        return run


for _op, _make2 in BINARY.items():
    _register_binary(_op, _make2)


# ---- variadic --------------------------------------------------------------------------
def _register_variadic(op: str, ufunc: np.ufunc, mean: bool = False) -> None:
    @kernel(op, inplace=True)
    def build(spec: KernelSpec) -> Run:
        check_dtypes(spec)
        dtype = spec.out_types[0].dtype

        def run(*xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            if out is None:
                out = np.empty(np.broadcast_shapes(*(x.shape for x in xs)), dtype)
            # read the input that `out` is, if any, before anything overwrites it
            first = next((i for i, x in enumerate(xs) if same(out, x)), 0)
            order = [xs[first], *xs[:first], *xs[first + 1:]]
            if len(order) == 1:
                if not same(out, order[0]):
                    np.copyto(out, order[0])
            else:
                ufunc(order[0], order[1], out=out)
                for x in order[2:]:
                    ufunc(out, x, out=out)
            if mean:
                np.divide(out, len(xs), out=out)
            return out

        return run


_register_variadic("Max", np.maximum)
_register_variadic("Min", np.minimum)
_register_variadic("Sum", np.add)
_register_variadic("Mean", np.add, mean=True)


# ---- selection, clipping, casts ----------------------------------------------------------
@kernel("Where", inplace=True)
def _where(spec: KernelSpec) -> Run:
    check_dtypes(spec)

    def run(cond: np.ndarray, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None and same(out, cond):  # a bool Where may be handed its condition's buffer
            out[...] = np.where(cond, a, b)
            return out
        return as_array(_select(cond, a, b, out))

    return run


@kernel("Clip", inplace=True)
def _clip(spec: KernelSpec) -> Run:
    check_dtypes(spec)

    def run(x: np.ndarray, low: np.ndarray | None = None, high: np.ndarray | None = None,
            out: np.ndarray | None = None) -> np.ndarray:
        if low is None and high is None:
            if out is None:
                return x.copy()
            if not same(out, x):
                np.copyto(out, x)
            return out
        return as_array(np.clip(x, low, high, out=out))

    return run


def _cast_kernel(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    dtype = spec.out_types[0].dtype

    def run(x: np.ndarray, *like: Any) -> np.ndarray:
        return view_of_first(x, *like).astype(dtype, copy=False)

    return run


kernel("Cast", views=True)(_cast_kernel)
kernel("CastLike", views=True)(_cast_kernel)


@kernel("Identity", views=True)
def _identity(spec: KernelSpec) -> Run:
    return lambda x: x


@kernel("Transfer", views=True)
def _transfer(spec: KernelSpec) -> Run:
    """On the NumPy backend every device's memory is host memory: the buffer passes as is."""
    return lambda x: x
