"""Winograd F(2x2, 3x3) on NHWC buffers (Lavin & Gray, 2015; the NCHW form is winograd.py).

Each 2x2 output tile is A^T [(G g G^T) * (B^T d B)] A for the 4x4 input tile d around it.
Channels last, every transform pass is one ufunc call over (N, tiles, C) with C innermost and
contiguous, and the 16 products are one batched GEMM (16, tiles, C) @ (16, C, F) whose result
is already channels-last: the output transform writes the NHWC result directly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .common import Window, is_splat

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

MIN_TILES = 36
"""Fewer output tiles than this (a 12x12 output) and the 16 thin GEMMs lose to im2col."""
MIN_CHANNELS = 32
"""Fewer input or output channels and the transforms cost more than the saved products."""


def winograd_weight(rscf: np.ndarray) -> np.ndarray:
    """An RSCF weight (3, 3, C, F) as U (16, C, F), computed in float64."""
    c, f = rscf.shape[2:]
    if is_splat(rscf):
        return np.broadcast_to(winograd_weight(np.ascontiguousarray(rscf[:, :, :1, :1])), (16, c, f))
    u = np.einsum("ik,klcf,jl->ijcf", _G, rscf.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, c, f).astype(rscf.dtype))


def worth_winograd_nhwc(kernel: Sequence[int], geo: Window, n: int, c: int, f: int) -> bool:
    """3x3, stride 1, undilated, with enough tiles and channels (measured thresholds)."""
    if tuple(kernel) != (3, 3) or tuple(geo.strides) != (1, 1) or tuple(geo.dilations) != (1, 1):
        return False
    tiles = n * -(-geo.out_shape[0] // 2) * -(-geo.out_shape[1] // 2)
    return tiles >= MIN_TILES and min(c, f) >= MIN_CHANNELS


def _padded(x: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    """x (N, H, W, C) placed at (top, left) in a zeroed (N, height, width, C) buffer, cropped to it."""
    n, h, w, c = x.shape
    p = np.empty((n, height, width, c), x.dtype)
    rows, cols = min(h, height - top), min(w, width - left)
    p[:, :top] = 0
    p[:, top + rows:] = 0
    p[:, top:top + rows, :left] = 0
    p[:, top:top + rows, left + cols:] = 0
    p[:, top:top + rows, left:left + cols] = x[:, :rows, :cols]
    return p


def _input_transform(p: np.ndarray, th: int, tw: int) -> np.ndarray:
    """V = B^T d B for every tile of the padded input, as (16, N * th * tw, C)."""
    n, _, wp, c = p.shape
    t = np.empty((4, n, th, wp, c), p.dtype)
    d = [p[:, k:k + 2 * th - 1:2] for k in range(4)]
    np.subtract(d[0], d[2], out=t[0])
    np.add(d[1], d[2], out=t[1])
    np.subtract(d[2], d[1], out=t[2])
    np.subtract(d[1], d[3], out=t[3])
    v = np.empty((4, 4, n, th, tw, c), p.dtype)
    for i in range(4):
        e = [t[i][:, :, k:k + 2 * tw - 1:2] for k in range(4)]
        np.subtract(e[0], e[2], out=v[i, 0])
        np.add(e[1], e[2], out=v[i, 1])
        np.subtract(e[2], e[1], out=v[i, 2])
        np.subtract(e[1], e[3], out=v[i, 3])
    return v.reshape(16, n * th * tw, c)


def winograd_nhwc(x: np.ndarray, u: np.ndarray, geo: Window, bias: np.ndarray | None) -> np.ndarray:
    """Conv of x (N, H, W, C) with U (16, C, F): the (N, OH, OW, F) result."""
    n = x.shape[0]
    f = u.shape[-1]
    oh, ow = geo.out_shape
    th, tw = -(-oh // 2), -(-ow // 2)
    p = _padded(x, geo.pads_begin[0], geo.pads_begin[1], 2 * th + 2, 2 * tw + 2)
    m = np.matmul(_input_transform(p, th, tw), u)  # (16, tiles, F)
    if bias is not None:
        m[5] += bias  # every output of a tile takes m[1][1] with coefficient 1
    m = m.reshape(4, 4, n, th, tw, f)
    # A^T m A with A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]: over tile rows (in m's own rows 0
    # and 1, which nothing reads afterwards), then columns
    top, bottom = m[0], m[1]
    top += m[1]
    top += m[2]
    bottom -= m[2]
    bottom -= m[3]
    y = np.empty((n, th, 2, tw, 2, f), x.dtype)
    for r, s in enumerate((top, bottom)):
        left, right = y[:, :, r, :, 0], y[:, :, r, :, 1]
        np.add(s[0], s[1], out=left)
        left += s[2]
        np.subtract(s[1], s[2], out=right)
        right -= s[3]
    y = y.reshape(n, 2 * th, 2 * tw, f)
    if (2 * th, 2 * tw) != (oh, ow):
        y = np.ascontiguousarray(y[:, :oh, :ow])
    return y
