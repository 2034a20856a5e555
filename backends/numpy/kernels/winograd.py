"""Winograd F(2x2, 3x3) convolution: 3x3, stride-1, undilated, ungrouped 2-D Conv with 2.25x
fewer multiplications than im2col + GEMM (Lavin & Gray, "Fast Algorithms for Convolutional
Neural Networks", 2015).

Each 2x2 output tile is A^T [(G g G^T) * (B^T d B)] A for the 4x4 input tile d around it.
The weight transform U = G g G^T runs once in the factory for constant weights; per call,
the input and output transforms are a few dozen ufunc passes and the products are one
batched GEMM, (16, F, C) @ (16, C, tiles). Tiles overlap by two pixels, so the padded input
is first split into its four (row, column) parity phases; each transform pass is then a
single ufunc call over a whole flat buffer shifted by one row or one column, which runs
several times faster than passes over every other element of short rows.
"""
from __future__ import annotations

import numpy as np

from .common import is_splat

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def weight_transform(w: np.ndarray) -> np.ndarray:
    """W (F, C, 3, 3) as U (16, F, C) contiguous, computed in float64."""
    f, c = w.shape[:2]
    if is_splat(w):
        return np.broadcast_to(weight_transform(np.ascontiguousarray(w[:1, :1])), (16, f, c))
    u = np.einsum("ik,fckl,jl->ijfc", _G, w.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, f, c).astype(w.dtype))


def _phases(x: np.ndarray, pads: tuple[int, int, int, int], th: int, tw: int) -> list[list[np.ndarray]]:
    """The zero-padded input (N, C, 2th+2, 2tw+2) split by row and column parity:
    phase[a][b][..., p, q] = padded[..., 2p + a, 2q + b], each (N, C, th+1, tw+1)."""
    n, c, h, w = x.shape
    top, left = pads[0], pads[1]
    phases = []
    for a in range(2):
        row = []
        for b in range(2):
            phase = np.zeros((n, c, th + 1, tw + 1), x.dtype)
            # padded row 2p + a holds input row 2p + a - top, when that is inside the input
            first_in = (a - top) % 2  # the first input row of this parity
            p0 = (first_in + top - a) // 2
            rows = x[:, :, first_in::2]
            q_first_in = (b - left) % 2
            q0 = (q_first_in + left - b) // 2
            block = rows[:, :, : max(th + 1 - p0, 0), q_first_in::2][:, :, :, : max(tw + 1 - q0, 0)]
            phase[:, :, p0:p0 + block.shape[2], q0:q0 + block.shape[3]] = block
            row.append(phase)
        phases.append(row)
    return phases


def _input_transform(x: np.ndarray, pads: tuple[int, int, int, int], th: int, tw: int) -> np.ndarray:
    """V = B^T d B for every tile, as (16, N, C, th, tw + 1): tile (p, q) of image n and
    channel c at [:, n, c, p, q]; the extra tile column q = tw is garbage.

    Every pass is one ufunc call over a whole flat buffer, shifted by one row or one
    column: the passes' garbage lands in row th and column tw of each channel's
    (th + 1, tw + 1) grid, which the GEMM never reads."""
    n, c = x.shape[:2]
    ph = [[p.reshape(-1) for p in row] for row in _phases(x, pads, th, tw)]
    size, row = n * c * (th + 1) * (tw + 1), tw + 1
    # rows of B^T d: d0 - d2, d1 + d2, d2 - d1, d1 - d3 (tile row i = phase row i % 2 at
    # offset i // 2), one set per column parity
    t = []
    for b in range(2):
        e0, e1 = ph[0][b][: size - row], ph[0][b][row:]
        o0, o1 = ph[1][b][: size - row], ph[1][b][row:]
        t.append((np.subtract(e0, e1), np.add(o0, e1), np.subtract(e1, o0), np.subtract(o0, o1)))
    v = np.empty((16, size), x.dtype)
    v[:, size - row - 1:] = 0
    for i in range(4):
        even, odd = t[0][i], t[1][i]  # tile column j = column parity j % 2 at offset j // 2
        e0, e1, o0, o1 = even[:-1], even[1:], odd[:-1], odd[1:]
        length = size - row - 1
        np.subtract(e0, e1, out=v[4 * i][:length])
        np.add(o0, e1, out=v[4 * i + 1][:length])
        np.subtract(e1, o0, out=v[4 * i + 2][:length])
        np.subtract(o0, o1, out=v[4 * i + 3][:length])
    return v.reshape(16, n, c, th + 1, tw + 1)[:, :, :, :th, :]


def winograd_conv(x: np.ndarray, u: np.ndarray, pads: tuple[int, int, int, int],
                  bias: np.ndarray | None) -> np.ndarray:
    """Conv of x (N, C, H, W) with transformed weights U (16, F, C); pads (top, left, bottom, right)."""
    n, c, h, w = x.shape
    f = u.shape[1]
    out_h, out_w = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    th, tw = -(-out_h // 2), -(-out_w // 2)
    v = _input_transform(x, pads, th, tw).reshape(16, n, c, th * (tw + 1))  # strided rows: no copy
    m = np.matmul(u[:, None], v)  # (16, N, F, th * (tw + 1))
    if bias is not None:
        m[5] += bias.reshape(f, 1)  # every output of a tile takes m[1][1] with coefficient 1
    m = m.reshape(4, 4, n, f, th, tw + 1)
    # A^T m A with A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]: first over tile rows, then columns
    top = m[0] + m[1]
    top += m[2]
    bottom = m[1] - m[2]
    bottom -= m[3]
    y = np.empty((n, f, th, 2, tw, 2), x.dtype)
    for r, s in enumerate((top, bottom)):
        left = np.add(s[0], s[1])
        left += s[2]
        right = np.subtract(s[1], s[2])
        right -= s[3]
        y[:, :, :, r, :, 0] = left[..., :tw]
        y[:, :, :, r, :, 1] = right[..., :tw]
    y = y.reshape(n, f, 2 * th, 2 * tw)
    if (2 * th, 2 * tw) != (out_h, out_w):
        y = np.ascontiguousarray(y[:, :, :out_h, :out_w])
    return y
