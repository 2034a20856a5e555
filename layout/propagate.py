"""Propagation: move Pack up and Unpack down through the graph until they cancel or fold.

Rules, applied in topological sweeps until none fires (one sweep carries an Unpack as far
down as it can go, since its consumers come later in the order):
1. fold: Pack (or Unpack) of a constant becomes a packed constant at compile time; a packed
   splat stays a splat unless padding that must read zero would hold its value.
2. cancel: Pack(Unpack(p)) with the same layout is p (refused when the padding differs:
   padding must never change a result); Unpack(Pack(x)) is x.
3. down: a node reading Unpack(p) runs on p instead, its results get the encodings its
   iteration signature maps p's encoding to, and Unpacks follow its packed results. Only
   when no new runtime layout op is needed: every other operand is a constant (packed at
   compile time), an Unpack of the mapped encoding, or needs no packing at all.
4. up: Pack(N(...)) where every user of N packs the same way, by the same mapping run
   backwards, under the same condition.
5. absorb: a Pack left in front of an anchor whose kernel can read the unpacked operand
   (a conv reading NCHW, writing NHWC) is folded into the anchor.
6. transposes: a Transpose moves no data. Its result keeps its input's buffer, with the
   permuted encoding (an Unpack after it then moves down by rule 3), or its producer, an
   anchor, writes the transposed layout (rule 4 into an anchor).
7. reshapes: a Reshape of a permuted buffer is a view of it whenever each group of dims
   it merges or splits stays together in the buffer (`reshape_perm`).
8. anchors read and write the packed buffers the target says their kernels take without a
   copy (on the CPU: matmul operands and results whose matrices are row- or column-major).

The mapping through a signature: tiled dims must be parallel iteration dims (never
reduction or window dims); a permutation of outer dims maps through any op. Tiled
encodings go only through layout-agnostic (elementwise) ops, whose kernels run on the
packed buffers as they are; permutations go through every op with a signature.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..graph.graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from ..graph.passes.cse import cse
from ..graph.passes.dce import dce
from ..graph.passes.pipeline import Pass, PassResult, PipelineLog, run_passes
from ..graph.registry import get, signature
from ..graph.signature import Signature
from ..graph.types import Splat, TensorType, Value, as_array
from .encoding import PackedEncoding, canonical, pack, unpack
from .targets import Target

PACK, UNPACK = "Pack", "Unpack"
_FIXED = {INPUT, OUTPUT, CONSTANT, PACK, UNPACK}


@dataclass
class Mapping:
    """Encodings for every operand and result of one node."""

    operands: list[PackedEncoding | None]
    results: list[PackedEncoding | None]
    ranked: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Operands (constants only) to reshape to these higher-rank shapes before packing."""


# ---- the mapping of an encoding through an iteration signature ---------------------------
def _letters(sig: Signature, index: int, is_result: bool) -> list[str | None] | None:
    """The iteration dim of each tensor dim. A singleton (`None`: an operand's broadcast
    dim, a result's kept reduced dim) is named after the dim it lines up with, right-aligned
    as numpy broadcasts, in the result (or operand 0, for a result)."""
    idx = sig.results[index] if is_result else sig.operands[index]
    if idx is None:
        return None
    letters = list(idx)
    full = sig.operands[0] if is_result else sig.results[0]
    if None in letters and full is not None and len(full) >= len(letters):
        offset = len(full) - len(letters)
        letters = [full[offset + d] if l is None else l for d, l in enumerate(letters)]
    return letters


def map_encoding(node: Node, sig: Signature, in_types: Sequence[TensorType | None],
                 fixed: tuple[bool, int], enc: PackedEncoding) -> Mapping | None:
    """Encodings for every operand and result when the tensor `fixed` ((is_result, index))
    has `enc`, or None when the signature cannot carry it."""
    out_types = node.outputs
    is_result, index = fixed
    src = _letters(sig, index, is_result)
    if src is None or None in src:
        return None
    tiles = {src[d]: t for d, t in enc.tiles().items()}
    if tiles and get(node.op).layout != "agnostic":
        return None
    if any(sig.kind(letter) != "parallel" for letter in tiles):
        return None
    order = [src[d] for d in enc.outer_perm(len(src))]
    inner = [src[d] for d in enc.inner_dims_pos]

    ranked: dict[int, tuple[int, ...]] = {}

    def derive(letters: list[str | None] | None, shape: Sequence, slot: int | None) -> PackedEncoding | None | bool:
        if letters is None:
            return None  # a shape operand: not indexed, not packed
        if slot is not None and all(d == 1 for d in shape):
            return None  # one element broadcasts against any buffer
        if None in letters or any(l not in order for l in letters):
            return False
        missing = [l for l in order if l not in letters]
        if missing != order[: len(missing)] or any(l in tiles for l in missing):
            full = sig.results[0]  # a lower-rank operand: as if left-padded with size-1 dims
            if slot is None or full is None or len(full) <= len(letters) or None in full:
                return False
            offset = len(full) - len(letters)
            letters, shape = list(full[:offset]) + letters, (1,) * offset + tuple(shape)
            ranked[slot] = shape
        perm = tuple(sorted(range(len(letters)), key=lambda d: order.index(letters[d])))
        pos = tuple(sorted((d for d in range(len(letters)) if letters[d] in tiles),
                           key=lambda d: inner.index(letters[d])))
        sizes = tuple(tiles[letters[d]] if shape[d] != 1 else 1 for d in pos)
        packed = PackedEncoding(pos, sizes, perm, enc.pad)
        if slot is None and all(isinstance(d, int) for d in shape) and packed.is_padded(shape):
            packed = packed.with_pad(None)  # what an op leaves in padding is not known
        return canonical(packed, shape)

    operands: list[PackedEncoding | None] = []
    for i, t in enumerate(in_types):
        if t is None:
            operands.append(None)
            continue
        got = enc if (not is_result and i == index) else derive(_letters(sig, i, False), t.shape, i)
        if got is False:
            return None
        operands.append(got)  # type: ignore[arg-type]
    results: list[PackedEncoding | None] = []
    for k, t in enumerate(out_types):
        got = enc if (is_result and k == index) else derive(_letters(sig, k, True), t.shape, None)
        if got is False:
            return None
        results.append(got)  # type: ignore[arg-type]
    return Mapping(operands, results, ranked)


def reshape_perm(src: Sequence[int], dst: Sequence[int], perm: Sequence[int]) -> tuple[int, ...] | None:
    """The outer permutation of a `dst`-shaped view of a buffer holding `src` permuted by
    `perm`, or None when the reshape would need to move data. Reshapes pair groups of src
    dims with groups of dst dims of equal size; each src group must lie contiguous and in
    order in the buffer (size-1 dims do not count)."""
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
    ones = [d for d in range(len(dst)) if dst[d] == 1]
    return tuple(ones + [d for _, gt in groups for d in gt])


def _permutation(t: TensorType) -> tuple[int, ...] | None:
    enc = t.encoding
    if not isinstance(enc, PackedEncoding) or enc.inner_tiles or not t.is_static:
        return None
    return enc.outer_perm(t.rank)


# ---- rules --------------------------------------------------------------------------------
def _producer(graph: Graph, value: Value | None) -> Node | None:
    return graph.node(value.node) if value is not None else None


def _source(graph: Graph, value: Value | None, enc: PackedEncoding | None,
            shape: tuple[int, ...] | None = None) -> Value | None | bool:
    """What a node may read for `value` in encoding `enc` without a new runtime layout op:
    the value itself (enc None), a packed constant (reshaped to `shape` first, when given),
    or the packed input of an Unpack."""
    if value is None or enc is None:
        return value
    producer = _producer(graph, value)
    if producer.op == CONSTANT:
        return _packed_constant(graph, producer, enc, shape)
    if shape is not None:
        return False
    if producer.op == UNPACK:
        packed = graph.inputs_of(producer.name)[0]
        if graph.type_of(packed).encoding == enc:
            return packed
    return False


def _packed_constant(graph: Graph, const: Node, enc: PackedEncoding, shape: tuple[int, ...] | None = None) -> Value:
    value = const.attrs["value"]
    t = const.outputs[0]
    if t.encoding is not None:
        value, t = unpack(value, t.encoding, t.shape), TensorType(t.shape, t.dtype)
    if shape is not None:
        value = value.reshape(shape) if isinstance(value, Splat) else np.reshape(value, shape)
        t = TensorType(shape, t.dtype)
    padded = t.is_static and enc.is_padded(t.shape)
    if isinstance(value, Splat) and not (padded and enc.pad is not None and enc.pad != value.value):
        stored_enc = enc.with_pad(value.value) if padded else enc
        packed = Splat(value.value, stored_enc.physical_shape(t.shape), t.dtype)
        return graph.add_constant(packed, name=f"{const.name}_packed", type=TensorType(t.shape, t.dtype, stored_enc))
    return graph.add_constant(pack(as_array(value), enc), name=f"{const.name}_packed",
                              type=TensorType(t.shape, t.dtype, enc))


def _rewrite(graph: Graph, node: Node, mapping: Mapping, sources: list[Value | None]) -> None:
    """Make `node` read `sources` and write `mapping.results`; Unpack its packed results."""
    for slot, value in enumerate(sources):
        graph.set_input(node.name, slot, value)
    for k, enc in enumerate(mapping.results):
        logical = node.outputs[k]
        if enc is None:
            continue
        node.outputs[k] = TensorType(logical.shape, logical.dtype, enc)
        out = Value(node.name, k)
        users = graph.users(out)
        if not users:
            continue
        unpack_node = graph.add_node(UNPACK, [out], [logical], name=f"unpack_{node.name}", origin=node.origin)
        graph.replace_all_uses(out, Value(unpack_node.name), exclude={unpack_node.name})


def _sources_for(graph: Graph, node: Node, mapping: Mapping) -> list[Value | None] | None:
    inputs = graph.inputs_of(node.name)
    sources = [_source(graph, v, enc, mapping.ranked.get(i)) for i, (v, enc) in enumerate(zip(inputs, mapping.operands))]
    return None if any(s is False for s in sources) else sources  # type: ignore[return-value]


def _signature_of(graph: Graph, node: Node) -> tuple[Signature, list[TensorType | None]] | None:
    if node.op in _FIXED or any(t.encoding is not None for t in node.outputs):
        return None
    inputs = graph.inputs_of(node.name)
    in_types = [graph.type_of(v) if v is not None else None for v in inputs]
    if any(t is not None and t.encoding is not None for t in in_types):
        return None
    sig = signature(node.op, node.attrs, in_types, node.outputs, [graph.constant_value(v) for v in inputs])
    return (sig, in_types) if sig is not None else None


def _unpacked(graph: Graph, value: Value | None) -> Value | None:
    """The packed value behind `value` when `value` is an Unpack's result."""
    producer = _producer(graph, value)
    return graph.inputs_of(producer.name)[0] if producer is not None and producer.op == UNPACK else None


def anchor_reads(graph: Graph, node: Node, target: Target) -> bool:
    """An anchor whose kernel reads an operand's packed buffer directly takes it."""
    changed = False
    for slot, value in enumerate(graph.inputs_of(node.name)):
        packed = _unpacked(graph, value)
        if packed is not None and target.reads(node, slot, graph.type_of(packed)):
            graph.set_input(node.name, slot, packed)
            changed = True
    return changed


def reshape_down(graph: Graph, node: Node) -> bool:
    """A Reshape of a permuted buffer is a view when its groups of dims stay together."""
    packed = _unpacked(graph, graph.inputs_of(node.name)[0])
    out = node.outputs[0]
    if packed is None or not out.is_static or node.outputs[0].encoding is not None:
        return False
    t = graph.type_of(packed)
    perm = _permutation(t)
    new = reshape_perm(t.shape, out.shape, perm) if perm is not None else None
    if new is None:
        return False
    enc = canonical(PackedEncoding((), (), new), out.shape)
    _rewrite(graph, node, Mapping([enc, None], [enc]), [packed, graph.inputs_of(node.name)[1]])
    return True


def relabel_transpose(graph: Graph, node: Node, target: Target) -> bool:
    """A Transpose moves no data: its result keeps the input's buffer, either because the
    input's producer (an anchor) writes the transposed layout, or with a permuted encoding
    whose Unpack then moves down to where it can be absorbed."""
    x = graph.inputs_of(node.name)[0]
    t_in, t_out = graph.type_of(x), node.outputs[0]
    if t_in.encoding is not None or t_out.encoding is not None or not t_out.is_static:
        return False
    perm = tuple(node.attrs.get("perm") or range(t_in.rank - 1, -1, -1))
    producer = _producer(graph, x)
    wanted = TensorType(t_in.shape, t_in.dtype, PackedEncoding((), (), perm))
    if producer.op in target.anchors and len(graph.users(x)) == 1 and target.writes(producer, wanted):
        producer.outputs[0] = wanted
        return True
    enc = canonical(PackedEncoding((), (), None).permuted(perm), t_out.shape)
    if enc is None:
        return False
    _rewrite(graph, node, Mapping([None], [enc]), [x])
    return True


def push_down(graph: Graph, node: Node, target: Target) -> bool:
    if node.op in target.anchors:
        return anchor_reads(graph, node, target)
    if node.op == "Reshape":
        return reshape_down(graph, node)
    if node.op == "Transpose" and _unpacked(graph, graph.inputs_of(node.name)[0]) is None:
        return relabel_transpose(graph, node, target)
    found = _signature_of(graph, node)
    if found is None:
        return False
    sig, in_types = found
    for slot, value in enumerate(graph.inputs_of(node.name)):
        producer = _producer(graph, value)
        if producer is None or producer.op != UNPACK:
            continue
        enc = graph.type_of(graph.inputs_of(producer.name)[0]).encoding
        mapping = map_encoding(node, sig, in_types, (False, slot), enc)
        sources = _sources_for(graph, node, mapping) if mapping is not None else None
        if sources is not None:
            _rewrite(graph, node, mapping, sources)
            return True
    return False


def push_up(graph: Graph, pack_node: Node, target: Target) -> bool:
    value = graph.inputs_of(pack_node.name)[0]
    producer = _producer(graph, value)
    if producer is None or len(producer.outputs) != 1:
        return False
    enc = pack_node.attrs["encoding"]
    packs = [graph.node(u) for u, _ in graph.users(value)]
    if any(p.op != PACK or not p.attrs["encoding"] == enc for p in packs):
        return False
    if producer.op in target.anchors:  # the anchor writes the packed layout itself
        wanted = TensorType(producer.outputs[0].shape, producer.outputs[0].dtype, enc)
        if producer.outputs[0].encoding is not None or not target.writes(producer, wanted):
            return False
        producer.outputs[0] = wanted
        _drop(graph, packs, value)
        return True
    found = _signature_of(graph, producer)
    if found is None:
        return False
    sig, in_types = found
    mapping = map_encoding(producer, sig, in_types, (True, 0), enc)
    sources = _sources_for(graph, producer, mapping) if mapping is not None else None
    if sources is None:
        return False
    for slot, source in enumerate(sources):
        graph.set_input(producer.name, slot, source)
    producer.outputs[0] = TensorType(producer.outputs[0].shape, producer.outputs[0].dtype, mapping.results[0])
    _drop(graph, packs, value)
    return True


def _drop(graph: Graph, packs: list[Node], value: Value) -> None:
    """Readers of `packs` read `value`, which is now produced packed."""
    for p in packs:
        graph.replace_all_uses(Value(p.name), value)
        graph.remove_node(p.name)


def fold_or_cancel(graph: Graph, node: Node) -> bool:
    """Rules 1 and 2 for one Pack or Unpack node."""
    value = graph.inputs_of(node.name)[0]
    producer = _producer(graph, value)
    out = Value(node.name)
    if producer.op == CONSTANT:
        if node.op == PACK:
            replacement = _packed_constant(graph, producer, node.attrs["encoding"])
        else:
            t = producer.outputs[0]
            replacement = graph.add_constant(unpack(as_array(producer.attrs["value"]), t.encoding, t.shape),
                                             name=f"{producer.name}_unpacked")
    elif node.op == PACK and producer.op == UNPACK:
        packed = graph.inputs_of(producer.name)[0]
        have = graph.type_of(packed).encoding
        want = node.attrs["encoding"]
        shape = node.outputs[0].shape
        same_padding = not (node.outputs[0].is_static and want.is_padded(shape)) or have.pad == want.pad
        if not (have.same_layout(want) and same_padding):
            return False
        replacement = packed
    elif node.op == UNPACK and producer.op == PACK:
        replacement = graph.inputs_of(producer.name)[0]
    else:
        return False
    graph.replace_all_uses(out, replacement)
    graph.remove_node(node.name)
    return True


def absorb(graph: Graph, node: Node, target: Target) -> bool:
    """Rule 5: an anchor reads the unpacked operand 0 itself."""
    users = graph.users(Value(node.name))
    if len(users) != 1 or users[0][1] != 0:
        return False
    anchor = graph.node(users[0][0])
    if anchor.op not in target.anchors:
        return False
    inputs = graph.inputs_of(anchor.name)
    logical = [graph.type_of(v) if v is not None else None for v in inputs]
    logical[0] = graph.type_of(graph.inputs_of(node.name)[0])
    layout = target.anchor_layout(anchor, logical)
    if layout is None or not layout.reads_identity:
        return False
    graph.set_input(anchor.name, 0, graph.inputs_of(node.name)[0])
    graph.remove_node(node.name)
    return True


def _sweep(graph: Graph, target: Target, final: bool) -> bool:
    modified = False
    for node in graph.nodes():
        if node.name not in graph:
            continue
        if node.op in (PACK, UNPACK):
            changed = fold_or_cancel(graph, node)
            if not changed and node.op == PACK:
                changed = push_up(graph, node, target) or (final and absorb(graph, node, target))
        else:
            changed = push_down(graph, node, target)
        modified |= changed
    return modified


def propagate(graph: Graph, target: Target, *, verify: bool = False, log: PipelineLog | None = None) -> Graph:
    """Run the rules to a fixed point, then absorb what is left into anchors, then clean up."""
    moves = Pass("propagate", lambda g: PassResult(g, _sweep(g, target, final=False)))
    graph = run_passes(graph, [moves, dce], verify=verify, fixed_point=True, max_rounds=50, log=log)
    last = Pass("absorb", lambda g: PassResult(g, _sweep(g, target, final=True)))
    return run_passes(graph, [last, cse, dce], verify=verify, fixed_point=True, log=log)
