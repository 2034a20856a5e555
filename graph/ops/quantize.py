"""QuantizeLinear and DequantizeLinear (opset 21): the Q and DQ nodes of quantized ("QDQ")
models.

A scale (and zero point) is per tensor (a scalar or one element), per axis (1-D along
`axis`) or blocked (the input's rank, `axis` divided into blocks of `block_size`):
- per tensor `abc,_,_->abc` (a scalar indexes nothing; a one-element vector is a broadcast
  singleton);
- per axis `abc,b,b->abc` for axis 1, like BatchNormalization's per-channel operands, so
  layouts pass through a QDQ pair as through any per-channel op;
- blocked: no signature (layouts stop there; such scales mostly quantize weights, which
  fold at load).
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ..errors import VerifyError
from ..registry import OpDef, register
from ..signature import LETTERS, Signature
from ..types import ConstValue, Dequantized, TensorType, as_array, freeze, type_of_constant
from .shapes import conflict, norm_axis, onnx_dtype

Mode = Literal["tensor", "axis", "block"]

QUANTIZED = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
"""The integer types QuantizeLinear writes (and DequantizeLinear reads, with int32)."""


def per_tensor(scale: TensorType) -> bool:
    """A scalar, or a vector of one element: one scale (or zero point) for the whole tensor."""
    return scale.rank == 0 or (scale.rank == 1 and scale.shape[0] == 1)


def mode(op: str, attrs: dict[str, Any], x: TensorType, scale: TensorType) -> Mode:
    """How the scale applies to `x`; VerifyError when its shape fits no mode."""
    if per_tensor(scale):
        return "tensor"
    axis = norm_axis(attrs["axis"], x.rank)
    block = attrs["block_size"]
    if scale.rank == 1 and not block:
        if conflict(scale.shape[0], x.shape[axis]):
            raise VerifyError(f"{op}: per-axis scale {scale} does not match input {x} on axis {axis}")
        return "axis"
    if scale.rank == x.rank and block > 0:
        for d, (s, n) in enumerate(zip(scale.shape, x.shape)):
            want = -(-n // block) if d == axis and isinstance(n, int) else n
            if conflict(s, want):
                raise VerifyError(f"{op}: blocked scale {scale} does not fit input {x} in blocks of "
                                  f"{block} along axis {axis}")
        return "block"
    raise VerifyError(f"{op}: scale {scale} fits input {x} neither per tensor, per axis {axis} "
                      f"nor in blocks (block_size={block})")


def _check_zero_point(op: str, scale: TensorType, zero: TensorType | None) -> None:
    """The zero point has the scale's shape (a scalar and a one-element vector are alike)."""
    if zero is None or (zero.numel() == 1 and scale.numel() == 1):
        return
    if zero.rank != scale.rank or any(conflict(a, b) for a, b in zip(zero.shape, scale.shape)):
        raise VerifyError(f"{op}: zero point {zero} does not match scale {scale}")


def quantized_dtype(attrs: dict[str, Any], zero: TensorType | None) -> np.dtype:
    """QuantizeLinear's result type: the zero point's, else `output_dtype`, else uint8."""
    chosen = onnx_dtype(attrs["output_dtype"], "QuantizeLinear") if attrs["output_dtype"] else None
    if zero is not None:
        if chosen is not None and chosen != zero.dtype:
            raise VerifyError(f"QuantizeLinear: output_dtype {chosen} differs from the zero point's {zero.dtype}")
        return zero.dtype
    return chosen if chosen is not None else np.dtype(np.uint8)


def broadcastable(how: Mode, value: np.ndarray, shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast against an input of `shape`."""
    if how == "tensor":
        return value.reshape(())
    if how == "axis":
        return value.reshape([-1 if d == axis else 1 for d in range(len(shape))])
    return np.repeat(value, block, axis=axis)[(slice(None),) * axis + (slice(0, shape[axis]),)]


def dequantize(x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, how: Mode, axis: int, block: int,
               dtype: np.dtype) -> np.ndarray:
    """onnx.reference's DequantizeLinear: (x - zero) in float32 times the scale, in `dtype`;
    `axis` normalized, `how` as `mode` gives it."""
    y = x.astype(np.float32)
    if zero is not None:
        y -= broadcastable(how, zero, x.shape, axis, block)
    y *= broadcastable(how, scale, x.shape, axis, block)
    return y.astype(dtype, copy=False)


def dequantized_value(d: Dequantized) -> np.ndarray:
    """The logical value of a constant folded from `d`."""
    x, scale = type_of_constant(d.data), type_of_constant(d.scale)
    how = mode("DequantizeLinear", {"axis": d.axis, "block_size": d.block_size}, x, scale)
    return dequantize(d.data, d.scale, d.zero_point, how, d.axis % max(x.rank, 1), d.block_size, d.scale.dtype)


def dequantized_buffer(d: Dequantized, t: TensorType) -> np.ndarray:
    """The stored buffer of a constant of type `t` folded from `d` (packed by its encoding)."""
    value = dequantized_value(d)
    return value if t.encoding is None else t.encoding.pack(value)


def _fold_origin(attrs: dict[str, Any], consts: list[ConstValue | None]) -> Dequantized | None:
    """DequantizeLinear of a constant integer array keeps it (a splat's value is one number:
    it costs nothing to store as it is); a splat scale or zero point is written out."""
    data, scale, zero = (list(consts) + [None])[:3]
    if not isinstance(data, np.ndarray) or scale is None:
        return None
    scale, zero = (None if c is None else freeze(np.array(as_array(c))) for c in (scale, zero))
    return Dequantized(data, scale, zero, int(attrs["axis"]), int(attrs["block_size"]))


def _quantize_infer(attrs, types, consts):
    x, scale, zero = types[0], types[1], types[2] if len(types) > 2 else None
    mode("QuantizeLinear", attrs, x, scale)
    _check_zero_point("QuantizeLinear", scale, zero)
    return [TensorType(x.shape, quantized_dtype(attrs, zero))]


def _dequantize_infer(attrs, types, consts):
    x, scale, zero = types[0], types[1], types[2] if len(types) > 2 else None
    mode("DequantizeLinear", attrs, x, scale)
    _check_zero_point("DequantizeLinear", scale, zero)
    if zero is not None and zero.dtype != x.dtype:
        raise VerifyError(f"DequantizeLinear: zero point {zero} has another type than input {x}")
    return [TensorType(x.shape, scale.dtype)]


def _signature(op: str):
    def signature(attrs, types, outs, consts=None) -> Signature | None:
        x, scale = types[0], types[1]
        how = mode(op, attrs, x, scale)
        if how == "block":
            return None
        letters = tuple(LETTERS[:x.rank])
        axis = letters[norm_axis(attrs["axis"], x.rank)] if how == "axis" else None
        params = [None if t is None else (axis,) if axis else (None,) * t.rank for t in types[1:]]
        return Signature((letters, *params), (letters,))

    return signature


register(OpDef(
    "QuantizeLinear", infer=_quantize_infer, signature=_signature("QuantizeLinear"), layout="sensitive",
    min_inputs=2, max_inputs=3, defaults={"axis": 1, "saturate": 1, "block_size": 0, "output_dtype": 0},
    doc="saturate(round_half_even(x / scale) + zero_point) in the zero point's integer type "
        "(uint8 by default); saturate only matters for float8 results, which tilefold does not support."))
register(OpDef(
    "DequantizeLinear", infer=_dequantize_infer, signature=_signature("DequantizeLinear"), layout="sensitive",
    min_inputs=2, max_inputs=3, defaults={"axis": 1, "block_size": 0}, fold_origin=_fold_origin,
    doc="(x - zero_point) * scale, computed in float32, in the scale's type."))
