"""ScatterElements and ScatterND: the result is a copy of `data` with `updates` written, or
combined by a reduction, at the positions the indices name.

The copy is no kernel's work: the template's `prefill` names `data`, which the executor copies
into the result buffer on the device before each launch (so a rerun, an autotuning one, starts
afresh). The kernel then iterates the elements of `updates`, looks up each one's position in the
result (negative indices counted from the end of their dim; one outside its dim writes nothing and
sets the kernel's codegen.Flag, an error after the run as on the NumPy backend) and applies it,
by the first of these that the reduction and the dtype allow:

1. reduction none: a plain store. Repeated positions are undefined in ONNX; without them the
   result is the NumPy backend's.
2. ATOMICS: Triton's atomic add (float32, float16 and the integers) and atomic max and min
   (the integers only: its float ones compare bit patterns, which a NaN of either sign breaks).
3. Every other (reduction, dtype), mul and float max and min included: a compare-and-swap loop,
   each lane reading its position, combining (COMBINE, floats in float32 and rounded once, max
   and min propagating NaN) and swapping the bits in where they are still the ones it read, and
   trying again where another lane came first. Exact for max and min, and for add and mul up to
   the order of the updates; float16 and bfloat16 swap 16-bit words.

`data` is the kernel's first operand, read by the prefill alone.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.types import TensorType, Value
from .codegen import Table, jit_function
from .elementwise import block_lines
from .indexing import NAN, is_float, offset, parameter, triton_dtype, value_ok
from .layout_ops import looked_up

OPS = frozenset({"ScatterElements", "ScatterND"})
WORD_INTEGERS = frozenset({"int32", "int64"})
"""The index dtypes ONNX allows, and the only integer data a reduction combines (ATOMICS and the
compare-and-swap words below are for these)."""

ATOMICS: dict[tuple[str, str], str] = {
    **{("add", dtype): "tl.atomic_add" for dtype in ("float32", "float16", "int32", "int64")},
    **{(how, dtype): f"tl.atomic_{how}" for how in ("max", "min") for dtype in ("int32", "int64")},
}
"""(reduction, dtype) -> the Triton atomic that applies it (what the interpreter runs too:
bfloat16 has no atomic add there, and float max and min are refused above)."""

COMBINE = {"add": "{0} + {1}", "mul": "{0} * {1}", "max": "tl.maximum({0}, {1}" + NAN + ")",
           "min": "tl.minimum({0}, {1}" + NAN + ")"}
"""Reduction -> the combined value of the result's element {0} and the update {1}."""

BITS = {2: "tl.int16", 4: "tl.int32", 8: "tl.int64"}
"""Item size -> the integer type whose bits a compare-and-swap exchanges."""


def _types(graph: Graph, node: Node) -> tuple[TensorType, TensorType, TensorType] | None:
    values = graph.inputs_of(node.name)
    if len(values) != 3 or any(v is None for v in values):
        return None
    data, indices, updates = (graph.type_of(v) for v in values)  # type: ignore[arg-type]
    return data, indices, updates


def supports(graph: Graph, node: Node) -> bool:
    """A scatter of static float or integer data (bool data with reduction none) by int32 or
    int64 indices, its result laid out as data is (the prefill copies the buffer as it is)."""
    if node.op not in OPS or len(node.outputs) != 1:
        return False
    types = _types(graph, node)
    if types is None:
        return False
    data, indices, updates = types
    out = node.outputs[0]
    reduction = node.attrs.get("reduction", "none")
    if not (value_ok(data) and value_ok(updates) and value_ok(out) and indices.is_static
            and indices.dtype.name in WORD_INTEGERS and data == out and updates.dtype == data.dtype):
        return False
    if reduction not in ("none", *COMBINE):
        return False
    if reduction != "none" and not (is_float(data) or data.dtype.name in WORD_INTEGERS):
        return False  # bool data; the narrower and unsigned integers have neither atomics nor checked swaps here
    if node.op == "ScatterElements":
        axis = int(node.attrs.get("axis", 0)) % data.rank
        return indices.shape == updates.shape and indices.rank == data.rank and all(
            int(i) <= int(d) for k, (i, d) in enumerate(zip(indices.shape, data.shape)) if k != axis)
    return int(indices.shape[-1]) <= data.rank


def numel(graph: Graph, nodes: Sequence[Node]) -> int:
    """The number of updates: the kernel's flat iteration."""
    updates = graph.inputs_of(nodes[0].name)[2]
    return int(np.prod(graph.type_of(updates).shape, dtype=np.int64))  # type: ignore[arg-type]


def prefill(graph: Graph, nodes: Sequence[Node]) -> Value:
    """`data`, copied into the result before the kernel applies the updates."""
    data = graph.inputs_of(nodes[0].name)[0]
    assert data is not None
    return data


def _targets(graph: Graph, node: Node, names: list[str], params: list[Value | Table]) -> tuple[list[str], list[str]]:
    """Lines looking up where the update at `names` goes (`inside`: whether every looked-up
    index lies in its dim), and the result index there."""
    data, indices, _ = graph.inputs_of(node.name)
    assert data is not None and indices is not None
    d_t, i_t = graph.type_of(data), graph.type_of(indices)
    lines: list[str] = []
    found: list[str] = []
    if node.op == "ScatterElements":
        axis = int(node.attrs.get("axis", 0)) % d_t.rank
        lines += looked_up(graph, node, indices, list(names), params, "indices", names, "idx0", int(d_t.shape[axis]))
        found = ["idx0"]
        index = [*names[:axis], "idx0", *names[axis + 1:]]
    else:
        k, lead = int(i_t.shape[-1]), names[:i_t.rank - 1]
        for m in range(k):
            lines += looked_up(graph, node, indices, [*lead, str(m)], params, f"indices[..., {m}]", names, f"idx{m}",
                               int(d_t.shape[m]))
            found.append(f"idx{m}")
        index = [*found, *names[i_t.rank - 1:]]
    inside = " & ".join(["mask", *(f"({v}_out == 0)" for v in found)])
    return [*lines, f"inside = {inside}"], index


def _cas_loop(out_t: TensorType, reduction: str) -> list[str]:
    """Lines combining `upd` into the result at `at` for the lanes `inside`, by compare-and-swap
    until every lane's swap lands; a lane that is done swaps its element's bits for themselves."""
    store = triton_dtype(out_t.dtype)
    bits = BITS[out_t.dtype.itemsize]
    widen = ".to(tl.float32)" if is_float(out_t) else ""
    combined = COMBINE[reduction].format(f"old{widen}", f"upd{widen}")
    return [
        f"words = out0.to(tl.pointer_type({bits}), bitcast=True)",
        "pending = inside",
        "while tl.max(pending.to(tl.int32), axis=0) > 0:",
        "    at = tl.where(pending, target, 0)",
        "    old = tl.load(out0 + at)",
        f"    new = tl.where(pending, ({combined}).to({store}), old)",
        f"    old_bits = old.to({bits}, bitcast=True)",
        f"    seen = tl.atomic_cas(words + at, old_bits, new.to({bits}, bitcast=True))",
        "    pending = pending & (seen != old_bits)",
    ]


def kernel(graph: Graph, nodes: Sequence[Node], fn_name: str) -> tuple[str, list[Value | Table]]:
    """Source of a kernel applying the updates of one scatter to its prefilled result;
    parameters: data (the prefill's), indices, updates, then the result."""
    (node,) = nodes
    data, _, updates = graph.inputs_of(node.name)
    assert data is not None and updates is not None
    out_t, u_t = node.outputs[0], graph.type_of(updates)
    shape = [int(d) for d in u_t.shape]
    names = [f"i{d}" for d in range(len(shape))]
    params: list[Value | Table] = [data]
    lines = block_lines(shape, names)
    looked_up, index = _targets(graph, node, names, params)
    lines += looked_up
    where = offset(u_t, names) if shape else "offs"  # a rank-0 update: lane 0 of a block
    lines.append(f"upd = tl.load({parameter(params, updates)} + {where}, mask=mask)  # "
                 f"{graph.value_name(updates)}: {u_t}")
    lines.append(f"target = {offset(out_t, index)}" + ("" if shape else " + offs"))
    reduction = node.attrs.get("reduction", "none")
    atomic = ATOMICS.get((reduction, out_t.dtype.name))
    if reduction == "none":
        lines.append(f"tl.store(out0 + target, upd, mask=inside)  # {out_t}")
    elif atomic is not None:
        lines.append(f"{atomic}(out0 + target, upd, mask=inside)  # {out_t}, {reduction}")
    else:
        lines += _cas_loop(out_t, reduction)
    source = jit_function(fn_name, len(params), lines)
    return source, params
