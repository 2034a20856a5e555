"""Channels-last convolution: the CPU target's packed Conv.

Activations are NHWC buffers (`PackedEncoding((), (), (0, 2, 3, 1))`, any spatial rank:
channels last), or the identity NC* input read directly (the layout change fused into the
im2col copy); weights are RSCF buffers (`PackedEncoding((), (), (2, 3, 1, 0))`: physical
(*k, C/g, F), which is the (prod(k) * C/g, F) GEMM operand as it is) or identity FCRS.

- a splat weight (a constant of one value): linalg.splat_conv, whose output channels are
  equal by construction;
- 1x1, stride 1, unpadded: one GEMM (N*H*W, C) @ (C, F) on the input buffer, no copy (one
  batched GEMM over the groups' channels in place for a grouped conv);
- depthwise (C/g == 1): the taps accumulate into the output, each multiply spanning whole
  (W_out * C) rows of a padded copy of the input (depthwise.py);
- 3x3, stride 1, ungrouped, enough tiles: Winograd F(2x2, 3x3) in NHWC (packed_winograd);
- otherwise at stride 1, ungrouped, with at most half as many output channels as input ones:
  one GEMM for every tap's products, added in at their shifts (conv_taps);
- otherwise im2col: each tap copies whole channel rows into a (N, *out, g, *k, C/g) buffer
  (borders zeroed, no padded copy of the input), then one GEMM (one batched GEMM for groups);
  an NCHW input is copied along its rows instead (the NCHW kernel's column buffer), and BLAS
  reads those columns transposed so that the result still comes out channels-last.

The result is NHWC; an identity-encoded output gets it transposed (a reshape when the
spatial output is 1x1, so the element order is the same).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ....layout.encoding import PackedEncoding
from ..registry import KernelSpec, Run, packed_kernel
from .common import Window, check_dtypes, dense, is_splat, nchw_columns, prod, tap_slices, window_geometry
from .conv_taps import FEW_OUTPUTS, conv_taps, tap_weights, worth_taps
from .depthwise import DepthwiseWeights, depthwise
from .linalg import splat_conv, wide
from .packed_winograd import winograd_nhwc, winograd_weight, worth_winograd_nhwc


def channels_last(rank: int) -> tuple[int, ...]:
    """outer_dims_perm of a channels-last activation of `rank` dims (NHWC for 4)."""
    return (0, *range(2, rank), 1)


def weight_gemm(rank: int) -> tuple[int, ...]:
    """outer_dims_perm of a conv weight in GEMM form (RSCF for 4)."""
    return (*range(2, rank), 1, 0)


def is_permutation(enc: Any, perm: Sequence[int]) -> bool:
    """`enc` is the untiled encoding whose buffer is the logical tensor transposed by `perm`."""
    return isinstance(enc, PackedEncoding) and not enc.inner_tiles and enc.outer_perm(len(perm)) == tuple(perm)


def _zero_borders(dst: np.ndarray, ranges: Sequence[tuple[int, int, int]], first: int) -> None:
    """Zero the part of `dst` (spatial axes from `first` on) outside the valid box, once each."""
    inside: list[slice] = []
    for d, (lo, hi, _) in enumerate(ranges):
        lead = (slice(None),) * first + tuple(inside)
        if lo > 0:
            dst[lead + (slice(0, lo),)] = 0
        if hi < dst.shape[first + d]:
            dst[lead + (slice(hi, None),)] = 0
        inside.append(slice(lo, hi))


def _source(x: np.ndarray, src: tuple[slice, ...], nchw: bool) -> np.ndarray:
    """The input window of one tap as (N, *lens, C), a view of an NHWC or NCHW buffer."""
    if nchw:
        return np.moveaxis(x[(slice(None), slice(None)) + src], 1, -1)
    return x[(slice(None),) + src]


# ---- the ways ----------------------------------------------------------------------------------
def im2col(x: np.ndarray, geo: Window, groups: int) -> np.ndarray:
    """(N, *out, g, *k, C/g) from an NHWC buffer: every tap's window, channel rows copied whole."""
    nd = len(geo.kernel)
    n, c = x.shape[0], x.shape[-1]
    spatial = x.shape[1:-1]
    cols = np.empty((n, *geo.out_shape, groups, *geo.kernel, c // groups), x.dtype)
    for tap in itertools.product(*(range(k) for k in geo.kernel)):
        ranges, src = tap_slices(geo, spatial, tap)
        dst = cols[(slice(None),) * (1 + nd) + (slice(None),) + tap]  # (N, *out, g, C/g)
        _zero_borders(dst, ranges, 1)
        if all(hi > lo for lo, hi, _ in ranges):
            window = _source(x, src, False)
            dst[(slice(None),) + tuple(slice(lo, hi) for lo, hi, _ in ranges)] = window.reshape(
                *window.shape[:-1], groups, c // groups)
    return cols


def gemm_conv_columns(cols: np.ndarray, wmat: np.ndarray, out_shape: Sequence[int]) -> np.ndarray:
    """`nchw_columns`' (N, g, Kg, M) times wmat (g, Kg, F/g) as an (N, *out, F) buffer: BLAS
    reads the columns transposed, so the result comes out channels-last."""
    n, groups, _, m = cols.shape
    fg = wmat.shape[-1]
    y = np.empty((n, m, groups, fg), cols.dtype)
    np.matmul(cols.transpose(0, 1, 3, 2), wmat, out=y.transpose(0, 2, 1, 3))
    return y.reshape(n, *out_shape, groups * fg)


def gemm_conv(cols: np.ndarray, wmat: np.ndarray) -> np.ndarray:
    """cols (N, *out, g, Kg) times wmat (g, Kg, F/g) as an (N, *out, F) buffer."""
    groups, kg, fg = wmat.shape
    lead = cols.shape[: (cols.ndim - 1) // 2]  # (N, *out) of (N, *out, g, *k, C/g)
    m = prod(lead)
    if groups == 1:
        return np.matmul(cols.reshape(m, kg), wmat[0]).reshape(*lead, fg)
    y = np.empty((m, groups, fg), cols.dtype)
    np.matmul(cols.reshape(m, groups, kg).transpose(1, 0, 2), wmat, out=y.transpose(1, 0, 2))
    return y.reshape(*lead, groups * fg)


# ---- weights ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvWeights:
    """A weight in the forms the ways above use, each built once (at the first call) for a constant weight."""

    rscf: np.ndarray  # (*k, C/g, F)
    groups: int

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(self.rscf.shape[:-2])

    @functools.cached_property
    def gemm(self) -> np.ndarray:
        """(g, prod(k) * C/g, F/g): a reshape of the RSCF buffer when there is one group."""
        *k, cg, f = self.rscf.shape
        g = self.groups
        taps = prod(k)
        if g == 1:
            return self.rscf.reshape(1, taps * cg, f)
        per = self.rscf.reshape(taps, cg, g, f // g).transpose(2, 0, 1, 3)
        return dense(per).reshape(g, taps * cg, f // g)

    @functools.cached_property
    def gemm_channels_first(self) -> np.ndarray:
        """(g, C/g * prod(k), F/g): the operand of `nchw_columns`' (C/g, *k) rows."""
        *k, cg, f = self.rscf.shape
        g = self.groups
        per = self.rscf.reshape(prod(k), cg, g, f // g).transpose(2, 1, 0, 3)
        return dense(per).reshape(g, cg * prod(k), f // g)

    @functools.cached_property
    def depthwise(self) -> DepthwiseWeights:
        """For C/g == 1."""
        return DepthwiseWeights.from_gemm_form(self.rscf, self.groups)

    @functools.cached_property
    def winograd(self) -> np.ndarray:
        return winograd_weight(self.rscf)

    @functools.cached_property
    def taps(self) -> np.ndarray:
        return tap_weights(self.rscf, channels_last=True)

    @functools.cached_property
    def taps_channels_first(self) -> np.ndarray:
        return tap_weights(self.rscf, channels_last=False)


def conv_weights(w: np.ndarray, packed: bool, groups: int) -> ConvWeights:
    """The RSCF form of a weight buffer (packed RSCF already, or identity FCRS)."""
    w = wide(w)
    rscf = w if packed else w.transpose(weight_gemm(w.ndim))
    return ConvWeights(dense(rscf), groups)


# ---- the kernel --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    attrs: dict[str, Any]
    groups: int
    nchw_in: bool
    packed_weight: bool
    out_channels_last: bool
    kernel_attr: tuple[int, ...] | None


def conv_nhwc(x: np.ndarray, weights: ConvWeights, plan: _Plan, bias: np.ndarray | None) -> np.ndarray:
    """The convolution of an NHWC (or NCHW, `plan.nchw_in`) buffer as an NHWC buffer."""
    nchw = plan.nchw_in
    spatial = x.shape[2:] if nchw else x.shape[1:-1]
    kernel_shape = plan.kernel_attr or weights.kernel
    geo = window_geometry(plan.attrs, spatial, kernel_shape)
    g = plan.groups
    cg, f = weights.rscf.shape[-2:]
    unit = all(k == 1 for k in kernel_shape) and all(s == 1 for s in geo.strides) and not geo.padded
    if is_splat(weights.rscf):
        rows = x if nchw else np.moveaxis(x, -1, 1)
        y = splat_conv(rows, weights.rscf.flat[0], f, kernel_shape, plan.attrs, g, bias, geo)
        return np.ascontiguousarray(np.moveaxis(y, 1, -1))
    if g == 1 and unit and not nchw:
        y = np.matmul(x.reshape(-1, cg), weights.gemm[0]).reshape(x.shape[0], *spatial, f)
    elif cg == 1 and g > 1:
        return depthwise(x, weights.depthwise, geo, nchw, bias)
    elif unit and not nchw:  # grouped 1x1: each group's GEMM reads its channels of the buffer in place
        y = gemm_conv(x.reshape(x.shape[0], *spatial, g, *kernel_shape, cg), weights.gemm)
    elif g == 1 and worth_winograd_nhwc(kernel_shape, geo, x.shape[0], cg, f) and not nchw:
        u = weights.winograd
        return winograd_nhwc(x, u, geo, bias)
    elif g == 1 and worth_taps(kernel_shape, geo, cg, f):
        if nchw or f <= FEW_OUTPUTS:  # channels-first products, the small result moved channels-last
            rows = x if nchw else np.moveaxis(x, -1, 1)
            y = conv_taps(rows, weights.taps_channels_first, geo, False, bias)
            return np.ascontiguousarray(np.moveaxis(y, 1, -1))
        return conv_taps(x, weights.taps, geo, True, bias)
    elif nchw:
        y = gemm_conv_columns(nchw_columns(x, geo, g), weights.gemm_channels_first, geo.out_shape)
    else:
        y = gemm_conv(im2col(x, geo, g), weights.gemm)
    if bias is not None:
        y += bias
    return y


def accepts_channels_last(spec: KernelSpec, weight_perm: Callable[[int], tuple[int, ...]]) -> bool:
    """A float conv-like node (Conv, ConvTranspose) whose activations are channels-last or
    identity, whose weight is permuted by `weight_perm(rank)` or identity, and whose bias is plain."""
    x, w = spec.in_types[0], spec.in_types[1]
    b = spec.in_types[2] if len(spec.in_types) > 2 else None
    y = spec.out_types[0]
    if x is None or w is None or x.rank < 3 or x.rank != w.rank or len(spec.out_types) != 1:
        return False
    if x.dtype not in (np.float16, np.float32, np.float64) or spec.attrs.get("auto_pad", "NOTSET") not in (
            "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return False
    last = channels_last(x.rank)
    return (
        (x.encoding is None or is_permutation(x.encoding, last))
        and (y.encoding is None or is_permutation(y.encoding, last))
        and (w.encoding is None or is_permutation(w.encoding, weight_perm(w.rank)))
        and (b is None or b.encoding is None)
    )


@packed_kernel("Conv")
def packed_conv(spec: KernelSpec) -> Run | None:
    """Conv on channels-last and RSCF buffers (see the module docstring), or None."""
    if not accepts_channels_last(spec, weight_gemm):
        return None
    check_dtypes(spec)
    x_type, w_type, y_type = spec.in_types[0], spec.in_types[1], spec.out_types[0]
    groups = int(spec.attrs.get("group", 1))
    kernel_attr = spec.attrs.get("kernel_shape")
    plan = _Plan(dict(spec.attrs), groups, x_type.encoding is None, w_type.encoding is not None,
                 y_type.encoding is not None, tuple(kernel_attr) if kernel_attr else None)
    const_w = spec.const_array(1)
    fixed = conv_weights(const_w, plan.packed_weight, groups) if const_w is not None else None
    const_b = spec.const_array(2) if len(spec.consts) > 2 else None
    bias_fixed = None if const_b is None else np.ascontiguousarray(wide(const_b))

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        dtype = x.dtype
        weights = fixed if fixed is not None else conv_weights(w, plan.packed_weight, groups)
        bias = bias_fixed if bias_fixed is not None else (None if b is None else wide(b))
        y = conv_nhwc(wide(x), weights, plan, bias)
        if y.dtype != dtype:
            y = y.astype(dtype)
        if not plan.out_channels_last:
            y = np.ascontiguousarray(np.moveaxis(y, -1, 1))
        return y

    return run
