"""split_projections: a Split of a Linear layer's features, read through a permute, becomes
one Linear layer per piece.

FocalNet's modulation computes its query, context and gates with one Linear layer (2C + L + 1
features), views the result as a channels-last map, permutes it to NCHW and splits the
channels. The pieces are then channel slices of one channels-last buffer, and each reader
wants its own layout: on the gpu target the L + 1 gates are not whole channel tiles, so the
Split stays channels-last and the query and context are copied into the NCHWc16 their conv
and product read (three copies per block). With one Linear layer per piece, each writes its
piece in the layout its readers ask for (layout/propagate's rule 2b), for the same FLOPs and
weight bytes (the weight's columns are sliced at compile time).

Only where the chain between the Linear layer and the Split moves the features off the last
dim (a Transpose): a Split of the last dim (GPT-2's query, key and value) reads column blocks
of the result in place on every target, and is left alone. The chain holds Reshapes and
Transposes, each result read by nothing else; the weights and bias are constants.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import CONSTANT, DEQUANTIZED, Graph, Node
from ..ops.shapes import norm_axis
from ..ops.tensor import transpose_perm
from ..types import TensorType, Value, as_array
from .pipeline import Pass, PassResult


def plain(t: TensorType) -> bool:
    """A static type with no encoding: a Linear layer's operands and results these passes change."""
    return t.is_static and t.encoding is None


def axis_before_reshape(t_in: TensorType, t_out: TensorType, axis: int) -> int | None:
    """The input dim that a reshape leaves as its result's dim `axis` (same size, same
    row-major stride), or None."""
    after = int(np.prod(t_out.shape[axis + 1:], dtype=np.int64))
    for d, size in enumerate(t_in.shape):
        if size == t_out.shape[axis] and int(np.prod(t_in.shape[d + 1:], dtype=np.int64)) == after:
            return d
    return None


def constant_weights(graph: Graph, value: Value | None) -> np.ndarray | None:
    """A constant's value, unless it stands for a dequantized one (kept whole)."""
    if value is None:
        return None
    node = graph.node(value.node)
    if node.op != CONSTANT or node.attrs.get(DEQUANTIZED) is not None:
        return None
    return as_array(node.attrs["value"])


@dataclass
class Projection:
    """The Gemm or MatMul behind a Split, its weights and bias, and the chain from it to the
    Split: each node with the axis of its result that becomes the split axis."""

    anchor: Node
    weights: np.ndarray
    bias: np.ndarray | None
    chain: list[tuple[Node, int]]
    axis: int  # the Split's
    bias_add: Node | None = None  # the Add of `bias` after a MatMul anchor; None: the Gemm's C


def _projection(graph: Graph, split: Node) -> Projection | None:
    """`split`'s Projection, or None where the pattern does not hold."""
    x = graph.inputs_of(split.name)[0]
    t = graph.type_of(x)
    if not plain(t) or not all(plain(o) for o in split.outputs):
        return None
    split_axis = axis = norm_axis(split.attrs.get("axis", 0), t.rank)
    chain: list[tuple[Node, int]] = []
    bias_add: Node | None = None  # the Add of a MatMul's bias (torch.onnx's Linear layer)
    while True:
        producer = graph.node(x.node)
        if len(graph.users(x)) != 1 or len(producer.outputs) != 1 or not plain(producer.outputs[0]):
            return None
        if producer.op in ("Gemm", "MatMul"):
            break
        if producer.op == "Add" and bias_add is None:
            anchor = graph.node(graph.inputs_of(producer.name)[0].node)
            if (anchor.op == "MatMul" and len(graph.users(Value(anchor.name))) == 1
                    and anchor.outputs[0].shape == producer.outputs[0].shape):
                bias_add, x = producer, Value(anchor.name)
                continue
        inputs = graph.inputs_of(producer.name)
        source = inputs[0] if inputs else None
        if source is None or not plain(graph.type_of(source)):
            return None
        chain.insert(0, (producer, axis))
        if producer.op == "Transpose":
            axis = transpose_perm(producer.attrs, producer.outputs[0].rank)[axis]
        elif producer.op == "Reshape":
            found = axis_before_reshape(graph.type_of(source), producer.outputs[0], axis)
            if found is None:
                return None
            axis = found
        else:
            return None
        x = source
    out = producer.outputs[0]
    if axis != out.rank - 1 or not any(node.op == "Transpose" and a != node.outputs[0].rank - 1 for node, a in chain):
        return None
    operands = graph.inputs_of(producer.name)
    b = constant_weights(graph, operands[1])
    if b is None or b.ndim != 2 or (producer.op == "Gemm" and producer.attrs.get("transA", 0)):
        return None
    bias = graph.inputs_of(bias_add.name)[1] if bias_add is not None else (operands[2] if len(operands) > 2 else None)
    c = constant_weights(graph, bias)
    if bias is not None and (c is None or c.ndim > out.rank):
        return None
    return Projection(producer, b, c, chain, split_axis, bias_add)


def _piece(graph: Graph, found: Projection, start: int, size: int, k: int) -> Value:
    """The anchor and its chain for features [start, start + size): the piece's value."""
    anchor = found.anchor
    operands = graph.inputs_of(anchor.name)
    transposed = anchor.op == "Gemm" and anchor.attrs.get("transB", 0)
    columns = found.weights[start:start + size] if transposed else found.weights[:, start:start + size]
    inputs = [operands[0], graph.add_constant(np.ascontiguousarray(columns), name=f"{operands[1].node}_{k}")]
    bias = None
    if found.bias is not None:
        c = found.bias
        if c.ndim and c.shape[-1] == anchor.outputs[0].shape[-1]:
            c = np.ascontiguousarray(c[..., start:start + size])
        bias = graph.add_constant(c, name=f"{anchor.name}_bias_{k}")
    out = anchor.outputs[0]
    piece = TensorType(out.shape[:-1] + (size,), out.dtype)
    gemm_bias = [bias] if bias is not None and found.bias_add is None else []
    value = Value(graph.add_node(anchor.op, inputs + gemm_bias, [piece], dict(anchor.attrs),
                                 name=f"{anchor.name}_{k}", origin=anchor.origin).name)
    if found.bias_add is not None:
        add = found.bias_add
        value = Value(graph.add_node("Add", [value, bias], [piece], name=f"{add.name}_{k}", origin=add.origin).name)
    for node, axis in found.chain:
        t = node.outputs[0]
        shape = t.shape[:axis] + (size,) + t.shape[axis + 1:]
        extra = [graph.add_constant(np.array(shape, np.int64), name=f"{node.name}_{k}_shape")] if node.op == "Reshape" else []
        value = Value(graph.add_node(node.op, [value, *extra], [TensorType(shape, t.dtype)], dict(node.attrs),
                                     name=f"{node.name}_{k}", origin=node.origin).name)
    return value


def _split_projections(graph: Graph) -> PassResult:
    changed = False
    for split in graph.nodes():
        if split.op != "Split" or split.name not in graph:
            continue
        found = _projection(graph, split)
        if found is None:
            continue
        start = 0
        for k, piece in enumerate(split.outputs):
            size = int(piece.shape[found.axis])
            graph.replace_all_uses(Value(split.name, k), _piece(graph, found, start, size, k))
            start += size
        graph.remove_node(split.name)
        changed = True
    return PassResult(graph, changed)


split_projections = Pass("split_projections", _split_projections)
