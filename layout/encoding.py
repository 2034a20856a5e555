"""Packed encodings with MLIR `tensor.pack` semantics, and their NumPy reference pack/unpack.

A logical tensor of shape S (rank n) packed with `inner_dims_pos` P, `inner_tiles` T and
`outer_dims_perm` Q is stored as a buffer of rank n + len(P):
- outer dims: for each logical dim d, ceil(S[d] / t) when d is tiled by t, else S[d];
  ordered by Q (outer dim i of the buffer is logical dim Q[i]);
- inner dims: the tiles, in the order of P.
Tiled dims are padded up to whole tiles; `pad` records what the padding holds (a value,
or None when unknown), so that a consumer that would read padding (a reduction, a matmul's
k) can check it. Every other module is tested against `pack`/`unpack` here.

`reshape_perm` and `reshape_encoding` say when a reshape of a packed buffer is a view of it,
and in which encoding (propagation moves layouts through reshapes with them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..graph.errors import VerifyError
from ..graph.types import Dim


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PackedEncoding:
    inner_dims_pos: tuple[int, ...]
    inner_tiles: tuple[int, ...]
    outer_dims_perm: tuple[int, ...] | None = None
    pad: float | None = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "inner_dims_pos", tuple(int(d) for d in self.inner_dims_pos))
        object.__setattr__(self, "inner_tiles", tuple(int(t) for t in self.inner_tiles))
        if self.outer_dims_perm is not None:
            perm = tuple(int(d) for d in self.outer_dims_perm)
            object.__setattr__(self, "outer_dims_perm", None if perm == tuple(range(len(perm))) else perm)
        if len(self.inner_dims_pos) != len(self.inner_tiles):
            raise VerifyError(f"encoding {self}: {len(self.inner_dims_pos)} tiled dims but {len(self.inner_tiles)} tiles")
        if len(set(self.inner_dims_pos)) != len(self.inner_dims_pos):
            raise VerifyError(f"encoding {self}: a dim is tiled twice")
        if any(t <= 0 for t in self.inner_tiles):
            raise VerifyError(f"encoding {self}: tiles must be positive")

    # ---- shapes -------------------------------------------------------------------------
    def outer_perm(self, rank: int) -> tuple[int, ...]:
        return self.outer_dims_perm if self.outer_dims_perm is not None else tuple(range(rank))

    def tiles(self) -> dict[int, int]:
        return dict(zip(self.inner_dims_pos, self.inner_tiles))

    def pack(self, array: np.ndarray) -> np.ndarray:
        """`pack(array, self)`: the IR's `Encoding` protocol asks it of every encoding."""
        return pack(array, self)

    def validate(self, shape: Sequence[Dim]) -> None:
        rank = len(shape)
        if any(not 0 <= d < rank for d in self.inner_dims_pos):
            raise VerifyError(f"encoding {self} tiles a dim outside rank {rank}")
        if sorted(self.outer_perm(rank)) != list(range(rank)):
            raise VerifyError(f"encoding {self}: outer_dims_perm is not a permutation of rank {rank}")

    def outer_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        tiles = self.tiles()
        outer = [ceil_div(d, tiles[i]) if i in tiles else d for i, d in enumerate(shape)]
        return tuple(outer[i] for i in self.outer_perm(len(shape)))

    def physical_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The buffer's shape: permuted outer dims, then the tiles."""
        self.validate(shape)
        return self.outer_shape(shape) + self.inner_tiles

    def padded_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        tiles = self.tiles()
        return tuple(ceil_div(d, tiles[i]) * tiles[i] if i in tiles else d for i, d in enumerate(shape))

    def nbytes(self, shape: Sequence[int], dtype: np.dtype) -> int:
        return int(np.prod(self.physical_shape(shape), dtype=np.int64)) * np.dtype(dtype).itemsize

    def is_padded(self, shape: Sequence[int]) -> bool:
        return tuple(self.padded_shape(shape)) != tuple(shape)

    def is_trivial(self, shape: Sequence[Dim]) -> bool:
        """True when the buffer holds `shape`'s elements in row-major order (no padding, and
        only size-1 dims move): such an encoding is identity and is canonicalized away."""
        if any(not isinstance(d, int) for d in shape):
            return False
        if self.is_padded(shape):  # type: ignore[arg-type]
            return False
        tiles = self.tiles()
        order = [(d, 0) for d in self.outer_perm(len(shape)) if _outer_size(shape, d, tiles) != 1]
        order += [(d, 1) for d, t in zip(self.inner_dims_pos, self.inner_tiles) if t != 1]
        return order == sorted(order)

    # ---- algebra ------------------------------------------------------------------------
    def same_layout(self, other: object) -> bool:
        """Equal buffers for equal tensors (what the padding holds aside)."""
        return isinstance(other, PackedEncoding) and (
            self.inner_dims_pos, self.inner_tiles, self.outer_dims_perm
        ) == (other.inner_dims_pos, other.inner_tiles, other.outer_dims_perm)

    def same_layout_on(self, other: PackedEncoding, shape: Sequence[Dim]) -> bool:
        """`same_layout`, or two encodings that store a static tensor of `shape` as the same
        bytes without padding: NCHWc16 and NHWC of 16 channels, tiles of a dim one tile long."""
        if self.same_layout(other):
            return True
        if any(not isinstance(d, int) for d in shape) or self.is_padded(shape) or other.is_padded(shape):
            return False
        return flat_order(self, shape) == flat_order(other, shape)

    def permuted(self, perm: Sequence[int]) -> PackedEncoding:
        """The encoding of `transpose(x, perm)` that keeps x's buffer unchanged.

        Result dim i is x's dim perm[i], so x's dim d is result dim inverse[d]: a transpose
        of a packed tensor is a relabeling, never a data movement.
        """
        inverse = np.argsort(perm)
        rank = len(perm)
        return PackedEncoding(
            tuple(int(inverse[d]) for d in self.inner_dims_pos),
            self.inner_tiles,
            tuple(int(inverse[d]) for d in self.outer_perm(rank)),
            self.pad,
        )

    def with_pad(self, pad: float | None) -> PackedEncoding:
        return PackedEncoding(self.inner_dims_pos, self.inner_tiles, self.outer_dims_perm, pad)

    def __str__(self) -> str:
        tiles = ",".join(f"{d}:{t}" for d, t in zip(self.inner_dims_pos, self.inner_tiles))
        perm = "" if self.outer_dims_perm is None else " outer=" + "".join(map(str, self.outer_dims_perm))
        pad = "" if not self.inner_tiles else (" pad=?" if self.pad is None else f" pad={self.pad:g}")
        return f"packed({tiles}{perm}{pad})"


def _outer_size(shape: Sequence, d: int, tiles: dict[int, int]) -> int:
    return ceil_div(shape[d], tiles[d]) if d in tiles else shape[d]


def buffer_axes(enc: PackedEncoding, shape: Sequence[int]) -> list[tuple[int, int, int]]:
    """(logical dim, step within the dim, size) of every buffer axis."""
    tiles = enc.tiles()
    axes = [(d, tiles[d], ceil_div(shape[d], tiles[d])) if d in tiles else (d, 1, shape[d])
            for d in enc.outer_perm(len(shape))]
    return axes + [(d, 1, t) for d, t in zip(enc.inner_dims_pos, enc.inner_tiles)]


def flat_order(enc: PackedEncoding, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The merged (row-major logical stride, size) of the buffer's axes, size-1 axes dropped:
    two unpadded buffers hold the same bytes when these are equal."""
    strides = _strides(shape)
    merged: list[tuple[int, int]] = []
    for d, step, size in buffer_axes(enc, shape):
        if size == 1:
            continue
        stride = strides[d] * step
        if merged and merged[-1][0] == stride * size:
            merged[-1] = (stride, merged[-1][1] * size)
        else:
            merged.append((stride, size))
    return tuple(merged)


def canonical(enc: PackedEncoding | None, shape: Sequence[Dim]) -> PackedEncoding | None:
    """None for an encoding that is identity on `shape` (see `is_trivial`)."""
    return None if enc is None or enc.is_trivial(shape) else enc


def split_order(enc: PackedEncoding, rank: int) -> list[int]:
    """The transpose from the padded tensor with each tiled dim split into (outer, tile) to
    the buffer: permuted outer dims first, then the tiles in `inner_dims_pos` order."""
    tiles = enc.tiles()
    outer_axis: dict[int, int] = {}
    inner_axis: dict[int, int] = {}
    position = 0
    for d in range(rank):
        outer_axis[d] = position
        position += 1
        if d in tiles:
            inner_axis[d] = position
            position += 1
    return [outer_axis[d] for d in enc.outer_perm(rank)] + [inner_axis[d] for d in enc.inner_dims_pos]


def pack(x: np.ndarray, enc: PackedEncoding) -> np.ndarray:
    """The packed buffer of `x` (padding filled with `enc.pad`, 0 when unknown)."""
    x = np.asarray(x)
    enc.validate(x.shape)
    padded = enc.padded_shape(x.shape)
    if padded != x.shape:
        fill = 0 if enc.pad is None else enc.pad
        x = np.pad(x, [(0, p - d) for p, d in zip(padded, x.shape)], constant_values=fill)
    tiles = enc.tiles()
    split: list[int] = []
    for d, size in enumerate(padded):
        split.extend([size // tiles[d], tiles[d]] if d in tiles else [size])
    order = split_order(enc, x.ndim)
    return contiguous(x.reshape(split).transpose(order))


SLAB = 8
"""Elements of the result's last axis that `contiguous` copies at a time."""


def contiguous(view: np.ndarray) -> np.ndarray:
    """`np.ascontiguousarray(view)`, faster for a view that reads its last axis with a stride
    (a weight transposed to RSCF: the result's last axis F is the source's first).

    numpy then walks the source a whole row of the result at a time, one element per page
    for rows this long; copying slabs of `SLAB` along the last axis keeps the rows it reads
    in the cache (ResNet-50's conv weights to RSCF, 94 MB: 34 ms against 62 ms, measured
    on this machine's 2 cores, destination memory already mapped).
    """
    if view.ndim < 2 or view.flags.c_contiguous or view.shape[-1] < 8 * SLAB or view.strides[-1] == view.itemsize:
        return np.ascontiguousarray(view)
    out = np.empty(view.shape, view.dtype)
    for start in range(0, view.shape[-1], SLAB):
        out[..., start:start + SLAB] = view[..., start:start + SLAB]
    return out


def unpack(p: np.ndarray, enc: PackedEncoding, shape: Sequence[int]) -> np.ndarray:
    """The logical tensor of shape `shape` held by the packed buffer `p`."""
    shape = tuple(int(d) for d in shape)
    expected = enc.physical_shape(shape)
    if tuple(p.shape) != expected:
        raise VerifyError(f"unpack: buffer shape {tuple(p.shape)} does not hold {shape} in {enc} (expected {expected})")
    order = split_order(enc, len(shape))
    split = p.transpose(np.argsort(order))
    padded = enc.padded_shape(shape)
    logical = split.reshape(padded)
    return np.ascontiguousarray(logical[tuple(slice(0, d) for d in shape)])


# ---- reshapes of packed buffers -----------------------------------------------------------
def reshape_perm(src: Sequence[int], dst: Sequence[int], perm: Sequence[int]) -> tuple[int, ...] | None:
    """The outer permutation of a `dst`-shaped view of a buffer holding `src` permuted by
    `perm`, or None when the reshape would need to move data. Reshapes pair groups of src
    dims with groups of dst dims of equal size; each src group must lie contiguous and in
    order in the buffer (size-1 dims do not count). A size-1 dst dim is placed right after
    its logical predecessor (first for dim 0): GQA's repeat of key/value heads unsqueezes a
    dim after the heads, expands it and merges the two."""
    if int(np.prod(src)) != int(np.prod(dst)):
        return None
    s_dims = [d for d in range(len(src)) if src[d] != 1]
    t_dims = [d for d in range(len(dst)) if dst[d] != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(s_dims) and j < len(t_dims):
        gs, gt = [s_dims[i]], [t_dims[j]]
        ps, pt = src[s_dims[i]], dst[t_dims[j]]
        i, j = i + 1, j + 1
        while ps != pt:
            if ps < pt and i < len(s_dims):
                gs.append(s_dims[i]); ps *= src[s_dims[i]]; i += 1
            elif pt < ps and j < len(t_dims):
                gt.append(t_dims[j]); pt *= dst[t_dims[j]]; j += 1
            else:
                return None
        groups.append((gs, gt))
    position = {d: k for k, d in enumerate(d for d in perm if src[d] != 1)}
    for gs, _ in groups:
        first = position[gs[0]]
        if [position[d] for d in gs] != list(range(first, first + len(gs))):
            return None
    groups.sort(key=lambda g: position[g[0][0]])
    order = [d for _, gt in groups for d in gt]
    for d in range(len(dst)):  # a size-1 dim goes where no data moves either way: beside
        if dst[d] == 1:        # its logical predecessor, which a later merge pairs it with
            order.insert(order.index(d - 1) + 1 if d else 0, d)
    return tuple(order)


def _strides(shape: Sequence[int]) -> list[int]:
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * shape[i + 1]
    return out


def reshape_encoding(src: Sequence[int], dst: Sequence[int], enc: PackedEncoding) -> PackedEncoding | None:
    """The encoding of a `dst`-shaped view of the buffer holding `src` in `enc`, or None when
    the reshape would move data. A tiled dim passes through whole: its tile becomes the inner
    part of the one `dst` dim that starts at the same row-major stride and holds whole tiles
    (BERT's head split: hidden 768 tiled by 16 becomes (12, 64) with 64 tiled by 16), and it
    must hold no padding. Each tiled dim counts as its (blocks, tile) pair, and `reshape_perm`
    checks that the groups stay together in the buffer. A leading tile that holds its whole
    dim is read as an outer dim first (`whole_tiles_outer`): a 16-token sequence in 16x16
    tiles viewed as a 4x4 map is that map's NCHWc16 buffer."""
    found = _reshape_encoding(src, dst, enc)
    if found is None:
        outer = whole_tiles_outer(enc, src)
        found = _reshape_encoding(src, dst, outer) if outer != enc else None
    return found


def whole_tiles_outer(enc: PackedEncoding, shape: Sequence[int]) -> PackedEncoding:
    """The same buffer with each leading inner tile that holds its whole dim (no padding) made
    the last outer dim instead."""
    tiles, perm = list(zip(enc.inner_dims_pos, enc.inner_tiles)), list(enc.outer_perm(len(shape)))
    while tiles and isinstance(shape[tiles[0][0]], int) and tiles[0][1] == shape[tiles[0][0]]:
        d = tiles.pop(0)[0]
        perm.remove(d)
        perm.append(d)
    if len(tiles) == len(enc.inner_dims_pos):
        return enc
    return PackedEncoding(tuple(d for d, _ in tiles), tuple(t for _, t in tiles), tuple(perm), enc.pad)


def _reshape_encoding(src: Sequence[int], dst: Sequence[int], enc: PackedEncoding) -> PackedEncoding | None:
    tiles = {d: t for d, t in enc.tiles().items() if t != 1}
    if any(src[d] % t for d, t in tiles.items()):
        return None  # padding would land inside the reshaped dims
    s_stride, t_stride = _strides(src), _strides(dst)
    split: dict[int, int] = {}
    for d, t in tiles.items():
        found = [j for j in range(len(dst)) if dst[j] != 1 and t_stride[j] == s_stride[d] and dst[j] % t == 0]
        if len(found) != 1 or found[0] in split:
            return None
        split[found[0]] = t
    src_at, src2 = refine(src, tiles)
    dst_at, dst2 = refine(dst, split)
    perm2 = [src_at[d] for d in enc.outer_perm(len(src))] + [src_at[d] + 1 for d in enc.inner_dims_pos if d in tiles]
    new = reshape_perm(src2, dst2, perm2)
    if new is None:
        return None
    tile_of = {dst_at[j] + 1: j for j in split}
    body = [k for k in new if dst2[k] != 1]
    inner = body[len(body) - len(split):] if split else []
    if set(inner) != set(tile_of):
        return None  # a tile would sit among the outer dims
    dim_of = {dst_at[j]: j for j in range(len(dst))}
    outer = tuple(dim_of[k] for k in new if k not in tile_of)
    inner_dims = tuple(tile_of[k] for k in inner)
    return canonical(PackedEncoding(inner_dims, tuple(split[j] for j in inner_dims), outer, enc.pad), dst)


def refine(shape: Sequence[int], tiles: dict[int, int]) -> tuple[dict[int, int], list[int]]:
    """`shape` with each tiled dim split into (blocks, tile), and where each dim starts."""
    at: dict[int, int] = {}
    refined: list[int] = []
    for d, size in enumerate(shape):
        at[d] = len(refined)
        refined += [size // tiles[d], tiles[d]] if d in tiles else [size]
    return at, refined
