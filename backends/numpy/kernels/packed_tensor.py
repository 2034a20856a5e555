"""View ops on packed buffers: Transpose, Reshape, Flatten, Squeeze, Unsqueeze (and Shape, Size);
Concat and Split of packed buffers along whole blocks.

When the result's buffer holds the same bytes as the input's (a Transpose whose result
encoding is `in_encoding.permuted(perm)`, a Flatten of an NHWC (N, 1, 1, C) into an identity
(N, C), a Reshape splitting or merging dims that the layouts keep whole), the kernel returns
the input buffer reshaped: a view, no copy. Otherwise it declines, and the generic path
moves the data. Shapes must be static, so that the decision is made once at build time.

Concat and Split run on the buffers as they are when every piece is laid out like the whole
and holds whole tiles along the axis: the pieces are then runs of whole blocks along the
axis's outer buffer axis (DenseNet's and Inception's channel concats on the gpu target).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....graph.ops.tensor import RESHAPES, transpose_perm
from ....graph.types import TensorType
from ....layout.encoding import PackedEncoding
from ..registry import KernelSpec, Run, packed_kernel
from .common import norm_axes, view_of_first
from .packed_layout import as_encoding, physical_shape, same_buffer, same_reshaped_buffer


def _keeps_padding(spec: KernelSpec) -> bool:
    """The result's padding (the input's, reused) holds what the result's encoding records."""
    source, target = spec.in_types[0].encoding, spec.out_types[0].encoding
    if target is None or target.pad is None or not target.is_padded(spec.out_types[0].shape):
        return True
    return source is not None and source.pad == target.pad


def _view(spec: KernelSpec, same: bool) -> Run | None:
    if not same or not _keeps_padding(spec):
        return None
    y = spec.out_types[0]
    target = physical_shape(y.encoding, y.shape)

    def run(x: np.ndarray, *rest: Any) -> np.ndarray:
        return view_of_first(x, *rest).reshape(target)

    return run


def _static(spec: KernelSpec) -> bool:
    x, y = spec.in_types[0], spec.out_types[0]
    return x is not None and x.is_static and y.is_static and len(spec.out_types) == 1


@packed_kernel("Transpose")
def _transpose(spec: KernelSpec) -> Run | None:
    if not _static(spec):
        return None
    x, y = spec.in_types[0], spec.out_types[0]
    perm = transpose_perm(spec.attrs, x.rank)
    relabeled = as_encoding(x.encoding).permuted(perm)
    return _view(spec, same_buffer(y.encoding, relabeled, y.shape))


def _reshaping(op: str) -> None:
    @packed_kernel(op)
    def build(spec: KernelSpec) -> Run | None:
        if not _static(spec):
            return None
        x, y = spec.in_types[0], spec.out_types[0]
        return _view(spec, same_reshaped_buffer(x.encoding, x.shape, y.encoding, y.shape))


for _op in sorted(RESHAPES):
    _reshaping(_op)


@packed_kernel("Shape")
def _shape(spec: KernelSpec) -> Run | None:
    """The logical shape, which the spec knows: the buffer is never read (nor unpacked)."""
    x = spec.in_types[0]
    if x is None or not x.is_static:
        return None
    start, end = int(spec.attrs.get("start", 0)), spec.attrs.get("end")
    dims = np.array(x.shape[start:end], dtype=np.int64)
    return lambda p: dims.copy()


@packed_kernel("Size")
def _size(spec: KernelSpec) -> Run | None:
    x = spec.in_types[0]
    if x is None or not x.is_static:
        return None
    size = int(np.prod(x.shape, dtype=np.int64))
    return lambda p: np.array(size, dtype=np.int64)


def _block_axis(whole: TensorType, pieces: list[TensorType], axis: int) -> int | None:
    """The buffer axis holding `axis`'s blocks when every piece is laid out like `whole`
    (its padding holding what the whole's records) and holds whole tiles along `axis`."""
    enc = whole.encoding
    if not isinstance(enc, PackedEncoding) or not all(t.is_static for t in (whole, *pieces)):
        return None
    tile = enc.tiles().get(axis, 1)
    for t in pieces:
        if not enc.same_layout(t.encoding) or t.shape[axis] % tile:
            return None
        if enc.is_padded(whole.shape) and enc.pad is not None and t.encoding.pad != enc.pad:
            return None
    return enc.outer_perm(whole.rank).index(axis)


@packed_kernel("Concat")
def _concat(spec: KernelSpec) -> Run | None:
    y = spec.out_types[0]
    if any(t is None for t in spec.in_types):
        return None
    (axis,) = norm_axes([spec.attrs["axis"]], y.rank)
    at = _block_axis(y, list(spec.in_types), axis)
    if at is None:
        return None
    return lambda *parts: np.concatenate(parts, axis=at)


@packed_kernel("Split")
def _split(spec: KernelSpec) -> Run | None:
    x = spec.in_types[0]
    (axis,) = norm_axes([spec.attrs.get("axis", 0)], x.rank)
    whole = x if x.encoding is not None else None
    at = _block_axis(whole, list(spec.out_types), axis) if whole is not None else None
    if at is None:
        return None
    tile = x.encoding.tiles().get(axis, 1)
    bounds = np.cumsum([t.shape[axis] // tile for t in spec.out_types])[:-1].tolist()

    def run(p: np.ndarray, _split: Any = None) -> Any:
        parts = tuple(np.ascontiguousarray(part) for part in np.split(p, bounds, axis=at))
        return parts if len(parts) > 1 else parts[0]

    return run
