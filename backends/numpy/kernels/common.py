"""Helpers shared by the kernel families: dtype checks, axis and constant handling, and the
window geometry (padding, output size) of convolutions and pooling."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ....graph.errors import UnsupportedOpError, where
from ....graph.ops.shapes import window_attrs, window_out
from ..registry import KernelSpec

NUMERIC_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64,
))
"""What NumPy computes natively. bfloat16, float8 and int4 (ml_dtypes types, some of which
claim kind 'f'), strings and complex numbers are not supported."""


def check_dtypes(spec: KernelSpec) -> None:
    """UnsupportedOpError when an input or output has a dtype NumPy cannot compute with."""
    for kind, types in (("input", spec.in_types), ("output", spec.out_types)):
        for index, t in enumerate(types):
            if t is not None and t.dtype not in NUMERIC_DTYPES:
                raise UnsupportedOpError(
                    f"{where(spec.node)}: {kind} {index} has dtype {t.dtype}, "
                    "which the NumPy backend does not support"
                )


def unsupported(spec: KernelSpec, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{where(spec.node)}: {what}")


def as_array(x: Any) -> np.ndarray:
    """A ufunc on 0-d inputs returns a NumPy scalar; the executor wants arrays."""
    return x if type(x) is np.ndarray else np.asarray(x)


def is_splat(a: np.ndarray) -> bool:
    """A broadcast view of one element (a splat constant, as `Splat.to_array` gives it)."""
    return a.size > 1 and not any(a.strides)


def dense(a: np.ndarray) -> np.ndarray:
    """`a` as a contiguous array for BLAS, except a splat view, which stays one element
    broadcast: splat weights are never materialized (BLAS calls copy them per call)."""
    return a if is_splat(a) else np.ascontiguousarray(a)


def view_of_first(x: np.ndarray, *others: Any) -> np.ndarray:
    """`x`, or a copy of it when it also arrives as another input (Squeeze(v, v)): the result
    of a views kernel may share memory with input 0 only."""
    for other in others:
        if isinstance(other, np.ndarray) and np.may_share_memory(x, other):
            return x.copy()
    return x


def const_ints(spec: KernelSpec, index: int) -> list[int] | None:
    """Constant integer input `index` as a list, or None when it is computed at run time."""
    value = spec.const_array(index)
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def norm_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    return tuple(int(a) % rank if rank else 0 for a in axes)


@dataclass(frozen=True)
class Window:
    """Geometry of a sliding window over the spatial dims of one input shape."""

    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    extra_end: tuple[int, ...]  # padding beyond `pads_end` that ceil_mode needs (pooling)
    out_shape: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]

    @property
    def effective(self) -> tuple[int, ...]:
        """Extent of one dilated window."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def padded(self) -> bool:
        return any(self.pads_begin) or any(self.pads_end) or any(self.extra_end)


def window_geometry(
    attrs: dict[str, Any], spatial: Sequence[int], kernel: Sequence[int], *, ceil_mode: bool = False
) -> Window:
    """Pads and output size of a conv or pool (ONNX auto_pad, pads, strides, dilations,
    ceil_mode): the output sizes are shape inference's own (`window_out`), so a kernel and
    the graph's types cannot disagree."""
    n = len(spatial)
    strides, dilations, pads = window_attrs("Conv/pool", attrs, spatial, kernel)
    auto_pad = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    begin, end = list(pads[:n]), list(pads[n:])
    out, extra = [0] * n, [0] * n
    for i in range(n):
        size, s = spatial[i], strides[i]
        effective = (kernel[i] - 1) * dilations[i] + 1
        out[i] = int(window_out(size, kernel[i], s, dilations[i], (begin[i], end[i]), auto_pad, ceil_mode,
                                "Conv/pool", i))
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = max(0, (out[i] - 1) * s + effective - size)
            small, large = total // 2, total - total // 2
            begin[i], end[i] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            begin[i], end[i] = 0, 0
        extra[i] = max(0, (out[i] - 1) * s + effective - (size + begin[i] + end[i]))
    return Window(tuple(begin), tuple(end), tuple(extra), tuple(out), tuple(kernel), strides, dilations)


def tap_range(size: int, out: int, j: int, stride: int, dilation: int, pad_begin: int) -> tuple[int, int, int]:
    """(lo, hi, start): outputs [lo, hi) read input start + (o - lo) * stride at tap j."""
    offset = j * dilation - pad_begin  # input index of output 0 at this tap
    lo = min(max(0, -(offset // stride) if offset < 0 else 0), out)
    hi = min(out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    hi = max(hi, lo)
    return lo, hi, offset + lo * stride


def tap_slices(geo: Window, spatial: Sequence[int], tap: Sequence[int]):
    """Per spatial dim: the valid output range and the strided input slice of one tap."""
    ranges = [tap_range(spatial[d], geo.out_shape[d], tap[d], geo.strides[d], geo.dilations[d],
                        geo.pads_begin[d]) for d in range(len(tap))]
    src = tuple(slice(start, start + (hi - lo - 1) * s + 1, s) if hi > lo else slice(0, 0)
                for (lo, hi, start), s in zip(ranges, geo.strides))
    return ranges, src


def transposed_taps(space: Sequence[int], out: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int], begins: Sequence[int]):
    """ConvTranspose's kernel offsets, each with the input positions it reaches and where they
    land: (offset, source slices over the input's spatial dims, strided target slices over the
    result's). Offsets whose every position lands outside the result are skipped."""
    for offset in itertools.product(*(range(k) for k in kernel)):
        source, target = [], []
        for i, size in enumerate(space):
            shift = offset[i] * dilations[i] - begins[i]  # output position of input 0
            first = max(0, -(-(-shift) // strides[i]))  # the first input landing at >= 0
            last = min(size, -(-(out[i] - shift) // strides[i]))  # past the last landing < out
            if first >= last:
                break
            source.append(slice(first, last))
            start = first * strides[i] + shift
            target.append(slice(start, start + (last - first - 1) * strides[i] + 1, strides[i]))
        else:
            yield offset, tuple(source), tuple(target)


def pad(x: np.ndarray, widths: Sequence[tuple[int, int]], value: Any = 0) -> np.ndarray:
    """Constant padding with non-negative widths; np.pad does the same in several more passes."""
    shape = tuple(n + b + e for n, (b, e) in zip(x.shape, widths))
    out = np.empty(shape, x.dtype)
    out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, widths))] = x
    for axis, (b, e) in enumerate(widths):
        lead = (slice(None),) * axis
        if b:
            out[lead + (slice(0, b),)] = value
        if e:
            out[lead + (slice(shape[axis] - e, None),)] = value
    return out


def padded(x: np.ndarray, geo: Window, pad_value: Any = 0) -> np.ndarray:
    """`x` with the window's pads (and ceil_mode's extra end padding) on its trailing dims."""
    if not geo.padded:
        return x
    nd = len(geo.kernel)
    widths = [(0, 0)] * (x.ndim - nd) + [
        (b, e + extra) for b, e, extra in zip(geo.pads_begin, geo.pads_end, geo.extra_end)
    ]
    return pad(x, widths, pad_value)


def windows(x: np.ndarray, geo: Window, pad_value: Any = 0) -> np.ndarray:
    """A strided view (N, C, *out, *kernel) of every window of `x` (padded first if needed)."""
    nd = len(geo.kernel)
    x = padded(x, geo, pad_value)
    spatial_axes = tuple(range(x.ndim - nd, x.ndim))
    view = np.lib.stride_tricks.sliding_window_view(x, geo.effective, axis=spatial_axes)
    index = (slice(None),) * (x.ndim - nd)
    index += tuple(slice(0, max((o - 1) * s + 1, 0), s) for o, s in zip(geo.out_shape, geo.strides))
    index += tuple(slice(None, None, d) for d in geo.dilations)
    return view[index]


def nchw_columns(x: np.ndarray, geo: Window, groups: int) -> np.ndarray:
    """The im2col columns of an NC* buffer as (N, g, C/g * prod(k), prod(out)), rows in
    (C/g, *k) order: one GEMM per group reads them as they are."""
    n, c = x.shape[:2]
    nd = len(geo.kernel)
    if _phases_pay(geo):
        cols = _phase_columns(x, geo)
    else:
        view = windows(x, geo)  # (N, C, *out, *k)
        cols = np.ascontiguousarray(view.transpose(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd)))
    return cols.reshape(n, groups, (c // groups) * prod(geo.kernel), prod(geo.out_shape))


PHASE_MIN_ROW = 96
"""Output rows this long (and at least 4 taps per phase) make a strided conv's columns from
its stride phases: copies along contiguous rows, where the windows view copies every s-th
element. Best of 30, in one process: ResNet's 7x7/2 stem (rows of 112) 0.57 against 0.86 ms,
a 5x5/2 0.40 against 0.46; a 7x7/2 with rows of 56 0.29 against 0.25, a 3x3/2 with rows of
224 0.84 against 0.77 (2.25 taps per phase do not pay for copying the phases)."""


def _phases_pay(geo: Window) -> bool:
    return (any(s > 1 for s in geo.strides) and all(d == 1 for d in geo.dilations)
            and geo.out_shape[-1] >= PHASE_MIN_ROW and prod(geo.kernel) >= 4 * prod(geo.strides))


def _phase_columns(x: np.ndarray, geo: Window) -> np.ndarray:
    """(N, C, *k, *out) columns of an undilated strided window, built per stride phase.

    Tap j of a spatial dim with stride s reads padded index s * o + j, which is element
    o + j // s of phase j % s (every s-th element, starting at j % s). Each phase is copied
    once into a contiguous buffer; its taps are then stride-1 windows, copied whole rows at a
    time. The padded extent (out - 1) * s + k covers every phase's last window."""
    nd = len(geo.kernel)
    xp = padded(x, geo)
    spatial = tuple(range(2, 2 + nd))
    cols = np.empty((*x.shape[:2], *geo.kernel, *geo.out_shape), x.dtype)
    for phase in itertools.product(*(range(min(s, k)) for s, k in zip(geo.strides, geo.kernel))):
        steps = tuple(slice(a, None, s) for a, s in zip(phase, geo.strides))
        source = np.ascontiguousarray(xp[(slice(None), slice(None)) + steps])
        view = np.lib.stride_tricks.sliding_window_view(source, geo.out_shape, axis=spatial)
        taps = tuple(slice(0, -(-(k - a) // s)) for k, a, s in zip(geo.kernel, phase, geo.strides))
        cols[(slice(None), slice(None)) + steps] = view[(slice(None), slice(None)) + taps]
    return cols


def window_reduce(x: np.ndarray, geo: Window, ufunc: np.ufunc, pad_value: Any = 0,
                  dtype: np.dtype | None = None) -> np.ndarray:
    """`ufunc` folded over every window (max or sum pooling), one spatial axis at a time:
    a k1 x k2 window costs k1 + k2 - 2 ufunc passes instead of k1 * k2 - 1."""
    nd = len(geo.kernel)
    acc = padded(x, geo, pad_value)
    if dtype is not None and acc.dtype != dtype:
        acc = acc.astype(dtype)
    for d in range(nd):
        axis = acc.ndim - nd + d
        k, s, dil, out = geo.kernel[d], geo.strides[d], geo.dilations[d], geo.out_shape[d]

        def tap(j: int) -> np.ndarray:
            index = [slice(None)] * acc.ndim
            index[axis] = slice(j * dil, j * dil + max((out - 1) * s + 1, 0), s)
            return acc[tuple(index)]

        folded = tap(0).copy() if k == 1 else ufunc(tap(0), tap(1))
        for j in range(2, k):
            ufunc(folded, tap(j), out=folded)
        acc = folded
    return acc


def prod(values: Sequence[int]) -> int:
    return int(math.prod(values))
