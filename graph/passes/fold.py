"""Constant folding and BatchNorm folding.

constant_folding(evaluate) replaces a pure node whose inputs are all constants by
constants, and a node whose result its input types decide (Shape of a static tensor):
1. ConstantOfShape and ops declared `splat="movement"` on a splat give a splat of the
   inferred shape; ops declared `splat="elementwise"` on splats give a splat of f(values):
   splats are never materialized.
2. Other nodes run through `evaluate` (the NumPy backend's kernels), unless the result
   would be much larger than its inputs (Expand, Tile: cheaper to compute at run time).
3. `forwards` ops (Identity, inference Dropout) are bypassed.
A folded constant keeps what its op's `fold_origin` says of how it was computed
(DequantizeLinear: its integers), for writers.

fold_batchnorm rewrites Conv -> BatchNormalization with constant parameters into one Conv
with scaled weights and a bias (splat parameters stay splats).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import VerifyError, where
from ..graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from ..registry import get, infer
from ..types import ConstValue, Dequantized, Splat, Value, as_array, type_of_constant
from .pipeline import Evaluate, Pass, PassResult

_SKIP = {INPUT, OUTPUT, CONSTANT}
MAX_GROWTH = 4
"""Fold only results at most this many times larger than their inputs (or small ones)."""
SMALL = 1 << 16


def constant_folding(evaluate: Evaluate) -> Pass:
    def run(graph: Graph) -> PassResult:
        modified = False
        for node in graph.nodes():
            if node.op in _SKIP or node.name not in graph:
                continue
            opdef = get(node.op, node)
            if opdef.forwards is not None:
                modified |= _bypass(graph, node, opdef.forwards)
                continue
            if not opdef.pure:
                continue
            values = fold_node(graph, node, evaluate)
            if values is not None:
                origin = None if opdef.fold_origin is None else opdef.fold_origin(
                    node.attrs, [graph.constant_value(v) for v in graph.inputs_of(node.name)])
                _replace_with_constants(graph, node, values, origin)
                modified = True
        return PassResult(graph, modified)

    return Pass("constant_folding", run)


def fold_node(graph: Graph, node: Node, evaluate: Evaluate) -> list[ConstValue] | None:
    """The constant results of `node`, or None when it cannot (or should not) be folded."""
    if any(t.encoding is not None for t in node.outputs):
        return None  # packed results are folded by layout/, which keeps their encodings
    inputs = graph.inputs_of(node.name)
    types = [graph.type_of(v) if v is not None else None for v in inputs]
    opdef = get(node.op, node)
    if opdef.static_value is not None:
        value = opdef.static_value(node.attrs, types)
        if value is not None:
            return [np.asarray(value)]
    consts = [graph.constant_value(v) for v in inputs]
    if any(v is not None and c is None for v, c in zip(inputs, consts)):
        return None
    splat = _fold_splat(node, opdef.splat, types, consts, evaluate)
    if splat is not None:
        return splat
    if not _worth_folding(node, consts):
        return None
    results = evaluate(node, consts)
    for k, (value, declared) in enumerate(zip(results, node.outputs)):
        got = type_of_constant(value)
        if got.dtype != declared.dtype or got.rank != declared.rank:
            raise VerifyError(f"folding {where(node)} gave {got} for output {k}, declared {declared}")
    return list(results)


def _fold_splat(node: Node, kind: str | None, types: list, consts: list, evaluate: Evaluate):
    data = [c for c in consts if c is not None]
    if node.op == "ConstantOfShape":
        value = node.attrs.get("value")
        scalar = np.asarray(value).reshape(-1)[0] if value is not None else np.float32(0)
        shape = [int(d) for d in np.asarray(as_array(consts[0])).reshape(-1)]
        return [Splat(scalar.item(), tuple(shape), scalar.dtype)]
    if kind is None or len(node.outputs) != 1 or not any(isinstance(c, Splat) for c in data):
        return None
    out_type = infer(node.op, node.attrs, types, consts, node)[0]
    if not out_type.is_static:
        return None
    if kind == "movement" and isinstance(consts[0], Splat):
        return [Splat(consts[0].value, out_type.shape, out_type.dtype)]
    if kind == "elementwise" and all(isinstance(c, Splat) or c.size == 1 for c in data):
        tiny = [None if c is None else np.reshape(as_array(c).reshape(-1)[:1], (1,) * c.ndim) for c in consts]
        value = evaluate(node, tiny)[0]
        return [Splat(value.reshape(-1)[0].item(), out_type.shape, value.dtype)]
    return None


def _worth_folding(node: Node, consts: Sequence[ConstValue | None]) -> bool:
    size_in = sum(int(np.prod(c.shape)) for c in consts if c is not None)
    size_out = 0
    for t in node.outputs:
        n = t.numel()
        if n is None:
            return True  # a data-dependent shape: folding is what makes it static
        size_out += n
    return size_out <= max(MAX_GROWTH * size_in, SMALL)


def _replace_with_constants(graph: Graph, node: Node, values: list[ConstValue],
                            origin: Dequantized | None = None) -> None:
    """`origin` (the op's `fold_origin`) goes with a single array result."""
    for k, value in enumerate(values):
        out = Value(node.name, k)
        if not graph.users(out):
            continue
        base = node.out_names[k] if k < len(node.out_names) else f"{node.name}_{k}"
        kept = origin if len(values) == 1 and isinstance(value, np.ndarray) else None
        const = graph.add_constant(value, name=base, dequantized=kept)
        graph.replace_all_uses(out, const)
    graph.remove_node(node.name)


def _bypass(graph: Graph, node: Node, index: int) -> bool:
    source = graph.inputs_of(node.name)[index]
    out = Value(node.name)
    extra_outputs_used = any(graph.users(Value(node.name, k)) for k in range(1, len(node.outputs)))
    if source is None or extra_outputs_used or graph.type_of(source) != graph.type_of(out):
        return False
    graph.replace_all_uses(out, source)
    graph.remove_node(node.name)
    return True


# ---- BatchNormalization into Conv -----------------------------------------------------
def _fold_batchnorm(graph: Graph) -> PassResult:
    modified = False
    for bn in graph.nodes():
        if bn.op != "BatchNormalization" or bn.name not in graph or len(bn.outputs) != 1:
            continue
        x, scale, bias, mean, var = (graph.inputs_of(bn.name) + [None] * 5)[:5]
        params = [graph.constant_value(v) for v in (scale, bias, mean, var)]
        if x is None or any(p is None for p in params) or bn.attrs.get("training_mode", 0):
            continue
        conv = graph.node(x.node)
        if conv.op != "Conv" or len(graph.users(x)) != 1:
            continue
        conv_inputs = graph.inputs_of(conv.name) + [None]
        weight, conv_bias = graph.constant_value(conv_inputs[1]), graph.constant_value(conv_inputs[2])
        if weight is None or (conv_inputs[2] is not None and conv_bias is None):
            continue
        s, b, m, v = params
        eps = float(bn.attrs.get("epsilon", 1e-5))
        factor = _apply(lambda s_, v_: s_ / np.sqrt(v_ + eps), s, v)  # per output channel
        new_weight = _scale_rows(weight, factor)
        old_bias = conv_bias if conv_bias is not None else Splat(0.0, (weight.shape[0],), weight.dtype)
        new_bias = _apply(lambda c_, m_, f_, b_: (c_ - m_) * f_ + b_, old_bias, m, factor, b)
        w = graph.add_constant(new_weight, name=f"{conv.name}_w_bn")
        c = graph.add_constant(new_bias, name=f"{conv.name}_b_bn")
        fused = graph.add_node(
            "Conv", [conv_inputs[0], w, c], [bn.outputs[0]], conv.attrs,
            name=conv.name, origin=f"{conv.origin or conv.name}+{bn.origin or bn.name}",
            out_names=bn.out_names,
        )
        graph.replace_all_uses(Value(bn.name), Value(fused.name))
        graph.remove_node(bn.name)
        graph.remove_node(conv.name)
        modified = True
    return PassResult(graph, modified)


fold_batchnorm = Pass("fold_batchnorm", _fold_batchnorm)


def _apply(fn: Any, *args: ConstValue | float) -> ConstValue:
    """fn over constants and scalars; the result stays a splat when every operand is one."""
    dtype = next(a.dtype for a in args if isinstance(a, (Splat, np.ndarray)))
    if all(isinstance(a, (Splat, float, int)) for a in args):
        shape = np.broadcast_shapes(*(a.shape for a in args if isinstance(a, Splat)))
        values = [np.asarray(a.value if isinstance(a, Splat) else a, dtype) for a in args]
        return Splat(np.asarray(fn(*values), dtype).item(), shape, dtype)
    return np.asarray(fn(*(as_array(a) if isinstance(a, (Splat, np.ndarray)) else a for a in args)), dtype)


def _scale_rows(weight: ConstValue, factor: ConstValue) -> ConstValue:
    """weight[f, ...] * factor[f]."""
    if isinstance(factor, Splat):
        factor = factor.reshape((factor.shape[0],) + (1,) * (len(weight.shape) - 1))
    else:
        factor = np.reshape(factor, (-1,) + (1,) * (len(weight.shape) - 1))
    return _apply(np.multiply, weight, factor)
