"""PyTorch's ATen kernels for the ops NumPy computes in many passes: Gelu, Erf, Sigmoid,
Softmax, LogSoftmax and LayerNormalization, for float32 and float64 data.

NumPy has no fused or SIMD erf, so the NumPy backend's Gelu is about 25 ufunc passes over
its tensor, Erf about 22, Sigmoid 4, and Softmax and LayerNormalization a dozen or so; ATen
does each in one vectorized pass (BERT-base's 128x3072 Gelu: 0.6 against 2.4 ms). The set
is not the default: importing torch costs seconds, so only callers that have it loaded
anyway ask for it (the torch.compile backend, `tilefold.compile(..., kernels="aten")`).

ATen runs each call on one thread. Its OpenMP workers and OpenBLAS's threads both spin for
a while after their work: with two OpenMP threads, BERT-base's GEMMs took 2.4x as long as
the two pools starved each other (bench/RESULTS.md). Where ATen does not cover a node (other
dtypes, LayerNormalization with its statistics or a broadcast scale), the NumPy kernel runs.
"""
from __future__ import annotations

import dataclasses
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from ..registry import KERNELS, KernelDef, KernelSpec, Run

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@contextmanager
def one_thread() -> Iterator[None]:
    """ATen on one thread for the call, the caller's setting restored after it."""
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


def tensor(array: np.ndarray) -> torch.Tensor:
    """`array` as a tensor sharing its memory (ATen only reads it: a read-only input or
    constant is wrapped too, without torch's warning about writing into it); a view with a
    negative stride (a reversing Slice), which torch cannot wrap, is copied."""
    if any(s < 0 for s in array.strides):
        array = np.ascontiguousarray(array)
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _covers(spec: KernelSpec) -> bool:
    x, out = spec.in_types[0], spec.out_types[0]
    return x is not None and x.dtype in _FLOATS and out.dtype == x.dtype and x.rank > 0


def _one_pass(fn: Callable[[torch.Tensor], torch.Tensor]) -> Run:
    """`run(x)`: `fn` on `x` wrapped as a tensor, on one thread, as an array."""
    def run(x: np.ndarray) -> np.ndarray:
        with one_thread():
            return fn(tensor(x)).numpy()

    return run


def _gelu(spec: KernelSpec) -> Run | None:
    approximate = spec.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        return None
    return _one_pass(lambda t: torch.nn.functional.gelu(t, approximate=approximate))


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[KernelSpec], Run]:
    return lambda spec: _one_pass(fn)


def _softmax(log: bool) -> Callable[[KernelSpec], Run]:
    fn = torch.log_softmax if log else torch.softmax

    def build(spec: KernelSpec) -> Run:
        axis = int(spec.attrs.get("axis", -1)) % spec.in_types[0].rank
        return _one_pass(lambda t: fn(t, axis))

    return build


def _layer_norm(spec: KernelSpec) -> Run | None:
    """ONNX LayerNormalization over axes [axis, rank) when torch's layer_norm computes the
    same: the result alone, in the input's type (NumPy's kernel computes float64 data in
    float64 whatever the stash type), a scale and bias of the normalized shape exactly."""
    x = spec.in_types[0]
    axis = int(spec.attrs.get("axis", -1)) % x.rank
    normalized = tuple(x.shape[axis:])
    params = [t for t in spec.in_types[1:] if t is not None]
    if (len(spec.out_types) > 1 or not x.is_static or any(tuple(t.shape) != normalized for t in params)
            or any(t.encoding is not None or t.dtype != x.dtype for t in params)):
        return None
    eps = float(spec.attrs.get("epsilon", 1e-5))
    scale_const, bias_const = (None if spec.const_array(k) is None else torch.tensor(np.array(spec.const_array(k)))
                               for k in (1, 2))

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        w = scale_const if scale_const is not None else tensor(scale)
        b = bias_const if bias_const is not None else None if bias is None else tensor(bias)
        with one_thread():
            return torch.nn.functional.layer_norm(tensor(x), normalized, w, b, eps).numpy()

    return run


def _aten(op: str, build: Callable[[KernelSpec], Run | None]) -> KernelDef:
    """`op`'s NumPy entry with `build` tried first: the packed factories stay, and the NumPy
    kernel builds whatever `build` declines (None) or does not cover."""
    numpy = KERNELS[op]

    def build_either(spec: KernelSpec) -> Run:
        run = build(spec) if _covers(spec) else None
        return run if run is not None else numpy.build(spec)

    # ATen's kernels allocate their results: not in place (the elementwise ones stay
    # `physical`: on a packed buffer they run as they are, like NumPy's; the row ops meet
    # packed operands through the NumPy entry's packed factories)
    return dataclasses.replace(numpy, build=build_either, inplace=False)


ATEN: dict[str, KernelDef] = {
    "Gelu": _aten("Gelu", _gelu),
    "Erf": _aten("Erf", _unary(torch.erf)),  # Gelu as older exports write it, around an Erf
    "Sigmoid": _aten("Sigmoid", _unary(torch.sigmoid)),  # SiLU's gate
    "Softmax": _aten("Softmax", _softmax(log=False)),
    "LogSoftmax": _aten("LogSoftmax", _softmax(log=True)),
    "LayerNormalization": _aten("LayerNormalization", _layer_norm),
}
