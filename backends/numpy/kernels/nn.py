"""Neural-network kernels: normalizations, softmax, LRN, pooling and dropout (inference).

Pooling folds np.maximum or np.add over strided views of the (padded) input, one spatial
axis at a time, so the Python loop runs over the few kernel taps, never over spatial
positions or elements. MaxPool's Indices output folds over every kernel offset instead.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ..registry import KernelSpec, Run, kernel
from .common import (Window, as_array, check_dtypes, pad, prod, unsupported, view_of_first, window_geometry,
                     window_reduce, windows)


# ---- normalization -----------------------------------------------------------------------
@kernel("BatchNormalization")
def _batch_norm(spec: KernelSpec) -> Run:
    """Inference form: y = x * s + t with s = scale / sqrt(var + eps), t = B - mean * s."""
    check_dtypes(spec)
    if spec.attrs.get("training_mode", 0):
        raise unsupported(spec, "BatchNormalization training_mode=1 is not supported (inference only)")
    eps = float(spec.attrs.get("epsilon", 1e-5))
    dtype = spec.out_types[0].dtype

    def affine(scale, bias, mean, var, rank):
        s = (scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps))
        t = bias.astype(np.float64) - mean.astype(np.float64) * s
        shape = (-1,) + (1,) * (rank - 2)
        return s.astype(dtype).reshape(shape), t.astype(dtype).reshape(shape)

    consts = [spec.const_array(i) for i in range(1, 5)]
    rank = spec.in_types[0].rank if spec.in_types[0] is not None else None
    folded = affine(*consts, rank) if all(c is not None for c in consts) and rank else None

    def run(x, scale, bias, mean, var):
        s, t = folded if folded is not None else affine(scale, bias, mean, var, x.ndim)
        y = np.multiply(x, s)
        y += t
        return y

    return run


def exact_mean(x: np.ndarray, axis: int | tuple[int, ...]) -> np.ndarray:
    """The mean over `axis` (kept), summed in float64 and returned in x's dtype: a row of
    equal values then gives that value exactly, so a normalization centers it to 0 and
    returns its bias as onnxruntime does (a float32 mean's last-bit error, times
    1/sqrt(epsilon), was 2e-4 of the output). It costs 0.01 ms per BERT-base LayerNorm."""
    return x.mean(axis=axis, keepdims=True, dtype=np.float64).astype(x.dtype, copy=False)


def instance_normalize(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float,
                       axes: tuple[int, ...]) -> np.ndarray:
    """x normalized over its spatial `axes` (statistics in float32 at least), then scaled and
    shifted by `scale` and `bias`, already shaped to broadcast along x's channel axis."""
    wide = x.astype(np.float32) if x.dtype == np.float16 else x
    centered = np.subtract(wide, exact_mean(wide, axes))
    var = np.mean(np.square(centered), axis=axes, keepdims=True)
    var += eps
    factor = np.sqrt(var, out=var)
    np.divide(scale, factor, out=factor)
    centered *= factor
    centered += bias
    return centered.astype(x.dtype, copy=False)


@kernel("InstanceNormalization")
def _instance_norm(spec: KernelSpec) -> Run:
    """Each (n, c) normalized over its spatial dims, then scaled and shifted per channel."""
    check_dtypes(spec)
    eps = float(spec.attrs.get("epsilon", 1e-5))

    def run(x, scale, bias):
        per_channel = (-1,) + (1,) * (x.ndim - 2)
        return instance_normalize(x, scale.reshape(per_channel), bias.reshape(per_channel), eps,
                                  tuple(range(2, x.ndim)))

    return run


@kernel("LayerNormalization")
def _layer_norm(spec: KernelSpec) -> Run:
    """Normalizes over axes [axis, rank), then scales and shifts. Mean and variance are
    computed in the stash type (float32 by default) or the input's, whichever is wider."""
    check_dtypes(spec)
    eps = float(spec.attrs.get("epsilon", 1e-5))
    axis_attr = int(spec.attrs.get("axis", -1))
    dtype = spec.out_types[0].dtype
    stash = np.result_type(np.float32 if int(spec.attrs.get("stash_type", 1)) == 1 else dtype, dtype)
    stat_types = [t.dtype for t in spec.out_types[1:]]

    def run(x, scale, bias=None):
        axis = axis_attr % x.ndim
        rows = prod(x.shape[:axis])
        cols = prod(x.shape[axis:])
        flat = x.reshape(rows, cols).astype(stash, copy=False)
        mean = exact_mean(flat, 1)
        centered = np.subtract(flat, mean)
        var = np.einsum("ij,ij->i", centered, centered)[:, None]
        var /= cols
        var += eps
        inv_std = np.sqrt(var, out=var)
        np.reciprocal(inv_std, out=inv_std)
        centered *= inv_std
        y = centered.reshape(x.shape)
        if y.dtype != dtype:
            y = y.astype(dtype)
        y *= scale
        if bias is not None:
            y += bias
        if not stat_types:
            return y
        stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
        stats = [mean.reshape(stat_shape), inv_std.reshape(stat_shape)]
        return (y, *(s.astype(t) for s, t in zip(stats, stat_types)))

    return run


@kernel("LRN")
def _lrn(spec: KernelSpec) -> Run:
    """y = x / (bias + alpha / size * sum of x^2 over a window of channels) ** beta."""
    check_dtypes(spec)
    alpha = float(spec.attrs.get("alpha", 1e-4))
    beta = float(spec.attrs.get("beta", 0.75))
    bias = float(spec.attrs.get("bias", 1.0))
    size = int(spec.attrs["size"])
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2

    def run(x):
        squares = np.square(x)
        widths = [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2)
        padded = pad(squares, widths)
        channels = x.shape[1]
        total = np.zeros_like(squares)
        for k in range(size):
            total += padded[:, k:k + channels]
        total *= alpha / size
        total += bias
        np.power(total, beta, out=total)
        return np.divide(x, total, out=total)

    return run


# ---- softmax ---------------------------------------------------------------------------
def _softmax(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    if x.size == 0:
        return np.empty_like(x)
    y = np.subtract(x, x.max(axis=axis, keepdims=True), out=np.empty_like(x))  # 0-d stays an array
    if log:
        y -= np.log(np.exp(y).sum(axis=axis, keepdims=True))
        return y
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


@kernel("Softmax")
def _softmax_kernel(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    axis = int(spec.attrs.get("axis", -1))
    return lambda x: as_array(_softmax(x, axis % max(x.ndim, 1), log=False))


@kernel("LogSoftmax")
def _log_softmax_kernel(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    axis = int(spec.attrs.get("axis", -1))
    return lambda x: as_array(_softmax(x, axis % max(x.ndim, 1), log=True))


# ---- pooling ---------------------------------------------------------------------------
def _pool_attrs(spec: KernelSpec) -> tuple[tuple[int, ...], bool]:
    attrs = spec.attrs
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise unsupported(spec, f"{spec.node.op} auto_pad={attrs['auto_pad']!r} is not supported")
    kernel_shape = attrs.get("kernel_shape")
    if not kernel_shape:
        raise unsupported(spec, f"{spec.node.op} needs a kernel_shape attribute")
    return tuple(int(k) for k in kernel_shape), bool(attrs.get("ceil_mode", 0))


def _offsets(geo: Window):
    return itertools.product(*(range(k) for k in geo.kernel))


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "f":
        return -np.inf
    return np.iinfo(dtype).min if dtype.kind in "iu" else False


def max_pool(x: np.ndarray, geo: Window, indices: bool = False, storage_order: int = 0):
    """Max over each window; with `indices`, also the flat NC* index of each maximum."""
    if not indices:
        return window_reduce(x, geo, np.maximum, pad_value=_lowest(x.dtype))
    view = windows(x, geo, pad_value=_lowest(x.dtype))
    offsets = list(_offsets(geo))
    y = np.array(view[(...,) + offsets[0]])
    best = np.zeros(y.shape, np.int64)
    for k, offset in enumerate(offsets[1:], start=1):
        candidate = view[(...,) + offset]
        better = np.greater(candidate, y)  # strictly: the first maximum wins ties
        if y.dtype.kind == "f":  # a NaN wins, as without indices and in PyTorch
            better |= np.isnan(candidate) & ~np.isnan(y)
        best[better] = k
        np.copyto(y, candidate, where=better)
    return y, _flat_indices(x.shape, geo, best, offsets, storage_order)


def _flat_indices(shape, geo: Window, best: np.ndarray, offsets: list, storage_order: int) -> np.ndarray:
    """Flat input index of each window's chosen kernel offset (row- or column-major spatial)."""
    nd = len(geo.kernel)
    spatial = shape[2:]
    table = np.array(offsets, np.int64)  # (positions, nd)
    coords = []
    for d in range(nd):
        out_pos = np.arange(geo.out_shape[d], dtype=np.int64).reshape(
            (-1,) + (1,) * (nd - 1 - d)) * geo.strides[d] - geo.pads_begin[d]
        coords.append(out_pos + table[best, d] * geo.dilations[d])
    order = range(nd) if storage_order == 0 else reversed(range(nd))
    flat = np.zeros(best.shape, np.int64)
    for d in order:
        flat = flat * spatial[d] + coords[d]
    plane = np.arange(shape[0] * shape[1], dtype=np.int64).reshape((shape[0], shape[1]) + (1,) * nd)
    flat += plane * prod(spatial)
    return flat


def average_pool(x: np.ndarray, geo: Window, count_include_pad: bool) -> np.ndarray:
    """Mean over each window; the divisor counts real elements (and explicit pads if asked)."""
    acc_dtype = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    total = window_reduce(x, geo, np.add, dtype=acc_dtype)
    if geo.padded:
        nd = len(geo.kernel)
        mask = np.ones(x.shape[2:], acc_dtype)
        if count_include_pad:  # explicit pads count, ceil_mode's extra padding does not
            mask = pad(mask, list(zip(geo.pads_begin, geo.pads_end)), 1)
            geo = Window((0,) * nd, (0,) * nd, geo.extra_end, geo.out_shape, geo.kernel,
                         geo.strides, geo.dilations)
        total /= window_reduce(mask, geo, np.add)
    else:
        total /= prod(geo.kernel)
    return total.astype(x.dtype, copy=False)


@kernel("MaxPool")
def _max_pool(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    kernel_shape, ceil_mode = _pool_attrs(spec)
    attrs = spec.attrs
    indices = len(spec.out_types) > 1
    storage_order = int(attrs.get("storage_order", 0))

    def run(x):
        geo = window_geometry(attrs, x.shape[2:], kernel_shape, ceil_mode=ceil_mode)
        return max_pool(x, geo, indices, storage_order)

    return run


@kernel("AveragePool")
def _average_pool(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    kernel_shape, ceil_mode = _pool_attrs(spec)
    attrs = spec.attrs
    include = bool(attrs.get("count_include_pad", 0))

    def run(x):
        geo = window_geometry(attrs, x.shape[2:], kernel_shape, ceil_mode=ceil_mode)
        return average_pool(x, geo, include)

    return run


@kernel("GlobalAveragePool")
def _global_average_pool(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    return lambda x: as_array(x.mean(axis=tuple(range(2, x.ndim)), keepdims=True))


@kernel("GlobalMaxPool")
def _global_max_pool(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    return lambda x: as_array(x.max(axis=tuple(range(2, x.ndim)), keepdims=True))


# ---- dropout ---------------------------------------------------------------------------
@kernel("Dropout", views=True)
def _dropout(spec: KernelSpec) -> Run:
    """Inference: the data passes through and the optional mask is all true. Training mode
    (random) is refused unless the ratio is zero, at build time when training_mode is a
    constant, else at run time."""
    check_dtypes(spec)
    with_mask = len(spec.out_types) > 1
    refusal = unsupported(spec, "Dropout in training mode with a nonzero ratio is not supported (it is random)")

    def training(ratio: np.ndarray | None, mode: np.ndarray | None) -> bool:
        active = mode is not None and bool(np.asarray(mode))
        return active and (ratio is None or float(np.asarray(ratio)) != 0.0)

    consts = [spec.const_array(i) if i < len(spec.consts) else None for i in (1, 2)]
    ratio_known = len(spec.in_types) < 2 or spec.in_types[1] is None or consts[0] is not None
    mode_known = len(spec.in_types) < 3 or spec.in_types[2] is None or consts[1] is not None
    if ratio_known and mode_known and training(*consts):
        raise refusal

    def run(x, ratio=None, mode=None):
        if training(ratio, mode):
            raise refusal
        x = view_of_first(x, ratio, mode)
        if with_mask:
            return x, np.ones(x.shape, bool)
        return x

    return run
