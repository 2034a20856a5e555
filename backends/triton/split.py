"""Split as a generated kernel with one result per output: a single pass over the operand.

The kernel iterates the logical elements of the operand (a chain iterates its result's):
each element is loaded once, through the operand's encoding, and stored by one masked
`tl.store` per result, the one whose range along the axis holds it, at its index along the
axis minus that range's start, through that result's own encoding (`part_stores`, which a
matmul whose kernel ends with a Split shares). So a packed operand may
be split into plain results and the other way round, along a tiled axis or not. The results
are the pointers `out0, out1, ...`, one per output slot of the node in order, read or not
(a multi-result kernel: executor.py fills each padded packed one before the launch). A split
copies: values are stored in the dtype they were loaded in. A part of size 0 gets a pointer
and no store.

The part sizes are the NumPy backend's (`split_sizes`), from a constant `split` input or
`num_outputs`; they must agree with the results' types, which size the buffers. A `split`
computed at run time leaves the node on the NumPy backend.
"""
from __future__ import annotations

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.types import Value, as_array
from ..numpy.kernels.tensor import split_sizes
from .codegen import Table, jit_function
from .elementwise import block_lines, store_expr, value_ok
from .indexing import offset


def _axis(graph: Graph, node: Node) -> int:
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    return int(node.attrs.get("axis", 0)) % x.rank


def sizes(graph: Graph, node: Node) -> list[int] | None:
    """The part sizes along the axis; None where the `split` input is computed at run time."""
    values = list(graph.inputs_of(node.name)) + [None]
    given = None
    if values[1] is not None:
        const = graph.constant_value(values[1])
        if const is None:
            return None
        given = [int(v) for v in as_array(const).reshape(-1)]
    length = int(graph.type_of(values[0]).shape[_axis(graph, node)])  # type: ignore[arg-type]
    count = int(node.attrs.get("num_outputs", 0) or len(node.outputs))
    return split_sizes(length, count, given)


def supports(graph: Graph, node: Node) -> bool:
    """A Split of a static float, bool or integer operand of rank >= 1 into static results, its sizes
    known at compile time and the ones the result types have."""
    x = graph.inputs_of(node.name)[0] if node.op == "Split" else None
    if x is None:
        return False
    t = graph.type_of(x)
    if t.rank == 0 or not value_ok(t) or not all(value_ok(out) for out in node.outputs):
        return False
    axis = _axis(graph, node)
    return sizes(graph, node) == [int(out.shape[axis]) for out in node.outputs]


def results(nodes: list[Node]) -> list[Value]:
    """Every output slot of the Split, in order: the kernel writes them all."""
    node = nodes[-1]
    return [Value(node.name, k) for k in range(len(node.outputs))]


def numel(graph: Graph, nodes: list[Node]) -> int:
    """The elements the kernel iterates: the operand's."""
    x = graph.type_of(graph.inputs_of(nodes[-1].name)[0])  # type: ignore[arg-type]
    return int(np.prod([int(d) for d in x.shape], dtype=np.int64))


def kernel(graph: Graph, nodes: list[Node], fn_name: str) -> tuple[str, list[Value | Table]]:
    """Source of the kernel splitting `nodes[-1]`'s operand (`in0`) into `out0, out1, ...`."""
    node = nodes[-1]
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    t = graph.type_of(value)
    shape = [int(d) for d in t.shape]
    names = [f"i{d}" for d in range(len(shape))]
    lines = block_lines(shape, names)
    lines.append(f"x = tl.load(in0 + {offset(t, names)}, mask=mask)  # {graph.value_name(value)}: {t}")
    lines += part_stores(graph, node, names, "x")
    source = jit_function(fn_name, 1, lines, results=len(node.outputs))
    return source, [value]


def part_stores(graph: Graph, node: Node, index: list[str], var: str, narrow: bool = False,
                slots: list[int | None] | None = None) -> list[str]:
    """One masked `tl.store` per part of Split `node` of `var`, the operand's elements at
    logical `index`: those inside the part's range along the axis, at their index in the part
    minus its start, through the part's encoding (`out0, out1, ...`, or `out{slots[k]}`, none
    for a part whose slot is None); `narrow`: `var` is float32 registers, converted to each
    part's dtype (a matmul's accumulator)."""
    axis = _axis(graph, node)
    parts = sizes(graph, node) or []
    lines, low = [], 0
    for k, (out, size) in enumerate(zip(node.outputs, parts)):
        slot = k if slots is None else slots[k]
        if size and slot is not None:
            at = [f"{i} - {low}" if d == axis and low else i for d, i in enumerate(index)]
            inside = ([f"({index[axis]} >= {low})"] if low else []) + \
                ([f"({index[axis]} < {low + size})"] if low + size < sum(parts) else [])
            value = store_expr(var, out) if narrow else var
            lines.append(f"tl.store(out{slot} + {offset(out, at)}, {value}, mask={' & '.join(['mask', *inside])})  "
                         f"# {graph.value_name(Value(node.name, k))}: {out}")
        low += size
    return lines
