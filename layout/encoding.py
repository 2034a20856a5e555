"""Packed encodings with MLIR `tensor.pack` semantics, and their NumPy reference pack/unpack.

A logical tensor of shape S (rank n) packed with `inner_dims_pos` P, `inner_tiles` T and
`outer_dims_perm` Q is stored as a buffer of rank n + len(P):
- outer dims: for each logical dim d, ceil(S[d] / t) when d is tiled by t, else S[d];
  ordered by Q (outer dim i of the buffer is logical dim Q[i]);
- inner dims: the tiles, in the order of P.
Tiled dims are padded up to whole tiles; `pad` records what the padding holds (a value,
or None when unknown), so that a consumer that would read padding (a reduction, a matmul's
k) can check it. Every other module is tested against `pack`/`unpack` here.
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


def canonical(enc: PackedEncoding | None, shape: Sequence[Dim]) -> PackedEncoding | None:
    """None for an encoding that is identity on `shape` (see `is_trivial`)."""
    return None if enc is None or enc.is_trivial(shape) else enc


def _split_axes(enc: PackedEncoding, rank: int) -> tuple[list[int], dict[int, int], dict[int, int]]:
    """Axis positions after splitting each tiled dim d into (outer_d, tile_d)."""
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
    order = [outer_axis[d] for d in enc.outer_perm(rank)] + [inner_axis[d] for d in enc.inner_dims_pos]
    return order, outer_axis, inner_axis


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
    order, _, _ = _split_axes(enc, x.ndim)
    return np.ascontiguousarray(x.reshape(split).transpose(order))


def unpack(p: np.ndarray, enc: PackedEncoding, shape: Sequence[int]) -> np.ndarray:
    """The logical tensor of shape `shape` held by the packed buffer `p`."""
    shape = tuple(int(d) for d in shape)
    expected = enc.physical_shape(shape)
    if tuple(p.shape) != expected:
        raise VerifyError(f"unpack: buffer shape {tuple(p.shape)} does not hold {shape} in {enc} (expected {expected})")
    order, _, _ = _split_axes(enc, len(shape))
    split = p.transpose(np.argsort(order))
    padded = enc.padded_shape(shape)
    logical = split.reshape(padded)
    return np.ascontiguousarray(logical[tuple(slice(0, d) for d in shape)])
