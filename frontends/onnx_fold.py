"""Shape inference that sees through constant arithmetic.

onnx's data propagation follows shape values through Shape, Gather, Slice, Concat and a
few more ops, but not through arithmetic that exporters emit (torch's `Mod(c, c)` slice
bounds in attention, `Range(0, Size(Shape(x)))` axes in expanded functions), and then a
Reshape's or a reduction's rank is lost. So inference also runs on a copy of the model in
which every node computable from small constants, and every Shape or Size of a tensor
whose shape is static, has been replaced by its value (evaluated with onnx.reference);
the types it finds are copied back. The model itself keeps every node: folding for real
is a pass of its own (graph/passes/fold.py), run on the Graph.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ..graph.registry import CANONICAL_OPSET
from .onnx_values import DEFAULT_DOMAINS, constant_node_value

FOLD_LIMIT = 4096
"""Largest constant (in elements) that is folded: shape arithmetic is far smaller."""

_NONDETERMINISTIC = {
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
}


def _count(values: list[np.ndarray | None], index: int) -> int:
    value = values[index] if index < len(values) else None
    return int(np.prod(value, dtype=np.int64)) if value is not None else 0


def _range_size(values: list[np.ndarray | None]) -> int:
    start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in values[:3])
    return int(np.ceil((limit - start) / delta)) if delta else FOLD_LIMIT + 1


# Ops whose result size is set by input values, checked before evaluating them.
_RESULT_SIZE: dict[str, Callable[[list[np.ndarray | None]], int]] = {
    "ConstantOfShape": lambda v: _count(v, 0),
    "Expand": lambda v: max(_count(v, 1), v[0].size),
    "Tile": lambda v: v[0].size * _count(v, 1),
    "Range": _range_size,
}


def folded_values(
    model: onnx.ModelProto,
    static_shapes: dict[str, tuple[int, ...]] | None = None,
    known: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Values of the tensors that small constants determine, by name (computed nodes only).

    `static_shapes` (from a previous inference) makes Shape and Size of a static tensor
    constants too; `known` holds values folded before, which are not evaluated again.
    """
    static_shapes = static_shapes or {}
    known = known or {}
    constants: dict[str, np.ndarray] = {}
    for tensor in model.graph.initializer:
        if _elements(tensor.dims) <= FOLD_LIMIT:
            constants[tensor.name] = numpy_helper.to_array(tensor)
    folded: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        if node.domain not in DEFAULT_DOMAINS or node.op_type in _NONDETERMINISTIC:
            continue
        if node.op_type == "Constant":
            if _constant_elements(node) <= FOLD_LIMIT:
                constants[node.output[0]] = constant_node_value(node, node.name)
            continue
        outputs = [o for o in node.output if o]
        if outputs and all(o in known for o in outputs):
            results = {o: known[o] for o in outputs}
        else:
            results = _fold(node, constants, static_shapes)
        if results is not None:
            constants.update(results)
            folded.update(results)
    return folded


def _fold(
    node: onnx.NodeProto, constants: dict[str, np.ndarray], static_shapes: dict[str, tuple[int, ...]]
) -> dict[str, np.ndarray] | None:
    """The node's results, when its inputs are known and they are small; None otherwise."""
    names = [n for n in node.input if n]
    if node.op_type in ("Shape", "Size") and names and names[0] in static_shapes:
        shape = static_shapes[names[0]]
        if node.op_type == "Size":
            return {node.output[0]: np.array(int(np.prod(shape, dtype=np.int64)), np.int64)}
        attrs = {a.name: a.i for a in node.attribute}
        return {node.output[0]: np.array(shape[attrs.get("start", 0):attrs.get("end")], np.int64)}
    if not names or any(n not in constants for n in names):
        return None
    values = [constants[n] if n else None for n in node.input]
    size = _RESULT_SIZE.get(node.op_type)
    try:
        if size is not None and size(values) > FOLD_LIMIT:
            return None
        results = _evaluate(node, values)
    except Exception:  # an op onnx.reference cannot run here: inference goes without it
        return None
    if all(isinstance(v, np.ndarray) and v.size <= FOLD_LIMIT for v in results.values()):
        return results
    return None


def static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Tensors whose inferred shape is fully static, by name."""
    shapes: dict[str, tuple[int, ...]] = {}
    graph = model.graph
    for info in (*graph.input, *graph.value_info, *graph.output):
        tensor = info.type.tensor_type
        if info.type.HasField("tensor_type") and tensor.HasField("shape"):
            if all(d.HasField("dim_value") for d in tensor.shape.dim):
                shapes[info.name] = tuple(int(d.dim_value) for d in tensor.shape.dim)
    return shapes


def without_folded_nodes(model: onnx.ModelProto, folded: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy whose nodes that `folded` fully determines are initializers instead."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = list(copy.graph.node)
    gone = [bool(n.output) and all(not o or o in folded for o in n.output) for n in nodes]
    del copy.graph.node[:]
    copy.graph.node.extend(n for n, g in zip(nodes, gone) if not g)
    dropped = {o for n, g in zip(nodes, gone) if g for o in n.output if o}
    copy.graph.initializer.extend(numpy_helper.from_array(folded[name], name) for name in dropped)
    return copy


def _evaluate(node: onnx.NodeProto, values: list[np.ndarray | None]) -> dict[str, np.ndarray]:
    """Run one node at the canonical opset with onnx.reference."""
    feeds = {name: value for name, value in zip(node.input, values) if name}
    function = helper.make_function(
        "tilefold.fold", "node", list(feeds), [o for o in node.output if o], [node],
        opset_imports=[helper.make_opsetid("", CANONICAL_OPSET)],
    )
    outputs = ReferenceEvaluator(function).run(None, feeds, attributes={})
    return {name: np.asarray(v) for name, v in zip([o for o in node.output if o], outputs)}


def _elements(dims) -> int:
    return int(np.prod([int(d) for d in dims], dtype=np.int64))


def _constant_elements(node: onnx.NodeProto) -> int:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            return _elements(attr.t.dims)
        if attr.type == onnx.AttributeProto.SPARSE_TENSOR:
            return _elements(attr.sparse_tensor.dims)
        if attr.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS):
            return len(attr.ints) + len(attr.floats) + len(attr.strings)
    return 1
