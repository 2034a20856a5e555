"""Pooling on channels-last buffers: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

The window folds one spatial axis at a time (k1 + k2 ufunc passes for a k1 x k2 window),
each tap over the output positions whose input lies inside the tensor, so that padding is
never materialized: max ignores it, and the average divides by the count of real (or, with
count_include_pad, explicitly padded) positions, a product of one count per axis. Channels
stay innermost and contiguous in every pass.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..registry import KernelSpec, Run, packed_kernel
from .common import Window, as_array, check_dtypes, window_geometry
from .nn import _lowest, _pool_attrs
from .packed_conv import channels_last, is_permutation, tap_range
from .packed_layout import converter


def _fold_axis(acc: np.ndarray, axis: int, size_out: int, kernel: int, stride: int, dilation: int,
               pad_begin: int, ufunc: np.ufunc, fill: Any, dtype: np.dtype) -> np.ndarray:
    """`ufunc` over the taps of one window axis; positions outside the input are skipped."""
    size = acc.shape[axis]
    ranges = [tap_range(size, size_out, j, stride, dilation, pad_begin) for j in range(kernel)]
    shape = list(acc.shape)
    shape[axis] = size_out
    out = np.empty(shape, dtype)
    lead = (slice(None),) * axis

    def source(lo: int, hi: int, start: int) -> np.ndarray:
        return acc[lead + (slice(start, start + (hi - lo - 1) * stride + 1, stride),)]

    whole = next((j for j, (lo, hi, _) in enumerate(ranges) if (lo, hi) == (0, size_out) and size_out), None)
    if whole is None:
        out.fill(fill)
    else:
        out[...] = source(*ranges[whole])
    for j, (lo, hi, start) in enumerate(ranges):
        if j != whole and hi > lo:
            target = out[lead + (slice(lo, hi),)]
            ufunc(target, source(lo, hi, start), out=target)
    return out


def window_fold(x: np.ndarray, geo: Window, ufunc: np.ufunc, fill: Any, dtype: np.dtype) -> np.ndarray:
    """(N, *spatial, C) folded over every window into (N, *out, C)."""
    acc = x
    for d in range(len(geo.kernel)):
        acc = _fold_axis(acc, 1 + d, geo.out_shape[d], geo.kernel[d], geo.strides[d], geo.dilations[d],
                         geo.pads_begin[d], ufunc, fill, dtype)
    return acc


def window_counts(spatial: tuple[int, ...], geo: Window, include_pad: bool, dtype: np.dtype) -> np.ndarray:
    """(1, *out, 1): how many real (or explicitly padded) positions each window averages."""
    counts = np.ones((1,) * (len(spatial) + 2), dtype)
    for d, size in enumerate(spatial):
        begin = 0 if include_pad else geo.pads_begin[d]
        extent = size + geo.pads_begin[d] + geo.pads_end[d] if include_pad else size
        per = np.zeros(geo.out_shape[d], dtype)
        for j in range(geo.kernel[d]):
            lo, hi, _ = tap_range(extent, geo.out_shape[d], j, geo.strides[d], geo.dilations[d], begin)
            per[lo:hi] += 1
        counts = counts * per.reshape((1,) * (1 + d) + (-1,) + (1,) * (len(spatial) - d))
    return counts


def _channels_last_io(spec: KernelSpec) -> bool:
    """Input channels-last (untiled) and one result, channels-last too or of static shape
    (so that the channels-last buffer can be converted to its encoding)."""
    x, y = spec.in_types[0], spec.out_types[0]
    if x is None or x.rank < 3 or not is_permutation(x.encoding, channels_last(x.rank)) or len(spec.out_types) != 1:
        return False
    return is_permutation(y.encoding, channels_last(y.rank)) or (
        x.is_static and y.is_static and (y.encoding is None or not y.encoding.inner_tiles))


def _to_result(spec: KernelSpec):
    """`fn(channels-last buffer)` -> the result's buffer in its encoding."""
    x, y = spec.in_types[0], spec.out_types[0]
    if is_permutation(y.encoding, channels_last(y.rank)):
        return lambda p: p
    return converter(x.encoding, y.encoding, y.shape)


@packed_kernel("MaxPool")
def _max_pool(spec: KernelSpec) -> Run | None:
    if not _channels_last_io(spec):
        return None
    check_dtypes(spec)
    kernel_shape, ceil_mode = _pool_attrs(spec)
    attrs = spec.attrs
    fill = _lowest(spec.in_types[0].dtype)
    finish = _to_result(spec)

    def run(x: np.ndarray) -> np.ndarray:
        geo = window_geometry(attrs, x.shape[1:-1], kernel_shape, ceil_mode=ceil_mode)
        return finish(window_fold(x, geo, np.maximum, fill, x.dtype))

    return run


@packed_kernel("AveragePool")
def _average_pool(spec: KernelSpec) -> Run | None:
    if not _channels_last_io(spec):
        return None
    check_dtypes(spec)
    kernel_shape, ceil_mode = _pool_attrs(spec)
    attrs = spec.attrs
    include = bool(attrs.get("count_include_pad", 0))
    finish = _to_result(spec)

    def run(x: np.ndarray) -> np.ndarray:
        spatial = x.shape[1:-1]
        geo = window_geometry(attrs, spatial, kernel_shape, ceil_mode=ceil_mode)
        acc = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
        total = window_fold(x, geo, np.add, 0, acc)
        total /= window_counts(spatial, geo, include, acc)
        return finish(total.astype(x.dtype, copy=False))

    return run


def _global(op: str, reduce: Any) -> None:
    @packed_kernel(op)
    def build(spec: KernelSpec) -> Run | None:
        if not _channels_last_io(spec):
            return None
        check_dtypes(spec)
        finish = _to_result(spec)
        return lambda x: finish(as_array(reduce(x, axis=tuple(range(1, x.ndim - 1)), keepdims=True)))


_global("GlobalAveragePool", np.mean)
_global("GlobalMaxPool", np.max)
