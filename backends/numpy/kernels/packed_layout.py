"""Pack and Unpack kernels, and the buffer-order algebra the packed kernels rely on.

`pack_buffer` / `unpack_buffer` compute what layout/encoding.py's reference `pack` / `unpack`
compute, in one copy: the buffer is written (or read) through its "split" view, whose axes
are each logical dim's (outer, tile) pair in logical order; a tiled dim whose size the tile
does not divide is handled as a block of whole tiles plus one partial tile, so the padded
logical tensor is never materialized (np.pad would be a second pass).

`same_buffer(enc_a, enc_b, shape)` says whether two encodings store a tensor as the same
bytes (then a layout change is a reshape of the buffer, never a copy); `same_reshaped_buffer`
says the same across a reshape (the layout: what the padding holds is the caller's
concern). Both work from each buffer axis's stride in the logical
row-major order: the buffers are equal when the merged (stride, size) lists are. With
padding, the padding positions matter too, so they compare index arrays instead (exact,
O(size), and only where an encoding pads).
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from ....layout.encoding import PackedEncoding, flat_order, split_order
from ..registry import KernelSpec, Run, kernel, packed_kernel

IDENTITY = PackedEncoding((), ())
INDEX_LIMIT = 1 << 24
"""Largest tensor whose padded layouts are compared with index arrays; larger ones are
reported as different (a kernel then copies instead of returning a view)."""


def as_encoding(enc: Any) -> PackedEncoding:
    """None (identity) as the identity PackedEncoding."""
    return IDENTITY if enc is None else enc


def split_view(p: np.ndarray, enc: PackedEncoding, rank: int) -> np.ndarray:
    """The buffer `p` with its axes in split order: a view, never a copy."""
    return p.transpose(np.argsort(split_order(enc, rank)))


def _blocks(shape: Sequence[int], tiles: dict[int, int]):
    """(logical index, split index, split block shape) of every whole-tile / partial-tile block."""
    per_dim = []
    for d, n in enumerate(shape):
        if d not in tiles:
            per_dim.append([((slice(None),), (slice(None),), (n,))])
            continue
        t = tiles[d]
        full, rem = divmod(n, t)
        parts = []
        if full:
            parts.append(((slice(0, full * t),), (slice(0, full), slice(None)), (full, t)))
        if rem:
            parts.append(((slice(full * t, n),), (slice(full, full + 1), slice(0, rem)), (1, rem)))
        per_dim.append(parts)
    for combo in itertools.product(*per_dim):
        yield (sum((c[0] for c in combo), ()), sum((c[1] for c in combo), ()), sum((c[2] for c in combo), ()))


def _padding(shape: Sequence[int], tiles: dict[int, int]):
    """Split indices of the padding of each tiled dim (regions may overlap)."""
    for d, n in enumerate(shape):
        if d in tiles and n % tiles[d]:
            index: tuple[slice, ...] = ()
            for e in range(len(shape)):
                if e == d:
                    index += (slice(n // tiles[d], None), slice(n % tiles[d], None))
                else:
                    index += (slice(None),) * (2 if e in tiles else 1)
            yield index


def pack_buffer(x: np.ndarray, enc: PackedEncoding | None) -> np.ndarray:
    """`pack(x, enc)` in one copy (a view of x when the buffer is x's own element order)."""
    enc = as_encoding(enc)
    shape = x.shape
    if not enc.is_padded(shape):
        split = [s for d, n in enumerate(shape) for s in ((n // enc.tiles()[d], enc.tiles()[d])
                                                         if d in enc.tiles() else (n,))]
        return np.ascontiguousarray(x.reshape(split).transpose(split_order(enc, x.ndim)))
    tiles = enc.tiles()
    out = np.empty(enc.physical_shape(shape), x.dtype)
    view = split_view(out, enc, x.ndim)
    for src, dst, block in _blocks(shape, tiles):
        view[dst] = x[src].reshape(block)
    fill = 0 if enc.pad is None else enc.pad
    for index in _padding(shape, tiles):
        view[index] = fill
    return out


def unpack_buffer(p: np.ndarray, enc: PackedEncoding | None, shape: Sequence[int]) -> np.ndarray:
    """`unpack(p, enc, shape)` in one copy: a view of p when the element order is unchanged,
    else a fresh contiguous array."""
    enc = as_encoding(enc)
    shape = tuple(int(d) for d in shape)
    view = split_view(p, enc, len(shape))
    if not enc.is_padded(shape):
        logical = view.reshape(shape)
        return logical if logical.flags.c_contiguous else np.ascontiguousarray(logical)
    out = np.empty(shape, p.dtype)
    for dst, src, block in _blocks(shape, enc.tiles()):
        np.reshape(out[dst], block, copy=False)[...] = view[src]
    return out


def physical_shape(enc: Any, shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(shape) if enc is None else enc.physical_shape(shape)


def logical_view(p: np.ndarray, enc: Any, shape: Sequence[int]) -> np.ndarray:
    """The logical tensor held by `p`: a transposed view for an untiled encoding, else unpacked."""
    if enc is None:
        return p.reshape(shape)
    if not enc.inner_tiles:
        return p.transpose(np.argsort(enc.outer_perm(len(shape))))
    return unpack_buffer(p, enc, shape)


def converter(enc_from: Any, enc_to: Any, shape: Sequence[int]):
    """`fn(buffer)`: the tensor of static `shape` held in `enc_from`, as its buffer in `enc_to`
    (a reshape when the bytes agree, else one copy for untiled encodings)."""
    if same_buffer(enc_from, enc_to, shape):
        target = physical_shape(enc_to, shape)
        return lambda p: p.reshape(target)
    source = physical_shape(enc_from, shape)
    return lambda p: pack_buffer(logical_view(p.reshape(source), enc_from, shape), enc_to)


# ---- buffer order ------------------------------------------------------------------------------
def _index_buffer(enc: PackedEncoding, shape: Sequence[int], index: np.ndarray) -> np.ndarray:
    return pack_buffer(index.reshape(shape), enc.with_pad(-1)).reshape(-1)


def same_reshaped_buffer(enc_a: Any, shape_a: Sequence[Any], enc_b: Any, shape_b: Sequence[Any]) -> bool:
    """Whether the tensor of `shape_a` in `enc_a` and its row-major reshape to `shape_b` in
    `enc_b` are the same bytes. False for symbolic shapes."""
    if not all(isinstance(d, int) for d in (*shape_a, *shape_b)):
        return enc_a is None and enc_b is None
    a, b = as_encoding(enc_a), as_encoding(enc_b)
    if not a.is_padded(shape_a) and not b.is_padded(shape_b):
        return flat_order(a, shape_a) == flat_order(b, shape_b)
    size = int(np.prod(shape_a, dtype=np.int64))
    if size > INDEX_LIMIT:
        return False
    index = np.arange(size, dtype=np.int64)
    buf_a, buf_b = _index_buffer(a, shape_a, index), _index_buffer(b, shape_b, index)
    return buf_a.shape == buf_b.shape and bool(np.array_equal(buf_a, buf_b))


def same_buffer(enc_a: Any, enc_b: Any, shape: Sequence[Any]) -> bool:
    """Whether `enc_a` and `enc_b` store a tensor of `shape` as the same bytes."""
    return same_reshaped_buffer(enc_a, shape, enc_b, shape)


# ---- kernels -------------------------------------------------------------------------------------
def _layout_change(spec: KernelSpec, unpacking: bool) -> Run:
    source, target = spec.in_types[0], spec.out_types[0]
    shape = source.shape
    if source.is_static and same_buffer(source.encoding, target.encoding, shape):
        physical = target.encoding.physical_shape(shape) if target.encoding is not None else shape
        return lambda p: p.reshape(physical)
    if unpacking:
        return lambda p: unpack_buffer(p, source.encoding, logical_shape(p, source.encoding, shape))
    return lambda x: pack_buffer(x, target.encoding)


def logical_shape(p: np.ndarray, enc: PackedEncoding, shape: Sequence[Any]) -> tuple[int, ...]:
    """The static dims of `shape`; a symbolic one read from the buffer (untiled dims only)."""
    if all(isinstance(d, int) for d in shape):
        return tuple(shape)
    tiles = enc.tiles()
    outer = dict(zip(enc.outer_perm(len(shape)), p.shape))
    dims = []
    for d, n in enumerate(shape):
        if isinstance(n, str) and d in tiles:
            raise ValueError(f"cannot tell the size of symbolic dim {n!r}: it is tiled by {tiles[d]}")
        dims.append(n if isinstance(n, int) else outer[d])
    return tuple(dims)


@kernel("Pack", views=True)
def _pack(spec: KernelSpec) -> Run:
    """The packed buffer of an identity input: one copy, or a reshape when the bytes agree."""
    return _layout_change(spec, unpacking=False)


@kernel("Unpack", views=True)
def _unpack(spec: KernelSpec) -> Run:
    """The identity buffer of a packed input: one copy, or a reshape when the bytes agree."""
    return _layout_change(spec, unpacking=True)


packed_kernel("Pack")(_pack)
packed_kernel("Unpack")(_unpack)
