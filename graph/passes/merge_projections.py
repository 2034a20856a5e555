"""merge_projections: Linear layers that read one activation become one Linear layer and a
Split of its features (a target asks for it: `Target.kernel_passes`).

BERT's query, key and value are three MatMuls (each with its bias Add) of one normalized
activation. On the gpu target each is a kernel whose 128 x 768 result fills few of the GPU's
multiprocessors; as one 128 x 2304 product with its bias and the Split in one kernel (the
Triton matmul stores each part itself), the three become one launch with three times the
programs. GPT-2 is exported this way already (its c_attn and a Split). The merged weight is
the pieces' columns side by side, the bias likewise; the parts are the old results, for the
same FLOPs and weight bytes.

Merged: MatMuls of one plain static operand by constant 2-D plain weights (not ones that stand
for a dequantized weight, which stays whole, as in split_projections), each alone or
read only by an Add of a constant bias of its features (all members alike), two or more of
them. Gemm (torch's Linear of a matrix) is left alone, and so is a layer whose features reach,
whole, a Transpose that moves them off the last dim (FocalNet's NCHW pieces): the layers that
split_projections splits, so the two passes never undo each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Graph, Node
from ..ops.tensor import transpose_perm
from ..types import TensorType, Value
from .pipeline import Pass, PassResult
from .projections import axis_before_reshape, constant_weights, plain


@dataclass
class _Member:
    matmul: Node
    weight: np.ndarray
    bias_add: Node | None
    bias: np.ndarray | None

    @property
    def result(self) -> Value:
        return Value((self.bias_add or self.matmul).name)


def _features_leave_the_last_dim(graph: Graph, value: Value) -> bool:
    """Whether `value`'s features (its last dim) reach, whole, through Reshapes and Transposes
    each read by nothing else, a Transpose that moves them off the last dim."""
    axis = graph.type_of(value).rank - 1
    while len(graph.users(value)) == 1:
        node = graph.node(graph.users(value)[0][0])
        if node.op not in ("Transpose", "Reshape"):
            return False
        out = node.outputs[0]
        if node.op == "Transpose":
            axis = transpose_perm(node.attrs, out.rank).index(axis)
            if axis != out.rank - 1:
                return True
        elif node.op == "Reshape":
            whole = [d for d in range(out.rank) if axis_before_reshape(graph.type_of(value), out, d) == axis]
            if not whole:
                return False
            axis = whole[0]
        value = Value(node.name)
    return False


def _member(graph: Graph, node: Node) -> _Member | None:
    """`node` as a member: a MatMul of a plain static operand by a constant 2-D weight, with
    the Add of its bias where that Add alone reads it."""
    a, w = graph.inputs_of(node.name)[:2]
    weight = constant_weights(graph, w)
    if a is None or weight is None or weight.ndim != 2 or not plain(graph.type_of(a)) or \
            not plain(node.outputs[0]) or graph.type_of(a).rank < 2:
        return None
    users = graph.users(Value(node.name))
    if len(users) == 1:
        add = graph.node(users[0][0])
        others = [v for v in graph.inputs_of(add.name) if v != Value(node.name)]
        bias = constant_weights(graph, others[0]) if add.op == "Add" and len(others) == 1 else None
        if bias is not None and bias.shape == (weight.shape[1],) and bias.dtype == weight.dtype and \
                add.outputs[0].shape == node.outputs[0].shape and plain(add.outputs[0]):
            member = _Member(node, weight, add, bias)
            return None if _features_leave_the_last_dim(graph, member.result) else member
    return None if _features_leave_the_last_dim(graph, Value(node.name)) else _Member(node, weight, None, None)


def _merge(graph: Graph, members: list[_Member]) -> None:
    """One MatMul (and bias Add) computing every member's features, and a Split into them."""
    first = members[0].matmul
    a = graph.inputs_of(first.name)[0]
    out = first.outputs[0]
    sizes = [m.weight.shape[1] for m in members]
    shape = out.shape[:-1] + (sum(sizes),)
    weight = graph.add_constant(np.concatenate([m.weight for m in members], axis=1), name=f"{first.name}_merged_w")
    value = Value(graph.add_node("MatMul", [a, weight], [TensorType(shape, out.dtype)], {},
                                 name=f"{first.name}_merged", origin=first.origin).name)
    if members[0].bias_add is not None:
        bias = graph.add_constant(np.concatenate([m.bias for m in members]), name=f"{first.name}_merged_b")
        value = Value(graph.add_node("Add", [value, bias], [TensorType(shape, out.dtype)], {},
                                     name=f"{first.name}_merged_bias", origin=first.origin).name)
    parts = [TensorType(out.shape[:-1] + (size,), out.dtype) for size in sizes]
    sizes_value = graph.add_constant(np.array(sizes, np.int64), name=f"{first.name}_part_sizes")
    split = graph.add_node("Split", [value, sizes_value], parts, {"axis": -1}, name=f"{first.name}_parts",
                           origin=first.origin)
    for k, member in enumerate(members):
        graph.replace_all_uses(member.result, Value(split.name, k))
        for node in (member.bias_add, member.matmul):
            if node is not None:
                graph.remove_node(node.name)


def _merge_projections(graph: Graph) -> PassResult:
    by_operand: dict[Value, list[_Member]] = {}
    for node in graph.nodes():
        if node.op == "MatMul":
            member = _member(graph, node)
            if member is not None:
                by_operand.setdefault(graph.inputs_of(node.name)[0], []).append(member)  # type: ignore[arg-type]
    changed = False
    for members in by_operand.values():
        with_bias = [m for m in members if m.bias_add is not None]
        members = with_bias if len(with_bias) >= 2 else [m for m in members if m.bias_add is None]
        dtypes = {m.weight.dtype for m in members} | {m.matmul.outputs[0].dtype for m in members}
        if len(members) >= 2 and len(dtypes) == 1:
            _merge(graph, members)
            changed = True
    return PassResult(graph, changed)


merge_projections = Pass("merge_projections", _merge_projections)
