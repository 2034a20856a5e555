"""Neural-network ops around the anchors: normalizations, softmax, LRN and pooling.

Signatures:
- BatchNormalization (inference) `nchw,c,c,c,c->nchw`: per-channel, all dims parallel.
- InstanceNormalization `nchw,c,c->nchw` with the spatial dims reductions.
- LayerNormalization `abc,c,c->abc,ab1,ab1` for axis=-1: the normalized dims are
  reductions; Scale and B broadcast over the normalized dims like elementwise operands.
- Softmax / LogSoftmax `abc->abc` with the axis dim a reduction.
- LRN `nchw->nchw` with c a window (each channel reads its neighbours); its window may be
  tiled (NCHWc16 on the gpu target): its kernels read the neighbours by logical channel.
- MaxPool / AveragePool `nchw->nchw` with the spatial dims windows (the output extent
  differs from the input's); MaxPool's Indices output has the result's indexing.
- GlobalAveragePool / GlobalMaxPool `nchw->nc11` with the spatial dims reductions.
"""
from __future__ import annotations

import numpy as np

from ..errors import VerifyError
from ..registry import OpDef, register
from ..signature import LETTERS, Signature, elementwise
from ..types import TensorType
from .linalg import spatial_letters
from .shapes import broadcast, conflict, norm_axis, onnx_dtype, window_shape

INT64 = np.dtype(np.int64)


def _f32(x: float) -> float:
    """ONNX stores float attributes as float32: defaults are the float32-rounded values."""
    return float(np.float32(x))


def _letters(rank: int) -> tuple[str, ...]:
    return tuple(LETTERS[:rank])


# ---- BatchNormalization ---------------------------------------------------------------
def _batchnorm_infer(attrs, types, consts):
    x = types[0]
    if x.rank < 2:
        raise VerifyError(f"BatchNormalization: X {x} must have rank >= 2 (N, C, ...)")
    channels = x.shape[1]
    for name, t in zip(("scale", "B", "input_mean", "input_var"), types[1:]):
        if t.rank != 1 or conflict(t.shape[0], channels):
            raise VerifyError(f"BatchNormalization: {name} {t} must be 1-D of length C={channels} for X {x}")
    stats = types[3]
    return [TensorType(x.shape, x.dtype), TensorType((channels,), stats.dtype),
            TensorType((channels,), types[4].dtype)]


def _batchnorm_signature(attrs, types, outs, consts=None):
    if attrs["training_mode"]:
        return None
    letters = _letters(types[0].rank)
    c = (letters[1],)
    return Signature((letters, c, c, c, c), (letters,))


register(OpDef(
    "BatchNormalization", infer=_batchnorm_infer, signature=_batchnorm_signature,
    layout="sensitive", min_inputs=5, max_inputs=5,
    defaults={"epsilon": _f32(1e-5), "momentum": _f32(0.9), "training_mode": 0},
    doc="Inference form (training_mode=0) has one output. infer returns Y, running_mean "
        "and running_var; a node takes the prefix it declares. No signature in training mode.",
))


# ---- InstanceNormalization ------------------------------------------------------------
def _instancenorm_infer(attrs, types, consts):
    x = types[0]
    if x.rank < 3:
        raise VerifyError(f"InstanceNormalization: input {x} must have rank >= 3 (N, C, D1, ...)")
    channels = x.shape[1]
    for name, t in zip(("scale", "B"), types[1:]):
        if t.rank != 1 or conflict(t.shape[0], channels):
            raise VerifyError(f"InstanceNormalization: {name} {t} must be 1-D of length C={channels} for input {x}")
    return [TensorType(x.shape, x.dtype)]


def _instancenorm_signature(attrs, types, outs, consts=None):
    letters = _letters(types[0].rank)
    c = (letters[1],)
    return Signature((letters, c, c), (letters,), {d: "reduction" for d in letters[2:]})


register(OpDef(
    "InstanceNormalization", infer=_instancenorm_infer, signature=_instancenorm_signature,
    layout="sensitive", min_inputs=3, max_inputs=3, defaults={"epsilon": _f32(1e-5)},
    doc="Normalizes each (n, c) over its spatial dims, then scales and shifts per channel.",
))


# ---- LayerNormalization ---------------------------------------------------------------
def _layernorm_infer(attrs, types, consts):
    x = types[0]
    axis = norm_axis(attrs["axis"], x.rank)
    normalized = x.shape[axis:]
    for name, t in zip(("Scale", "B"), types[1:]):
        if t is None:
            continue
        try:
            out = broadcast(t.shape, normalized)
        except VerifyError:
            out = None
        if out is None or len(out) != len(normalized) or any(conflict(o, d) for o, d in zip(out, normalized)):
            raise VerifyError(
                f"LayerNormalization: {name} {t} does not broadcast to the normalized dims "
                f"{list(normalized)} of X {x} (axis={attrs['axis']})"
            )
    stash = onnx_dtype(attrs["stash_type"], "LayerNormalization")
    stat_shape = x.shape[:axis] + (1,) * (x.rank - axis)
    return [TensorType(x.shape, x.dtype), TensorType(stat_shape, stash), TensorType(stat_shape, stash)]


def _layernorm_signature(attrs, types, outs, consts=None):
    x = types[0]
    axis = norm_axis(attrs["axis"], x.rank)
    letters = _letters(x.rank)
    params = elementwise([None if t is None else t.shape for t in types[1:]], x.shape).operands
    stats = letters[:axis] + (None,) * (x.rank - axis)
    results = (letters, stats, stats)[: len(outs)]
    return Signature((letters, *params), results, {d: "reduction" for d in letters[axis:]})


register(OpDef(
    "LayerNormalization", infer=_layernorm_infer, signature=_layernorm_signature,
    layout="sensitive", min_inputs=2, max_inputs=3, broadcasts=True,
    defaults={"axis": -1, "epsilon": _f32(1e-5), "stash_type": 1},
    doc="Normalizes over dims axis..rank-1. infer returns Y, Mean and InvStdDev (shape of X "
        "with the normalized dims 1, element type stash_type); a node takes its prefix.",
))


# ---- Softmax, LRN ---------------------------------------------------------------------
def _same_infer(attrs, types, consts):
    return [TensorType(types[0].shape, types[0].dtype)]


def _softmax_infer(op: str):
    def infer(attrs, types, consts):
        norm_axis(attrs["axis"], types[0].rank)
        return _same_infer(attrs, types, consts)

    return infer


def _softmax_signature(attrs, types, outs, consts=None):
    letters = _letters(types[0].rank)
    if not letters:
        return Signature(((),), ((),))
    axis = norm_axis(attrs["axis"], len(letters))
    return Signature((letters,), (letters,), {letters[axis]: "reduction"})


for _op in ("Softmax", "LogSoftmax"):
    register(OpDef(
        _op, infer=_softmax_infer(_op), signature=_softmax_signature, layout="sensitive",
        defaults={"axis": -1}, doc="Opset-13 semantics: normalizes along one axis.",
    ))


def _lrn_infer(attrs, types, consts):
    x = types[0]
    if x.rank < 3:
        raise VerifyError(f"LRN: X {x} must have rank >= 3 (N, C, D1, ...)")
    if "size" not in attrs:
        raise VerifyError("LRN: attribute 'size' is required")
    return _same_infer(attrs, types, consts)


def _lrn_signature(attrs, types, outs, consts=None):
    letters = _letters(types[0].rank)
    return Signature((letters,), (letters,), {letters[1]: "window"})


register(OpDef(
    "LRN", infer=_lrn_infer, signature=_lrn_signature, layout="sensitive", tiled_windows=True,
    defaults={"alpha": _f32(1e-4), "beta": 0.75, "bias": 1.0},
    doc="Local response normalization across channels; attrs: size (required).",
))


# ---- pooling --------------------------------------------------------------------------
def _pool_infer(op: str, with_indices: bool):
    def infer(attrs, types, consts):
        x = types[0]
        if x.rank < 3:
            raise VerifyError(f"{op}: X {x} must have rank >= 3 (N, C, D1, ...)")
        kernel = attrs.get("kernel_shape")
        if not kernel:
            raise VerifyError(f"{op}: attribute 'kernel_shape' is required")
        shape = (*x.shape[:2], *window_shape(op, attrs, x.shape[2:], kernel))
        outs = [TensorType(shape, x.dtype)]
        if with_indices:
            outs.append(TensorType(shape, INT64))
        return outs

    return infer


def _pool_signature(attrs, types, outs, consts=None):
    space, _ = spatial_letters(types[0].rank - 2)
    idx = ("n", "c", *space)
    return Signature((idx,), (idx,) * len(outs), {s: "window" for s in space})


_POOL_DEFAULTS = {"auto_pad": "NOTSET", "ceil_mode": 0}
register(OpDef(
    "MaxPool", infer=_pool_infer("MaxPool", True), signature=_pool_signature, layout="sensitive",
    defaults={**_POOL_DEFAULTS, "storage_order": 0},
    doc="infer returns Y and Indices (int64); a node takes the prefix it declares.",
))
register(OpDef(
    "AveragePool", infer=_pool_infer("AveragePool", False), signature=_pool_signature,
    layout="sensitive", defaults={**_POOL_DEFAULTS, "count_include_pad": 0},
))


def _global_pool_infer(op: str):
    def infer(attrs, types, consts):
        x = types[0]
        if x.rank < 3:
            raise VerifyError(f"{op}: X {x} must have rank >= 3 (N, C, D1, ...)")
        return [TensorType((*x.shape[:2], *(1,) * (x.rank - 2)), x.dtype)]

    return infer


def _global_pool_signature(attrs, types, outs, consts=None):
    space, _ = spatial_letters(types[0].rank - 2)
    return Signature((("n", "c", *space),), (("n", "c", *(None,) * len(space)),),
                     {s: "reduction" for s in space})


for _op in ("GlobalAveragePool", "GlobalMaxPool"):
    register(OpDef(_op, infer=_global_pool_infer(_op), signature=_global_pool_signature,
                   layout="sensitive", doc="Reduces every spatial dim to 1."))
