"""Elementwise ops: unary activations and math, numpy-broadcast binary and variadic ops,
bitwise integer ops, Where, Clip, Cast, CastLike and inference-mode Dropout.

All are layout-agnostic (their signature is `ab,b->ab`-style, from `signature.elementwise`)
and act on splat constants value by value, so folding keeps splats unmaterialized.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import VerifyError
from ..registry import OpDef, register
from ..signature import Signature, elementwise
from ..types import ConstValue, TensorType
from .shapes import broadcast, onnx_dtype

BOOL = np.dtype(np.bool_)


def _f32(x: float) -> float:
    """ONNX stores float attributes as float32: defaults are the float32-rounded values."""
    return float(np.float32(x))


def _broadcast(op: str, types: Sequence[TensorType | None]) -> tuple:
    shapes = [t.shape for t in types if t is not None]
    try:
        return broadcast(*shapes)
    except VerifyError:
        text = ", ".join(str(t) for t in types if t is not None)
        raise VerifyError(f"{op}: input shapes do not broadcast: {text}") from None


def _same_dtype(op: str, types: Sequence[TensorType | None]) -> np.dtype:
    present = [t for t in types if t is not None]
    if len({t.dtype for t in present}) > 1:
        text = ", ".join(str(t) for t in present)
        raise VerifyError(f"{op}: inputs must share one element type, got {text}")
    return present[0].dtype


def _elementwise_signature(attrs: dict[str, Any], types: list[TensorType | None],
                           outs: list[TensorType], consts: Sequence[ConstValue | None] | None = None,
                           ) -> Signature:
    return elementwise([None if t is None else t.shape for t in types], outs[0].shape)


# ---- unary -----------------------------------------------------------------------------
def _integers_only(op: str, types: Sequence[TensorType | None]) -> None:
    """VerifyError unless every input has an integer element type (the bitwise ops)."""
    for i, t in enumerate(types):
        if t is not None and t.dtype.kind not in "iu":
            raise VerifyError(f"{op}: input {i} {t} must have an integer element type")


def _unary_infer(name: str, out_dtype: np.dtype | None, integers: bool):
    def infer(attrs, types, consts):
        if integers:
            _integers_only(name, types)
        t = types[0]
        return [TensorType(t.shape, out_dtype or t.dtype)]

    return infer


def _unary(name: str, *, out_dtype: np.dtype | None = None, defaults: dict | None = None,
           integers: bool = False, doc: str = "") -> None:
    register(OpDef(
        name, infer=_unary_infer(name, out_dtype, integers), signature=_elementwise_signature,
        layout="agnostic", splat="elementwise", min_inputs=1, max_inputs=1,
        defaults=defaults or {}, doc=doc,
    ))


for _name in ("Relu", "Sigmoid", "HardSwish", "Tanh", "Erf", "Softplus", "Sqrt", "Exp", "Log",
              "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sin", "Cos", "Sign",
              "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Softsign", "Mish"):
    _unary(_name)
_unary("LeakyRelu", defaults={"alpha": _f32(0.01)})
_unary("HardSigmoid", defaults={"alpha": _f32(0.2), "beta": _f32(0.5)})
_unary("Elu", defaults={"alpha": 1.0})
_unary("Selu", defaults={"alpha": _f32(1.67326319217681884765625), "gamma": _f32(1.05070102214813232421875)})
_unary("Celu", defaults={"alpha": 1.0})
_unary("ThresholdedRelu", defaults={"alpha": 1.0})
_unary("Shrink", defaults={"bias": 0.0, "lambd": 0.5},
       doc="x + bias below -lambd, x - bias above lambd, 0 between; any numeric type.")
_unary("Gelu", defaults={"approximate": "none"}, doc="approximate: 'none' (erf) or 'tanh'.")
_unary("BitwiseNot", integers=True)
_unary("Not", out_dtype=BOOL)
_unary("IsNaN", out_dtype=BOOL)
_unary("IsInf", out_dtype=BOOL, defaults={"detect_negative": 1, "detect_positive": 1})


# ---- binary and variadic ----------------------------------------------------------------
def _nary_infer(name: str, out_dtype: np.dtype | None, same_type: bool, integers: bool):
    def infer(attrs, types, consts):
        if integers:
            _integers_only(name, types)
        dtype = _same_dtype(name, types) if same_type else types[0].dtype
        return [TensorType(_broadcast(name, types), out_dtype or dtype)]

    return infer


def _nary(name: str, *, variadic: bool = False, out_dtype: np.dtype | None = None,
          same_type: bool = True, integers: bool = False, defaults: dict | None = None, doc: str = "") -> None:
    register(OpDef(
        name, infer=_nary_infer(name, out_dtype, same_type, integers), signature=_elementwise_signature,
        layout="agnostic", splat="elementwise", min_inputs=1 if variadic else 2,
        max_inputs=None if variadic else 2, broadcasts=True, defaults=defaults or {}, doc=doc,
    ))


for _name in ("Add", "Sub", "Mul", "Div"):
    _nary(_name)
_nary("Pow", same_type=False, doc="Base and exponent may differ in type; the result has the base's.")
_nary("Mod", defaults={"fmod": 0})
for _name in ("Max", "Min", "Sum", "Mean"):
    _nary(_name, variadic=True)
for _name in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor"):
    _nary(_name, out_dtype=BOOL)
for _name in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
    _nary(_name, integers=True)


def _bitshift_infer(attrs, types, consts):
    if attrs.get("direction") not in ("LEFT", "RIGHT"):
        raise VerifyError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {attrs.get('direction')!r}")
    return _nary_infer("BitShift", None, True, True)(attrs, types, consts)


register(OpDef(
    "BitShift", infer=_bitshift_infer, signature=_elementwise_signature, layout="agnostic",
    splat="elementwise", min_inputs=2, max_inputs=2, broadcasts=True,
    doc="direction: 'LEFT' or 'RIGHT' (required). A shift that is negative or at least the width "
        "gives the sign fill (0, or -1 for a right shift of a negative value), as opset 28 defines.",
))


def _prelu_infer(attrs, types, consts):
    x, slope = types
    _same_dtype("PRelu", types)
    out = _broadcast("PRelu", types)
    if len(out) != x.rank or any(isinstance(o, int) and o != d for o, d in zip(out, x.shape)):
        raise VerifyError(f"PRelu: slope {slope} does not broadcast to input {x}")
    return [TensorType(x.shape, x.dtype)]


register(OpDef("PRelu", infer=_prelu_infer, signature=_elementwise_signature, layout="agnostic",
               splat="elementwise", min_inputs=2, max_inputs=2, broadcasts=True,
               doc="slope broadcasts to X (unidirectionally); the result has X's shape."))


def _where_infer(attrs, types, consts):
    cond = types[0]
    if cond.dtype != BOOL:
        raise VerifyError(f"Where: condition must be bool, got {cond}")
    dtype = _same_dtype("Where", types[1:])
    return [TensorType(_broadcast("Where", types), dtype)]


register(OpDef("Where", infer=_where_infer, signature=_elementwise_signature, layout="agnostic",
               splat="elementwise", min_inputs=3, max_inputs=3, broadcasts=True))


def _clip_infer(attrs, types, consts):
    x = types[0]
    for bound in types[1:]:
        if bound is not None and bound.rank != 0 and bound.shape != (1,):
            raise VerifyError(f"Clip: min and max must be scalars, got {bound}")
    _same_dtype("Clip", types)
    return [TensorType(x.shape, x.dtype)]


def _clip_signature(attrs, types, outs, consts=None):
    letters = elementwise([types[0].shape], outs[0].shape)
    bounds = tuple(None if t is None else (None,) * t.rank for t in types[1:])
    return Signature(letters.operands + bounds, letters.results)


register(OpDef("Clip", infer=_clip_infer, signature=_clip_signature, layout="agnostic",
               splat="elementwise", min_inputs=1, max_inputs=3,
               doc="min and max are optional scalar inputs (a missing one is no bound)."))


# ---- type conversion and pass-through ---------------------------------------------------
def _cast_infer(attrs, types, consts):
    if "to" not in attrs:
        raise VerifyError("Cast: attribute 'to' is required")
    return [TensorType(types[0].shape, onnx_dtype(attrs["to"], "Cast"))]


def _data_only_signature(attrs, types, outs, consts=None):
    """Operand 0 maps onto every result dim for dim; other operands are not indexed."""
    sig = elementwise([types[0].shape], outs[0].shape)
    return Signature(sig.operands + (None,) * (len(types) - 1), sig.results * len(outs))


register(OpDef("Cast", infer=_cast_infer, signature=_elementwise_signature, layout="agnostic",
               splat="elementwise", defaults={"saturate": 1},
               doc="to: ONNX TensorProto element type code; 8-bit float/4-bit types are unsupported."))
register(OpDef("CastLike", infer=lambda a, t, c: [TensorType(t[0].shape, t[1].dtype)],
               signature=_data_only_signature, layout="agnostic", splat="elementwise",
               min_inputs=2, max_inputs=2, defaults={"saturate": 1},
               doc="Input 1 only gives the element type."))


def _dropout_infer(attrs, types, consts):
    x = types[0]
    return [TensorType(x.shape, x.dtype), TensorType(x.shape, BOOL)]


register(OpDef(
    "Dropout", infer=_dropout_infer, signature=_data_only_signature, layout="agnostic",
    splat="movement", forwards=0, min_inputs=1, max_inputs=3,
    doc="Inference only: output = data, optional mask output (bool, all true). infer returns "
        "both outputs' types; a node declaring one output takes the first. ratio and "
        "training_mode are scalar inputs, not indexed by the signature.",
))
