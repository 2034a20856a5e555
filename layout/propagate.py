"""Propagation: move Pack up and Unpack down through the graph until they cancel or fold.

Rules, applied in topological sweeps until none fires (one sweep carries an Unpack as far
down as it can go, since its consumers come later in the order):
1. fold: Pack (or Unpack) of a constant becomes a packed constant at compile time; a packed
   splat stays a splat unless padding that must read zero would hold its value.
2. cancel: Pack(Unpack(p)) with the same layout is p (refused when the padding differs:
   padding must never change a result); Unpack(Pack(x)) is x. 2b: a Pack after a reshape
   of Unpack(p), p in another layout than the reshape needs: the anchor that wrote p
   (through relabeling Transposes and reshapes, and elementwise ops on constants, nothing
   else reading them) writes that layout instead, when its kernel can, and the Pack moves
   up and cancels (`rewrite_writer`: BERT's head merge on the gpu target).
3. down: a node reading Unpack(p) runs on p instead, its results get the encodings its
   iteration signature maps p's encoding to, and Unpacks follow its packed results. Every
   other operand is a constant (packed at compile time), an Unpack of the mapped layout
   (or of one whose writer can write it instead, as in 2b: ConvNeXt's residual add), or
   needs no packing; or else (a value with several consumers) a runtime value packed by
   a Pack that is already there, or by a new one, while that moves fewer bytes than the
   Unpack: the Unpack then goes on down and cancels (an attention mask broadcast over
   heads, packed once). A Pack that only anchors read, and will absorb (rule 5), is not
   there to reuse when the Unpack can go for free instead (rule 2b, its anchor writing the
   plain layout): BERT's residual stream stays row-major.
4. up: Pack(N(...)) where every user of N packs the same way, by the same mapping run
   backwards, under the same condition.
5. absorb: a Pack left in front of an anchor whose kernel can read the unpacked operand
   (a conv reading NCHW, writing NHWC) is folded into the anchor; a Pack left whose encoding
   is trivial on its shape (one whole tile per matrix) is dropped, its buffer being the same.
6. transposes: a Transpose moves no data. Its result keeps its input's buffer, with the
   permuted encoding (an Unpack after it then moves down by rule 3), or its producer, an
   anchor, writes the transposed layout (rule 4 into an anchor). For a Transpose of a value
   that is not unpacked, either at once or only once no other rule fires (its input may
   still become one): `layout.optimize` tries both orders.
7. reshapes: a reshape of a packed buffer is a view of it whenever each group of dims it
   merges or splits stays together in the buffer and each tiled dim passes through whole
   (`reshape_encoding`), down (Unpack) and up (Pack). A flatten read only as a Gemm's or
   MatMul's k against constant weights reads the buffer in its own order, the weight rows
   permuted at compile time (`flatten_into_weights`).
8. anchors read and write the packed buffers the target says their kernels take without a
   copy (on the CPU: matmul operands and results whose matrices are row- or column-major).

The mapping through a signature: a permutation of outer dims maps through any op; a tiled
dim never through a window dim (but for ops whose kernels index windows logically, LRN and
Gather, and a window read at one index and dropped, a Gather of a scalar),
through a parallel dim whose sizes differ between operands
(Concat, Split, Slice, Pad along it) only when every size is whole tiles, and through a
reduction dim only when the padding is neutral for it (Softmax and LayerNormalization need
whole tiles). What padding holds is tracked in the encodings' `pad` (layout/padding.py):
unknown (None) unless provably zero, and a Pack asking for zeros does not move up past an op
that would break that.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..graph.graph import CONSTANT, DEQUANTIZED, INPUT, OUTPUT, Graph, Node
from ..graph.passes.cse import cse
from ..graph.passes.dce import dce
from ..graph.passes.pipeline import Pass, PassResult, PipelineLog, run_passes
from ..graph.ops.tensor import RESHAPES, transpose_perm
from ..graph.registry import REGISTRY, signature
from ..graph.signature import Signature
from ..graph.types import ConstValue, Splat, TensorType, Value, as_array
from .encoding import PackedEncoding, canonical, pack, refine, reshape_encoding, reshape_perm, unpack

__all__ = ["propagate", "map_encoding", "reshape_encoding", "reshape_perm"]
from .padding import padding_checked
from .targets import Target

PACK, UNPACK = "Pack", "Unpack"
_K_READERS = frozenset({"Gemm", "MatMul"})
"""Anchors whose operand 0's last dim is the reduction k against the rows of operand 1."""
_FIXED = {INPUT, OUTPUT, CONSTANT, PACK, UNPACK}


@dataclass
class Mapping:
    """Encodings for every operand and result of one node."""

    operands: list[PackedEncoding | None]
    results: list[PackedEncoding | None]
    ranked: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Operands (constants only) to reshape to these higher-rank shapes before packing."""


# ---- the mapping of an encoding through an iteration signature ---------------------------
def _tiles_line_up(sig: Signature, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType],
                   tiles: dict[str, int]) -> bool:
    """Each tiled iteration dim has one size in every tensor that indexes it, or else (a
    Concat, Split, Slice or Pad along it) every size is a whole number of tiles, so that the
    pieces' blocks line up with the result's."""
    if not tiles:
        return True
    sizes: dict[str, set] = {letter: set() for letter in tiles}
    tensors = [(t, sig.letters(i, False)) for i, t in enumerate(in_types)]
    tensors += [(t, sig.letters(k, True)) for k, t in enumerate(out_types)]
    for t, letters in tensors:
        if t is None or letters is None:
            continue
        for dim, letter in zip(t.shape, letters):
            if letter in sizes and dim != 1:
                sizes[letter].add(dim)
    for letter, found in sizes.items():
        if any(not isinstance(d, int) for d in found):
            return False
        if len(found) > 1 and any(d % tiles[letter] for d in found):
            return False
    return True


def map_encoding(node: Node, sig: Signature, in_types: Sequence[TensorType | None],
                 fixed: tuple[bool, int], enc: PackedEncoding) -> Mapping | None:
    """Encodings for every operand and result when the tensor `fixed` ((is_result, index))
    has `enc`, or None when the signature cannot carry it."""
    out_types = node.outputs
    is_result, index = fixed
    src = sig.letters(index, is_result)
    if src is None or None in src:
        return None
    tiles = {src[d]: t for d, t in enc.tiles().items()}
    tiled_windows = node.op in REGISTRY and REGISTRY[node.op].tiled_windows
    kept = {letter for k in range(len(out_types)) for letter in sig.letters(k, True) or ()}
    if not tiled_windows and any(sig.kind(letter) == "window" and letter in kept for letter in tiles):
        return None  # (a window read at one index and dropped addresses its tile like any index)
    if not _tiles_line_up(sig, in_types, out_types, tiles):
        return None
    order = [src[d] for d in enc.outer_perm(len(src))]
    inner = [src[d] for d in enc.inner_dims_pos]

    ranked: dict[int, tuple[int, ...]] = {}
    broadcasts = node.op in REGISTRY and REGISTRY[node.op].broadcasts

    def derive(letters: list[str | None] | None, shape: Sequence, slot: int | None) -> PackedEncoding | None | bool:
        if letters is None:
            return None  # a shape operand: not indexed, not packed
        if slot is not None and all(d == 1 for d in shape):
            return None  # one element broadcasts against any buffer
        if None in letters or any(l not in order for l in letters):
            return False
        missing = [l for l in order if l not in letters]
        if slot is None:
            if any(sig.kind(l) == "parallel" for l in missing):
                return False  # only a reduction, or a window read at one index, drops a dim
        own_rank = False
        if slot is not None and (missing != order[: len(missing)] or any(l in tiles for l in missing)):
            full = sig.results[0]  # a lower-rank operand: as if left-padded with size-1 dims
            if full is None or len(full) <= len(letters) or None in full:
                return False
            offset = len(full) - len(letters)
            if broadcasts and list(full[offset:]) == letters:
                letters, shape = list(full[:offset]) + letters, (1,) * offset + tuple(shape)
                ranked[slot] = shape
            else:
                own_rank = True  # BatchNormalization's per-channel vectors: their rank is fixed
        perm = tuple(sorted(range(len(letters)), key=lambda d: order.index(letters[d])))
        pos = tuple(sorted((d for d in range(len(letters)) if letters[d] in tiles),
                           key=lambda d: inner.index(letters[d])))
        sizes = tuple(tiles[letters[d]] if shape[d] != 1 else 1 for d in pos)
        packed = PackedEncoding(pos, sizes, perm, enc.pad)
        if slot is None and all(isinstance(d, int) for d in shape) and packed.is_padded(shape):
            packed = packed.with_pad(None)  # what an op leaves in padding is not known
        packed = canonical(packed, shape)
        if own_rank and packed is not None:
            return False  # read as it is only when its own layout would not change
        return packed

    operands: list[PackedEncoding | None] = []
    for i, t in enumerate(in_types):
        if t is None:
            operands.append(None)
            continue
        got = enc if (not is_result and i == index) else derive(sig.letters(i, False), t.shape, i)
        if got is False:
            return None
        operands.append(got)  # type: ignore[arg-type]
    results: list[PackedEncoding | None] = []
    for k, t in enumerate(out_types):
        got = enc if (is_result and k == index) else derive(sig.letters(k, True), t.shape, None)
        if got is False:
            return None
        results.append(got)  # type: ignore[arg-type]
    return Mapping(operands, results, ranked)


# ---- rules --------------------------------------------------------------------------------
def _producer(graph: Graph, value: Value | None) -> Node | None:
    return graph.node(value.node) if value is not None else None


def _source(graph: Graph, value: Value | None, enc: PackedEncoding | None,
            shape: tuple[int, ...] | None = None, dry: bool = False) -> Value | None | bool:
    """What a node may read for `value` in encoding `enc` without a new runtime layout op:
    the value itself (enc None), a packed constant (reshaped to `shape` first, when given),
    or the packed input of an Unpack. `dry` only asks: a constant is then not packed (the
    value itself stands for it)."""
    if value is None or enc is None:
        return value
    producer = _producer(graph, value)
    if producer.op == CONSTANT:
        return value if dry else _packed_constant(graph, producer, enc, shape)
    if shape is not None:
        return False
    if producer.op == UNPACK:
        packed = graph.inputs_of(producer.name)[0]
        t = graph.type_of(packed)
        if enc.same_layout_on(t.encoding, t.shape):
            return packed  # what its padding holds is checked by `padding_checked`
    return False


def _logical_constant(const: Node) -> tuple[ConstValue, TensorType]:
    """A constant's logical value and type: unpacked where it is stored packed (a splat stays one)."""
    value, t = const.attrs["value"], const.outputs[0]
    if t.encoding is None:
        return value, t
    if isinstance(value, Splat):
        return Splat(value.value, t.shape, t.dtype), t.logical()
    return unpack(value, t.encoding, t.shape), t.logical()


def _packed_constant(graph: Graph, const: Node, enc: PackedEncoding, shape: tuple[int, ...] | None = None) -> Value:
    value, t = _logical_constant(const)
    dequantized = const.attrs.get(DEQUANTIZED)  # the logical value's origin
    if shape is not None:
        value = value.reshape(shape) if isinstance(value, Splat) else np.reshape(value, shape)
        t = TensorType(shape, t.dtype)
        dequantized = dequantized and dequantized.reshaped(shape)
    padded = t.is_static and enc.is_padded(t.shape)
    if isinstance(value, Splat) and not (padded and enc.pad is not None and enc.pad != value.value):
        stored_enc = enc.with_pad(value.value) if padded else enc
        packed = Splat(value.value, stored_enc.physical_shape(t.shape), t.dtype)
        return graph.add_constant(packed, name=f"{const.name}_packed", type=TensorType(t.shape, t.dtype, stored_enc))
    if padded and enc.pad is None:
        enc = enc.with_pad(0.0)  # what `pack` fills in
    return graph.add_constant(pack(as_array(value), enc), name=f"{const.name}_packed",
                              type=TensorType(t.shape, t.dtype, enc), dequantized=dequantized)


def _rewrite(graph: Graph, node: Node, mapping: Mapping, sources: list[Value | None]) -> None:
    """Make `node` read `sources` and write `mapping.results`; Unpack its packed results."""
    for slot, value in enumerate(sources):
        _read(graph, node, slot, value)
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


def _read(graph: Graph, node: Node, slot: int, value: Value | None) -> None:
    """`node` reads `value` at `slot`; the Unpack it read before goes when nothing else reads
    it (a packed value read by one node is what rule 2b looks for)."""
    before = graph.inputs_of(node.name)[slot]
    graph.set_input(node.name, slot, value)
    if before is not None and before != value and graph.node(before.node).op == UNPACK and not graph.users(before):
        graph.remove_node(before.node)


def _sources_for(graph: Graph, node: Node, mapping: Mapping, budget: int = 0,
                 target: Target | None = None, writes_plain: Callable[[], bool] | None = None
                 ) -> list[Value | None] | None:
    """What `node` reads under `mapping` (see `_source`). With a `target`, an operand that is
    an Unpack of another layout, or a runtime value read by nothing else, is read in place
    once its anchor can write the mapped layout instead (`rewrite_writer`: a residual add of a
    conv's tiles and a Linear layer's result).
    With a `budget` (the bytes of the Unpack being pushed down), a runtime operand may be
    packed too, reusing a Pack of it that is already there while the bytes it moves stay
    within the budget, or adding one that moves fewer bytes than the budget (a broadcast
    attention mask packed once for every layer instead of each layer's scores unpacked).
    A Pack that anchors will absorb in the end (rule 5) is not there to reuse when
    `writes_plain()` says the Unpack can go for free instead (rule 2b: its anchor writes
    the plain layout; BERT's residual stream then stays plain, with no Pack after the
    embedding and no Unpack at the output)."""
    inputs = graph.inputs_of(node.name)
    sources = [_source(graph, v, enc, mapping.ranked.get(i)) for i, (v, enc) in enumerate(zip(inputs, mapping.operands))]
    if target is not None and any(s is False for s in sources):
        rewritable = {i: _unpacked(graph, inputs[i]) or inputs[i] for i, s in enumerate(sources) if s is False}
        if all(len(graph.users(inputs[i])) == 1 and rewrite_writer(graph, p, mapping.operands[i], target, dry=True)
               for i, p in rewritable.items()):
            for i, p in rewritable.items():
                rewrite_writer(graph, p, mapping.operands[i], target)
                sources[i] = p
    if not any(s is False for s in sources):
        return sources  # type: ignore[return-value]
    if not budget:
        return None
    plan: dict[int, tuple[Value | None, int]] = {}
    for i, s in enumerate(sources):
        if s is not False:
            continue
        v, enc, t = inputs[i], mapping.operands[i], graph.type_of(inputs[i])
        if i in mapping.ranked or t.encoding is not None or not t.is_static:
            return None
        existing = [u for u, _ in graph.users(v) if graph.node(u).op == PACK and graph.node(u).attrs["encoding"] == enc
                    and not (writes_plain is not None and _absorbed(graph, graph.node(u), target) and writes_plain())]
        plan[i] = (Value(existing[0]) if existing else None, 0 if _pack_moves_up(graph, v, enc) else t.nbytes())
    spent = sum(cost for _, cost in plan.values())
    adds = any(found is None for found, _ in plan.values())
    if spent > budget or (adds and spent == budget):
        return None
    for i, (found, _) in plan.items():
        if found is None:
            t, enc = graph.type_of(inputs[i]), mapping.operands[i]
            if enc.pad is None and enc.is_padded(t.shape):
                enc = enc.with_pad(0.0)
            found = Value(graph.add_node(PACK, [inputs[i]], [TensorType(t.shape, t.dtype, enc)], {"encoding": enc},
                                         name=f"pack_{node.name}_{i}", origin=node.origin).name)
        sources[i] = found
    return sources  # type: ignore[return-value]


def _pack_moves_up(graph: Graph, value: Value, enc: PackedEncoding) -> bool:
    """Whether a Pack of `value` into `enc` costs nothing: `push_up` moves it through the
    producer, read by nothing else, onto operands that are constants or read in `enc`'s
    image with no copy (a channels-last or channel-tiled product of (1, C, 1, 1) and
    (1, 1, H, W), whose images are relabelings). Unpadded only: padding would have to hold
    what the Pack promises."""
    t = graph.type_of(value)
    if not t.is_static or enc.is_padded(t.shape) or len(graph.users(value)) != 1:
        return False
    producer = _producer(graph, value)
    if producer is None or len(producer.outputs) != 1:
        return False
    found = _signature_of(graph, producer)
    if found is None:
        return False
    mapping = map_encoding(producer, *found, (True, 0), enc)
    if mapping is None:
        return False
    inputs = graph.inputs_of(producer.name)
    return all(_source(graph, v, e, mapping.ranked.get(i), dry=True) is not False
               for i, (v, e) in enumerate(zip(inputs, mapping.operands)))


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
    """An anchor whose kernel reads an operand's packed buffer directly takes it, also when
    the operand is a Pack of the Unpack of that buffer into the layout the anchor asked for."""
    changed = False
    for slot, value in enumerate(graph.inputs_of(node.name)):
        producer = _producer(graph, value)
        if producer is not None and producer.op == PACK:
            value = graph.inputs_of(producer.name)[0]
        packed = _unpacked(graph, value)
        if packed is not None and target.reads(node, slot, graph.type_of(packed)):
            _read(graph, node, slot, packed)
            changed = True
    return changed


def reshape_down(graph: Graph, node: Node) -> bool:
    """A reshape of a packed buffer is a view when its groups of dims stay together and each
    tiled dim passes through whole (`reshape_encoding`)."""
    inputs = graph.inputs_of(node.name)
    packed = _unpacked(graph, inputs[0])
    out = node.outputs[0]
    if packed is None or not out.is_static or out.encoding is not None:
        return False
    t = graph.type_of(packed)
    if not t.is_static:
        return False
    enc = reshape_encoding(t.shape, out.shape, t.encoding)
    if enc is None:
        return False
    _rewrite(graph, node, Mapping([enc] + [None] * (len(inputs) - 1), [enc]), [packed, *inputs[1:]])
    return True


def flatten_into_weights(graph: Graph, node: Node) -> bool:
    """A flatten (N, ...) -> (N, K) of a packed buffer read only as a Gemm's or MatMul's k,
    against constant weights, reads the buffer in its own element order instead: the
    flatten's input becomes `x` reshaped into its (blocks, tile) dims and transposed into
    buffer order (both views of the buffer), and the weight's k rows are permuted the same
    way at compile time (AlexNet's channels-last activation flattened into its classifier)."""
    inputs = graph.inputs_of(node.name)
    packed, out = _unpacked(graph, inputs[0]), node.outputs[0]
    gemm = _k_reader(graph, Value(node.name))
    if packed is None or gemm is None or out.rank != 2:
        return False
    t, enc = graph.type_of(packed), graph.type_of(packed).encoding
    weights = graph.inputs_of(gemm.name)[1]
    w = graph.type_of(weights)
    if gemm.attrs.get("transA", 0) or not t.is_static or t.rank < 2 or w.rank != 2 or _producer(graph, weights).op != CONSTANT:
        return False
    if enc.is_padded(t.shape) or 0 in enc.tiles() or enc.outer_perm(t.rank)[0] != 0 or out.shape[0] != t.shape[0]:
        return False
    tiles = enc.tiles()
    at, refined = refine(t.shape, tiles)
    order = tuple([at[d] for d in enc.outer_perm(t.rank)] + [at[d] + 1 for d in enc.inner_dims_pos])
    x = inputs[0]
    if tiles:
        shape = graph.add_constant(np.array(refined, np.int64), name=f"{node.name}_blocks")
        x = Value(graph.add_node("Reshape", [x, shape], [TensorType(tuple(refined), t.dtype)],
                                 name=f"{node.name}_blocks", origin=node.origin).name)
    ordered = graph.add_node("Transpose", [x], [TensorType(tuple(refined[k] for k in order), t.dtype)],
                             {"perm": order}, name=f"{node.name}_in_buffer_order", origin=node.origin)
    b = as_array(_producer(graph, weights).attrs["value"])
    if w.encoding is not None:
        b = unpack(b, w.encoding, w.shape)
    transposed = gemm.op == "Gemm" and gemm.attrs.get("transB", 0)
    by_column = b if transposed else b.T  # (M, K): each row packed like one sample of x
    packed_rows = pack(by_column.reshape((by_column.shape[0], *t.shape[1:])), enc).reshape(by_column.shape)
    rows = packed_rows if transposed else np.ascontiguousarray(packed_rows.T)
    stored = rows if w.encoding is None else pack(rows, w.encoding)
    graph.set_input(gemm.name, 1, graph.add_constant(stored, name=f"{weights.node}_rows", type=w))
    graph.set_input(node.name, 0, Value(ordered.name))
    return True


def _k_reader(graph: Graph, value: Value) -> Node | None:
    """The Gemm or MatMul that alone reads `value` as its operand 0 (through one Pack)."""
    users = graph.users(value)
    if len(users) != 1 or users[0][1] != 0:
        return None
    reader = graph.node(users[0][0])
    if reader.op == PACK:
        return _k_reader(graph, Value(reader.name))
    return reader if reader.op in _K_READERS else None


def reshape_up(graph: Graph, node: Node, enc: PackedEncoding) -> list[Value | None] | None:
    """Sources for a reshape to write `enc` itself: its input as a view in the encoding
    `reshape_encoding` gives backwards (a packed constant, or the buffer behind an Unpack)."""
    inputs = graph.inputs_of(node.name)
    t, out = graph.type_of(inputs[0]), node.outputs[0]
    if not (t.is_static and out.is_static):
        return None
    if t.encoding is not None or out.encoding is not None:
        return None
    wanted = _view_back(t, out, enc)
    source = _source(graph, inputs[0], wanted) if wanted is not None else False
    return None if source is False else [source, *inputs[1:]]


def _view_back(t_in: TensorType, out: TensorType, enc: PackedEncoding) -> PackedEncoding | None:
    """The encoding of a (static) reshape's input whose view in the result's shape is `enc`
    (`reshape_encoding` run backwards, and checked forwards), or None."""
    back = reshape_encoding(out.shape, t_in.shape, enc)
    if back is None or reshape_encoding(t_in.shape, out.shape, back) != canonical(enc, out.shape):
        return None
    return back


def relabel_transpose(graph: Graph, node: Node, target: Target) -> bool:
    """A Transpose moves no data: its result keeps the input's buffer, either because the
    input's producer (an anchor) writes the transposed layout, or with a permuted encoding
    whose Unpack then moves down to where it can be absorbed."""
    x = graph.inputs_of(node.name)[0]
    t_in, t_out = graph.type_of(x), node.outputs[0]
    if t_in.encoding is not None or t_out.encoding is not None or not t_out.is_static:
        return False
    perm = transpose_perm(node.attrs, t_in.rank)
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


def push_down(graph: Graph, node: Node, target: Target, grow: bool = True, relabel: bool = True) -> bool:
    """Rules 3 and 4 into `node`; with `grow` False, an Unpack does not move past an op whose
    results are larger than the value it unpacks (a broadcast into a bigger tensor); with
    `relabel` False, a Transpose of a value that is not unpacked is left as it is (rule 6
    waits: `propagate`'s `late_relabel`)."""
    if node.op in target.anchors:
        return anchor_reads(graph, node, target)
    if node.op in RESHAPES and (reshape_down(graph, node) or flatten_into_weights(graph, node)):
        return True
    if node.op == "Transpose" and _unpacked(graph, graph.inputs_of(node.name)[0]) is None:
        return relabel and relabel_transpose(graph, node, target)
    found = _signature_of(graph, node)
    if found is None:
        return False
    sig, in_types = found
    for slot, value in enumerate(graph.inputs_of(node.name)):
        producer = _producer(graph, value)
        if producer is None or producer.op != UNPACK:
            continue
        behind = graph.inputs_of(producer.name)[0]
        packed = graph.type_of(behind)
        budget = packed.nbytes() or 0
        if not grow and sum(t.nbytes() or 0 for t in node.outputs) > budget:
            continue
        mapping = map_encoding(node, sig, in_types, (False, slot), packed.encoding)
        writes_plain = lambda: rewrite_writer(graph, behind, PackedEncoding((), ()), target, dry=True)  # noqa: E731
        sources = _sources_for(graph, node, mapping, budget, target, writes_plain) if mapping is not None else None
        results = padding_checked(graph, node, sig, sources, mapping.results) if sources is not None else None
        if results is not None:
            mapping.results = results
            _rewrite(graph, node, mapping, sources)
            return True
        _drop_new_packs(graph, node, sources)
    return False


def _drop_new_packs(graph: Graph, node: Node, sources: list[Value | None] | None) -> None:
    """Remove the Packs `_sources_for` added for a rewrite that was refused."""
    for v in sources or ():
        if v is not None and v.node.startswith(f"pack_{node.name}_") and not graph.users(v):
            graph.remove_node(v.node)


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
    sources = reshape_up(graph, producer, enc) if producer.op in RESHAPES else None
    if sources is None and producer.op in RESHAPES and _relayout_behind(graph, producer, enc, target):
        sources = reshape_up(graph, producer, enc)
    if sources is not None:
        for slot, source in enumerate(sources):
            graph.set_input(producer.name, slot, source)
        producer.outputs[0] = TensorType(producer.outputs[0].shape, producer.outputs[0].dtype, enc)
        _drop(graph, packs, value)
        return True
    found = _signature_of(graph, producer)
    if found is None:
        return False
    sig, in_types = found
    mapping = map_encoding(producer, sig, in_types, (True, 0), enc)
    sources = _sources_for(graph, producer, mapping) if mapping is not None else None
    results = padding_checked(graph, producer, sig, sources, mapping.results) if sources is not None else None
    if results is None or (enc.pad is not None and results[0].pad != enc.pad):
        return False  # the padding would not hold what the Pack's readers expect
    for slot, source in enumerate(sources):
        graph.set_input(producer.name, slot, source)
    producer.outputs[0] = TensorType(producer.outputs[0].shape, producer.outputs[0].dtype, results[0])
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
                                             name=f"{producer.name}_unpacked",
                                             dequantized=producer.attrs.get(DEQUANTIZED))
    elif node.op == PACK and producer.op == UNPACK:
        packed = graph.inputs_of(producer.name)[0]
        have = graph.type_of(packed).encoding
        want = node.attrs["encoding"]
        shape = node.outputs[0].shape
        same_padding = not (node.outputs[0].is_static and want.is_padded(shape)) or have.pad == want.pad
        if not (have.same_layout_on(want, shape) and same_padding):
            return False
        replacement = packed
    elif node.op == UNPACK and producer.op == PACK:
        replacement = graph.inputs_of(producer.name)[0]
    else:
        return False
    graph.replace_all_uses(out, replacement)
    graph.remove_node(node.name)
    return True


def drop_identity_pack(graph: Graph, node: Node) -> bool:
    """A Pack of a plain value into an encoding that is trivial on its shape (16x16 tiles of a
    16x16 matrix) writes the same buffer: its readers read the value itself."""
    value = graph.inputs_of(node.name)[0]
    out = node.outputs[0]
    if graph.type_of(value).encoding is not None or not out.is_static or not out.encoding.is_trivial(out.shape):
        return False
    _drop(graph, [node], value)
    return True


def rewrite_writer(graph: Graph, packed: Value, want: PackedEncoding, target: Target, dry: bool = False) -> bool:
    """Rule 2b: `packed`, read by nothing but one Unpack, is an anchor's result (through
    Transposes and reshapes that relabel it, elementwise ops whose other operands are
    constants, and Unpacks, each read once): the anchor writes `want` instead, mapped back
    through them (an Unpack on the way goes), when its kernel can, so that a Pack to `want`
    after the Unpack cancels, or an op reading the Unpack beside another in `want` runs on
    both buffers. On the gpu target BERT's
    attention context is then written with the heads inside the sequence blocks, and merging
    the heads (Transpose, Reshape) moves no data; ConvNeXt's second Linear layer writes its
    result in the channel tiles of the residual it is added to, through the layer scale and
    the permute back to NCHW. With `dry`, only whether it can."""
    steps: list[tuple[Node, PackedEncoding, Mapping | None]] = []  # each node and its result's encoding
    v, enc = packed, want
    while True:
        producer = _producer(graph, v)
        if producer is None or len(graph.users(v)) != 1 or len(producer.outputs) != 1:
            return False
        result = producer.outputs[0]
        if not result.is_static or enc.is_padded(result.shape):
            return False  # (what an anchor leaves in padding is not what a Pack promises)
        if producer.op in target.anchors:
            break
        inputs = graph.inputs_of(producer.name)
        if producer.op in _FIXED - {UNPACK} or not inputs or inputs[0] is None:
            return False
        source = inputs[0]
        mapping, back = None, None
        if producer.op == UNPACK:
            back = enc  # the packed value itself is written in `enc`, and the Unpack goes
        elif producer.op == "Transpose":
            rank = graph.type_of(source).rank
            back = enc.permuted(tuple(int(i) for i in np.argsort(transpose_perm(producer.attrs, rank))))
        elif producer.op in RESHAPES:
            back = _reshaped_back(graph.type_of(source).logical(), result.logical(), enc)
        else:
            mapping, slot = _elementwise_back(graph, producer, enc)
            if mapping is not None:  # (an operand's encoding None: plain, as `enc` is)
                back, source = mapping.operands[slot] or PackedEncoding((), ()), inputs[slot]
        if back is None:
            return False
        steps.append((producer, enc, mapping))
        v, enc = source, back
    through_unpack = any(node.op == UNPACK for node, _, _ in steps)
    if not through_unpack and result.encoding is not None and result.encoding.same_layout(enc):
        return False
    if not target.writes(producer, TensorType(result.shape, result.dtype, enc)):
        return False
    if dry:
        return True
    producer.outputs[0] = TensorType(result.shape, result.dtype, canonical(enc, result.shape))
    for node, enc, mapping in steps:
        if node.op == UNPACK:
            graph.replace_all_uses(Value(node.name), graph.inputs_of(node.name)[0])
            graph.remove_node(node.name)
            continue
        shape = node.outputs[0].shape
        node.outputs[0] = TensorType(shape, node.outputs[0].dtype, canonical(enc, shape))
        if mapping is not None:
            for slot, (value, operand_enc) in enumerate(zip(graph.inputs_of(node.name), mapping.operands)):
                const = _producer(graph, value)
                if const is not None and const.op == CONSTANT:
                    graph.set_input(node.name, slot, _constant_in(graph, const, operand_enc, mapping.ranked.get(slot)))
    return True


def _elementwise_back(graph: Graph, node: Node, enc: PackedEncoding) -> tuple[Mapping | None, int]:
    """How an elementwise `node` writes `enc`: the encodings of its operands, and which one is
    its only runtime operand (the others are constants, packed at compile time)."""
    opdef = REGISTRY.get(node.op)
    inputs = graph.inputs_of(node.name)
    runtime = [i for i, v in enumerate(inputs) if v is not None and _producer(graph, v).op != CONSTANT]
    if opdef is None or opdef.layout != "agnostic" or len(runtime) != 1:
        return None, 0
    in_types = [graph.type_of(v).logical() if v is not None else None for v in inputs]
    sig = signature(node.op, node.attrs, in_types, [t.logical() for t in node.outputs])
    mapping = map_encoding(node, sig, in_types, (True, 0), enc) if sig is not None else None
    if mapping is None or runtime[0] in mapping.ranked or in_types[runtime[0]].shape != node.outputs[0].shape:
        return None, 0
    return mapping, runtime[0]


def _constant_in(graph: Graph, const: Node, enc: PackedEncoding | None, shape: tuple[int, ...] | None) -> Value:
    """`const` packed in `enc` (reshaped to `shape` first, when given), or its logical value
    where `enc` is None."""
    if enc is not None:
        return _packed_constant(graph, const, enc, shape)
    if const.outputs[0].encoding is None:
        return Value(const.name)
    value, t = _logical_constant(const)
    return graph.add_constant(value, name=f"{const.name}_logical", type=t, dequantized=const.attrs.get(DEQUANTIZED))


def _reshaped_back(t_in: TensorType, out: TensorType, enc: PackedEncoding) -> PackedEncoding | None:
    """The encoding a reshape's input needs for its result to be a view in `enc` (identity
    when `enc` is: a plain reshape is always a view), or None when no encoding does."""
    if not (t_in.is_static and out.is_static):
        return None
    return PackedEncoding((), ()) if enc.is_trivial(out.shape) else _view_back(t_in, out, enc)


def write_unpacked(graph: Graph, node: Node, target: Target) -> bool:
    """Rule 2b with nothing to cancel: an Unpack of an anchor's result, through Transposes
    and reshapes that relabel it, goes when the anchor can write the layout that they turn
    into the logical one (on the gpu target, BERT's attention context from PyTorch, whose
    heads are merged for a Gemm that reads it row-major; a 2-D mm's result viewed as
    (batch, tokens, hidden) for a residual add)."""
    source = graph.inputs_of(node.name)[0]
    if source is None or not rewrite_writer(graph, source, PackedEncoding((), ()), target):
        return False
    graph.replace_all_uses(Value(node.name), source)
    graph.remove_node(node.name)
    return True


def _relayout_behind(graph: Graph, reshape: Node, enc: PackedEncoding, target: Target) -> bool:
    """Rule 2b behind a reshape: its input is Unpack(p), p's writer can write the layout the
    reshape's Pack needs backwards (`reshape_encoding`), and now does."""
    x = graph.inputs_of(reshape.name)[0]
    if x is None:
        return False
    t, out = graph.type_of(x), reshape.outputs[0]
    if not (t.is_static and out.is_static) or t.encoding is not None:
        return False
    wanted = reshape_encoding(out.shape, t.shape, enc)
    unpack_node = _producer(graph, x)
    if wanted is None or unpack_node.op != UNPACK or len(graph.users(x)) != 1:
        return False
    return rewrite_writer(graph, graph.inputs_of(unpack_node.name)[0], wanted, target)


def _reads_unpacked(graph: Graph, anchor: Node, slot: int, pack_node: Node, target: Target) -> bool:
    """Whether `anchor`'s kernel reads the value `pack_node` packs at `slot`, unpacked."""
    if slot != 0 or anchor.op not in target.anchors:
        return False
    logical = [graph.type_of(v) if v is not None else None for v in graph.inputs_of(anchor.name)]
    logical[0] = graph.type_of(graph.inputs_of(pack_node.name)[0])
    layout = target.anchor_layout(anchor, logical)
    return layout is not None and layout.reads_identity


def _absorbed(graph: Graph, pack_node: Node, target: Target) -> bool:
    """Whether every reader of `pack_node` is an anchor that will absorb it (rule 5): such a
    Pack costs nothing yet, so reusing it for another reader is not free."""
    users = graph.users(Value(pack_node.name))
    return bool(users) and all(_reads_unpacked(graph, graph.node(u), slot, pack_node, target) for u, slot in users)


def absorb(graph: Graph, node: Node, target: Target) -> bool:
    """Rule 5: an anchor reads the unpacked operand 0 itself."""
    users = graph.users(Value(node.name))
    if len(users) != 1 or not _reads_unpacked(graph, graph.node(users[0][0]), users[0][1], node, target):
        return False
    graph.set_input(users[0][0], 0, graph.inputs_of(node.name)[0])
    graph.remove_node(node.name)
    return True


def _sweep(graph: Graph, target: Target, final: bool, grow: bool = True, relabel: bool = True) -> bool:
    modified = False
    for node in graph.nodes():
        if node.name not in graph:
            continue
        if node.op in (PACK, UNPACK):
            changed = fold_or_cancel(graph, node)
            if not changed and node.op == PACK:
                changed = push_up(graph, node, target) or (final and (absorb(graph, node, target)
                                                                       or drop_identity_pack(graph, node)))
            elif not changed and final:
                changed = write_unpacked(graph, node, target)
        else:
            changed = push_down(graph, node, target, grow, relabel)
        modified |= changed
    return modified


def fold_constant_layouts(graph: Graph, *, verify: bool = False, log: PipelineLog | None = None) -> Graph:
    """Rule 1 alone: Packs and Unpacks of constants become constants; nothing moves."""
    def fold(g: Graph) -> PassResult:
        layout_of_constants = [n for n in g.nodes() if n.op in (PACK, UNPACK)
                               and _producer(g, g.inputs_of(n.name)[0]).op == CONSTANT]
        return PassResult(g, any([fold_or_cancel(g, n) for n in layout_of_constants]))

    return run_passes(graph, [Pass("fold", fold), dce], verify=verify, fixed_point=True, log=log)


def propagate(graph: Graph, target: Target, *, verify: bool = False, log: PipelineLog | None = None,
              grow: bool = True, late_relabel: bool = True) -> Graph:
    """Run the rules to a fixed point, then absorb what is left into anchors, then clean up.
    `grow` False keeps Unpacks out of ops that broadcast into larger results (`push_down`).
    `late_relabel`: rule 6 for a Transpose of a value that is not unpacked waits for a sweep
    in which nothing else fires. Relabeled early, such a Transpose keeps the layout its input
    had then, and an Unpack reaching it later stops there (ConvNeXt's permute in front of
    each downsampling LayerNorm, relabeled before the residual Add feeding it ran on tiles);
    relabeled late, an op after it may already have taken another layout from its readers
    (a Llama's scaled keys, tiled for the score MatMul before the keys' permute was
    relabeled). `layout.optimize` tries both."""
    def sweep(g: Graph) -> bool:
        if late_relabel:
            return _sweep(g, target, final=False, grow=grow, relabel=False) or _sweep(g, target, final=False, grow=grow)
        return _sweep(g, target, final=False, grow=grow)

    moves = Pass("propagate", lambda g: PassResult(g, sweep(g)))
    graph = run_passes(graph, [moves, dce], verify=verify, fixed_point=True, max_rounds=50, log=log)
    last = Pass("absorb", lambda g: PassResult(g, _sweep(g, target, final=True, grow=grow)))
    return run_passes(graph, [last, cse, dce], verify=verify, fixed_point=True, log=log)
