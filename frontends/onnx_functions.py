"""Ops newer than the canonical opset, expanded into the ONNX functions that define them, so
that onnx's version converter can then bring the model down to opset 21.

Opset 23 added RMSNormalization, RotaryEmbedding and Attention (torch.onnx writes them for
Llama-like models when asked for opset 23), later opsets Swish, SwiGLU, LinearAttention and
CausalConvWithState. Each schema defines its op as a function of older ops; onnx.inliner
expands it, with the types from onnx shape inference that the context-dependent bodies
(Attention's, RMSNormalization's) are built from. A newer op without such a body (BitCast,
CumProd, TensorScatter) is a one-line UnsupportedOpError naming it.
"""
from __future__ import annotations

import onnx
from onnx import defs, helper, inliner, shape_inference

from ..graph.errors import ModelError, UnsupportedOpError
from ..graph.registry import CANONICAL_OPSET
from .onnx_read import checker_message, node_label
from .onnx_values import DEFAULT_DOMAINS

MAX_ROUNDS = 4
"""A function body may use another newer op; each round expands one level."""


def newer_ops(model: onnx.ModelProto) -> dict[str, str]:
    """Default-domain ops of the graph that no opset up to CANONICAL_OPSET has: op -> the
    label of its first node."""
    found: dict[str, str] = {}
    for i, node in enumerate(model.graph.node):
        if node.domain in DEFAULT_DOMAINS and node.op_type not in found and not defs.has(
                node.op_type, CANONICAL_OPSET, ""):
            found[node.op_type] = node_label(node, i)
    return found


def expand_newer_ops(model: onnx.ModelProto, version: int, label: str) -> onnx.ModelProto:
    """`model` (default opset `version`) with every op newer than CANONICAL_OPSET replaced by
    its function body, recursively."""
    for _ in range(MAX_ROUNDS):
        found = newer_ops(model)
        if not found:
            return model
        for op, where in found.items():
            schema = defs.get_schema(op, version, "")
            if not (schema.has_function or schema.has_context_dependent_function):
                raise UnsupportedOpError(
                    f"{label}: {where}: op {op} (opset {schema.since_version}) is newer than opset "
                    f"{CANONICAL_OPSET} and has no ONNX function body to expand it into older ops")
            model = _inline(model, version, op, where, label)
    raise ModelError(f"{label}: ops newer than opset {CANONICAL_OPSET} still left after {MAX_ROUNDS} "
                     f"expansions: {', '.join(sorted(newer_ops(model)))}")


def _inline(model: onnx.ModelProto, version: int, op: str, where: str, label: str) -> onnx.ModelProto:
    """Every node of `op` replaced by its schema's function body (the model's value types
    left as they were: shape inference types the body's values later)."""
    try:
        out = inliner.inline_selected_functions(_typed(_with_defaults(model, version, op)), [("", op)],
                                                inline_schema_functions=True)
    except Exception as exc:
        raise ModelError(f"{label}: {where}: cannot expand op {op} into opset-{CANONICAL_OPSET} ops: "
                         f"{checker_message(exc)}") from None
    flow = sorted(_control_flow(out) - _control_flow(model))
    if flow:
        raise UnsupportedOpError(f"{label}: {where}: op {op} is defined by an ONNX function that runs "
                                 f"{flow[0]} (control flow), which tilefold does not support")
    del out.graph.value_info[:]
    out.graph.value_info.extend(model.graph.value_info)
    return out


def _control_flow(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)}


def _typed(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose values carry the types onnx shape inference gives them, initializers
    included (shape inference leaves those out, and the inliner builds context-dependent
    bodies from the types of their operands)."""
    typed = shape_inference.infer_shapes(model, data_prop=True)
    known = {v.name for v in (*typed.graph.input, *typed.graph.value_info, *typed.graph.output)}
    typed.graph.value_info.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in typed.graph.initializer if t.name not in known)
    if any(not name for node in typed.graph.node for name in node.input):
        # An optional input left out before a given one ("") has no type, and the inliner
        # asks for the type of every input name: an empty type says "absent" to the body.
        typed.graph.value_info.add().name = ""
    return typed


def _with_defaults(model: onnx.ModelProto, version: int, op: str) -> onnx.ModelProto:
    """A copy whose nodes of `op` spell out every attribute the schema gives a default: the
    inliner leaves a body's reference to an attribute the node does not set unresolved (SwiGLU's
    `alpha` became a Constant with no value)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if node.op_type != op or node.domain not in DEFAULT_DOMAINS:
            continue
        present = {a.name for a in node.attribute}
        for name, attr in defs.get_schema(node.op_type, version, "").attributes.items():
            default = attr.default_value
            if name not in present and default.type != onnx.AttributeProto.UNDEFINED:
                node.attribute.add().CopyFrom(default)
                node.attribute[-1].name = name
    return out
