"""Reshapes composed, and merges of leading batch dims sunk below the ops that treat them as
batch.

compose_reshapes: a Reshape of a Reshape reads the first one's input (a reshape depends only
on the element order), and a Reshape to its input's own shape is its input.

sink_batch_merges: attention written for `bmm` (transformers' XGLM, DPT's ViT) merges batch
and heads, (B, H, T, D) -> (B*H, T, D), and splits them again after. On the layouts that
write the heads in place ((B, T, H, D) buffers), that merge is a copy no encoding can view. A
merge with one reader moves below it when the reader treats the merged dim as a batch:
- a Transpose that keeps it first;
- Softmax or LogSoftmax over a later axis;
- an elementwise op whose other operands do not reach the merged dim (a scale, a bias);
- a MatMul of two merges of equal leading dims (the batched product runs on both).
The moved merge meets the reshape that splits it again and composes away, so the attention
runs 4-D as BERT's does, and its head transposes fold into the layouts. Static, non-empty
shapes and unencoded values only (layout/ owns encoded ones).
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Node
from ..registry import get
from ..types import TensorType, Value
from .pipeline import Pass, PassResult


def _static(t: TensorType) -> bool:
    """Static, unencoded and not empty (a 0 in a Reshape's shape would copy an input dim)."""
    return t.is_static and t.encoding is None and 0 not in t.shape


def _compose(graph: Graph) -> PassResult:
    modified = False
    for node in graph.nodes():
        if node.op != "Reshape" or node.name not in graph or not _static(node.outputs[0]):
            continue
        source = graph.inputs_of(node.name)[0]
        inner = graph.node(source.node) if source is not None else None
        if inner is not None and inner.op == "Reshape" and _static(inner.outputs[0]):
            x = graph.inputs_of(inner.name)[0]
            if x is not None and _static(graph.type_of(x)):
                graph.set_input(node.name, 0, x)
                graph.set_input(node.name, 1, _shape(graph, node.outputs[0], node))
                source, modified = x, True
        if source is not None and graph.type_of(source) == node.outputs[0]:
            graph.replace_all_uses(Value(node.name), source)
            graph.remove_node(node.name)
            modified = True
    return PassResult(graph, modified)


compose_reshapes = Pass("compose_reshapes", _compose)


def _shape(graph: Graph, t: TensorType, node: Node) -> Value:
    return graph.add_constant(np.array(t.shape, np.int64), name=f"{node.name}_shape")


def _merged(graph: Graph, value: Value | None) -> Value | None:
    """The input of the Reshape producing `value` when it merges the input's two leading dims
    (rank 3 or more, static, unencoded) and `value` has one reader; else None."""
    if value is None or len(graph.users(value)) != 1:
        return None
    reshape = graph.node(value.node)
    if reshape.op != "Reshape" or not _static(reshape.outputs[0]):
        return None
    x = graph.inputs_of(reshape.name)[0]
    if x is None or not _static(graph.type_of(x)):
        return None
    s, out = graph.type_of(x).shape, reshape.outputs[0].shape
    if len(s) < 3 or tuple(out) != (s[0] * s[1], *s[2:]):
        return None
    return x


def _unmerged(node: Node, graph: Graph) -> tuple[list[Value | None], dict, TensorType] | None:
    """How `node`, reading a merge at operand 0 (and MatMul at 1 too), runs on the unmerged
    operands: its inputs, attributes and result type; None where it cannot."""
    inputs = graph.inputs_of(node.name)
    x = _merged(graph, inputs[0]) if inputs else None  # an op run by onnx.reference may read nothing
    if x is None or len(node.outputs) != 1 or not _static(node.outputs[0]):
        return None
    lead = graph.type_of(x).shape[:2]
    out = node.outputs[0]
    rank = out.rank
    unmerged = TensorType((*lead, *out.shape[1:]), out.dtype)
    if node.op == "Transpose":
        perm = tuple(node.attrs.get("perm") or reversed(range(rank)))
        if perm[0] != 0:
            return None
        return [x], {**node.attrs, "perm": (0, 1, *(p + 1 for p in perm[1:]))}, unmerged
    if node.op in ("Softmax", "LogSoftmax"):
        axis = int(node.attrs.get("axis", -1)) % rank
        return ([x], {**node.attrs, "axis": axis + 1}, unmerged) if axis else None
    if node.op == "MatMul":
        y = _merged(graph, inputs[1])
        if y is None or graph.type_of(y).shape[:2] != lead or graph.type_of(y).rank != graph.type_of(x).rank:
            return None
        return [x, y], dict(node.attrs), unmerged
    opdef = get(node.op, node)
    if opdef.layout == "agnostic" and all(v is None or graph.type_of(v).rank < rank for v in inputs[1:]):
        return [x, *inputs[1:]], dict(node.attrs), unmerged
    return None


def _sink(graph: Graph) -> PassResult:
    modified = False
    for node in graph.nodes():
        plan = _unmerged(node, graph) if node.name in graph else None
        if plan is None:
            continue
        inputs, attrs, unmerged = plan
        inner = graph.add_node(node.op, inputs, [unmerged], attrs, name=node.name, origin=node.origin or node.name)
        merge = graph.add_node("Reshape", [Value(inner.name), _shape(graph, node.outputs[0], node)],
                               [node.outputs[0]], name=f"{node.name}_merged", origin=node.origin or node.name,
                               out_names=node.out_names)
        graph.replace_all_uses(Value(node.name), Value(merge.name))
        graph.remove_node(node.name)
        modified = True
    return PassResult(graph, modified)


sink_batch_merges = Pass("sink_batch_merges", _sink)
