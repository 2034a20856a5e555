"""Targets: tiling policies, one per kind of device, in a registry a user extends from Python.

A target answers one question: for this anchor op (MatMul, Gemm, Conv; ConvTranspose on the
cpu target) with these operand types, which encoding should each operand and the result
have? Hardware facts (vector widths, kernel block sizes) live here and nowhere else.

    class MyTarget(Target): ...
    register_target(MyTarget("mine"))
    tilefold.optimize(graph, target="mine")
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..graph.errors import TilefoldError
from ..graph.graph import Node
from ..graph.passes.hoist_scales import hoist_scales
from ..graph.passes.merge_projections import merge_projections
from ..graph.passes.pipeline import Pass
from ..graph.passes.rotations import gather_rotations
from ..graph.types import TensorType
from .encoding import PackedEncoding, canonical


def channels_last(rank: int) -> PackedEncoding:
    """NWC, NHWC, NDHWC: channels-last activations of any spatial rank."""
    return PackedEncoding((), (), (0, *range(2, rank), 1))


def gemm_weight(rank: int) -> PackedEncoding:
    """(*k, C/group, F): a conv weight in GEMM form, for any spatial rank."""
    return PackedEncoding((), (), (*range(2, rank), 1, 0))


def transposed_weight(rank: int) -> PackedEncoding:
    """(C, *k, F/group): a ConvTranspose weight (C, F/group, *k) in GEMM form, each group's
    (C/group, prod(k) * F/group) matrix contiguous, for any spatial rank."""
    return PackedEncoding((), (), (0, *range(2, rank), 1))


NHWC = channels_last(4)
"""Channels-last activations: buffer (N, H, W, C)."""
RSCF = gemm_weight(4)
"""Conv weights in GEMM form: buffer (R, S, C/group, F), i.e. a (R*S*C/group, F) matrix."""


@dataclass(frozen=True)
class AnchorLayout:
    """Encodings an anchor wants: one per input slot (None = as is) and one for its result.

    `reads_identity`: the anchor's kernel can also read operand 0 unpacked, doing the layout
    change inside the kernel (a conv reading NCHW input and writing NHWC); propagation uses
    it to absorb a Pack it cannot cancel.
    """

    operands: tuple[PackedEncoding | None, ...]
    result: PackedEncoding | None
    reads_identity: bool = False


class Target:
    """A tiling policy. Subclass and override `anchor_layout`."""

    name = "base"
    anchors: frozenset[str] = frozenset({"MatMul", "Gemm", "Conv"})
    kernel_passes: tuple[Pass, ...] = ()
    """Graph passes run before layouts are chosen, for a backend whose kernels fuse: fewer,
    larger ops (the gpu target's merge_projections, gather_rotations and hoist_scales)."""

    def __init__(self, name: str | None = None) -> None:
        if name is not None:
            self.name = name

    def anchor_layout(self, node: Node, in_types: Sequence[TensorType | None]) -> AnchorLayout | None:
        """The anchor's encodings, or None to leave it as it is."""
        return None

    def reads(self, node: Node, slot: int, t: TensorType) -> bool:
        """Can the anchor's kernel read operand `slot` in `t.encoding` with no copy?"""
        return False

    def writes(self, node: Node, t: TensorType) -> bool:
        """Can the anchor's kernel write its result in `t.encoding` with no copy?"""
        return False

    def __repr__(self) -> str:
        return f"<target {self.name}>"


def _conv(node: Node, in_types: Sequence[TensorType | None], ranks: frozenset[int],
          ops: frozenset[str] = frozenset({"Conv"})) -> bool:
    x = in_types[0] if in_types else None
    w = in_types[1] if len(in_types) > 1 else None
    return node.op in ops and x is not None and w is not None and x.rank in ranks and w.rank == x.rank


def _conv2d(node: Node, in_types: Sequence[TensorType | None]) -> bool:
    return _conv(node, in_types, frozenset({4}))



def strided_matrices(t: TensorType) -> bool:
    """A permutation-only encoding whose innermost buffer dim is one of the last two logical
    dims: every matrix is then row- or column-contiguous, which BLAS reads and writes in
    place (numpy's matmul measured 0.36 ms for BERT's Q.K^T on such views, 0.25 ms
    contiguous, and the same time for P.V into a transposed output)."""
    enc = t.encoding
    if not isinstance(enc, PackedEncoding) or enc.inner_tiles or t.rank < 2:
        return False
    return enc.outer_perm(t.rank)[-1] in (t.rank - 1, t.rank - 2)


class CpuTarget(Target):
    """Tuned for the NumPy kernels: channels-last convolution (im2col copies whole channel
    rows and 1x1 convs are GEMMs on the activation buffer with no copy: 48.3 ms against
    49.8 ms for the NCHW kernel summed over ResNet-50's convs), 1-D ones too (an audio stem's
    transpose to (N, T, C) is then a relabeling), weights pre-packed as GEMM operands.
    ConvTranspose too, so that a decoder's upsampling between channels-last convs moves no
    data. MatMul and Gemm stay row-major: BLAS reads either operand transposed at no cost, and
    reads and writes strided matrices (attention heads) in place."""

    name = "cpu"
    anchors = Target.anchors | {"ConvTranspose"}

    def anchor_layout(self, node: Node, in_types: Sequence[TensorType | None]) -> AnchorLayout | None:
        if not _conv(node, in_types, frozenset({3, 4}), frozenset({"Conv", "ConvTranspose"})):
            return None
        rank = in_types[0].rank
        activations = channels_last(rank)
        weight = transposed_weight(rank) if node.op == "ConvTranspose" else gemm_weight(rank)
        operands = (canonical(activations, in_types[0].shape), weight) + (None,) * (len(in_types) - 2)
        return AnchorLayout(operands, canonical(activations, node.outputs[0].shape), reads_identity=True)

    def reads(self, node: Node, slot: int, t: TensorType) -> bool:
        return node.op == "MatMul" and slot < 2 and strided_matrices(t)

    def writes(self, node: Node, t: TensorType) -> bool:
        return node.op == "MatMul" and strided_matrices(t)


_MATMULS = frozenset({"MatMul", "Gemm"})


class GpuTarget(Target):
    """Tiles matching the Triton kernels' blocks: NCHWc16 convolution with weights tiled on
    F and C, and mmt4d-style 2-D tiles for the operands of MatMul and Gemm (torch's Linear
    of a matrix arrives as a Gemm) whose matrix dims the tile divides (BLOCK 16 here; the
    Triton backend reads these tiles as its block sizes). A kernel loads a row-major operand 0 with strides
    as cheaply as a tiled one, so a Pack left in front of an anchor is absorbed. The Triton
    matmul addresses 16x16 blocks by strides, so it reads and writes unpadded blocks in any
    outer order and tiles in either order (attention heads, a transposed K), 16-wide tiles of
    one matrix dim (a channel-tiled map read as (N, H, W, C) is (N, C/16, H, W, 16):
    ConvNeXt's Linear layers read their LayerNorm's NCHWc16 buffer), and row- or
    column-contiguous matrices (untiled head views), with no copy."""

    name = "gpu"
    block = 16
    kernel_passes = (merge_projections, gather_rotations, hoist_scales)
    """BERT's query, key and value as one product whose kernel stores the three parts: one
    launch, three times the programs (the Triton matmul's Split epilogue); rotary's
    rotate_half as one Gather, and the keys' scale before GQA's Expand, both of which the
    fusion then puts in the rotary product's kernel."""
    programs = 132
    """The programs a matmul or conv grid should reach, its blocks shrinking towards `block`
    until it does: an H100's or H200's multiprocessors. At 128 x 128 blocks a BERT-base's
    128 x 768 products ran 6 programs and its convs at batch 1 as few as 4 (H200, 2026-11-28)."""
    pad_tiles = False
    """Tile matmul dims the block does not divide too (padded tiles); a subclass may set it."""
    weight_tiles = True
    """Whether a matmul's operand B is tiled too, or stays row-major (K, N): a Gemm's (N, K)
    weight is then turned once, at compile time. Row-major measured 3-5% faster on each of
    bench/gpu.py's matmul shapes (0.86x cuBLAS against 0.83x at 4096^3; H200, 2026-11-28, one
    run); tiles stay the default until a second run confirms it end to end, which
    bench/ablate.py measures with this set both ways."""

    def anchor_layout(self, node: Node, in_types: Sequence[TensorType | None]) -> AnchorLayout | None:
        t = self.block
        if _conv2d(node, in_types) and isinstance(in_types[0].shape[1], int):  # C is tiled: static only
            act = PackedEncoding((1,), (t,))
            weight = PackedEncoding((0, 1), (t, t))
            bias = (PackedEncoding((0,), (t,)),) if len(in_types) > 2 and in_types[2] is not None else ()
            return AnchorLayout((act, weight) + bias, act, reads_identity=True)
        if node.op in _MATMULS and all(x is not None and x.rank >= 2 for x in in_types[:2]):
            a, b = in_types[0], in_types[1]
            if not all(isinstance(d, int) for x in (a, b, node.outputs[0]) for d in x.shape[-2:]):
                return None  # a symbolic row count tiled could not be told from its padded buffer
            layout = AnchorLayout((self._tiles(a), self._tiles(b) if self.weight_tiles else self._rows(node, b))
                                  + (None,) * (len(in_types) - 2),
                                  self._tiles(node.outputs[0]), reads_identity=True)
            return layout if layout.result is not None or any(layout.operands) else None
        return None

    def _tiles(self, t: TensorType) -> PackedEncoding | None:
        """16x16 tiles on the matrix dims, or None (used as it is) where a tile would hold
        padding: the kernel reads and writes any layout masked to the logical extent, while a
        padded tile would stop propagation at every softmax or matmul over that dim (a ViT's
        197 tokens, a sequence of 100)."""
        if not self.pad_tiles and any(int(d) % self.block for d in t.shape[-2:]):
            return None
        return PackedEncoding((t.rank - 2, t.rank - 1), (self.block, self.block))

    @staticmethod
    def _rows(node: Node, b: TensorType) -> PackedEncoding | None:
        """Operand B row-major (K, N): as it is, or a Gemm's transposed (N, K) turned."""
        if node.op == "Gemm" and node.attrs.get("transB", 0):
            return canonical(PackedEncoding((), (), (1, 0)), b.shape)
        return None

    def _blocks(self, t: TensorType) -> bool:
        """Unpadded 16-wide tiles of one or both matrix dims, in any outer order."""
        enc, r = t.encoding, t.rank
        return (isinstance(enc, PackedEncoding) and r >= 2 and bool(enc.inner_dims_pos)
                and set(enc.inner_dims_pos) <= {r - 2, r - 1}
                and all(tile == self.block for tile in enc.inner_tiles) and not enc.is_padded(t.shape))

    def reads(self, node: Node, slot: int, t: TensorType) -> bool:
        return node.op in _MATMULS and slot < 2 and (self._blocks(t) or strided_matrices(t))

    def writes(self, node: Node, t: TensorType) -> bool:
        return node.op in _MATMULS and (self._blocks(t) or strided_matrices(t))


class DeviceTargets(Target):
    """One target per device: each node is planned by the target of the device it runs on
    (`node.device`), so a graph placed on several devices gets each device's layouts."""

    def __init__(self, targets: dict[str, Target], default: Target) -> None:
        super().__init__("+".join(sorted({t.name for t in [*targets.values(), default]})))
        self.targets = targets
        self.default = default
        self.anchors = frozenset().union(*(t.anchors for t in [*targets.values(), default]))

    def _of(self, node: Node) -> Target:
        return self.targets.get(node.device or "", self.default)

    def anchor_layout(self, node: Node, in_types: Sequence[TensorType | None]) -> AnchorLayout | None:
        target = self._of(node)
        return target.anchor_layout(node, in_types) if node.op in target.anchors else None

    def reads(self, node: Node, slot: int, t: TensorType) -> bool:
        return self._of(node).reads(node, slot, t)

    def writes(self, node: Node, t: TensorType) -> bool:
        return self._of(node).writes(node, t)


TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    TARGETS[target.name] = target
    return target


def get_target(target: str | Target) -> Target:
    if isinstance(target, Target):
        return target
    try:
        return TARGETS[target]
    except KeyError:
        raise TilefoldError(f"unknown target {target!r}; registered targets: {', '.join(sorted(TARGETS))}") from None


register_target(CpuTarget())
register_target(GpuTarget())
