"""Grouping nodes into kernels: an anchor (matmul, row reduction) with the elementwise ops
that follow it as its epilogue, and runs of elementwise ops as one chain kernel.

A node joins the group of the producer of one of its operands when that producer is the
group's last node, its result is read by this node alone (so it never needs a buffer), and
the node's result has the producer's shape (an epilogue or a chain iterates one index space;
other operands may broadcast into it). A group runs at the place of its last node in the
topological order: every operand of every member is ready by then, and since a fused
result has a single reader, nothing outside the group waits on a member.
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


EPILOGUE_KINDS = frozenset({"chain", "movement", "matmul", "conv"})
"""Kinds whose last node may take elementwise nodes after it."""


def _fusable(graph: Graph, producer: Node, value: Value, node: Node) -> bool:
    if value.slot != 0 or any(graph.users(Value(producer.name, k)) for k in range(1, len(producer.outputs))):
        return False
    users = graph.users(value)
    if len(users) != 1 or users[0][0] != node.name:
        return False
    return tuple(node.outputs[0].shape) == tuple(producer.outputs[0].shape)


def group_nodes(graph: Graph, classify: Callable[[Graph, Node], str], fuse: bool = True) -> list[Group]:
    """The graph's compute nodes grouped into kernels, in a valid launch order."""
    order = [n for n in graph.nodes() if n.op not in (INPUT, OUTPUT, CONSTANT)]
    position = {n.name: i for i, n in enumerate(order)}
    owner: dict[str, Group] = {}
    groups: list[Group] = []
    for node in order:
        kind = classify(graph, node)
        joined = None
        if fuse and kind == "chain":
            for value in graph.inputs_of(node.name):
                if value is None or value.node not in owner:
                    continue
                group = owner[value.node]
                last = group.nodes[-1]
                if group.kind in EPILOGUE_KINDS and last.name == value.node and _fusable(graph, last, value, node):
                    joined = group
                    break
        if joined is None:
            joined = Group(kind, [])
            groups.append(joined)
        joined.nodes.append(node)
        owner[node.name] = joined
    return sorted(groups, key=lambda g: position[g.nodes[-1].name])
