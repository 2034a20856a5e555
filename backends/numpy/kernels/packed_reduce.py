"""Reductions (ReduceMean, ReduceSum, ReduceMax, ... : `REDUCE_OPS`) on packed buffers.

The reduction runs over the buffer axes that hold the reduced dims, outer and tile axes
alike, so no element moves: a channels-last (N, H, W, C) buffer reduced over H and W is one
`np.mean` over its axes 1 and 2. A tiled dim may be reduced only when its tile divides it
(padding would enter the reduction); otherwise the generic path unpacks. The reduced buffer
is the result in the input's encoding less the reduced dims' tiles; it becomes the result's
encoding by a reshape when the bytes agree, else by one copy.
"""
from __future__ import annotations


from ....graph.ops.reduce import REDUCE_OPS
from ....layout.encoding import PackedEncoding
from ..registry import KernelSpec, Run, packed_kernel
from .common import as_array, check_dtypes, const_ints, norm_axes
from .packed_layout import as_encoding, converter
from .reduce import reducer


def reduced_encoding(enc: PackedEncoding, rank: int, axes: set[int], keep: bool) -> PackedEncoding:
    """The encoding of the reduced buffer: reduced dims lose their tiles (and, without
    keepdims, their place in the outer order)."""
    kept = [d for d in range(rank) if keep or d not in axes]
    index = {d: i for i, d in enumerate(kept)}
    tiled = [(d, t) for d, t in zip(enc.inner_dims_pos, enc.inner_tiles) if d not in axes]
    return PackedEncoding(tuple(index[d] for d, _ in tiled), tuple(t for _, t in tiled),
                          tuple(index[d] for d in enc.outer_perm(rank) if d in index), enc.pad)


def _register(op: str) -> None:
    @packed_kernel(op)
    def build(spec: KernelSpec) -> Run | None:
        x, y = spec.in_types[0], spec.out_types[0]
        if x is None or x.encoding is None or not (x.is_static and y.is_static):
            return None
        keep = bool(spec.attrs.get("keepdims", 1))
        has_axes = len(spec.in_types) > 1 and spec.in_types[1] is not None
        chosen = const_ints(spec, 1) if has_axes else []
        if chosen is None or (not chosen and spec.attrs.get("noop_with_empty_axes", 0)):
            return None
        axes = set(norm_axes(chosen, x.rank)) if chosen else set(range(x.rank))
        enc = x.encoding
        tiles = enc.tiles()
        if any(d in tiles and x.shape[d] % tiles[d] for d in axes):
            return None  # padding would be reduced
        check_dtypes(spec)
        split = enc.outer_perm(x.rank)
        buffer_axes = tuple(k for k, d in enumerate(split) if d in axes)
        buffer_axes += tuple(len(split) + i for i, d in enumerate(enc.inner_dims_pos) if d in axes)
        reduce = reducer(op, y.dtype)
        finish = converter(reduced_encoding(enc, x.rank, axes, keep), as_encoding(y.encoding), y.shape)
        return lambda p, _axes=None: finish(as_array(reduce(p, buffer_axes, keep)).astype(y.dtype, copy=False))


for _op in REDUCE_OPS:
    _register(_op)
