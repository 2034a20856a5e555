"""The verifier: the IR's invariants, checked after every pass in tests and debug runs.

1. The graph is acyclic and every op is registered with a valid arity.
2. Every edge reads an existing output slot into an existing input slot, one edge per slot.
3. Inputs and outputs are listed exactly once; an Output reads one value.
4. Declared types agree with the registry's inference (dtype, rank, static dims).
5. Constants match their declared types; encodings are valid for their shapes.
"""
from __future__ import annotations

from .errors import TilefoldError, VerifyError, where
from .graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from .registry import get, infer
from .types import TensorType, type_of_constant

_SELF_TYPED = {INPUT, OUTPUT, "OnnxReference"}


def verify_graph(graph: Graph, context: str = "") -> None:
    """Raise VerifyError naming the first broken invariant (and `context`, e.g. the pass)."""
    try:
        _verify(graph)
    except VerifyError as exc:
        raise VerifyError(f"{context}: {exc}" if context else str(exc)) from None


def _verify(graph: Graph) -> None:
    nodes = graph.nodes()  # (1) raises on a cycle
    g = graph.nx
    for node in nodes:
        opdef = get(node.op, node)
        opdef.check_arity(node.arity, node)
        seen: set[int] = set()
        for src, _, data in g.in_edges(node.name, data=True):
            slot = data["dst"]
            if slot >= node.arity or slot in seen:  # (2)
                raise VerifyError(f"{where(node)} has a bad or doubled edge into input slot {slot}")
            seen.add(slot)
            if data["src"] >= len(graph.node(src).outputs):
                raise VerifyError(f"{where(node)} reads output {data['src']} of {src!r}, which has none")
        _check_role(graph, node)
        _check_types(graph, node)


def _check_role(graph: Graph, node: Node) -> None:
    if node.op == INPUT and graph.inputs.count(node.name) != 1:
        raise VerifyError(f"{where(node)} is not listed once among the graph inputs")
    if node.op == OUTPUT and (graph.outputs.count(node.name) != 1 or graph.inputs_of(node.name)[0] is None):
        raise VerifyError(f"{where(node)} is not listed once among the outputs, or reads nothing")
    if node.op == CONSTANT:
        actual = type_of_constant(node.attrs["value"])
        declared = node.outputs[0]
        shape = declared.shape if declared.encoding is None else declared.encoding.physical_shape(declared.shape)
        if (actual.shape, actual.dtype) != (tuple(shape), declared.dtype):
            raise VerifyError(f"{where(node)} holds {actual} but declares {declared}")


def _check_types(graph: Graph, node: Node) -> None:
    for t in node.outputs:
        if t.encoding is not None:
            try:
                t.encoding.validate(t.shape)
            except TilefoldError as exc:
                raise VerifyError(f"{where(node)}: encoding {t.encoding} invalid for {t}: {exc}") from None
    if node.op in _SELF_TYPED or node.op == CONSTANT:
        return
    values = graph.inputs_of(node.name)
    types = [graph.type_of(v) if v is not None else None for v in values]
    consts = [graph.constant_value(v) for v in values]
    inferred = infer(node.op, node.attrs, types, consts, node)
    for k, declared in enumerate(node.outputs):
        if k < len(inferred) and not compatible(inferred[k], declared):
            raise VerifyError(
                f"{where(node)} output {k} declares {declared} but its inputs give {inferred[k]}"
            )


def compatible(a: TensorType, b: TensorType) -> bool:
    """Same dtype and rank; static dims equal (a symbolic dim matches anything)."""
    if a.dtype != b.dtype or a.rank != b.rank:
        return False
    return all(x == y or isinstance(x, str) or isinstance(y, str) for x, y in zip(a.shape, b.shape))
