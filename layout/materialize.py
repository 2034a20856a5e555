"""Materialize: every anchor gets its target's encodings, with explicit Pack/Unpack around it.

After this pass each anchor reads packed operands and writes a packed result, and the rest
of the graph is unchanged: the layout traffic is at its worst, which the report shows as
"before". Propagation then moves and cancels the Pack/Unpack nodes.
"""
from __future__ import annotations

from ..graph.graph import Graph
from ..graph.passes.pipeline import Pass, PassResult, PipelineLog, run_passes
from ..graph.types import TensorType, Value
from .targets import Target


def wrap_anchors(graph: Graph, target: Target) -> bool:
    modified = False
    for node in graph.nodes():
        if node.op not in target.anchors:
            continue
        inputs = graph.inputs_of(node.name)
        in_types = [graph.type_of(v) if v is not None else None for v in inputs]
        layout = target.anchor_layout(node, in_types)
        if layout is None:
            continue
        for slot, (value, enc) in enumerate(zip(inputs, layout.operands)):
            if value is None or enc is None:
                continue
            t = graph.type_of(value)
            pack = graph.add_node("Pack", [value], [TensorType(t.shape, t.dtype, enc)], {"encoding": enc},
                                  name=f"pack_{node.name}_{slot}", origin=node.origin)
            graph.set_input(node.name, slot, Value(pack.name))
        if layout.result is not None:
            out = Value(node.name)
            logical = node.outputs[0]
            node.outputs[0] = TensorType(logical.shape, logical.dtype, layout.result)
            unpack = graph.add_node("Unpack", [out], [logical], name=f"unpack_{node.name}", origin=node.origin,
                                    out_names=node.out_names[:1])
            graph.replace_all_uses(out, Value(unpack.name), exclude={unpack.name})
        modified = True
    return modified


def materialize(graph: Graph, target: Target, *, verify: bool = False, log: PipelineLog | None = None) -> Graph:
    step = Pass("materialize", lambda g: PassResult(g, wrap_anchors(g, target)))
    return run_passes(graph, [step], verify=verify, log=log)
