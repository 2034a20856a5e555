"""Convolution with fewer output than input channels: one GEMM of the input with every tap's
weights side by side, then each tap's slice of the products added into the result at its shift.

im2col + GEMM writes a column buffer of prod(k) * C values per input position; this writes
prod(k) * F products. At stride 1 both multiply the same pairs, so it wins when F < C (a U-Net
decoder halving its channels, a segmentation or detection head). Measured here (2 threads,
float32, channels-last, 3x3 unless noted):

| C -> F, size | im2col + GEMM | tap products |
| --- | --- | --- |
| 128 -> 4, 128x128 | 28.6 ms | 3.2 ms |
| 64 -> 16, 128x128 | 15.2 ms | 5.2 ms |
| 128 -> 32, 64x64 | 4.9 ms | 2.8 ms |
| 128 -> 64, 32x32, 5x5 | 4.8 ms | 3.6 ms |
| 256 -> 128, 28x28 | 3.3 ms | 3.1 ms |
| 64 -> 64, 56x56 | 1.7 ms | 2.0 ms |
| 128 -> 64, 64x64, stride 2 | 1.2 ms | 3.8 ms (4x the products) |

Winograd, where it applies, stays ahead (4.5 against 4.1 ms at 128 -> 32, 64x64, but 5.9
against 7.2 at 128 -> 64). ConvTranspose (linalg.py) scatters its products the same way.
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from .common import Window, prod, tap_slices


FEW_OUTPUTS = 16
"""Up to this many output channels, a channels-last input's products are computed channels-first
(the input read transposed), so that each tap's slice is whole rows: 2.5 against 3.2 ms at
128 -> 4, 4.2 against 5.2 at 64 -> 16, but 3.1 against 2.8 at 128 -> 32."""


def worth_taps(kernel: Sequence[int], geo: Window, c: int, f: int) -> bool:
    """More than one tap, stride 1, and at most half as many output channels as input ones."""
    return prod(kernel) > 1 and all(s == 1 for s in geo.strides) and 2 * f <= c


def tap_weights(rscf: np.ndarray, channels_last: bool) -> np.ndarray:
    """An RSCF weight (*k, C, F) as (C, prod(k) * F) for a channels-last input, else as
    (prod(k) * F, C): the GEMM operand whose products are grouped by tap."""
    *k, c, f = rscf.shape
    by_tap = np.moveaxis(rscf, -2, 0).reshape(c, prod(k) * f)
    return np.ascontiguousarray(by_tap if channels_last else by_tap.T)


def conv_taps(x: np.ndarray, weights: np.ndarray, geo: Window, channels_last: bool,
              bias: np.ndarray | None) -> np.ndarray:
    """The ungrouped convolution of x (N, *spatial, C), or (N, C, *spatial), with `tap_weights`,
    in x's layout; outputs that a tap reaches only through padding take nothing from it."""
    n, taps = x.shape[0], prod(geo.kernel)
    if channels_last:
        spatial, c = x.shape[1:-1], x.shape[-1]
        f = weights.shape[1] // taps
        products = np.matmul(x.reshape(-1, c), weights).reshape(n, *spatial, taps, f)
        y = np.empty((n, *geo.out_shape, f), np.result_type(x.dtype, weights.dtype))
    else:
        spatial, c = x.shape[2:], x.shape[1]
        f = weights.shape[0] // taps
        products = np.matmul(weights, x.reshape(n, c, -1)).reshape(n, taps, f, *spatial)
        y = np.empty((n, f, *geo.out_shape), np.result_type(x.dtype, weights.dtype))
    y[...] = 0 if bias is None else (bias if channels_last else bias.reshape(-1, *(1,) * len(spatial)))
    for index, tap in enumerate(itertools.product(*(range(k) for k in geo.kernel))):
        ranges, src = tap_slices(geo, spatial, tap)
        if any(hi <= lo for lo, hi, _ in ranges):
            continue
        box = tuple(slice(lo, hi) for lo, hi, _ in ranges)
        if channels_last:
            y[(slice(None), *box)] += products[(slice(None), *src, index)]
        else:
            y[(slice(None), slice(None), *box)] += products[(slice(None), index, slice(None), *src)]
    return y
