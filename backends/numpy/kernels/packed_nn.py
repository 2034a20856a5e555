"""Pooling on channels-last buffers: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

The window folds one spatial axis at a time (k1 + k2 ufunc passes for a k1 x k2 window),
each tap over the output positions whose input lies inside the tensor, so that padding is
never materialized: max ignores it, and the average divides by the count of real (or, with
count_include_pad, explicitly padded) positions, a product of one count per axis. Channels
stay innermost and contiguous in every pass.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ....graph.types import TensorType
from ....layout.encoding import PackedEncoding
from ..registry import KernelSpec, Run, packed_kernel
from .common import Window, as_array, check_dtypes, tap_range, window_geometry
from .nn import _lowest, _pool_attrs, _softmax, exact_mean, instance_normalize
from .packed_conv import channels_last, is_permutation
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


def blocked_channels(spec: KernelSpec) -> int | None:
    """The channel tile t when input and result are both NCHWc (channels tiled by t, outer
    dims in order), static and with one result; else None."""
    x, y = spec.in_types[0], spec.out_types[0]
    if x is None or len(spec.out_types) != 1 or x.rank < 3 or not (x.is_static and y.is_static):
        return None
    encs = [x.encoding, y.encoding]
    if any(not isinstance(e, PackedEncoding) or e.inner_dims_pos != (1,) or e.outer_dims_perm is not None
           for e in encs):
        return None
    if encs[0].inner_tiles != encs[1].inner_tiles or (y.encoding.pad is not None and y.encoding.pad != x.encoding.pad
                                                       and y.encoding.is_padded(y.shape)):
        return None
    return encs[0].inner_tiles[0]


def _per_block(fn: Callable[[np.ndarray], np.ndarray], spec: KernelSpec) -> Run:
    """`fn` on channels-last (N * C/t, *spatial, t) views of NCHWc buffers."""
    y = spec.out_types[0]
    out_shape = y.encoding.physical_shape(y.shape)

    def run(p: np.ndarray) -> np.ndarray:
        blocks = p.reshape((-1, *p.shape[2:]))
        return np.ascontiguousarray(fn(blocks)).reshape(out_shape)

    return run


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


@packed_kernel("InstanceNormalization")
def _instance_norm(spec: KernelSpec) -> Run | None:
    """On a channels-last buffer: the spatial axes are the middle ones, the channel the last."""
    if not _channels_last_io(spec) or any(t is not None and t.encoding is not None for t in spec.in_types[1:]):
        return None
    check_dtypes(spec)
    eps = float(spec.attrs.get("epsilon", 1e-5))
    finish = _to_result(spec)
    return lambda x, scale, bias: finish(instance_normalize(x, scale, bias, eps, tuple(range(1, x.ndim - 1))))


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


@packed_kernel("MaxPool")
def _max_pool_blocked(spec: KernelSpec) -> Run | None:
    if blocked_channels(spec) is None:
        return None
    check_dtypes(spec)
    kernel_shape, ceil_mode = _pool_attrs(spec)
    attrs, fill = spec.attrs, _lowest(spec.in_types[0].dtype)

    def fold(x: np.ndarray) -> np.ndarray:
        geo = window_geometry(attrs, x.shape[1:-1], kernel_shape, ceil_mode=ceil_mode)
        return window_fold(x, geo, np.maximum, fill, x.dtype)

    return _per_block(fold, spec)


@packed_kernel("AveragePool")
def _average_pool_blocked(spec: KernelSpec) -> Run | None:
    if blocked_channels(spec) is None:
        return None
    check_dtypes(spec)
    kernel_shape, ceil_mode = _pool_attrs(spec)
    attrs = spec.attrs
    include = bool(attrs.get("count_include_pad", 0))

    def fold(x: np.ndarray) -> np.ndarray:
        spatial = x.shape[1:-1]
        geo = window_geometry(attrs, spatial, kernel_shape, ceil_mode=ceil_mode)
        acc = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
        total = window_fold(x, geo, np.add, 0, acc)
        total /= window_counts(spatial, geo, include, acc)
        return total.astype(x.dtype, copy=False)

    return _per_block(fold, spec)


def _global_blocked(op: str, reduce: Any) -> None:
    @packed_kernel(op)
    def build(spec: KernelSpec) -> Run | None:
        if blocked_channels(spec) is None:
            return None
        check_dtypes(spec)
        return _per_block(lambda x: as_array(reduce(x, axis=tuple(range(1, x.ndim - 1)), keepdims=True)), spec)


_global_blocked("GlobalAveragePool", np.mean)
_global_blocked("GlobalMaxPool", np.max)


# ---- softmax and layer norm over packed dims ---------------------------------------------------
def _buffer_axes(t: TensorType, dims: Sequence[int]) -> tuple[int, ...] | None:
    """The buffer axes holding logical `dims` (outer and tile axes), or None when one of
    them holds padding (which would enter the normalization)."""
    enc = t.encoding
    tiles = enc.tiles()
    if any(d in tiles and t.shape[d] % tiles[d] for d in dims):
        return None
    perm = enc.outer_perm(t.rank)
    axes = [perm.index(d) for d in dims]
    axes += [t.rank + enc.inner_dims_pos.index(d) for d in dims if d in tiles]
    return tuple(sorted(axes))


def _same_packed_io(spec: KernelSpec) -> bool:
    """One static input and result in the same packed layout, whose padding (if any) is not
    promised to hold a value (a normalization writes its own values there)."""
    x, y = spec.in_types[0], spec.out_types[0]
    if x is None or not isinstance(x.encoding, PackedEncoding) or not (x.is_static and y.is_static):
        return False
    if not x.encoding.same_layout(y.encoding):
        return False
    return y.encoding.pad is None or not y.encoding.is_padded(y.shape)


def _softmax_packed(op: str, log: bool) -> None:
    @packed_kernel(op)
    def build(spec: KernelSpec) -> Run | None:
        if len(spec.out_types) != 1 or not _same_packed_io(spec):
            return None
        x = spec.in_types[0]
        axes = _buffer_axes(x, [int(spec.attrs.get("axis", -1)) % x.rank])
        if axes is None:
            return None
        check_dtypes(spec)
        return lambda p: as_array(_softmax(p, axes, log=log))


_softmax_packed("Softmax", False)
_softmax_packed("LogSoftmax", True)


@packed_kernel("LayerNormalization")
def _layer_norm_packed(spec: KernelSpec) -> Run | None:
    """Mean and variance over the buffer axes of the normalized dims; scale and bias packed
    like the result, reshaped (for free) to broadcast against its buffer."""
    from ..packed import _broadcast_encoding  # the physical path's broadcast rule (packed.py imports this module)
    from .packed_layout import same_buffer

    if len(spec.out_types) != 1 or not _same_packed_io(spec):
        return None
    x, y = spec.in_types[0], spec.out_types[0]
    axis = int(spec.attrs.get("axis", -1)) % x.rank
    axes = _buffer_axes(x, range(axis, x.rank))
    if axes is None:
        return None
    shapes = []
    for t in spec.in_types[1:]:
        if t is None:
            shapes.append(None)
            continue
        wanted = _broadcast_encoding(y, t) if t.is_static else None
        if wanted is None or not same_buffer(t.encoding, wanted[0], t.shape):
            return None
        shapes.append(wanted[1])
    check_dtypes(spec)
    eps = float(spec.attrs.get("epsilon", 1e-5))
    dtype = y.dtype
    stash = np.result_type(np.float32 if int(spec.attrs.get("stash_type", 1)) == 1 else dtype, dtype)
    count = int(np.prod(x.shape[axis:]))

    def run(p: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        flat = p.astype(stash, copy=False)
        mean = exact_mean(flat, axes)
        centered = np.subtract(flat, mean)
        var = np.square(centered).sum(axis=axes, keepdims=True) / count
        centered *= 1 / np.sqrt(var + eps)
        out = centered.astype(dtype, copy=False)
        out *= scale.reshape(shapes[0])
        if bias is not None:
            out += bias.reshape(shapes[1])
        return out

    return run
