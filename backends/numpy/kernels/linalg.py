"""BLAS-backed kernels: MatMul, Gemm, N-d Conv (im2col + one batched GEMM over groups;
Winograd F(2x2, 3x3) for large enough 3x3 stride-1 convolutions; a splat weight as a sum
over channels) and Einsum.

Constant weights are rearranged once, in the factory: Gemm's B transposed (and scaled by
alpha) into a contiguous (K, N) matrix, Conv's W into GEMM form (groups, F/g, C/g * prod(k))
and, where Winograd applies, into its transformed form (16, F, C).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....graph.ops.linalg import einsum_terms
from ....graph.ops.shapes import transposed_window, window_attrs
from ..registry import KernelSpec, Run, kernel
from .common import (Window, check_dtypes, dense, is_splat, nchw_columns, prod, transposed_taps, unsupported,
                     window_geometry)
from .conv_taps import conv_taps, tap_weights, worth_taps
from .depthwise import DepthwiseWeights, depthwise
from .winograd import weight_transform, winograd_conv


def blasable(m: np.ndarray) -> np.ndarray:
    """`m` with each matrix contiguous in rows or columns.

    np.matmul falls back to a naive loop, not BLAS, when a matrix is strided otherwise
    (a transposed view of a 4-D tensor): measured 250x slower on attention scores.
    """
    if m.ndim < 2:
        return m
    s = m.strides
    item = m.itemsize
    rows = s[-1] == item and s[-2] >= m.shape[-1] * item
    cols = s[-2] == item and s[-1] >= m.shape[-2] * item
    return m if rows or cols else np.ascontiguousarray(m)


def wide(x: np.ndarray) -> np.ndarray:
    """float16 as float32: BLAS has no float16 GEMM, and NumPy's own loop is ~100x slower."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


SMALL_ROWS = 64
"""A stack of matrices with fewer rows than this meeting one matrix is copied into one
block of rows for a single GEMM: np.matmul runs one GEMM per matrix, and on Swin's 7-row
windows (4x4 windows of 7x7 tokens, 192 channels, against a 192x576 weight) that measured
7.6 ms against 1.35 ms with the copy; heads of 128 rows measured 0.15 ms batched, 0.18 ms
copied."""


def stacked_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """`a`'s matrices as one block of rows, for one GEMM with the matrix `b`: a view where
    they are one (a contiguous stack), a copy where the matrices are small; else None."""
    if b.ndim != 2 or a.ndim <= 2 or not (a.flags.c_contiguous or a.shape[-2] < SMALL_ROWS):
        return None
    return a.reshape(-1, a.shape[-1])


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul on BLAS-ready operands, as one GEMM when a stack of rows meets one matrix."""
    if a.dtype == np.float16:
        return matmul(wide(a), wide(b)).astype(np.float16)
    a, b = blasable(a), blasable(b)
    rows = stacked_rows(a, b)
    if rows is not None:
        return np.matmul(rows, b).reshape(*a.shape[:-1], b.shape[-1])
    return np.matmul(a, b)


@kernel("MatMul")
def _matmul(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    weight = spec.const_array(1)
    if weight is not None and weight.ndim == 2:
        weight = dense(wide(weight))
        return lambda a, _b: matmul(a, weight).astype(a.dtype, copy=False)
    return matmul


@kernel("Gemm")
def _gemm(spec: KernelSpec) -> Run:
    """Y = alpha * A' @ B' + beta * C, with A' = A.T if transA, B' = B.T if transB."""
    check_dtypes(spec)
    alpha = float(spec.attrs.get("alpha", 1.0))
    beta = float(spec.attrs.get("beta", 1.0))
    trans_a = bool(spec.attrs.get("transA", 0))
    trans_b = bool(spec.attrs.get("transB", 0))
    dtype = spec.out_types[0].dtype
    floating = dtype.kind == "f"

    weight = spec.const_array(1)
    scale = alpha
    if weight is not None:
        weight = weight.T if trans_b else weight
        if floating and alpha != 1.0:
            weight, scale = (weight * dtype.type(alpha)).astype(dtype), 1.0
        weight = dense(weight)
    bias = spec.const_array(2) if len(spec.consts) > 2 else None
    bias_scaled = bias is not None and floating
    if bias_scaled and beta != 1.0:
        bias = (bias * dtype.type(beta)).astype(dtype)

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        a = a.T if trans_a else a
        if weight is not None:
            y, s = matmul(a, weight), scale
        else:
            y, s = matmul(a, b.T if trans_b else b), alpha
        if s != 1.0:
            np.multiply(y, s, out=y, casting="unsafe")
        if c is not None and beta != 0.0:
            if bias_scaled:
                y += bias
            elif beta == 1.0:
                y += c
            else:
                np.add(y, np.multiply(c, beta), out=y, casting="unsafe")
        return y

    return run


def conv_weight_matrix(w: np.ndarray, groups: int) -> np.ndarray:
    """W (F, C/g, *k) as a contiguous stack of GEMM matrices (g, F/g, C/g * prod(k))."""
    f = w.shape[0]
    return dense(w.reshape(groups, f // groups, -1))


def conv(x: np.ndarray, wmat: np.ndarray, kernel_shape: tuple[int, ...], attrs: dict[str, Any],
         bias: np.ndarray | None, geo: Window | None = None) -> np.ndarray:
    """ONNX Conv on NC* input with weights already in GEMM form (and the window geometry, when
    the caller has it); a fresh contiguous result."""
    groups, per_group, _ = wmat.shape
    n, c = x.shape[:2]
    geo = window_geometry(attrs, x.shape[2:], kernel_shape) if geo is None else geo
    pointwise = (
        all(k == 1 for k in kernel_shape) and all(s == 1 for s in geo.strides) and not geo.padded
    )
    if pointwise:  # a plain GEMM on the NC* buffer
        cols = x.reshape(n, groups, c // groups, -1)
    else:
        cols = nchw_columns(x, geo, groups)
    if n == 1 and groups == 1:
        y = np.matmul(wmat[0], cols[0, 0])
    else:
        y = np.matmul(wmat, cols)
    y = y.reshape(n, groups * per_group, *geo.out_shape)
    if bias is not None:
        y += bias.reshape(-1, *(1,) * len(kernel_shape))
    return y


def splat_conv(x: np.ndarray, value: Any, out_channels: int, kernel_shape: tuple[int, ...],
               attrs: dict[str, Any], groups: int, bias: np.ndarray | None, geo: Window) -> np.ndarray:
    """Conv with a splat weight (every element `value`): each group's input channels summed,
    one all-ones window over the sum, scaled and repeated for the group's output channels.

    The output channels of a group are then the same numbers, as the math says. A GEMM does
    not promise that: BLAS computes rows at a micro-kernel's edge in another order, and a
    1-ulp difference between equal logits of 1e10 (the light SqueezeNet's constant weights)
    turns a uniform softmax into a one-hot one. It also skips F/g - 1 of every F/g products.
    """
    n, c = x.shape[:2]
    sums = x.reshape(n, groups, c // groups, *x.shape[2:]).sum(axis=2)
    ones = np.ones((groups, 1, prod(kernel_shape)), x.dtype)
    y = conv(sums, ones, kernel_shape, attrs, None, geo)
    y *= value
    y = np.repeat(y, out_channels // groups, axis=1)
    if bias is not None:
        y += bias.reshape(-1, *(1,) * len(kernel_shape))
    return y


def _tap_weights(w: np.ndarray) -> np.ndarray:
    """W (F, C, *k) as `conv_taps`' channels-first operand (prod(k) * F, C)."""
    return tap_weights(np.moveaxis(w, (0, 1), (-1, -2)), channels_last=False)


def _winograd_applies(spec: KernelSpec, kernel_shape, groups: int) -> bool:
    """3x3, stride 1, undilated, ungrouped 2-D float convolution: what winograd_conv computes."""
    attrs = spec.attrs
    x_type = spec.in_types[0]
    return (
        kernel_shape is not None and tuple(kernel_shape) == (3, 3) and groups == 1
        and tuple(attrs.get("strides") or (1, 1)) == (1, 1)
        and tuple(attrs.get("dilations") or (1, 1)) == (1, 1)
        and x_type is not None and x_type.dtype in (np.float32, np.float64)
    )


def _worth_winograd(x: np.ndarray, f: int, geo) -> bool:
    """Enough tiles and channels for the transforms to cost less than the multiplications they save."""
    tiles = x.shape[0] * -(-geo.out_shape[0] // 2) * -(-geo.out_shape[1] // 2)
    return tiles >= _WINOGRAD_MIN_TILES and min(x.shape[1], f) >= _WINOGRAD_MIN_CHANNELS


_WINOGRAD_MIN_TILES = 36  # a 14x14 output has 49 tiles and gains; 7x7 (16 tiles) loses
_WINOGRAD_MIN_CHANNELS = 16


def _is_depthwise(w: np.ndarray | None, groups: int) -> bool:
    """One input channel per group (depthwise.py's case), with more than one group."""
    return w is not None and groups > 1 and w.shape[1] == 1


@kernel("Conv")
def _conv(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    attrs = spec.attrs
    groups = int(attrs.get("group", 1))
    weight = spec.const_array(1)
    w_type = spec.in_types[1]
    kernel_attr = attrs.get("kernel_shape")
    if kernel_attr is None and w_type is not None and w_type.is_static:
        kernel_attr = tuple(w_type.shape[2:])
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise unsupported(spec, f"Conv auto_pad={attrs['auto_pad']!r} is not supported")
    depthwise_weight = _is_depthwise(weight, groups)
    wmat = conv_weight_matrix(wide(weight), groups) if weight is not None and not depthwise_weight else None
    dw_weight = DepthwiseWeights.from_onnx(wide(weight), groups) if depthwise_weight else None
    bias_const = spec.const_array(2) if len(spec.consts) > 2 else None
    winograd = _winograd_applies(spec, kernel_attr, groups)
    wino_weight = weight_transform(weight) if winograd and weight is not None else None
    x_type = spec.in_types[0]
    taps_weight = None
    if weight is not None and groups == 1 and kernel_attr is not None and x_type is not None and x_type.is_static:
        geo = window_geometry(attrs, x_type.shape[2:], kernel_attr)
        if worth_taps(kernel_attr, geo, x_type.shape[1], weight.shape[0]):
            taps_weight = _tap_weights(wide(weight))  # built only where it is used: it doubles the weight

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        if x.dtype == np.float16:
            return run(wide(x), w, b).astype(np.float16)
        bias = bias_const if bias_const is not None else b
        kernel_shape = tuple(kernel_attr) if kernel_attr is not None else tuple(w.shape[2:])
        geo = window_geometry(attrs, x.shape[2:], kernel_shape)
        if is_splat(w):
            return splat_conv(x, w.flat[0], w.shape[0], kernel_shape, attrs, groups,
                              None if bias is None else wide(bias), geo)
        if winograd and _worth_winograd(x, w.shape[0], geo):
            u = wino_weight if wino_weight is not None else weight_transform(w)
            pads = (*geo.pads_begin, *geo.pads_end)
            return winograd_conv(x, u, pads, bias)
        if _is_depthwise(w, groups):
            weights = dw_weight if dw_weight is not None else DepthwiseWeights.from_onnx(wide(w), groups)
            y = depthwise(x, weights, geo, True, None if bias is None else wide(bias))
            return np.ascontiguousarray(np.moveaxis(y, -1, 1))
        if groups == 1 and worth_taps(kernel_shape, geo, x.shape[1], w.shape[0]):
            taps = taps_weight if taps_weight is not None else _tap_weights(wide(w))
            return conv_taps(x, taps, geo, False, None if bias is None else wide(bias))
        matrix = wmat if wmat is not None else conv_weight_matrix(wide(w), groups)
        return conv(x, matrix, kernel_shape, attrs, None if bias is None else wide(bias), geo)

    return run


@kernel("ConvTranspose")
def _conv_transpose(spec: KernelSpec) -> Run:
    """One batched GEMM per group gives every (output channel, kernel offset) contribution of
    every input position, W_g^T @ X_g; each kernel offset then adds its slab into the result
    at stride steps (a loop over the few kernel offsets, none over positions)."""
    check_dtypes(spec)
    attrs = spec.attrs
    groups = int(attrs.get("group", 1))
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise unsupported(spec, f"ConvTranspose auto_pad={attrs['auto_pad']!r} is not supported")

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        if x.dtype == np.float16:
            return run(wide(x), wide(w), None if b is None else wide(b)).astype(np.float16)
        n, c, *space = x.shape
        kernel = tuple(w.shape[2:])
        out, begins = transposed_window("ConvTranspose", attrs, space, kernel)
        strides, dilations, _ = window_attrs("ConvTranspose", attrs, space, kernel)
        per_group = w.shape[1]
        taps = prod(kernel)
        wt = w.reshape(groups, c // groups, per_group * taps).transpose(0, 2, 1)  # (g, F/g * K, C/g)
        cols = np.matmul(wt, x.reshape(n, groups, c // groups, prod(space)))  # (N, g, F/g * K, P)
        cols = cols.reshape(n, groups * per_group, *kernel, *space)
        y = np.zeros((n, groups * per_group, *out), x.dtype)
        for offset, source, target in transposed_taps(space, out, kernel, strides, dilations, begins):
            y[(slice(None), slice(None), *target)] += cols[(slice(None), slice(None), *offset, *source)]
        if b is not None:
            y += b.reshape(-1, *(1,) * len(space))
        return y

    return run


@kernel("Einsum")
def _einsum(spec: KernelSpec) -> Run:
    """np.einsum with an optimized contraction order (pairs go through BLAS tensordot); a
    result that is a view of an input (a transpose, a diagonal) is copied."""
    check_dtypes(spec)
    terms, rhs = einsum_terms(spec.attrs["equation"], [t.rank for t in spec.in_types])
    equation, dtype = ",".join(terms) + "->" + rhs, spec.out_types[0].dtype

    def run(*xs: np.ndarray) -> np.ndarray:
        out = np.asarray(np.einsum(equation, *xs, optimize=len(xs) > 1)).astype(dtype, copy=False)
        return out.copy() if any(np.may_share_memory(out, x) for x in xs) else out

    return run
