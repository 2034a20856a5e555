"""Grouping nodes into kernels: an anchor (matmul, conv, a row op such as softmax, layer norm
or a float reduction; its template says which take one) with the elementwise ops that follow
it as its epilogue, and runs of elementwise ops as one chain kernel.

A node joins the group of the producer of one of its operands when that producer is the
group's last node, its result is read by this node alone (so it never needs a buffer), and
the node's result has the producer's shape (an epilogue or a chain iterates one index space;
other operands may broadcast into it). One shape with two readers joins too, a diamond: the
producer's result read by the node and by one other elementwise node that reads the node's
result, its only reader (the safe softmax's Where(IsNaN(s), 0, s), SiLU's x * sigmoid(x));
that other node then joins the same group when its turn comes (`owed`). A group runs at the
place of its last node in the topological order: every operand of every member is ready by
then, and every result a group does not write is read inside it alone (checked).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...graph.graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from ...graph.types import Value

HOST_DEVICE = "cpu"


@dataclass
class Group:
    """Nodes run by one kernel: `kind` names the template ("numpy": the NumPy backend)."""

    kind: str
    nodes: list[Node]

    @property
    def anchor(self) -> Node:
        return self.nodes[0]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def output(self) -> Value:
        return Value(self.nodes[-1].name)


def _first_result_only(graph: Graph, producer: Node, value: Value) -> bool:
    """`value` is slot 0 of `producer`, whose other results nobody reads."""
    return value.slot == 0 and not any(graph.users(Value(producer.name, k)) for k in range(1, len(producer.outputs)))


def _single_reader(graph: Graph, producer: Node, value: Value, reader: str) -> bool:
    """`value` is `producer`'s only read result, and `reader` alone reads it."""
    return _first_result_only(graph, producer, value) and all(user == reader for user, _ in graph.users(value))


def _same_shape(a: Node, b: Node) -> bool:
    return tuple(a.outputs[0].shape) == tuple(b.outputs[0].shape)


def _fusable(graph: Graph, producer: Node, value: Value, node: Node) -> bool:
    return _single_reader(graph, producer, value, node.name) and _same_shape(node, producer)


def _diamond(graph: Graph, producer: Node, value: Value, node: Node, classify: Callable[[Graph, Node], str]
             ) -> Node | None:
    """The node that closes a diamond over `value`: where `value` is read by `node` and by one
    other elementwise node that also reads `node`'s result, its only reader (the safe-softmax
    guard: Where(IsNaN(s), 0, s)), that node; both may then join `producer`'s group, `value`
    staying in registers. None for any other shape of graph."""
    if not _first_result_only(graph, producer, value):
        return None
    others = {user for user, _ in graph.users(value)} - {node.name}
    if len(others) != 1 or not _same_shape(node, producer):
        return None
    closer = graph.node(others.pop())
    if classify(graph, closer) != "chain" or not _fusable(graph, node, Value(node.name), closer):
        return None
    return closer


def group_nodes(graph: Graph, classify: Callable[[Graph, Node], str], takes_epilogue: Callable[[Graph, Group], bool],
                fuse: bool = True) -> list[Group]:
    """The graph's compute nodes grouped into kernels, in a valid launch order; `classify`
    gives a node's kind, `takes_epilogue` whether a group's kernel computes elementwise nodes
    after its last one (templates.takes_epilogue)."""
    order = [n for n in graph.nodes() if n.op not in (INPUT, OUTPUT, CONSTANT)]
    position = {n.name: i for i, n in enumerate(order)}
    owner: dict[str, Group] = {}
    owed: dict[str, Group] = {}  # the node that closes a diamond -> the group it must join
    groups: list[Group] = []
    for node in order:
        kind = classify(graph, node)
        joined = owed.pop(node.name, None)
        if fuse and kind == "chain" and joined is None:
            for value in graph.inputs_of(node.name):
                if value is None or value.node not in owner:
                    continue
                group = owner[value.node]
                last = group.nodes[-1]
                if last.name != value.node or not takes_epilogue(graph, group):
                    continue
                if _fusable(graph, last, value, node):
                    joined = group
                    break
                closer = _diamond(graph, last, value, node, classify)
                if closer is not None:
                    joined = owed[closer.name] = group
                    break
        if joined is None:
            joined = Group(kind, [])
            groups.append(joined)
        joined.nodes.append(node)
        owner[node.name] = joined
    _check_groups(graph, groups)
    return sorted(groups, key=lambda g: position[g.nodes[-1].name])


def _check_groups(graph: Graph, groups: list[Group]) -> None:
    """Every result a group computes but does not write (all but its last node's slot 0) is
    read inside the group alone: it never gets a buffer."""
    for group in groups:
        inside = set(group.names)
        for node in group.nodes[:-1]:
            for k in range(len(node.outputs)):
                outside = {user for user, _ in graph.users(Value(node.name, k))} - inside
                assert not outside, f"fusion: {node.name} of a {group.kind} group is read by {sorted(outside)}"
