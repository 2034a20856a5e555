"""Depthwise convolution (one input channel per group), for the plain and the channels-last
Conv kernels.

A GEMM per channel would multiply a 1 x prod(k) row by a prod(k) x (H*W) column buffer: BLAS
cannot use its blocking there, and the column buffer is prod(k) times the input. Instead each
tap multiplies the input's shifted window by its weights and adds the product into the
result: two passes over the result per tap. The input is copied once into a zero-padded
channels-last buffer (an NCHW transpose and a channel multiplier's repeat fused into that
copy), whose last spatial dim is split into `stride` planes, so that each tap reads
(W_out * C) contiguous elements per row and multiplies them by a row of weights: NumPy's inner
loop then spans a whole row, where a per-channel broadcast restarts it every C elements
(1.7x slower at ShuffleNet's 136 channels). Computing the result a few rows at a time, to stay
in L2 through the taps, was slower at every size measured (Python's per-call cost).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from .common import Window, pad


@dataclass(frozen=True)
class DepthwiseWeights:
    """Tap t's weight of output channel f (of input channel f // mult), as a (prod(k), F) array,
    and its rows repeated along an output row, built once per row width."""

    taps: np.ndarray
    mult: int
    rows_cache: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_gemm_form(cls, rscf: np.ndarray, groups: int) -> DepthwiseWeights:
        """From an (*k, 1, F) weight buffer (RSCF)."""
        f = rscf.shape[-1]
        return cls(rscf.reshape(-1, f), f // groups)

    @classmethod
    def from_onnx(cls, w: np.ndarray, groups: int) -> DepthwiseWeights:
        """From ONNX's (F, 1, *k) weight."""
        f = w.shape[0]
        return cls(np.ascontiguousarray(w.reshape(f, -1).T), f // groups)

    def rows(self, width: int) -> np.ndarray:
        """(prod(k), width * F): each tap's weights repeated along an output row of `width`."""
        if width not in self.rows_cache:
            self.rows_cache[width] = np.tile(self.taps, (1, width))
        return self.rows_cache[width]


def depthwise(x: np.ndarray, weights: DepthwiseWeights, geo: Window, nchw: bool,
              bias: np.ndarray | None) -> np.ndarray:
    """The convolution of an (N, *spatial, C) buffer, or an (N, C, *spatial) one (`nchw`), with
    one input channel per group, as an (N, *out, F) buffer (see the module docstring)."""
    out = geo.out_shape
    n, f = x.shape[0], weights.taps.shape[1]
    stride, dilation = geo.strides[-1], geo.dilations[-1]
    rows = np.moveaxis(x, 1, -1) if nchw else x
    if weights.mult > 1:
        rows = np.repeat(rows, weights.mult, axis=-1)
    widths = [(b, e + extra) for b, e, extra in zip(geo.pads_begin, geo.pads_end, geo.extra_end)]
    widths[-1] = (widths[-1][0], widths[-1][1] + (-(rows.shape[-2] + sum(widths[-1]))) % stride)
    if rows is x and not any(map(any, widths)):
        padded = x
    else:
        padded = pad(rows, [(0, 0), *widths, (0, 0)])
    if stride > 1:
        split = padded.reshape(*padded.shape[:-2], padded.shape[-2] // stride, stride, f)
        planes = np.ascontiguousarray(np.moveaxis(split, -2, 0))
    else:
        planes = padded[None]
    width = out[-1] * f
    w_rows = weights.rows(out[-1])
    y = np.empty((n, *out[:-1], width), np.result_type(x.dtype, w_rows.dtype))
    scratch = np.empty_like(y)
    for index, tap in enumerate(itertools.product(*(range(k) for k in geo.kernel))):
        lead = tuple(slice(t * d, t * d + (m - 1) * s + 1, s)
                     for t, d, s, m in zip(tap, geo.dilations, geo.strides, out[:-1]))
        offset = tap[-1] * dilation
        src = planes[offset % stride][(slice(None), *lead, slice(offset // stride, offset // stride + out[-1]))]
        src = src.reshape(*src.shape[:-2], width)
        if index == 0:
            np.multiply(src, w_rows[index], out=y)
        else:
            y += np.multiply(src, w_rows[index], out=scratch)
    if bias is not None:
        y += np.tile(bias, out[-1])
    return y.reshape(n, *out, f)
