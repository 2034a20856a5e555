"""hoist_scales: a Mul by a constant scalar moved before the data movement that feeds it (a
target asks for it: `Target.kernel_passes`).

torch's sdpa decomposition scales the keys by d**-1/4 after transformers' repeat_kv has
expanded them to every query head and split them into heads: Mul(Transpose(Reshape(Expand(
Unsqueeze(k)))), s). The Mul there is a kernel of its own on the gpu target (the movement ops
are views, or the Expand a kernel of its own), over the expanded tensor. A scalar commutes
with moving elements, bit for bit, so Mul(k, s) then the movement computes the same values,
and the Mul joins the kernel that computes k (LLaMA's rotary product): one kernel fewer a
layer, and the scaling done before the Expand multiplies it. (fold_scales moves such a scale
into the weights where a product computes the value; here the rotary embedding stands
between them.)

Moved through: Transpose, Reshape, Flatten, Squeeze, Unsqueeze and Expand, each read by the
next alone, a float scale of one element whose Mul leaves its operand's shape and dtype.
"""
from __future__ import annotations

from ..graph import Graph
from ..ops.tensor import RESHAPES
from ..types import TensorType, Value
from .pipeline import Pass, PassResult
from .scales import scalar

MOVES = RESHAPES | {"Transpose", "Expand"}


def _hoist_scales(graph: Graph) -> PassResult:
    changed = False
    for mul in list(graph.nodes()):
        if mul.op != "Mul":
            continue
        ins = graph.inputs_of(mul.name)
        slot = next((k for k in (1, 0) if scalar(graph, ins[k]) is not None), None)
        if slot is None or ins[1 - slot] is None:
            continue
        moved, scale = ins[1 - slot], ins[slot]
        if tuple(graph.type_of(moved).shape) != tuple(mul.outputs[0].shape) or \
                graph.type_of(moved).dtype != mul.outputs[0].dtype:  # type: ignore[arg-type]
            continue
        path = []
        value = moved
        while value is not None and value.slot == 0 and graph.node(value.node).op in MOVES and \
                len(graph.users(value)) == 1:
            path.append(graph.node(value.node))
            value = graph.inputs_of(value.node)[0]
        source = graph.type_of(value) if value is not None else None
        if not path or source is None or graph.type_of(scale).rank > source.rank:  # type: ignore[arg-type]
            continue
        scaled = graph.add_node("Mul", [value, scale], [TensorType(source.shape, source.dtype)], {},
                                name=f"{mul.name}_hoisted", origin=mul.origin)
        graph.set_input(path[-1].name, 0, Value(scaled.name))
        graph.replace_all_uses(Value(mul.name), moved)  # type: ignore[arg-type]
        graph.remove_node(mul.name)
        changed = True
    return PassResult(graph, changed)


hoist_scales = Pass("hoist_scales", _hoist_scales)
