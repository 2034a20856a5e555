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
    aten.tan.default: "Tan", aten.asin.default: "Asin", aten.acos.default: "Acos", aten.atan.default: "Atan",
    aten.sinh.default: "Sinh", aten.cosh.default: "Cosh", aten.asinh.default: "Asinh",
    aten.acosh.default: "Acosh", aten.atanh.default: "Atanh",
}
_FLOAT_ONLY = {"Exp", "Log", "Sqrt", "Sin", "Cos", "Tanh", "Sigmoid", "Erf", "Reciprocal",
               "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"}


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


@rule(aten.logical_not.default)
def _not(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Not", [emit.tensor(node.args[0], torch.bool)], node=node)


@rule(aten.bitwise_not.default)
def _bitwise_not(emit: Emitter, node: torch.fx.Node) -> Value:
    """Not on bools, BitwiseNot on integers."""
    op = "Not" if out_val(node).dtype == torch.bool else "BitwiseNot"
    return emit.op(op, [emit.value(node.args[0])], node=node)


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
_BITWISE = {
    ("And", "BitwiseAnd"): (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
    ("Or", "BitwiseOr"): (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
    ("Xor", "BitwiseXor"): (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar),
}
"""(op on bools, op on integers): torch's bitwise ops are logical ones on bools."""
_SHIFTS = {
    "LEFT": (aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
             aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar),
    "RIGHT": (aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
              aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar),
}
"""torch shifts as BitShift: both give 0 (or a negative value's sign fill, shifting right) for
an amount that is negative or at least the width."""


def _div_check(node: torch.fx.Node) -> str | None:
    return None if out_val(node).dtype.is_floating_point else "integer division"


for _op, _targets in _BINARY.items():
    rule(*_targets, check=_div_check if _op == "Div" else None)(_binary(_op))
for _op, _targets in _COMPARE.items():
    rule(*_targets)(_binary(_op, compare=True))
for _op, _targets in _LOGICAL.items():
    rule(*_targets)(_binary(_op, bool_inputs=True))
for (_logical, _bitwise), _targets in _BITWISE.items():
    def _convert_bitwise(emit: Emitter, node: torch.fx.Node, _logical: str = _logical,
                         _bitwise: str = _bitwise) -> Value:
        if out_val(node).dtype == torch.bool:
            return _binary(_logical, bool_inputs=True)(emit, node)
        return _binary(_bitwise)(emit, node)
    rule(*_targets)(_convert_bitwise)
for _direction, _targets in _SHIFTS.items():
    def _convert_shift(emit: Emitter, node: torch.fx.Node, _direction: str = _direction) -> Value:
        dtype = out_val(node).dtype
        operands = [emit.tensor(node.args[0], dtype), emit.tensor(node.args[1], dtype)]
        return emit.op("BitShift", operands, {"direction": _direction}, node=node)
    rule(*_targets, check=lambda n: "a shift of bools" if out_val(n).dtype == torch.bool else None)(_convert_shift)


@rule(aten.ne.Tensor, aten.ne.Scalar)
def _ne(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("Not", [_binary("Equal", compare=True)(emit, node)], node=node)


@rule(aten.div.Tensor_mode)
def _div_mode(emit: Emitter, node: torch.fx.Node) -> Value:
    """True, floor or truncating division. Integer Div truncates (as onnxruntime's); floor on
    integers divides a - (a mod b), which is exact; truncation on floats is sign(q) floor(|q|)."""
    mode, dtype = node.kwargs.get("rounding_mode"), out_val(node).dtype
    if mode is None:
        return _binary("Div")(emit, node)
    a, b = emit.tensor(node.args[0], dtype), emit.tensor(node.args[1], dtype)
    if not dtype.is_floating_point:
        if mode == "floor":
            a = emit.op("Sub", [a, emit.op("Mod", [a, b], {"fmod": 0})])
        return emit.op("Div", [a, b], node=node)
    quotient = emit.op("Div", [a, b])
    if mode == "floor":
        return emit.op("Floor", [quotient], node=node)
    whole = emit.op("Floor", [emit.op("Abs", [quotient])])
    return emit.op("Mul", [emit.op("Sign", [quotient]), whole], node=node)


@rule(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(emit: Emitter, node: torch.fx.Node) -> Value:
    dtype = out_val(node).dtype
    return emit.op("Pow", [emit.tensor(node.args[0], dtype), emit.tensor(node.args[1], dtype)], node=node)


@rule(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(emit: Emitter, node: torch.fx.Node) -> Value:
    dtype = out_val(node).dtype
    return emit.op("Mod", [emit.tensor(node.args[0], dtype), emit.tensor(node.args[1], dtype)], {"fmod": 1}, node=node)


@rule(aten.remainder.Tensor, aten.remainder.Scalar)
def _remainder(emit: Emitter, node: torch.fx.Node) -> Value:
    """Python's modulo (the divisor's sign): Mod itself for integers; for floats, which ONNX's
    Mod takes only as fmod, fmod plus the divisor where the signs differ, as PyTorch computes it."""
    dtype = out_val(node).dtype
    a, b = emit.tensor(node.args[0], dtype), emit.tensor(node.args[1], dtype)
    if not dtype.is_floating_point:
        return emit.op("Mod", [a, b], {"fmod": 0}, node=node)
    mod = emit.op("Mod", [a, b], {"fmod": 1})
    zero = emit.scalar(0, dtype)
    signs_differ = emit.op("Xor", [emit.op("Less", [mod, zero]), emit.op("Less", [b, zero])])
    nonzero = emit.op("Not", [emit.op("Equal", [mod, zero])])
    return emit.op("Where", [emit.op("And", [nonzero, signs_differ]), emit.op("Add", [mod, b]), mod], node=node)


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
    values = torch.arange(*node.args, dtype=torch.float32 if val.dtype == torch.bfloat16 else val.dtype)
    return emit.constant(values.numpy().astype(torch_to_numpy_dtype(val.dtype)))  # NumPy takes no torch bfloat16


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


@rule(aten.flip.default)
def _flip(emit: Emitter, node: torch.fx.Node) -> Value:
    rank = _rank(node)
    dims = sorted({d % rank for d in node.args[1]}) if rank else []
    if not dims:
        return emit.op("Identity", [emit.value(node.args[0])], node=node)
    lowest = int(np.iinfo(np.int64).min)
    inputs = [emit.value(node.args[0]), emit.ints([-1] * len(dims)), emit.ints([lowest] * len(dims)), emit.ints(dims),
              emit.ints([-1] * len(dims))]
    return emit.op("Slice", inputs, node=node)


@rule(aten.repeat.default)
def _repeat(emit: Emitter, node: torch.fx.Node) -> Value:
    """Tile; extra leading repeats first give the input leading dims of size 1, as torch does."""
    repeats = [int(r) for r in node.args[1]]
    x = emit.value(node.args[0])
    shape = tuple(int(d) for d in node.args[0].meta["val"].shape)
    if len(repeats) > len(shape):
        x = emit.op("Reshape", [x, emit.ints((1,) * (len(repeats) - len(shape)) + shape)], {"allowzero": 1})
    return emit.op("Tile", [x, emit.ints(repeats)], node=node)


@rule(aten.slice_scatter.default)
def _slice_scatter(emit: Emitter, node: torch.fx.Node) -> Value:
    """`x[..., start:end:step, ...] = src` (BEiT's relative-position table): src spread over
    x's extent along dim by a Gather at constant positions, then chosen where the slice is."""
    x_val = node.args[0].meta["val"]
    rank, dtype = x_val.dim(), out_val(node).dtype
    dim = arg(node, 2, "dim", 0) % rank
    length = int(x_val.shape[dim])
    start, end, step = arg(node, 3, "start", None), arg(node, 4, "end", None), arg(node, 5, "step", 1)
    positions = range(length)[slice(start, end, step)]
    src = emit.tensor(node.args[1], dtype)
    if len(positions) == length:
        return emit.op("Identity", [src], node=node)
    where = np.zeros(length, np.int64)
    where[list(positions)] = np.arange(len(positions))
    mask = np.zeros(length, bool)
    mask[list(positions)] = True
    shape = [1] * rank
    shape[dim] = length
    spread = emit.op("Gather", [src, emit.constant(where)], {"axis": dim})
    return emit.op("Where", [emit.constant(mask.reshape(shape)), spread, emit.tensor(node.args[0], dtype)], node=node)


@rule(aten.copy.default)
def _copy(emit: Emitter, node: torch.fx.Node) -> Value:
    """The functional copy_: src broadcast to self's shape, in self's dtype."""
    val = out_val(node)
    src = emit.tensor(node.args[1], val.dtype)
    if tuple(node.args[1].meta["val"].shape) == tuple(val.shape):
        return emit.op("Identity", [src], node=node)
    return emit.op("Expand", [src, emit.ints(val.shape)], node=node)


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
    return None


@rule(aten.index.Tensor, check=_index_check)
def _index(emit: Emitter, node: torch.fx.Node) -> Value:
    indices = list(node.args[1])
    x = emit.value(node.args[0])
    present = [i for i in indices if i is not None]
    if len(present) == 1:
        axis = next(i for i, t in enumerate(indices) if t is not None)
        return emit.op("Gather", [x, emit.value(present[0])], {"axis": axis}, node=node)
    # x[..., i0, ..., ik, ...] with broadcasting index tensors: GatherND over the stacked
    # indices, the indexed dims moved to the front first. As in NumPy and PyTorch, the
    # broadcast dims replace adjacent indexed dims in place, and lead otherwise.
    rank = node.args[0].meta["val"].dim()
    indexed = [d for d, i in enumerate(indices) if i is not None]
    others = [d for d in range(rank) if d not in indexed]
    if indexed != list(range(len(indexed))):
        x = emit.op("Transpose", [x], {"perm": tuple(indexed + others)})
    shape = torch.broadcast_shapes(*(i.meta["val"].shape for i in present))
    columns = [emit.op("Unsqueeze", [emit.op("Expand", [emit.tensor(i, torch.int64), emit.ints(shape)]),
                                     emit.ints([len(shape)])]) for i in present]
    stacked = emit.op("Concat", columns, {"axis": len(shape)})
    first, m = indexed[0], len(shape)
    if first == 0 or indexed != list(range(first, first + len(indexed))):
        return emit.op("GatherND", [x, stacked], node=node)
    gathered = emit.op("GatherND", [x, stacked])
    perm = [m + t for t in range(first)] + list(range(m)) + [m + t for t in range(first, len(others))]
    return emit.op("Transpose", [gathered], {"perm": tuple(perm)}, node=node)


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


_SCATTER_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "mean",
                   "add": "add", "multiply": "mul"}
"""torch's reduce names (scatter_reduce's, and the older scatter's add and multiply) -> ScatterElements'
reductions; mean is a sum divided by a count of the values met."""
_REDUCING_SCATTERS = (aten.scatter_reduce.two, aten.scatter.reduce, aten.scatter.value_reduce)


def _identity(reduction: str, dtype: np.dtype) -> Any:
    """The value that leaves `reduction` unchanged, in `dtype`."""
    if reduction in ("add", "mul", "mean"):
        return int(reduction == "mul")
    if dtype.kind == "f":
        return -np.inf if reduction == "max" else np.inf
    if dtype.kind in "iu":
        return np.iinfo(dtype).min if reduction == "max" else np.iinfo(dtype).max
    return reduction == "min"


def _scatter_reduction(node: torch.fx.Node) -> str | None:
    if node.target == aten.scatter_add.default:
        return "add"
    return _SCATTER_REDUCE.get(arg(node, 4, "reduce", None)) if node.target in _REDUCING_SCATTERS else "none"


def _scatter_check(node: torch.fx.Node) -> str | None:
    if not _rank(node):
        return "a 0-d input"
    reduction = _scatter_reduction(node)
    if reduction is None or (reduction == "mean" and not out_val(node).dtype.is_floating_point):
        return f"reduce={arg(node, 4, 'reduce', None)!r} on {out_val(node).dtype}"
    return None


@rule(aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
      aten.scatter_add.default, aten.scatter_reduce.two, check=_scatter_check)
def _scatter(emit: Emitter, node: torch.fx.Node) -> Value:
    """ScatterElements; src is cut to index's extent (torch lets it be larger), a value is
    broadcast to it. With include_self=False the reduction's identity is first written at
    every scattered position, so that only src values meet there; mean divides the sum by
    the count of values met, self included or not in the same way."""
    dtype, rank = out_val(node).dtype, _rank(node)
    axis = node.args[1] % rank
    index_shape = [int(d) for d in node.args[2].meta["val"].shape]
    src = node.args[3]

    def spread(value: Any) -> Value:
        if isinstance(value, torch.fx.Node) and [int(d) for d in value.meta["val"].shape] != index_shape:
            starts, axes = emit.ints([0] * rank), emit.ints(range(rank))
            return emit.op("Slice", [emit.tensor(value, dtype), starts, emit.ints(index_shape), axes])
        return emit.op("Expand", [emit.tensor(value, dtype), emit.ints(index_shape)])

    reduction = _scatter_reduction(node)
    include_self = node.target != aten.scatter_reduce.two or arg(node, 5, "include_self", True)
    index = emit.value(node.args[2])

    def scatter(x: Value, updates: Value, how: str, **out: Any) -> Value:
        if not include_self:
            identity = spread(_identity(how, torch_to_numpy_dtype(dtype)))
            x = emit.op("ScatterElements", [x, index, identity], {"axis": axis})
        return emit.op("ScatterElements", [x, index, updates], {"axis": axis, "reduction": how}, **out)

    x = emit.tensor(node.args[0], dtype)
    if reduction != "mean":
        return scatter(x, spread(src), reduction, node=node)
    ones = emit.op("Expand", [emit.scalar(1, dtype), emit.ints(out_val(node).shape)])
    counts = scatter(ones, spread(1), "add")
    return emit.op("Div", [scatter(x, spread(src), "add"), counts], node=node)


def _index_put_check(node: torch.fx.Node) -> str | None:
    present = [i for i in node.args[1] if i is not None]
    if not present or any(i.meta["val"].dtype not in (torch.int64, torch.int32) for i in present):
        return "boolean index tensors"
    return None


@rule(aten.index_put.default, check=_index_put_check)
def _index_put(emit: Emitter, node: torch.fx.Node) -> Value:
    """x[i0, ..., ik] = values (or += with accumulate) as ScatterND over x with its indexed
    dims moved to the front, values broadcast to what x[i0, ..., ik] would give (the
    broadcast index dims in place when the indexed dims are adjacent, else first) and moved
    into ScatterND's updates order; the result is moved back."""
    val = out_val(node)
    shape, rank, dtype = [int(d) for d in val.shape], val.dim(), val.dtype
    indices = list(node.args[1]) + [None] * (rank - len(node.args[1]))
    indexed = [d for d, i in enumerate(indices) if i is not None]
    others = [d for d in range(rank) if d not in indexed]
    batch = [int(d) for d in torch.broadcast_shapes(*(indices[d].meta["val"].shape for d in indexed))]
    m, first = len(batch), indexed[0]
    in_place = first > 0 and indexed == list(range(first, first + len(indexed)))
    result = (shape[:first] + batch + shape[indexed[-1] + 1:]) if in_place else batch + [shape[d] for d in others]
    updates = emit.op("Expand", [emit.tensor(node.args[2], dtype), emit.ints(result)])
    if in_place:
        perm = list(range(first, first + m)) + list(range(first)) + list(range(first + m, len(result)))
        updates = emit.op("Transpose", [updates], {"perm": tuple(perm)})
    columns = [emit.op("Unsqueeze", [emit.op("Expand", [emit.tensor(indices[d], torch.int64), emit.ints(batch)]),
                                     emit.ints([m])]) for d in indexed]
    stacked = columns[0] if len(columns) == 1 else emit.op("Concat", columns, {"axis": m})
    order = indexed + others
    x = emit.tensor(node.args[0], dtype)
    attrs = {"reduction": "add" if arg(node, 3, "accumulate", False) else "none"}
    if order == list(range(rank)):
        return emit.op("ScatterND", [x, stacked, updates], attrs, node=node)
    moved = emit.op("ScatterND", [emit.op("Transpose", [x], {"perm": tuple(order)}), stacked, updates], attrs)
    return emit.op("Transpose", [moved], {"perm": tuple(int(p) for p in np.argsort(order))}, node=node)


from . import fx_ops_nn  # noqa: E402,F401  (registers the linear algebra, nn and reduction rules)

SUPPORTED_OPS: frozenset[str] = frozenset(str(t) for t in RULES)
"""The ATen overloads tilefold claims (as `str(OpOverload)`: `aten.add.Tensor`, ...)."""
