"""gather_rotations: a Concat of pieces of one tensor along one axis, some negated, becomes one
Gather of that tensor by the pieces' indices (times a constant sign where a piece is negated;
a target asks for it: `Target.kernel_passes`).

Rotary embeddings rotate half of each head: rotate_half(x) = Concat(-x[..., h:], x[..., :h]),
two Slices, a Neg and a Concat; the Triton backend ran each Slice as a kernel of its own
before the Concat's. As Mul(Gather(x, [h, ..., d - 1, 0, ..., h - 1]), [-1, ..., 1, ...]) it
is one movement op and one elementwise op, read at the rotary product's own index, which the
fusion puts into the one kernel of `x * cos + rotate_half(x) * sin` (LLaMA, Mistral, Qwen2,
Gemma, Phi, GPT-NeoX, Falcon: two kernels fewer a layer for each of the query and the key).

Rewritten: a Concat whose every operand is a Slice of one tensor along the Concat's axis only
(constant starts, ends and steps, a static extent), or a Neg of such a Slice read by the Concat
alone, two operands at least. The Gather's indices are the pieces' indices in order, as the
NumPy kernels compute them, so the result is the same bit for bit (a negated float times -1.0
is its Neg).
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph, Node
from ..ops.tensor import slice_bounds
from ..types import TensorType, Value, is_float_dtype
from .pipeline import Pass, PassResult


def _indices(graph: Graph, node: Node, axis: int) -> tuple[Value, np.ndarray] | None:
    """A Slice along `axis` alone with constant starts, ends and steps: its operand and the
    indices it takes (clamped as ONNX clamps them); else None."""
    if node.op != "Slice":
        return None
    values = list(graph.inputs_of(node.name)) + [None] * 5
    x = values[0]
    if x is None:
        return None
    t = graph.type_of(x)
    consts = [graph.constant_value(v) if v is not None else None for v in values[1:5]]
    if consts[0] is None or consts[1] is None or (values[3] is not None and consts[2] is None) or \
            (values[4] is not None and consts[3] is None):
        return None
    starts, ends = (np.asarray(c).reshape(-1) for c in consts[:2])
    axes = np.asarray(consts[2]).reshape(-1) if values[3] is not None else np.arange(len(starts))
    steps = np.asarray(consts[3]).reshape(-1) if values[4] is not None else np.ones(len(starts), np.int64)
    if len(axes) != 1 or int(axes[0]) % t.rank != axis or not isinstance(t.shape[axis], int):
        return None
    size = int(t.shape[axis])
    start, end, step = (int(v) for v in (starts[0], ends[0], steps[0]))
    if step == 0:
        return None
    return x, np.arange(*slice_bounds(size, start, end, step), step, dtype=np.int64)


def _piece(graph: Graph, value: Value, concat: Node, axis: int) -> tuple[Value, np.ndarray, bool] | None:
    """A Concat operand that is a Slice of a tensor along `axis`, or its Neg read here alone:
    the tensor, the indices, and whether negated."""
    node = graph.node(value.node)
    negated = node.op == "Neg"
    if negated:
        if {user for user, _ in graph.users(value)} != {concat.name}:
            return None
        inner = graph.inputs_of(node.name)[0]
        if inner is None:
            return None
        node = graph.node(inner.node)
    found = _indices(graph, node, axis)
    return None if found is None else (found[0], found[1], negated)


def _gather_rotations(graph: Graph) -> PassResult:
    changed = False
    for concat in list(graph.nodes()):
        if concat.op != "Concat" or len(graph.inputs_of(concat.name)) < 2:
            continue
        out = concat.outputs[0]
        axis = int(concat.attrs.get("axis", 0)) % out.rank
        pieces = [_piece(graph, v, concat, axis) if v is not None else None for v in graph.inputs_of(concat.name)]
        if any(p is None for p in pieces) or len({p[0] for p in pieces}) != 1:  # type: ignore[index]
            continue
        x = pieces[0][0]  # type: ignore[index]
        negated = any(p[2] for p in pieces)  # type: ignore[index]
        if negated and not is_float_dtype(out.dtype):
            continue
        indices = np.concatenate([p[1] for p in pieces])  # type: ignore[index]
        index = graph.add_constant(indices, name=f"{concat.name}_indices")
        gathered = graph.add_node("Gather", [x, index], [TensorType(out.shape, out.dtype)], {"axis": axis},
                                  name=f"{concat.name}_gather", origin=concat.origin)
        result = Value(gathered.name)
        if negated:
            sign = np.concatenate([np.full(len(p[1]), -1.0 if p[2] else 1.0) for p in pieces])  # type: ignore[index]
            shape = (len(sign),) + (1,) * (out.rank - 1 - axis)
            signs = graph.add_constant(sign.astype(out.dtype).reshape(shape), name=f"{concat.name}_signs")
            result = Value(graph.add_node("Mul", [result, signs], [TensorType(out.shape, out.dtype)], {},
                                          name=f"{concat.name}_signed", origin=concat.origin).name)
        graph.replace_all_uses(Value(concat.name), result)
        graph.remove_node(concat.name)
        changed = True
    return PassResult(graph, changed)


gather_rotations = Pass("gather_rotations", _gather_rotations)
