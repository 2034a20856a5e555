"""Core ATen -> tilefold ops (ONNX opset-21 semantics): one rule per ATen overload.

A rule is data: `Rule(convert, check)`. `convert(emit, node)` adds the node's computation
to the graph through the `Emitter` (fx_emit.py) and returns its Value (or a tuple for ops
with several results); `check(node)` returns why this use of the op cannot be converted
(an attribute tilefold lacks), or None. Ops are mapped onto existing tilefold ops only
(decompositions such as rsqrt = Reciprocal(Sqrt) where ONNX has no single op).

Type promotion: an arithmetic op's operands are cast to the dtype torch gives its result
(`meta["val"]`); a comparison's operands to `torch.result_type` of its arguments.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.fx

from ..graph.types import Splat, Value
from .fx_emit import Emitter, arg, out_val, torch_to_numpy_dtype

aten = torch.ops.aten
Converted = Value | tuple[Value | None, ...]


@dataclass(frozen=True)
class Rule:
    convert: Callable[[Emitter, torch.fx.Node], Converted]
    check: Callable[[torch.fx.Node], str | None] | None = None


RULES: dict[Any, Rule] = {}


def rule(*targets: Any, check: Callable[[torch.fx.Node], str | None] | None = None):
    def register(fn: Callable[[Emitter, torch.fx.Node], Converted]):
        for target in targets:
            RULES[target] = Rule(fn, check)
        return fn
    return register


def _dims(value: Any, rank: int) -> list[int]:
    """Torch dim argument(s) (int, list, or None = all) as non-negative ints."""
    if value is None:
        return list(range(rank))
    dims = [value] if isinstance(value, int) else list(value)
    return [d % rank if rank else 0 for d in dims]


def _rank(node: torch.fx.Node, i: int = 0) -> int:
    return node.args[i].meta["val"].dim()


# ---- elementwise -------------------------------------------------------------------------
_UNARY = {
    aten.relu.default: "Relu", aten.neg.default: "Neg", aten.exp.default: "Exp",
    aten.log.default: "Log", aten.sqrt.default: "Sqrt", aten.sin.default: "Sin",
    aten.cos.default: "Cos", aten.tanh.default: "Tanh", aten.sigmoid.default: "Sigmoid",
    aten.abs.default: "Abs", aten.erf.default: "Erf", aten.ceil.default: "Ceil",
    aten.floor.default: "Floor", aten.reciprocal.default: "Reciprocal", aten.sign.default: "Sign",
    aten.round.default: "Round", aten.clone.default: "Identity", aten.alias.default: "Identity",
    aten.lift_fresh_copy.default: "Identity", aten.detach.default: "Identity", aten.isnan.default: "IsNaN",
}
_FLOAT_ONLY = {"Exp", "Log", "Sqrt", "Sin", "Cos", "Tanh", "Sigmoid", "Erf", "Reciprocal"}


def _float_input(node: torch.fx.Node) -> str | None:
    return None if node.args[0].meta["val"].dtype.is_floating_point else "integer input (torch promotes to float)"


for _target, _op in _UNARY.items():
    def _convert_unary(emit: Emitter, node: torch.fx.Node, _op: str = _op) -> Value:
        return emit.op(_op, [emit.value(node.args[0])], node=node)
    RULES[_target] = Rule(_convert_unary, _float_input if _op in _FLOAT_ONLY else None)


@rule(aten.rsqrt.default, check=_float_input)
def _rsqrt(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Reciprocal", [emit.op("Sqrt", [emit.value(node.args[0])])], node=node)


@rule(aten.log1p.default, check=_float_input)
def _log1p(emit: Emitter, node: torch.fx.Node) -> Value:
    x = emit.value(node.args[0])
    return emit.op("Log", [emit.op("Add", [x, emit.scalar(1, out_val(node).dtype)])], node=node)


@rule(aten.expm1.default, check=_float_input)
def _expm1(emit: Emitter, node: torch.fx.Node) -> Value:
    x = emit.value(node.args[0])
    return emit.op("Sub", [emit.op("Exp", [x]), emit.scalar(1, out_val(node).dtype)], node=node)


@rule(aten.gelu.default)
def _gelu(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Gelu", [emit.value(node.args[0])], {"approximate": arg(node, 1, "approximate", "none")},
                   node=node)


@rule(aten.leaky_relu.default)
def _leaky_relu(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("LeakyRelu", [emit.value(node.args[0])], {"alpha": float(arg(node, 1, "negative_slope", 0.01))},
                   node=node)


@rule(aten.hardtanh.default, aten.clamp.default)
def _clamp(emit: Emitter, node: torch.fx.Node) -> Value:
    dtype = out_val(node).dtype
    default_low, default_high = (-1.0, 1.0) if node.target == aten.hardtanh.default else (None, None)
    low, high = arg(node, 1, "min_val" if default_low else "min", default_low), \
        arg(node, 2, "max_val" if default_low else "max", default_high)
    x = emit.tensor(node.args[0], dtype)
    bounds = [None if b is None else emit.scalar(b, dtype) for b in (low, high)]
    return emit.op("Clip", [x, *bounds], node=node)


@rule(aten.clamp.Tensor)
def _clamp_tensor(emit: Emitter, node: torch.fx.Node) -> Value:
    dtype = out_val(node).dtype
    x = emit.tensor(node.args[0], dtype)
    low, high = arg(node, 1, "min", None), arg(node, 2, "max", None)
    if low is not None:
        x = emit.op("Max", [x, emit.tensor(low, dtype)], node=node if high is None else None)
    if high is not None:
        x = emit.op("Min", [x, emit.tensor(high, dtype)], node=node)
    return x


@rule(aten.logical_not.default, aten.bitwise_not.default,
      check=lambda n: None if n.args[0].meta["val"].dtype == torch.bool or n.target == aten.logical_not.default
      else "bitwise_not on integers")
def _not(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Not", [emit.tensor(node.args[0], torch.bool)], node=node)


def _binary(onnx_op: str, *, compare: bool = False, bool_inputs: bool = False):
    def convert(emit: Emitter, node: torch.fx.Node) -> Value:
        a, b = node.args[0], node.args[1]
        if bool_inputs:
            dtype = torch.bool
        elif compare:
            dtype = torch.result_type(_promotable(a), _promotable(b))
        else:
            dtype = out_val(node).dtype
        alpha = node.kwargs.get("alpha", 1)
        right = emit.tensor(b, dtype)
        if alpha != 1:
            right = emit.op("Mul", [right, emit.scalar(alpha, dtype)])
        return emit.op(onnx_op, [emit.tensor(a, dtype), right], node=node)
    return convert


def _promotable(x: Any) -> Any:
    return x.meta["val"] if isinstance(x, torch.fx.Node) else x


_BINARY = {
    "Add": (aten.add.Tensor, aten.add.Scalar), "Sub": (aten.sub.Tensor, aten.sub.Scalar),
    "Mul": (aten.mul.Tensor, aten.mul.Scalar), "Div": (aten.div.Tensor, aten.div.Scalar),
    "Max": (aten.maximum.default,), "Min": (aten.minimum.default,),
}
_COMPARE = {
    "Equal": (aten.eq.Tensor, aten.eq.Scalar), "Less": (aten.lt.Tensor, aten.lt.Scalar),
    "LessOrEqual": (aten.le.Tensor, aten.le.Scalar), "Greater": (aten.gt.Tensor, aten.gt.Scalar),
    "GreaterOrEqual": (aten.ge.Tensor, aten.ge.Scalar),
}
_LOGICAL = {
    "And": (aten.logical_and.default,), "Or": (aten.logical_or.default,), "Xor": (aten.logical_xor.default,),
}
_BITWISE_BOOL = {"And": aten.bitwise_and.Tensor, "Or": aten.bitwise_or.Tensor, "Xor": aten.bitwise_xor.Tensor}


def _div_check(node: torch.fx.Node) -> str | None:
    return None if out_val(node).dtype.is_floating_point else "integer division"


for _op, _targets in _BINARY.items():
    rule(*_targets, check=_div_check if _op == "Div" else None)(_binary(_op))
for _op, _targets in _COMPARE.items():
    rule(*_targets)(_binary(_op, compare=True))
for _op, _targets in _LOGICAL.items():
    rule(*_targets)(_binary(_op, bool_inputs=True))
for _op, _target in _BITWISE_BOOL.items():
    rule(_target, check=lambda n: None if out_val(n).dtype == torch.bool else "bitwise op on integers")(
        _binary(_op, bool_inputs=True))


@rule(aten.ne.Tensor, aten.ne.Scalar)
def _ne(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Not", [_binary("Equal", compare=True)(emit, node)], node=node)


@rule(aten.div.Tensor_mode, check=lambda n: None if n.kwargs.get("rounding_mode") in (None, "floor")
      and out_val(n).dtype.is_floating_point else "integer or truncating division")
def _div_mode(emit: Emitter, node: torch.fx.Node) -> Value:
    quotient = _binary("Div")(emit, node)
    if node.kwargs.get("rounding_mode") == "floor":
        return emit.op("Floor", [quotient], node=node)
    return quotient


@rule(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar,
      check=lambda n: None if out_val(n).dtype.is_floating_point else "integer power")
def _pow(emit: Emitter, node: torch.fx.Node) -> Value:
    dtype = out_val(node).dtype
    return emit.op("Pow", [emit.tensor(node.args[0], dtype), emit.tensor(node.args[1], dtype)], node=node)


@rule(aten.where.self)
def _where(emit: Emitter, node: torch.fx.Node) -> Value:
    dtype = out_val(node).dtype
    cond = emit.tensor(node.args[0], torch.bool)
    return emit.op("Where", [cond, emit.tensor(node.args[1], dtype), emit.tensor(node.args[2], dtype)], node=node)


@rule(aten._to_copy.default,
      check=lambda n: None if out_val(n).device.type == "cpu" and n.args[0].meta["val"].device.type == "cpu"
      else "a device copy")
def _to_copy(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Identity", [emit.tensor(node.args[0], out_val(node).dtype)], node=node)


# ---- creation ------------------------------------------------------------------------------
@rule(aten.full.default, aten.full_like.default, aten.scalar_tensor.default, aten.zeros.default,
      aten.ones.default, aten.zeros_like.default, aten.ones_like.default, aten.empty.memory_format,
      aten.empty_like.default)
def _full(emit: Emitter, node: torch.fx.Node) -> Value:
    val = out_val(node)
    fill = {aten.full.default: lambda: node.args[1], aten.full_like.default: lambda: node.args[1],
            aten.scalar_tensor.default: lambda: node.args[0], aten.ones.default: lambda: 1,
            aten.ones_like.default: lambda: 1}.get(node.target, lambda: 0)()
    return emit.constant(Splat(fill, tuple(val.shape), torch_to_numpy_dtype(val.dtype)))


@rule(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(emit: Emitter, node: torch.fx.Node) -> Value:
    val = out_val(node)
    values = torch.arange(*node.args, dtype=val.dtype)
    return emit.constant(values.numpy())


# ---- shapes and data movement ------------------------------------------------------------
@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dims,
      aten.squeeze.dim, aten.squeeze.default)
def _reshape(emit: Emitter, node: torch.fx.Node) -> Value:
    # a reshape of a reshape reshapes the first one's input: a MatMul that bmm's flattening
    # (see _bmm) put between reshapes then meets the Transpose after it, as in ONNX exports
    x = emit.value(node.args[0])
    producer = emit.graph.node(x.node)
    if producer.op == "Reshape":
        x = emit.graph.inputs_of(producer.name)[0]
    if emit.graph.type_of(x).shape == tuple(out_val(node).shape):
        return emit.op("Identity", [x], node=node)
    return emit.op("Reshape", [x, emit.ints(out_val(node).shape)], node=node)


@rule(aten.unsqueeze.default)
def _unsqueeze(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Unsqueeze", [emit.value(node.args[0]), emit.ints([node.args[1] % out_val(node).dim()])],
                   node=node)


@rule(aten.permute.default)
def _permute(emit: Emitter, node: torch.fx.Node) -> Value:
    perm = _dims(node.args[1], _rank(node))
    return emit.op("Transpose", [emit.value(node.args[0])], {"perm": tuple(perm)}, node=node)


@rule(aten.expand.default)
def _expand(emit: Emitter, node: torch.fx.Node) -> Value:
    if tuple(node.args[0].meta["val"].shape) == tuple(out_val(node).shape):
        return emit.op("Identity", [emit.value(node.args[0])], node=node)
    return emit.op("Expand", [emit.value(node.args[0]), emit.ints(out_val(node).shape)], node=node)


@rule(aten.slice.Tensor, check=lambda n: None if arg(n, 4, "step", 1) > 0 else "a non-positive step")
def _slice(emit: Emitter, node: torch.fx.Node) -> Value:
    rank = _rank(node)
    dim = arg(node, 1, "dim", 0) % rank
    start, end, step = arg(node, 2, "start", None), arg(node, 3, "end", None), arg(node, 4, "step", 1)
    start = 0 if start is None else start
    end = np.iinfo(np.int64).max if end is None else end
    inputs = [emit.value(node.args[0]), emit.ints([start]), emit.ints([end]), emit.ints([dim]), emit.ints([step])]
    return emit.op("Slice", inputs, node=node)


@rule(aten.select.int)
def _select(emit: Emitter, node: torch.fx.Node) -> Value:
    dim = node.args[1] % _rank(node)
    index = emit.constant(np.array(node.args[2], dtype=np.int64))
    return emit.op("Gather", [emit.value(node.args[0]), index], {"axis": dim}, node=node)


@rule(aten.cat.default)
def _cat(emit: Emitter, node: torch.fx.Node) -> Value:
    val = out_val(node)
    parts = [t for t in node.args[0] if t.meta["val"].dim() == val.dim()]  # torch skips legacy 1-D empties
    axis = arg(node, 1, "dim", 0) % val.dim()
    return emit.op("Concat", [emit.tensor(t, val.dtype) for t in parts], {"axis": axis}, node=node)


@rule(aten.split_with_sizes.default, aten.split.Tensor)
def _split(emit: Emitter, node: torch.fx.Node) -> tuple[Value, ...]:
    vals = out_val(node)
    axis = arg(node, 2, "dim", 0) % _rank(node)
    sizes = [int(v.shape[axis]) for v in vals]
    if len(sizes) == 1:
        return (emit.op("Identity", [emit.value(node.args[0])], node=node, result=0),)
    return emit.op("Split", [emit.value(node.args[0]), emit.ints(sizes)], {"axis": axis, "num_outputs": None},
                   node=node, n_out=len(sizes))


@rule(aten.constant_pad_nd.default, check=lambda n: None if all(p >= 0 for p in n.args[1]) else "negative padding")
def _pad(emit: Emitter, node: torch.fx.Node) -> Value:
    rank, pad = _rank(node), list(node.args[1])
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    dtype = out_val(node).dtype
    inputs = [emit.value(node.args[0]), emit.ints(begins + ends), emit.scalar(arg(node, 2, "value", 0), dtype)]
    return emit.op("Pad", inputs, {"mode": "constant"}, node=node)


@rule(aten.tril.default, aten.triu.default)
def _trilu(emit: Emitter, node: torch.fx.Node) -> Value:
    k = emit.constant(np.array(arg(node, 1, "diagonal", 0), dtype=np.int64))
    return emit.op("Trilu", [emit.value(node.args[0]), k], {"upper": int(node.target == aten.triu.default)},
                   node=node)


# ---- indexing ------------------------------------------------------------------------------
@rule(aten.embedding.default)
def _embedding(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Gather", [emit.value(node.args[0]), emit.value(node.args[1])], {"axis": 0}, node=node)


@rule(aten.index_select.default)
def _index_select(emit: Emitter, node: torch.fx.Node) -> Value:
    axis = node.args[1] % max(_rank(node), 1)
    return emit.op("Gather", [emit.value(node.args[0]), emit.value(node.args[2])], {"axis": axis}, node=node)


def _index_check(node: torch.fx.Node) -> str | None:
    indices = list(node.args[1])
    present = [i for i in indices if i is not None]
    if any(i.meta["val"].dtype not in (torch.int64, torch.int32) for i in present):
        return "boolean index tensors"
    if len(present) > 1 and any(i is None for i in indices[: len(present)]):
        return "index tensors that do not lead"
    return None


@rule(aten.index.Tensor, check=_index_check)
def _index(emit: Emitter, node: torch.fx.Node) -> Value:
    indices = list(node.args[1])
    x = emit.value(node.args[0])
    present = [i for i in indices if i is not None]
    if len(present) == 1:
        axis = next(i for i, t in enumerate(indices) if t is not None)
        return emit.op("Gather", [x, emit.value(present[0])], {"axis": axis}, node=node)
    # x[i0, ..., ik] with broadcasting index tensors: GatherND over the stacked indices
    shape = torch.broadcast_shapes(*(i.meta["val"].shape for i in present))
    columns = [emit.op("Unsqueeze", [emit.op("Expand", [emit.tensor(i, torch.int64), emit.ints(shape)]),
                                     emit.ints([len(shape)])]) for i in present]
    stacked = emit.op("Concat", columns, {"axis": len(shape)})
    return emit.op("GatherND", [x, stacked], node=node)


@rule(aten.gather.default,
      check=lambda n: None if tuple(n.args[2].meta["val"].shape) == tuple(out_val(n).shape)
      and tuple(n.args[0].meta["val"].shape) == tuple(out_val(n).shape) or _same_but_axis(n) else
      "an index smaller than its input")
def _gather(emit: Emitter, node: torch.fx.Node) -> Value:
    axis = node.args[1] % max(_rank(node), 1)
    return emit.op("GatherElements", [emit.value(node.args[0]), emit.value(node.args[2])], {"axis": axis},
                   node=node)


def _same_but_axis(node: torch.fx.Node) -> bool:
    x, index = node.args[0].meta["val"].shape, node.args[2].meta["val"].shape
    axis = node.args[1] % max(len(x), 1)
    return len(x) == len(index) and all(a == b for i, (a, b) in enumerate(zip(x, index)) if i != axis)


# ---- linear algebra and nn -----------------------------------------------------------------
@rule(aten.mm.default, aten.matmul.default)
def _matmul(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("MatMul", [emit.value(node.args[0]), emit.value(node.args[1])], node=node)


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _batched_source(x: torch.fx.Node) -> torch.fx.Node | None:
    """For a bmm operand `view(t, [B, m, k])` where t is [b1, .., bj, m, k] with B = b1*..*bj:
    t (decomposition flattens the batch dims of a batched matmul; MatMul takes them as they are)."""
    if x.target not in _VIEWS:
        return None
    source = x.args[0]
    flat, full = tuple(x.meta["val"].shape), tuple(source.meta["val"].shape)
    if len(full) < 3 or full[-2:] != flat[-2:] or int(np.prod(full[:-2])) != flat[0]:
        return None
    return source


@rule(aten.bmm.default)
def _bmm(emit: Emitter, node: torch.fx.Node) -> Value:
    a, b = (_batched_source(x) for x in node.args[:2])
    if a is None or b is None or tuple(a.meta["val"].shape[:-2]) != tuple(b.meta["val"].shape[:-2]):
        return emit.op("MatMul", [emit.value(node.args[0]), emit.value(node.args[1])], node=node)
    product = emit.op("MatMul", [emit.value(a), emit.value(b)])
    return emit.op("Reshape", [product, emit.ints(out_val(node).shape)], node=node)


@rule(aten.addmm.default)
def _addmm(emit: Emitter, node: torch.fx.Node) -> Value:
    beta, alpha = float(node.kwargs.get("beta", 1)), float(node.kwargs.get("alpha", 1))
    inputs = [emit.value(node.args[1]), emit.value(node.args[2]), emit.value(node.args[0])]
    return emit.op("Gemm", inputs, {"alpha": alpha, "beta": beta}, node=node)


def _conv_check(node: torch.fx.Node) -> str | None:
    if node.args[6]:
        return "transposed convolution"
    return None if node.args[0].meta["val"].dim() in (3, 4, 5) else "unbatched input"


@rule(aten.convolution.default, check=_conv_check)
def _convolution(emit: Emitter, node: torch.fx.Node) -> Value:
    x, w, b, stride, padding, dilation, _, _, groups = node.args
    spatial = w.meta["val"].dim() - 2
    attrs = {"kernel_shape": tuple(int(d) for d in w.meta["val"].shape[2:]),
             "strides": tuple(_spread(stride, spatial)), "pads": tuple(_spread(padding, spatial) * 2),
             "dilations": tuple(_spread(dilation, spatial)), "group": int(groups)}
    inputs = [emit.value(x), emit.value(w)] + ([emit.value(b)] if b is not None else [])
    return emit.op("Conv", inputs, attrs, node=node)


def _spread(values: Any, n: int) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    return [int(v) for v in (values * n if len(values) == 1 else values)]


@rule(aten.native_layer_norm.default)
def _layer_norm(emit: Emitter, node: torch.fx.Node) -> tuple[Value, ...]:
    x, shape, weight, bias, eps = node.args
    val = out_val(node)[0]
    norm_shape = tuple(int(d) for d in shape)
    dtype = torch_to_numpy_dtype(val.dtype)
    scale = emit.value(weight) if weight is not None else emit.constant(Splat(1, norm_shape, dtype))
    shift = emit.value(bias) if bias is not None else emit.constant(Splat(0, norm_shape, dtype))
    attrs = {"axis": -len(norm_shape), "epsilon": float(eps)}
    used = 1 + max((u.args[1] for u in node.users if u.target is operator.getitem), default=0)
    results = emit.op("LayerNormalization", [emit.value(x), scale, shift], attrs, node=node, n_out=used,
                      result=0 if used == 1 else None)
    return (results,) if used == 1 else results


def _only_first_result(node: torch.fx.Node) -> str | None:
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    return None if used <= {0} and all(u.target is operator.getitem for u in node.users) else \
        "its second or third result"


@rule(aten._native_batch_norm_legit_no_training.default, check=_only_first_result)
def _batch_norm(emit: Emitter, node: torch.fx.Node) -> tuple[Value | None, ...]:
    x, weight, bias, mean, var, _, eps = node.args
    channels = (int(x.meta["val"].shape[1]),)
    dtype = torch_to_numpy_dtype(out_val(node)[0].dtype)
    scale = emit.value(weight) if weight is not None else emit.constant(Splat(1, channels, dtype))
    shift = emit.value(bias) if bias is not None else emit.constant(Splat(0, channels, dtype))
    inputs = [emit.value(x), scale, shift, emit.value(mean), emit.value(var)]
    return (emit.op("BatchNormalization", inputs, {"epsilon": float(eps)}, node=node, result=0), None, None)


@rule(aten._softmax.default, aten._log_softmax.default,
      check=lambda n: None if not n.args[2] else "half_to_float")
def _softmax(emit: Emitter, node: torch.fx.Node) -> Value:
    op = "Softmax" if node.target == aten._softmax.default else "LogSoftmax"
    return emit.op(op, [emit.value(node.args[0])], {"axis": node.args[1] % max(_rank(node), 1)}, node=node)


def _pool_check(node: torch.fx.Node) -> str | None:
    if node.target == aten.max_pool2d_with_indices.default:
        return _only_first_result(node)
    if arg(node, 6, "divisor_override", None) is not None:
        return "divisor_override"
    return "ceil_mode" if arg(node, 4, "ceil_mode", False) else None


@rule(aten.max_pool2d_with_indices.default, aten.avg_pool2d.default, check=_pool_check)
def _pool(emit: Emitter, node: torch.fx.Node) -> Value | tuple[Value | None, ...]:
    kernel = _spread(node.args[1], 2)
    stride = _spread(arg(node, 2, "stride", []) or kernel, 2)
    padding = _spread(arg(node, 3, "padding", 0), 2)
    attrs: dict[str, Any] = {"kernel_shape": tuple(kernel), "strides": tuple(stride), "pads": tuple(padding * 2)}
    x = emit.value(node.args[0])
    if node.target == aten.max_pool2d_with_indices.default:
        attrs.update(dilations=tuple(_spread(arg(node, 4, "dilation", 1), 2)),
                     ceil_mode=int(arg(node, 5, "ceil_mode", False)))
        return (emit.op("MaxPool", [x], attrs, node=node, result=0), None)
    attrs.update(count_include_pad=int(arg(node, 5, "count_include_pad", True)))
    return emit.op("AveragePool", [x], attrs, node=node)


def _adaptive_check(node: torch.fx.Node) -> str | None:
    size = node.args[0].meta["val"].shape[2:]
    out = _spread(node.args[1], 2)
    return None if all(s % o == 0 for s, o in zip(size, out)) else "an output size that does not divide the input"


@rule(aten._adaptive_avg_pool2d.default, check=_adaptive_check)
def _adaptive_avg_pool(emit: Emitter, node: torch.fx.Node) -> Value:
    size = [int(s) for s in node.args[0].meta["val"].shape[2:]]
    out = _spread(node.args[1], 2)
    if out == [1, 1]:
        return emit.op("GlobalAveragePool", [emit.value(node.args[0])], node=node)
    kernel = tuple(s // o for s, o in zip(size, out))
    attrs = {"kernel_shape": kernel, "strides": kernel, "pads": (0, 0, 0, 0)}
    return emit.op("AveragePool", [emit.value(node.args[0])], attrs, node=node)


# ---- reductions ----------------------------------------------------------------------------
def _reduction(onnx_op: str, input_dtype: Callable[[torch.fx.Node], torch.dtype]):
    def convert(emit: Emitter, node: torch.fx.Node) -> Value:
        rank = _rank(node)
        dims = arg(node, 1, "dim", None)
        keep = bool(arg(node, 2, "keepdim", False))
        x = emit.tensor(node.args[0], input_dtype(node))
        if rank == 0:  # a 0-d tensor reduces to itself
            return emit.op("Identity", [x], node=node)
        inputs = [x] if dims is None or dims == [] else [x, emit.ints(_dims(dims, rank))]
        result = emit.op(onnx_op, inputs, {"keepdims": int(keep)}, node=node if rank else None)
        return result if rank else emit.op("Identity", [result], node=node)
    return convert


def _out_dtype(node: torch.fx.Node) -> torch.dtype:
    return out_val(node).dtype


def _reduce_float(node: torch.fx.Node) -> str | None:
    return None if out_val(node).dtype.is_floating_point else "an integer mean"


rule(aten.sum.dim_IntList)(_reduction("ReduceSum", _out_dtype))
rule(aten.mean.dim, check=_reduce_float)(_reduction("ReduceMean", _out_dtype))
rule(aten.amax.default)(_reduction("ReduceMax", _out_dtype))
rule(aten.amin.default)(_reduction("ReduceMin", _out_dtype))
rule(aten.any.dim, aten.any.dims)(_reduction("ReduceMax", lambda n: torch.bool))
rule(aten.all.dim, aten.all.dims)(_reduction("ReduceMin", lambda n: torch.bool))


@rule(aten.sum.default, aten.mean.default, aten.any.default, aten.all.default)
def _reduce_all(emit: Emitter, node: torch.fx.Node) -> Value:
    op = {aten.sum.default: "ReduceSum", aten.mean.default: "ReduceMean", aten.any.default: "ReduceMax",
          aten.all.default: "ReduceMin"}[node.target]
    dtype = torch.bool if op in ("ReduceMax", "ReduceMin") else out_val(node).dtype
    if _rank(node) == 0:
        return emit.op("Identity", [emit.tensor(node.args[0], dtype)], node=node)
    return emit.op(op, [emit.tensor(node.args[0], dtype)], {"keepdims": 0}, node=node)


@rule(aten.argmax.default, aten.argmin.default)
def _argmax(emit: Emitter, node: torch.fx.Node) -> Value:
    op = "ArgMax" if node.target == aten.argmax.default else "ArgMin"
    dim, keep = arg(node, 1, "dim", None), bool(arg(node, 2, "keepdim", False))
    x = emit.value(node.args[0])
    if dim is None:
        x, dim = emit.op("Reshape", [x, emit.ints([-1])]), 0
        result = emit.op(op, [x], {"axis": 0, "keepdims": 0})
        return emit.op("Reshape", [result, emit.ints(out_val(node).shape)], node=node)
    return emit.op(op, [x], {"axis": dim % max(_rank(node), 1), "keepdims": int(keep)}, node=node)


@rule(aten.cumsum.default)
def _cumsum(emit: Emitter, node: torch.fx.Node) -> Value:
    x = emit.tensor(node.args[0], out_val(node).dtype)  # torch sums integers and bools as int64
    return emit.op("CumSum", [x, emit.ints([int(arg(node, 1, "dim", 0)) % max(_rank(node), 1)])], node=node)


SUPPORTED_OPS: frozenset[str] = frozenset(str(t) for t in RULES)
"""The ATen overloads tilefold claims (as `str(OpOverload)`: `aten.add.Tensor`, ...)."""
