"""Reshapes composed, and merges of leading dims sunk below the ops that treat them as batch
or as rows.

compose_reshapes: a Reshape of a Reshape reads the first one's input (a reshape depends only
on the element order), and a Reshape to its input's own shape is its input.

sink_batch_merges: attention written for `bmm` (transformers' XGLM, DPT's ViT) merges batch
and heads, (B, H, T, D) -> (B*H, T, D), and splits them again after; a Linear layer traced
by torch merges every leading dim into rows, (N, H, W, C) -> (N*H*W, C), runs `addmm` and
splits them again. On the layouts that write the heads in place ((B, T, H, D) buffers), or
that tile a map's channels ((N, C/16, H, W, 16) buffers), that merge is a copy no encoding
can view. A merge of leading dims with one reader moves below it when the reader treats the
merged dim as a batch or as rows:
- a Transpose that keeps it first;
- Softmax or LogSoftmax over a later axis;
- an elementwise op whose other operands do not reach the merged dim (a scale, a bias);
- a MatMul of two merges of equal leading dims (the batched product runs on both);
- a MatMul or a Gemm whose weight is a matrix (each row of the merge is multiplied alone).
  A Gemm becomes that MatMul followed by the Add of its bias, as torch.onnx writes a Linear
  layer of a map (only alpha = beta = 1, not transA, a bias that does not vary by row).
  A merge that also reshapes the other dims into the matrix's columns (an attention's heads
  merged for its output projection, (B, T, H, D) -> (B*T, H*D)) is split in two: the
  columns reshaped alone ((B, T, H*D)), the rows merge sunk.
The moved merge meets the reshape that splits it again and composes away, so the attention
runs 4-D as BERT's does and a Linear layer reads the map as it is, and the layouts fold.
Static, non-empty shapes and unencoded values only (layout/ owns encoded ones).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import DEQUANTIZED, Graph, Node
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


def _merged(graph: Graph, value: Value | None, rows: bool = False) -> tuple[Value, tuple[int, ...]] | None:
    """The input of the Reshape producing `value` and the leading dims of it the Reshape
    merges (two or more) into its first dim, keeping the others (static, unencoded), when
    `value` has one reader; else None. With `rows`, a merge into a matrix may also reshape
    the other dims into its columns (the heads of an attention merged for its output
    projection: (B, T, H, D) -> (B*T, H*D))."""
    if value is None or len(graph.users(value)) != 1:
        return None
    reshape = graph.node(value.node)
    if reshape.op != "Reshape" or not _static(reshape.outputs[0]):
        return None
    x = graph.inputs_of(reshape.name)[0]
    if x is None or not _static(graph.type_of(x)):
        return None
    s, out = graph.type_of(x).shape, reshape.outputs[0].shape
    j = len(s) - len(out) + 1  # the number of dims merged
    if j >= 2 and tuple(out) == (int(np.prod(s[:j])), *s[j:]):
        return x, tuple(s[:j])
    if rows and len(out) == 2:
        j = next((j for j in range(len(s) - 1, 1, -1) if int(np.prod(s[:j])) == out[0]), 0)
        return (x, tuple(s[:j])) if j else None
    return None


@dataclass
class _Plan:
    """How a node reading a merge at operand 0 runs on the unmerged operands: `op` on
    `inputs` (the first viewed as `view` first, where given) with `attrs`, giving `result`,
    then `bias` added (a Gemm's C)."""

    op: str
    inputs: list[Value | None]
    attrs: dict
    result: TensorType
    bias: Value | None = None
    view: tuple[int, ...] | None = None


def _unmerged(node: Node, graph: Graph) -> _Plan | None:
    """The plan of `node` reading a merge at operand 0 (and MatMul at 1 too), or None where
    it cannot run on the unmerged operands."""
    inputs = graph.inputs_of(node.name)
    if not inputs or len(node.outputs) != 1 or not _static(node.outputs[0]):
        return None  # (an op run by onnx.reference may read nothing)
    matrix = len(inputs) > 1 and inputs[1] is not None and graph.type_of(inputs[1]).rank == 2
    found = _merged(graph, inputs[0], rows=node.op in ("MatMul", "Gemm") and matrix)
    if found is None:
        return None
    x, lead = found
    out = node.outputs[0]
    rank = out.rank
    extra = len(lead) - 1  # dims the merged one becomes beyond itself
    unmerged = TensorType((*lead, *out.shape[1:]), out.dtype)
    if node.op == "Transpose":
        perm = tuple(node.attrs.get("perm") or reversed(range(rank)))
        if perm[0] != 0:
            return None
        perm = (*range(len(lead)), *(p + extra for p in perm[1:]))
        return _Plan(node.op, [x], {**node.attrs, "perm": perm}, unmerged)
    if node.op in ("Softmax", "LogSoftmax"):
        axis = int(node.attrs.get("axis", -1)) % rank
        return _Plan(node.op, [x], {**node.attrs, "axis": axis + extra}, unmerged) if axis else None
    merged = graph.type_of(inputs[0]).shape
    view = None if graph.type_of(x).shape[len(lead):] == merged[1:] else (*lead, *merged[1:])
    if node.op == "MatMul":
        if matrix:
            return _Plan(node.op, [x, inputs[1]], dict(node.attrs), unmerged, view=view)
        other = _merged(graph, inputs[1])
        if other is None or other[1] != lead or graph.type_of(other[0]).rank != graph.type_of(x).rank:
            return None
        return _Plan(node.op, [x, other[0]], dict(node.attrs), unmerged)
    if node.op == "Gemm":
        plan = _linear(graph, node, x, unmerged)
        if plan is not None:
            plan.view = view
        return plan
    opdef = get(node.op, node)
    if opdef.layout == "agnostic" and all(v is None or graph.type_of(v).rank < rank for v in inputs[1:]):
        return _Plan(node.op, [x, *inputs[1:]], dict(node.attrs), unmerged)
    return None


def _linear(graph: Graph, gemm: Node, x: Value, unmerged: TensorType) -> _Plan | None:
    """A Gemm of a merge as MatMul(x, B) + C, where that computes the same."""
    a = gemm.attrs
    inputs = graph.inputs_of(gemm.name)
    bias = inputs[2] if len(inputs) > 2 else None
    if a.get("transA", 0) or float(a.get("alpha", 1.0)) != 1.0:
        return None
    if bias is not None:
        c = graph.type_of(bias)
        if float(a.get("beta", 1.0)) != 1.0 or (c.rank == 2 and c.shape[0] != 1):
            return None
    weight = inputs[1]
    if a.get("transB", 0):
        if DEQUANTIZED in graph.node(weight.node).attrs:
            return None  # a folded Transpose would forget the integers a writer stores
        t = graph.type_of(weight)
        weight = Value(graph.add_node("Transpose", [weight], [TensorType(t.shape[::-1], t.dtype)], {"perm": (1, 0)},
                                      name=f"{gemm.name}_weight", origin=gemm.origin or gemm.name).name)
    return _Plan("MatMul", [x, weight], {}, unmerged, bias)


def _sink(graph: Graph) -> PassResult:
    modified = False
    for node in graph.nodes():
        plan = _unmerged(node, graph) if node.name in graph else None
        if plan is None:
            continue
        origin = node.origin or node.name
        if plan.view is not None:
            x = plan.inputs[0]
            t = TensorType(plan.view, graph.type_of(x).dtype)
            plan.inputs[0] = Value(graph.add_node("Reshape", [x, _shape(graph, t, node)], [t], name=f"{node.name}_rows",
                                                  origin=origin).name)
        result = Value(graph.add_node(plan.op, plan.inputs, [plan.result], plan.attrs, name=node.name,
                                      origin=origin).name)
        if plan.bias is not None:
            result = Value(graph.add_node("Add", [result, plan.bias], [plan.result], name=f"{node.name}_bias",
                                          origin=origin).name)
        merge = graph.add_node("Reshape", [result, _shape(graph, node.outputs[0], node)],
                               [node.outputs[0]], name=f"{node.name}_merged", origin=origin,
                               out_names=node.out_names)
        graph.replace_all_uses(Value(node.name), Value(merge.name))
        graph.remove_node(node.name)
        modified = True
    return PassResult(graph, modified)


sink_batch_merges = Pass("sink_batch_merges", _sink)
