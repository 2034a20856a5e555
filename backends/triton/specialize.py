"""Specialization: a graph with symbolic dims (a dynamic batch) made static for one set of
input shapes, so the templates (which bake shapes into the generated source) can run it.

Every node's result types are inferred again in topological order from the concrete input
shapes, keeping each result's encoding. Shape computations (Shape, Size, and small integer
nodes on known values: the Gather/Concat/Unsqueeze chains exporters put in front of Reshape)
are evaluated on the way with the NumPy kernels, so that a Reshape's target shape is known;
the nodes stay in the graph and still run. The executor compiles one specialization per set
of input shapes and caches it.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ...graph.graph import CONSTANT, INPUT, OUTPUT, Graph
from ...graph.registry import get, infer
from ...graph.types import TensorType, Value

SMALL = 64
"""Largest integer result evaluated while specializing (shape tensors are tiny)."""


def specialize(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
    """A copy of `graph` whose inputs have `shapes` and every type is inferred from them."""
    from ..numpy import evaluate_node

    g = graph.copy()
    known: dict[Value, Any] = {}
    for node in g.nodes():
        if node.op in (CONSTANT, OUTPUT):
            continue
        if node.op == INPUT:
            old = node.outputs[0]
            new = TensorType(tuple(int(d) for d in shapes[node.name]), old.dtype, old.encoding)
            node.outputs = [new]
            node.attrs["type"] = new
            continue
        values = g.inputs_of(node.name)
        types = [g.type_of(v) if v is not None else None for v in values]
        consts = [None if v is None else g.constant_value(v) if g.constant_value(v) is not None else known.get(v)
                  for v in values]
        logical = types if node.op in ("Pack", "Unpack") else [
            None if t is None else t.logical() for t in types]
        outs = infer(node.op, node.attrs, logical, consts, node)
        node.outputs = [TensorType(o.shape, o.dtype, old.encoding if old.encoding is not None else None)
                        for o, old in zip(outs, node.outputs)]
        value = _shape_value(node, types, consts, values, evaluate_node)
        if value is not None:
            known[Value(node.name)] = value
    return g


def _shape_value(node: Any, types: list, consts: list, values: list, evaluate: Any) -> np.ndarray | None:
    """The result of a shape computation, when the inputs decide it."""
    opdef = get(node.op, node)
    if opdef.static_value is not None and all(t is None or t.is_static for t in types):
        value = opdef.static_value(node.attrs, types)
        if value is not None:
            return np.asarray(value)
    out = node.outputs[0] if len(node.outputs) == 1 else None
    if out is None or out.encoding is not None or out.dtype.kind not in "iu" or not out.is_static:
        return None
    if (out.numel() or 0) > SMALL or any(v is not None and c is None for v, c in zip(values, consts)):
        return None
    return evaluate(node, consts)[0]
