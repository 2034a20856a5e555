"""The template table: kind -> how a group of that kind is recognized, generated and launched.

`classify` gives each node the kind of kernel that runs it; a node no template supports (or
placed on the host, `node.device == "cpu"`) runs on the NumPy backend ("numpy"); a reshape
or transpose whose result is its operand's buffer as it stands is a view ("view": a plain
reshape, or whole tiles left in place) and Shape/Size of a static tensor a constant
computed at compile time ("static"): no kernel at all.

A kernel writes one result, slot 0 of its group's last node, except where its template's
`results` names more (a Split writes every output slot: split.py; a TopK its values and
indices: reduce.py), and then what its group `writes` besides (fusion.Group: the result of a
prologue that others read too, a post-norm LayerNorm's). A template's `prefill`
names an operand the executor copies into that result before each launch, for a kernel that
only changes some of its elements (a scatter: scatter.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.ops.tensor import RESHAPES
from ...graph.types import Value
from ...layout.encoding import pack
from ...layout.targets import GpuTarget
from . import attention, conv, elementwise, layout_ops, matmul, reduce, scatter, split
from .codegen import Table
from .indexing import next_pow2

Nodes = list[Node]


@dataclass(frozen=True)
class Template:
    kind: str
    supports: Callable[[Graph, Node], bool]
    kernel: Callable[[Graph, Nodes, str], tuple[str, list["Value | Table"]]]
    grid: Callable[[Graph, Nodes, dict[str, Any]], tuple[int, ...]]
    constexprs: Callable[[dict[str, Any]], dict[str, Any]]
    defaults: Callable[[Graph, Nodes, GpuTarget], dict[str, Any]]
    keys: frozenset[str]
    tiles: Callable[[Graph, Nodes], list] = lambda graph, nodes: []
    check: Callable[[Graph, Nodes, dict[str, Any]], "str | None"] = lambda graph, nodes, config: None
    results: Callable[[Nodes], list[Value]] = lambda nodes: [Value(nodes[-1].name)]
    prefill: Callable[[Graph, Nodes], "Value | None"] = lambda graph, nodes: None
    epilogue: Callable[[Graph, Node], bool] = lambda graph, anchor: False
    """Whether the kernel of a group with this anchor computes elementwise nodes after it."""
    widens: Callable[[Graph, Node], "tuple[int, ...] | None"] = lambda graph, anchor: None
    """The shape an epilogue may widen to after nodes of the anchor's result's shape (a
    reduction's row, after its one value per row), or None."""
    merges: Callable[[Graph, Node, Node, Value, Node], bool] = lambda graph, inner, outer, value, reader: False
    """Whether a group anchored at `inner`, whose result `value` a node `reader` of a group
    anchored at `outer` reads, can run inside that group's kernel (two row ops over one row;
    two chains read at one index)."""
    ends: Callable[[Graph, Nodes, Node], bool] = lambda graph, nodes, node: False
    """Whether `node`, of another kind, may end a group of these `nodes` (its only operand
    read, the group's result), writing its results instead (a matmul's Split)."""
    prologue: Callable[[Graph, Node, str, Nodes], bool] = lambda graph, anchor, kind, nodes: False
    """Whether the kernel of this anchor computes the group (of `kind`, these `nodes`) that gives
    its first operand, where it would load it (the group's kernel and its result's buffer go):
    a row op the chain of elementwise nodes before it, a matmul the layer norm before it."""
    shares: Callable[[Graph, Node, str, Nodes], bool] = lambda graph, anchor, kind, nodes: False
    """Whether the kernel of this anchor, computing the group that gives its first operand (a
    `prologue`), can also write that group's result, which nodes after the anchor read (a
    post-norm layer's LayerNorm, also its next residual): the group's kernel goes, its
    result's buffer stays."""
    absorbs: Callable[[Graph, Nodes, Callable[[Node], Any]], Nodes] = lambda graph, nodes, group_of: []
    """The nodes outside a group of these `nodes` (in the groups `group_of` gives) that its
    kernel computes itself as it reads its operands (attention: GQA's Expand of K and V, and
    the views between; Casts and scales of Q, K and V), so that their kernels go."""
    pairs: Callable[[Graph, Nodes], bool] = lambda graph, nodes: False
    """Whether elementwise nodes after a kernel of these `nodes` that writes several results
    (a Split's parts) may read them all at one index, in registers (a matmul's equal column
    parts: LLaMA's SiLU(gate) * up)."""
    part_epilogue: Callable[[Graph, Nodes], bool] = lambda graph, nodes: False
    """Whether elementwise nodes that read one of the several results of a kernel of these
    `nodes` (a Split's parts) may run in it as that part's epilogue, the other results stored
    as they are (a parallel block's MLP part, its projection merged with the attention's:
    the GELU of Phi, GPT-NeoX, Falcon)."""
    spans: Callable[[Graph, list[str], Nodes], bool] = lambda graph, kinds, nodes: False
    """Whether one kernel of this template runs a run of groups of `kinds`, each read by the
    next alone, whose nodes are `nodes` (attention: the scores' matmul, the softmax, the
    product with V)."""


def _numel(nodes: Nodes) -> int:
    return int(np.prod(nodes[-1].outputs[0].shape, dtype=np.int64))


def _flat_defaults(numel: int, tile: int) -> dict[str, Any]:
    """A block of a flat iteration over `numel` elements: a power of two, at least a tile."""
    return {"BLOCK": min(1024, max(tile, next_pow2(numel))), "num_warps": 4, "num_stages": 1}


def _flat_grid(numel: int, config: dict[str, Any]) -> tuple[int, ...]:
    return (max(1, -(-numel // config["BLOCK"])),)


def _flat(kind: str, supports: Callable[[Graph, Node], bool],
          kernel: Callable[[Graph, Nodes, str], tuple[str, list["Value | Table"]]],
          numel: Callable[[Graph, Nodes], int], **extra: Any) -> Template:
    """A template whose kernel iterates `numel` elements in blocks of BLOCK, one program each."""
    return Template(
        kind, supports, kernel,
        grid=lambda graph, nodes, config: _flat_grid(numel(graph, nodes), config),
        constexprs=lambda config: {"BLOCK": config["BLOCK"]},
        defaults=lambda graph, nodes, target: _flat_defaults(numel(graph, nodes), target.block),
        keys=frozenset({"BLOCK", "num_warps", "num_stages"}), **extra)


def _result_numel(graph: Graph, nodes: Nodes) -> int:
    return _numel(nodes)


def _always(graph: Graph, anchor: Node) -> bool:
    return True


def _same_index_space(graph: Graph, inner: Node, outer: Node, value: Value, reader: Node) -> bool:
    """A chain or movement group merges into a chain kernel whose node reads its result at
    the same index: of the reader's shape."""
    return tuple(graph.type_of(value).shape) == tuple(reader.outputs[0].shape)


TEMPLATES: dict[str, Template] = {
    "chain": _flat("chain", elementwise.supports, elementwise.chain_kernel, _result_numel, epilogue=_always,
                   merges=_same_index_space),
    "movement": _flat("movement", layout_ops.supports_head, elementwise.chain_kernel, _result_numel,
                      epilogue=_always, merges=_same_index_space),
    "matmul": Template(
        "matmul", matmul.supports, matmul.kernel, matmul.grid, matmul.constexprs, matmul.defaults,
        keys=frozenset({"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "input_precision"}),
        tiles=matmul.tiles, results=matmul.results, epilogue=_always, ends=matmul.takes_split,
        prologue=matmul.takes_prologue, pairs=matmul.pairs, shares=matmul.shares_prologue,
        part_epilogue=matmul.part_epilogue),
    "conv": Template(
        "conv", conv.supports, conv.kernel, conv.grid, conv.constexprs, conv.defaults,
        keys=frozenset({"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "input_precision"}),
        tiles=conv.tiles, epilogue=_always),
    "reduce": Template(
        "reduce", reduce.supports, reduce.kernel, reduce.grid,
        constexprs=lambda config: {"BLOCK": config["BLOCK"]}, defaults=reduce.defaults,
        keys=frozenset({"BLOCK", "num_warps", "num_stages"}), check=reduce.check,
        results=reduce.results, epilogue=reduce.takes_epilogue, widens=reduce.widens,
        merges=reduce.merges, prologue=reduce.takes_prologue),
    "attention": Template(
        "attention", lambda graph, node: False, attention.kernel, attention.grid, attention.constexprs,
        attention.defaults, keys=frozenset({"BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_E", "num_warps", "num_stages",
                                            "input_precision"}),
        tiles=attention.tiles, check=attention.check, spans=attention.spans, absorbs=attention.absorbs),
    "split": _flat("split", split.supports, split.kernel, split.numel, results=split.results),
    "scatter": _flat("scatter", scatter.supports, scatter.kernel, scatter.numel, prefill=scatter.prefill),
}

HOST_OPS = frozenset({"Shape", "Size", "ConstantOfShape"})
"""Ops whose result is decided by shapes (tiny host work): always the NumPy backend."""


def _on_host(graph: Graph, node: Node) -> bool:
    return node.device == "cpu" or (node.op in HOST_OPS and static_result(graph, node) is None)


def static_result(graph: Graph, node: Node) -> np.ndarray | None:
    """A result the input types decide (Shape, Size of a static tensor): no data is read."""
    from ...graph.registry import get

    opdef = get(node.op, node)
    if opdef.static_value is None:
        return None
    types = [graph.type_of(v) if v is not None else None for v in graph.inputs_of(node.name)]
    value = opdef.static_value({**opdef.defaults, **node.attrs}, types)
    return None if value is None else np.asarray(value)


VIEW_CHECK_LIMIT = 1 << 24
"""Elements up to which a reshape or transpose of a packed buffer is checked for being a view."""


def _view(graph: Graph, node: Node) -> bool:
    """A reshape or transpose whose result is its operand's buffer as it stands: a reshape of
    a plain buffer, or an op whose result's layout puts every element at the offset it has in
    the operand's (checked on the elements' indices, packed both ways): a BERT's heads split of
    16x16-tiled rows and their transpose into (B, H, T, D) blocks keep every tile whole and in
    place, and ran as six copy kernels a layer."""
    if len(node.outputs) != 1 or (node.op not in RESHAPES and node.op != "Transpose"):
        return False
    t, out = graph.type_of(graph.inputs_of(node.name)[0]), node.outputs[0]  # type: ignore[arg-type]
    if not (t.is_static and out.is_static) or t.dtype != out.dtype:
        return False
    if t.encoding is None and out.encoding is None and node.op in RESHAPES:
        return True
    shape, result_shape = tuple(int(d) for d in t.shape), tuple(int(d) for d in out.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if count > VIEW_CHECK_LIMIT or any(enc is not None and enc.is_padded(s)
                                       for enc, s in ((t.encoding, shape), (out.encoding, result_shape))):
        return False
    index = np.arange(count).reshape(shape)
    if node.op == "Transpose":
        result = index.transpose(node.attrs.get("perm") or tuple(reversed(range(len(shape)))))
    else:
        result = index.reshape(result_shape)
    before = index if t.encoding is None else pack(index, t.encoding)
    after = result if out.encoding is None else pack(result, out.encoding)
    return np.array_equal(before.ravel(), after.ravel())


RULES: list[tuple[str, Callable[[Graph, Node], bool]]] = [
    ("numpy", _on_host),
    ("transfer", lambda graph, node: node.op == "Transfer"),
    ("static", lambda graph, node: static_result(graph, node) is not None),
    ("view", _view),
    *((kind, TEMPLATES[kind].supports) for kind in ("matmul", "conv", "reduce", "chain", "movement", "split",
                                                                 "scatter")),
]
"""Which kernel runs a node: the first rule that holds (else the NumPy backend)."""


def epilogue_shapes(graph: Graph, group: Any) -> list[tuple[int, ...]]:
    """The shapes of the elementwise nodes the kernel of `group` (a fusion.Group) may compute
    after its last one: that node's (its first result's), and the shape its template widens
    to (none where the template's rule for its anchor says it takes no epilogue, or the kernel
    writes several results that the template does not pair)."""
    template = TEMPLATES.get(group.kind)
    if template is None or not template.epilogue(graph, group.anchor):
        return []
    if len(template.results(group.nodes)) != 1 and not template.pairs(graph, group.nodes):
        return []
    shapes = [tuple(int(d) for d in group.nodes[-1].outputs[0].shape)]
    wide = template.widens(graph, group.anchor)
    return shapes + ([wide] if wide is not None and wide not in shapes else [])


def ends(graph: Graph, group: Any, node: Node) -> bool:
    """Whether `node`, of another kind, ends `group` (a fusion.Group), writing its results:
    the template's rule."""
    template = TEMPLATES.get(group.kind)
    return template is not None and template.ends(graph, group.nodes, node)


def takes_prologue(graph: Graph, kind: str, node: Node, before: Any) -> bool:
    """Whether `node`, run by a kernel of `kind`, computes the group `before` (a fusion.Group)
    that gives its first operand in that kernel: its template's rule."""
    template = TEMPLATES.get(kind)
    return template is not None and template.prologue(graph, node, before.kind, before.nodes)


def shares(graph: Graph, kind: str, node: Node, before: Any) -> bool:
    """Whether `node`'s kernel of `kind`, computing the group `before` (a fusion.Group) that
    gives its first operand, can also write that group's result: its template's rule."""
    template = TEMPLATES.get(kind)
    return template is not None and template.shares(graph, node, before.kind, before.nodes)


def part_epilogue(graph: Graph, group: Any) -> bool:
    """Whether elementwise nodes reading one result of `group`'s kernel (a fusion.Group that
    writes several) may run in it: its template's rule."""
    template = TEMPLATES.get(group.kind)
    return template is not None and template.part_epilogue(graph, group.nodes)


def merges(graph: Graph, inner: Any, outer: Any, value: Value, reader: Node) -> bool:
    """Whether group `inner` (a fusion.Group), whose result `value` `reader` reads on joining
    group `outer`, can run inside `outer`'s kernel: the template's rule, for two groups whose
    kernels one function generates (a chain and a movement group: elementwise.chain_kernel);
    and a chain of elementwise nodes of the row's shape that `outer`'s anchor would take as its
    prologue, read at each element of that row (a half-precision RMSNorm's upcast of its row,
    which its square and its scaling both read)."""
    template, other = TEMPLATES.get(outer.kind), TEMPLATES.get(inner.kind)
    if template is None or other is None:
        return False
    if template.kernel is other.kernel:
        return template.merges(graph, inner.anchor, outer.anchor, value, reader)
    row = graph.inputs_of(outer.anchor.name)[0]
    shape = tuple(graph.type_of(value).shape)
    return inner.kind == "chain" and row is not None and shape == tuple(graph.type_of(row).shape) and \
        shape == tuple(reader.outputs[0].shape) and \
        all(n.op in elementwise.OPS and tuple(n.outputs[0].shape) == shape for n in inner.nodes) and \
        template.prologue(graph, outer.anchor, inner.kind, inner.nodes)


def spans(graph: Graph, kinds: list[str], nodes: Nodes) -> str | None:
    """The kind of the template whose one kernel runs a run of groups of `kinds` (each read by
    the next alone) with these `nodes`, or None."""
    return next((kind for kind, template in TEMPLATES.items() if template.spans(graph, kinds, nodes)), None)


def absorbs(graph: Graph, group: Any, group_of: Callable[[Node], Any]) -> Nodes:
    """The nodes outside `group` (a fusion.Group) its kernel computes as it reads, given each
    node's group: its template's rule."""
    template = TEMPLATES.get(group.kind)
    return template.absorbs(graph, group.nodes, group_of) if template is not None else []


def classify(graph: Graph, node: Node) -> str:
    """The kind of kernel that runs `node` (see the module docstring)."""
    return next((kind for kind, holds in RULES if holds(graph, node)), "numpy")


def supports(graph: Graph, node: Node) -> bool:
    """Whether the Triton backend runs `node` itself (a generated kernel, a view, a transfer,
    a shape known at compile time) rather than on the NumPy backend, wherever it is placed."""
    return any(holds(graph, node) for kind, holds in RULES if kind != "numpy")


def supported_ops() -> frozenset[str]:
    """Ops some template runs (for a device's `supports(node)`: whether one runs a given node
    also depends on its types, and an unsupported one falls back to the NumPy backend)."""
    from .reduce import NORMALIZATIONS, REDUCE_OPS, SCANS

    return frozenset({*elementwise.OPS, *layout_ops.HEADS, *RESHAPES, "MatMul", "Gemm", "Conv", "ConvTranspose",
                      "Softmax", "LogSoftmax", *NORMALIZATIONS, *REDUCE_OPS, *SCANS, "TopK", "Split", "Transfer",
                      "Shape", "Size", *scatter.OPS})
