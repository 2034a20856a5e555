"""QuantizeLinear and DequantizeLinear, with onnx.reference's arithmetic: x / scale in the
operands' float type, rounded half to even, plus the zero point, saturated to the integer
type (NaN to its lowest value, as the reference's int32 cast gives); (x - zero_point) in
float32 times the scale (graph/ops/quantize.py, which also computes the constants folded
from DequantizeLinear). A per-axis or blocked scale is reshaped (blocked: repeated) once per
call to broadcast against x."""
from __future__ import annotations

from typing import Any

import numpy as np

from ....graph.errors import ModelError, VerifyError, where
from ....graph.ops.quantize import QUANTIZED, broadcastable, dequantize, mode
from ..registry import KernelSpec, Run, kernel
from .common import check_dtypes, unsupported

_DEQUANTIZED_INPUTS = QUANTIZED | {np.dtype(np.int32)}


def _mode(spec: KernelSpec) -> tuple[str, int, int]:
    """The scale's mode, its axis and block size; a scale that fits none is a malformed model
    (onnx shape inference does not check it)."""
    x, scale = spec.in_types[0], spec.in_types[1]
    try:
        how = mode(spec.node.op, spec.attrs, x, scale)
    except VerifyError as exc:
        raise ModelError(f"{where(spec.node)}: {str(exc).removeprefix(spec.node.op + ': ')}") from None
    return how, int(spec.attrs["axis"]) % max(x.rank, 1), int(spec.attrs["block_size"])


@kernel("QuantizeLinear")
def _quantize(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    dtype = spec.out_types[0].dtype
    if dtype not in QUANTIZED:
        raise unsupported(spec, f"QuantizeLinear to {dtype} is not supported (int8, uint8, int16, uint16 are)")
    how, axis, block = _mode(spec)
    info = np.iinfo(dtype)
    low, high = float(info.min), float(info.max)

    def run(x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None = None) -> np.ndarray:
        # divided in the operands' type, as the reference does; float32 holds every result
        # that does not saturate exactly
        q = np.rint(x / broadcastable(how, scale, x.shape, axis, block)).astype(np.float32, copy=False)
        if zero is not None:
            q += broadcastable(how, zero, x.shape, axis, block)
        np.fmax(q, low, out=q)  # fmax and fmin, not clip: NaN becomes `low`
        np.fmin(q, high, out=q)
        return q.astype(dtype)

    return run


@kernel("DequantizeLinear")
def _dequantize(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    if spec.in_types[0].dtype not in _DEQUANTIZED_INPUTS:
        raise unsupported(spec, f"DequantizeLinear of {spec.in_types[0].dtype} is not supported "
                                "(int8, uint8, int16, uint16, int32 are)")
    dtype = spec.out_types[0].dtype
    how, axis, block = _mode(spec)

    def run(x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None = None) -> Any:
        return dequantize(x, scale, zero, how, axis, block, dtype)

    return run
