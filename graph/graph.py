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
from .types import ConstValue, Dequantized, Splat, TensorType, Value, freeze, type_of_constant

INPUT, OUTPUT, CONSTANT = "Input", "Output", "Constant"
DEQUANTIZED = "dequantized"
"""A constant's attribute holding the `Dequantized` it was folded from, if any."""


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


def _copy_node(node: Node) -> Node:
    """A node whose attrs, outputs, names and launch are its own (attribute values shared)."""
    new = type(node).__new__(type(node))
    new.__dict__.update(node.__dict__)
    new.attrs = dict(node.attrs)
    new.outputs = list(node.outputs)
    new.out_names = list(node.out_names)
    if node.launch is not None:
        new.launch = _copy.deepcopy(node.launch)
    return new


class Graph:
    """A model as one dataflow graph (see module docstring).

    Edits go through networkx's API; the hot queries (`node`, `nodes`, `inputs_of`, `users`,
    `set_input`, `copy`) read its adjacency dicts (`_node`, `_pred`, `_succ`) directly:
    networkx's per-call view objects were most of their time (and a third of `optimize` on
    a 10,000-op chain, with the garbage collection of those objects).
    """

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

    def add_constant(self, value: ConstValue, name: str | None = None, type: TensorType | None = None,
                     dequantized: Dequantized | None = None) -> Value:
        """A constant; `type` gives a packed constant its logical shape and encoding
        (`value` is then the packed buffer, of the encoding's physical shape); `dequantized`
        says how its logical value was computed from integers, where it was."""
        if not isinstance(value, Splat):
            value = freeze(value)
        declared = type if type is not None else type_of_constant(value)
        attrs: dict[str, Any] = {"value": value}
        if dequantized is not None:
            attrs[DEQUANTIZED] = dequantized
        node = self.add_node(CONSTANT, [], [declared], attrs, name=name or "const")
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
            return self._g._node[name]["node"]
        except KeyError:
            raise VerifyError(f"no node named {name!r} in graph {self.name!r}") from None

    def nodes(self) -> list[Node]:
        """All nodes in a deterministic topological order (insertion order breaks ties)."""
        # Kahn's algorithm on networkx's adjacency dicts, like nx.lexicographical_topological_sort
        # but without its per-node view objects (measured 4 s of 11 s optimizing a 10k-op chain).
        data, preds, succs = self._g._node, self._g._pred, self._g._succ
        pending: dict[str, int] = {}  # in-edges not yet emitted
        named: dict[int, str] = {}  # orders are unique: the heap holds them alone
        ready: list[int] = []
        for name, d in data.items():
            named[d["node"].order] = name
            incoming = preds[name]
            if incoming:
                pending[name] = sum(map(len, incoming.values()))
            else:
                ready.append(d["node"].order)
        if len(named) != len(data):
            raise VerifyError(f"graph {self.name!r}: two nodes share an insertion order (added outside add_node)")
        heapq.heapify(ready)
        order: list[Node] = []
        pop, push = heapq.heappop, heapq.heappush
        while ready:
            name = named[pop(ready)]
            order.append(data[name]["node"])
            for dst, keys in succs[name].items():
                left = pending[dst] - len(keys)
                pending[dst] = left
                if not left:
                    push(ready, data[dst]["node"].order)
        if len(order) != len(data):
            cycle = nx.find_cycle(self._g)
            names = " -> ".join(str(e[0]) for e in cycle)
            raise VerifyError(f"graph {self.name!r} has a cycle: {names}")
        return order

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes())

    def inputs_of(self, name: str) -> list[Value | None]:
        node = self.node(name)
        values: list[Value | None] = [None] * node.arity
        for src, keys in self._g._pred[name].items():
            for data in keys.values():
                values[data["dst"]] = Value(src, data["src"])
        return values

    def users(self, value: Value) -> list[tuple[str, int]]:
        """(consumer, input slot) pairs reading `value`."""
        slot = value.slot
        return [
            (dst, data["dst"])
            for dst, keys in self._g._succ.get(value.node, {}).items()
            for data in keys.values()
            if data["src"] == slot
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
        stale = [(src, key) for src, keys in self._g._pred[name].items() for key, data in keys.items()
                 if data["dst"] == slot]
        for src, key in stale:
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
        # networkx's own copy adds edge by edge through its API (most of the time this takes);
        # its adjacency dicts are built here directly, the same shape, in the same order, a
        # successor's and a predecessor's view of an edge sharing its key dict, as add_edge
        # makes them (networkx resets its cached views when `_node`, `_adj`, `_pred` are set).
        g, old = other._g, self._g
        g.graph.update(old.graph)
        succ = {name: {dst: {key: dict(data) for key, data in keys.items()} for dst, keys in users.items()}
                for name, users in old._succ.items()}
        g._node = {name: {**data, "node": _copy_node(data["node"])} for name, data in old._node.items()}
        g._adj = succ
        g._pred = {name: {src: succ[src][name] for src in preds} for name, preds in old._pred.items()}
        other._order = itertools.count(max((d["node"].order for d in self._g._node.values()), default=-1) + 1)
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
