"""The dataflow graph: a thin facade over `networkx.MultiDiGraph` that owns every edge edit.

A node is one operation. An edge carries one value from an output slot of its producer
to an input slot of its consumer (edge data `src`, `dst`). Graph inputs (`Input`),
constants (`Constant`) and outputs (`Output`) are nodes too, so every value has exactly
one producer. Passes edit the graph only through the verbs below.
"""
from __future__ import annotations

import copy as _copy
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import networkx as nx
import numpy as np

from .errors import VerifyError, where
from .types import ConstValue, Splat, TensorType, Value, freeze, type_of_constant

INPUT, OUTPUT, CONSTANT = "Input", "Output", "Constant"


@dataclass(eq=False)
class Node:
    """One operation: its op, attributes, output types and annotations."""

    name: str
    op: str
    attrs: dict[str, Any]
    outputs: list[TensorType]
    arity: int
    origin: str | None = None
    out_names: list[str] = field(default_factory=list)
    device: str | None = None
    launch: dict[str, Any] | None = None
    order: int = 0

    def __repr__(self) -> str:
        outs = ", ".join(str(t) for t in self.outputs)
        return f"<{self.op} {self.name!r} -> {outs}>"


class Graph:
    """A model as one dataflow graph (see module docstring)."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.meta: dict[str, Any] = {}
        self._g = nx.MultiDiGraph()
        self._order = itertools.count()

    # ---- construction -------------------------------------------------------------
    def fresh_name(self, base: str) -> str:
        if base not in self._g:
            return base
        for i in itertools.count(1):
            candidate = f"{base}_{i}"
            if candidate not in self._g:
                return candidate
        raise AssertionError("unreachable")

    def add_node(
        self,
        op: str,
        inputs: Sequence[Value | None],
        outputs: Sequence[TensorType],
        attrs: dict[str, Any] | None = None,
        name: str | None = None,
        origin: str | None = None,
        out_names: Sequence[str] | None = None,
    ) -> Node:
        name = self.fresh_name(name or op.lower())
        node = Node(
            name=name,
            op=op,
            attrs=dict(attrs or {}),
            outputs=list(outputs),
            arity=len(inputs),
            origin=origin,
            out_names=list(out_names) if out_names else [],
            order=next(self._order),
        )
        self._g.add_node(name, node=node)
        for slot, value in enumerate(inputs):
            if value is not None:
                self._connect(value, name, slot)
        return node

    def add_input(self, name: str, type: TensorType) -> Value:
        node = self.add_node(INPUT, [], [type], {"type": type}, name=name, out_names=[name])
        if node.name != name:
            raise VerifyError(f"graph input name {name!r} is used twice")
        self.inputs.append(name)
        return Value(name)

    def add_constant(self, value: ConstValue, name: str | None = None, type: TensorType | None = None) -> Value:
        """A constant; `type` gives a packed constant its logical shape and encoding
        (`value` is then the packed buffer, of the encoding's physical shape)."""
        if not isinstance(value, Splat):
            value = freeze(value)
        declared = type if type is not None else type_of_constant(value)
        node = self.add_node(CONSTANT, [], [declared], {"value": value}, name=name or "const")
        node.out_names = [node.name]
        return Value(node.name)

    def add_output(self, value: Value, name: str) -> Node:
        node = self.add_node(OUTPUT, [value], [], {"name": name}, name=f"output:{name}")
        self.outputs.append(node.name)
        return node

    def _connect(self, value: Value, dst: str, slot: int) -> None:
        if value.node not in self._g:
            raise VerifyError(f"{value} used by {dst!r} has no producer in the graph")
        if value.slot >= len(self.node(value.node).outputs):
            raise VerifyError(f"{value} used by {dst!r} is not an output of its producer")
        self._g.add_edge(value.node, dst, src=value.slot, dst=slot)

    # ---- queries ------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self._g

    def __len__(self) -> int:
        return self._g.number_of_nodes()

    def node(self, name: str) -> Node:
        try:
            return self._g.nodes[name]["node"]
        except KeyError:
            raise VerifyError(f"no node named {name!r} in graph {self.name!r}") from None

    def nodes(self) -> list[Node]:
        """All nodes in a deterministic topological order (insertion order breaks ties)."""
        # Kahn's algorithm on plain dicts, like nx.lexicographical_topological_sort but
        # without its per-node view objects (measured 4 s of 11 s optimizing a 10k-op chain).
        nodes = {name: data["node"] for name, data in self._g.nodes(data=True)}
        successors = {name: [(dst, len(keys)) for dst, keys in nbrs.items()] for name, nbrs in self._g.adjacency()}
        pending = dict.fromkeys(nodes, 0)
        for edges in successors.values():
            for dst, count in edges:
                pending[dst] += count
        ready = [(nodes[n].order, n) for n, count in pending.items() if count == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(nodes[name])
            for dst, count in successors[name]:
                pending[dst] -= count
                if pending[dst] == 0:
                    heapq.heappush(ready, (nodes[dst].order, dst))
        if len(order) != len(nodes):
            cycle = nx.find_cycle(self._g)
            names = " -> ".join(str(e[0]) for e in cycle)
            raise VerifyError(f"graph {self.name!r} has a cycle: {names}")
        return order

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes())

    def inputs_of(self, name: str) -> list[Value | None]:
        node = self.node(name)
        values: list[Value | None] = [None] * node.arity
        for src, _, data in self._g.in_edges(name, data=True):
            values[data["dst"]] = Value(src, data["src"])
        return values

    def users(self, value: Value) -> list[tuple[str, int]]:
        """(consumer, input slot) pairs reading `value`."""
        return [
            (dst, data["dst"])
            for _, dst, data in self._g.out_edges(value.node, data=True)
            if data["src"] == value.slot
        ]

    def consumers(self, name: str) -> set[str]:
        return set(self._g.successors(name))

    def type_of(self, value: Value) -> TensorType:
        return self.node(value.node).outputs[value.slot]

    def constant_value(self, value: Value | None) -> ConstValue | None:
        """The constant a value holds, or None when it is computed at run time."""
        if value is None:
            return None
        node = self.node(value.node)
        return node.attrs["value"] if node.op == CONSTANT else None

    def output_values(self) -> list[Value]:
        return [self.inputs_of(name)[0] for name in self.outputs]  # type: ignore[misc]

    def output_names(self) -> list[str]:
        return [self.node(name).attrs["name"] for name in self.outputs]

    def input_types(self) -> dict[str, TensorType]:
        return {name: self.node(name).outputs[0] for name in self.inputs}

    def value_name(self, value: Value) -> str:
        """The source-level name of a value (ONNX tensor name), for messages."""
        names = self.node(value.node).out_names
        return names[value.slot] if value.slot < len(names) else str(value)

    @property
    def nx(self) -> nx.MultiDiGraph:
        """The underlying networkx graph, read-only by convention (for algorithms, drawing)."""
        return self._g

    # ---- edits --------------------------------------------------------------------
    def set_input(self, name: str, slot: int, value: Value | None) -> None:
        node = self.node(name)
        if slot >= node.arity:
            node.arity = slot + 1
        for src, _, key, data in list(self._g.in_edges(name, keys=True, data=True)):
            if data["dst"] == slot:
                self._g.remove_edge(src, name, key)
        if value is not None:
            self._connect(value, name, slot)

    def replace_all_uses(self, old: Value, new: Value, exclude: set[str] | None = None) -> int:
        """Point every reader of `old` at `new`; returns how many uses moved."""
        moved = 0
        for dst, slot in self.users(old):
            if exclude and dst in exclude:
                continue
            self.set_input(dst, slot, new)
            moved += 1
        return moved

    def remove_node(self, name: str) -> None:
        if any(True for _ in self._g.successors(name)):
            users = sorted(self._g.successors(name))
            raise VerifyError(f"cannot remove {where(self.node(name))}: still used by {users}")
        if name in self.inputs:
            self.inputs.remove(name)
        if name in self.outputs:
            self.outputs.remove(name)
        self._g.remove_node(name)

    def set_type(self, value: Value, type: TensorType) -> None:
        self.node(value.node).outputs[value.slot] = type

    def copy(self) -> Graph:
        """A structural copy: nodes and attrs are new, constant arrays are shared (read-only)."""
        other = Graph(self.name)
        other.inputs = list(self.inputs)
        other.outputs = list(self.outputs)
        other.meta = _copy.deepcopy(self.meta)
        other._g = self._g.copy()
        for name in other._g.nodes:
            node: Node = other._g.nodes[name]["node"]
            new = _copy.copy(node)
            new.attrs = dict(node.attrs)
            new.outputs = list(node.outputs)
            new.out_names = list(node.out_names)
            new.launch = _copy.deepcopy(node.launch)
            other._g.nodes[name]["node"] = new
        other._order = itertools.count(max((n.order for n in self.nodes()), default=-1) + 1)
        return other

    # ---- summaries ------------------------------------------------------------------
    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name in self._g.nodes:
            op = self._g.nodes[name]["node"].op
            counts[op] = counts.get(op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def constants(self) -> Iterator[Node]:
        for name in self._g.nodes:
            node = self._g.nodes[name]["node"]
            if node.op == CONSTANT:
                yield node

    def parameter_count(self) -> int:
        """Elements held in constants (splats count their logical size)."""
        return sum(int(np.prod(n.attrs["value"].shape, dtype=np.int64)) for n in self.constants())

    def summary(self) -> Any:
        """Ops, parameters, layout ops and devices at a glance (a table: HTML in Jupyter)."""
        from .summary import summary

        return summary(self)

    def draw(self, **options: Any) -> Any:
        """A matplotlib drawing of the graph, or of a chosen part of it (see `graph.draw.draw`)."""
        from .draw import draw

        return draw(self, **options)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs>"
