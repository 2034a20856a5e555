"""Elementwise ops as Triton expressions, and the template for a fused elementwise chain.

`OPS` is the table: op -> `expr(args, node, consts)` building the Triton expression of the
op on argument expressions (None when this variant is not supported: the node then runs on
the NumPy backend); math Triton has no operation for (atan, an exact fmod, rint, ...) is a call
of a libm.py helper. Float values are computed in float32 whatever their storage dtype
(float16 and bfloat16 are loaded and widened, and narrowed when stored); Cast rounds through
its type. Integer values (signed and unsigned, 8 to 64 bits) stay in their type, through the
ops of INTEGER_OPS; arithmetic wraps as NumPy's does.

A chain is a run of elementwise nodes whose intermediate results are read only by the next
node in the run; it iterates the logical elements of its result, reads every operand through
its own encoding (packed or plain, broadcast numpy-style) and writes the result in its
encoding. Pack, Unpack and Identity are copies in this view (layout_ops.py), so a chain ending
in an Unpack writes the plain tensor directly.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.ops.quantize import per_tensor
from ...graph.types import Splat, TensorType, Value, is_float_dtype
from .codegen import Table, jit_function
from .indexing import INTEGERS, NAN, broadcast_index, is_integer, literal, offset, triton_dtype, unravel, value_ok
from .layout_ops import COPIES, HEADS

Expr = Callable[[list[str], Node, list[Any]], "str | None"]
"""(argument expressions, the node, its constant inputs) -> expression, or None."""


def _unary(fmt: str) -> Expr:
    return lambda a, node, consts: fmt.format(*a)


def _binary(fmt: str) -> Expr:
    return lambda a, node, consts: fmt.format(*a) if len(a) == 2 else None


def _gelu(a: list[str], node: Node, consts: list[Any]) -> str | None:
    x = a[0]
    if node.attrs.get("approximate", "none") == "tanh":
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return f"{x} * (1.0 - 1.0 / (1.0 + tl.exp(2.0 * {inner})))"
    return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"


def _clip(a: list[str], node: Node, consts: list[Any]) -> str:
    expr = a[0]
    if len(a) > 1 and a[1] != "None":
        expr = f"tl.where({expr} < {a[1]}, {a[1]}, {expr})"
    if len(a) > 2 and a[2] != "None":
        expr = f"tl.where({expr} > {a[2]}, {a[2]}, {expr})"
    return expr


def _scalar(const: Any) -> float | None:
    """The one value of a constant (a splat, or an array of one element), else None."""
    if isinstance(const, Splat):
        return float(const.value)
    if isinstance(const, np.ndarray) and const.size == 1 and (const.dtype.kind in "iu" or is_float_dtype(const.dtype)):
        return float(const.reshape(-1)[0])
    return None


def _pow(a: list[str], node: Node, consts: list[Any]) -> str | None:
    """x ** e for a constant e (Llama's RMSNorm squares, GPT-2's Gelu cubes): whole powers up
    to 8 as products, a square root as such, other fractional ones as exp2(e * log2(x)), which
    gives NaN for a negative base as powf does."""
    e = _scalar(consts[1]) if len(consts) > 1 else None
    if e is None:
        return None
    x = a[0]
    if e == 0.5:
        return f"tl.sqrt({x})"
    if e == 0:
        return f"tl.where({x} == {x}, 1.0, 1.0)"  # 1 for any x, NaN included; a block, not a scalar
    if e.is_integer():
        if abs(e) > 8:
            return None  # a negative base needs the sign of a whole power: left to the NumPy backend
        product = " * ".join([x] * int(abs(e)))
        return f"({product})" if e > 0 else f"(1.0 / ({product}))"
    return f"tl.exp2({e!r} * tl.log2({x}))"


def _sum(a: list[str], node: Node, consts: list[Any]) -> str:
    return " + ".join(a)


def _mean(a: list[str], node: Node, consts: list[Any]) -> str:
    return f"({' + '.join(a)}) / {float(len(a))!r}"


MOD_HELPERS = {(False, 0): "mod", (False, 1): "fmod", (True, 0): "imod", (True, 1): "ifmod"}
"""(integer operands, fmod) -> the libm.py helper computing Mod: the divisor's sign for fmod=0
(np.mod), the dividend's for fmod=1 (np.fmod); exact for floats, 0 for an integer divisor of 0."""


def _mod(a: list[str], node: Node, consts: list[Any]) -> str | None:
    if len(a) != 2:
        return None
    helper = MOD_HELPERS[is_integer(node.outputs[0]), int(node.attrs.get("fmod", 0))]
    return f"libm.{helper}({a[0]}, {a[1]})"


def _neg(a: list[str], node: Node, consts: list[Any]) -> str:
    """-x; a float is multiplied by -1, since Triton 3.6 (the GPU machines') lowers a float's
    unary minus to 0 - x, which gives +0 for -(+0)."""
    return f"-{a[0]}" if is_integer(node.outputs[0]) else f"({a[0]} * -1.0)"


def _bit_shift(a: list[str], node: Node, consts: list[Any]) -> str | None:
    """x << y, or x >> y filling with the sign, for 0 <= y < the width; a shift out of that
    range (a poison value on the GPU) gives what NumPy does and ONNX opset 28 asks: 0, or the
    sign fill shifting right."""
    if len(a) != 2:
        return None
    out = node.outputs[0].dtype
    width = 8 * out.itemsize
    x, y = a
    inside = f"(({y} >= 0) & ({y} < {width}))"
    if node.attrs.get("direction") == "LEFT":
        return f"tl.where({inside}, {x} << {y}, 0)"
    fill = "0" if out.kind == "u" else f"{x} >> {width - 1}"
    return f"tl.where({inside}, {x} >> {y}, {fill})"


def _div(a: list[str], node: Node, consts: list[Any]) -> str | None:
    """a / b; for integers ONNX's quotient rounded toward zero (Triton's `//`, C's), with the
    NumPy backend's answers where the GPU's are undefined: 0 for b = 0, and -a (which wraps)
    for b = -1, the most negative a over -1 included."""
    if len(a) != 2:
        return None
    x, y = a
    out = node.outputs[0].dtype
    if out.kind == "u":
        return f"tl.where({y} == 0, 0, {x} // tl.where({y} == 0, 1, {y}))"
    if out.kind == "i":
        safe = f"tl.where(({y} == 0) | ({y} == -1), 1, {y})"
        return f"tl.where({y} == 0, 0, tl.where({y} == -1, -{x}, {x} // {safe}))"
    return f"{x} / {y}"


def _bitwise_not(a: list[str], node: Node, consts: list[Any]) -> str:
    """~x, as x ^ (every bit set): the interpreter computes ~ as x ^ -1, which an unsigned
    type cannot hold."""
    out = node.outputs[0].dtype
    return f"({a[0]} ^ {2 ** (8 * out.itemsize) - 1})" if out.kind == "u" else f"(~{a[0]})"


def _variadic(fn: str, extra: str = "") -> Expr:
    """fn folded over the arguments, `extra` (NaN propagation) passed for float results only."""
    def expr(a: list[str], node: Node, consts: list[Any]) -> str:
        tail = "" if is_integer(node.outputs[0]) else extra
        out = a[0]
        for x in a[1:]:
            out = f"{fn}({out}, {x}{tail})"
        return out

    return expr



OPS: dict[str, Expr] = {
    "Relu": _unary("tl.where({0} < 0.0, 0.0, {0})"),
    "Neg": _neg,
    "Abs": _unary("tl.abs({0})"),
    "Exp": _unary("tl.exp({0})"),
    "Log": _unary("tl.log({0})"),
    "Sqrt": _unary("tl.sqrt({0})"),
    "Reciprocal": _unary("1.0 / {0}"),
    "Sigmoid": _unary("1.0 / (1.0 + tl.exp(-{0}))"),
    "Tanh": _unary("1.0 - 2.0 / (1.0 + tl.exp(2.0 * {0}))"),
    "Erf": _unary("tl.erf({0})"),
    "Sin": _unary("tl.sin({0})"),
    "Cos": _unary("tl.cos({0})"),
    "Floor": _unary("tl.floor({0})"),
    "Ceil": _unary("tl.ceil({0})"),
    "Round": _unary("libm.rint({0})"),
    "Tan": _unary("libm.tan({0})"),
    "Asin": _unary("libm.asin({0})"),
    "Acos": _unary("libm.acos({0})"),
    "Atan": _unary("libm.atan({0})"),
    "Sinh": _unary("libm.sinh({0})"),
    "Cosh": _unary("libm.cosh({0})"),
    "Asinh": _unary("libm.asinh({0})"),
    "Acosh": _unary("libm.acosh({0})"),
    "Atanh": _unary("libm.atanh({0})"),
    "HardSwish": _unary("{0} * tl.clamp({0} / 6.0 + 0.5, 0.0, 1.0" + NAN + ")"),
    "Softplus": _unary("tl.where({0} > 20.0, {0}, tl.log(1.0 + tl.exp({0})))"),
    "LeakyRelu": lambda a, node, c: f"tl.where({a[0]} >= 0.0, {a[0]}, {a[0]} * {float(node.attrs['alpha'])!r})",
    "Elu": lambda a, node, c: f"tl.where({a[0]} >= 0.0, {a[0]}, {float(node.attrs['alpha'])!r} * (tl.exp({a[0]}) - 1.0))",
    "Selu": lambda a, node, c: (
        f"{float(node.attrs['gamma'])!r} * tl.where({a[0]} > 0.0, {a[0]}, "
        f"{float(node.attrs['alpha'])!r} * (tl.exp({a[0]}) - 1.0))"),
    "Celu": lambda a, node, c: (
        f"tl.where({a[0]} >= 0.0, {a[0]}, {float(node.attrs['alpha'])!r} * "
        f"(tl.exp({a[0]} / {float(node.attrs['alpha'])!r}) - 1.0))"),
    "ThresholdedRelu": lambda a, node, c: f"tl.where({a[0]} > {float(node.attrs['alpha'])!r}, {a[0]}, 0.0)",
    "Softsign": _unary("{0} / (1.0 + tl.abs({0}))"),
    "Mish": _unary("{0} * (1.0 - 2.0 / (1.0 + tl.exp(2.0 * tl.where({0} > 20.0, {0}, tl.log(1.0 + tl.exp({0}))))))"),
    "HardSigmoid": lambda a, node, c: (
        f"tl.clamp({float(node.attrs['alpha'])!r} * {a[0]} + {float(node.attrs['beta'])!r}, 0.0, 1.0{NAN})"),
    "Gelu": _gelu,
    "Add": _binary("{0} + {1}"),
    "Sub": _binary("{0} - {1}"),
    "Mul": _binary("{0} * {1}"),
    "Div": _div,
    "Mod": _mod,
    "Pow": _pow,
    "Max": _variadic("tl.maximum", NAN),
    "Min": _variadic("tl.minimum", NAN),
    "Sum": _sum,
    "Mean": _mean,
    "PRelu": _binary("tl.where({0} < 0.0, {0} * {1}, {0})"),
    "Sign": _unary("tl.where({0} > 0.0, 1.0, tl.where({0} < 0.0, -1.0, {0} * 0.0))"),  # NaN stays NaN
    "Where": lambda a, node, c: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "Clip": _clip,
    "BitwiseAnd": _binary("({0} & {1})"),
    "BitwiseOr": _binary("({0} | {1})"),
    "BitwiseXor": _binary("({0} ^ {1})"),
    "BitwiseNot": _bitwise_not,
    "BitShift": _bit_shift,
}
"""Op -> Triton expression; Pack, Unpack, Identity and Cast come from layout_ops.py, whose
HEADS (transpose, reshape, gather, pools, resize, ...) may start a chain."""


BOOL = {
    "IsNaN": _unary("({0} != {0})"),
    "IsInf": lambda a, node, c: {(1, 1): f"(tl.abs({a[0]}) == float('inf'))", (1, 0): f"({a[0]} == float('inf'))",
                                 (0, 1): f"({a[0]} == -float('inf'))", (0, 0): "False"}[
        (int(node.attrs.get("detect_positive", 1)), int(node.attrs.get("detect_negative", 1)))],
    "Not": _unary("({0} == 0)"),
    "And": _binary("({0} & {1})"),
    "Or": _binary("({0} | {1})"),
    "Xor": _binary("({0} ^ {1})"),
    "Equal": _binary("({0} == {1})"),
    "Less": _binary("({0} < {1})"),
    "LessOrEqual": _binary("({0} <= {1})"),
    "Greater": _binary("({0} > {1})"),
    "GreaterOrEqual": _binary("({0} >= {1})"),
}
"""Ops with bool results (int1 values in the kernel)."""
OPS.update(BOOL)


OPS.update(COPIES)
OPS["CastLike"] = COPIES["Cast"]  # the result's dtype is the `like` operand's


def _batch_norm(a: list[str], node: Node, consts: list[Any]) -> str | None:
    """Inference form, as the NumPy kernel computes it: x * s + (bias - mean * s) with
    s = scale / sqrt(var + epsilon)."""
    if int(node.attrs.get("training_mode", 0)) or len(a) != 5:
        return None
    x, scale, bias, mean, var = a
    s = f"({scale} / tl.sqrt({var} + {float(node.attrs.get('epsilon', 1e-5))!r}))"
    return f"{x} * {s} + ({bias} - {mean} * {s})"


OPS["BatchNormalization"] = _batch_norm

PER_CHANNEL: dict[str, frozenset[int]] = {"BatchNormalization": frozenset({1, 2, 3, 4})}
"""Op -> input slots that are vectors along dim 1 of the result (ONNX's per-channel
operands), not numpy-broadcast ones."""


def _quantize(a: list[str], node: Node, consts: list[Any]) -> str | None:
    """As the NumPy kernel: x / scale rounded half to even, plus the zero point, saturated
    (NaN to the lowest value), in the result's integer type."""
    out = node.outputs[0].dtype
    info = np.iinfo(out)
    q = f"libm.rint({a[0]} / {a[1]})"
    if len(a) > 2 and a[2] != "None":
        q = f"({q} + {a[2]}.to(tl.float32))"
    return f"libm.saturate({q}, {float(info.min)!r}, {float(info.max)!r}).to({triton_dtype(out)})"


def _dequantize(a: list[str], node: Node, consts: list[Any]) -> str:
    """(x - zero point) in float32, times the scale."""
    x = f"{a[0]}.to(tl.float32)"
    if len(a) > 2 and a[2] != "None":
        x = f"({x} - {a[2]}.to(tl.float32))"
    return f"{x} * {a[1]}"


QDQ: dict[str, Expr] = {"QuantizeLinear": _quantize, "DequantizeLinear": _dequantize}
"""Ops converting between float32 and an integer type, through a scale and zero point per
tensor or per axis (per-axis ones read along `axis`, not numpy-broadcast)."""
OPS.update(QDQ)


def _qdq_ok(graph: Graph, node: Node) -> bool:
    """float32 data and scales, unblocked. Blocked scales, float16 (divided in float16) and int32
    data to quantize (divided in float64, as NumPy promotes it) stay on the NumPy backend."""
    values = graph.inputs_of(node.name)
    x, scale = graph.type_of(values[0]), graph.type_of(values[1])
    data = x if node.op == "QuantizeLinear" else node.outputs[0]
    return not node.attrs.get("block_size") and scale.rank <= 1 and scale.dtype == data.dtype == np.float32


TYPE_ONLY: dict[str, frozenset[int]] = {"CastLike": frozenset({1})}
"""Op -> input slots that give only a dtype (CastLike's `like`, of any shape, empty too):
never loaded."""

CASTS = frozenset({"Cast", "CastLike"})
"""Ops that take any integer operand (converted once, exactly), not just int32 and int64."""


def operand_dims(node: Node, slot: int, rank: int, t: TensorType) -> tuple[int, ...] | None:
    """The result dims an operand spans when it is not numpy-broadcast (None when it is)."""
    if slot in PER_CHANNEL.get(node.op, ()) and rank >= 2:
        return (1,)
    if node.op in QDQ and slot > 0 and not per_tensor(t):  # per axis (`supports` refuses blocked scales)
        return (int(node.attrs.get("axis", 1)) % rank,)
    return None


INTEGER_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Sum", "Neg", "Abs", "Clip", "Max", "Min", "Where", "Equal",
                         "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Mod", "BitwiseAnd", "BitwiseOr",
                         "BitwiseXor", "BitwiseNot", "BitShift", "CastLike", *COPIES})
"""Ops whose expressions compute integers in their own type (no float literal in them): the
arithmetic on ids and positions that models do before their embeddings, remainders and bits."""


def supports(graph: Graph, node: Node) -> bool:
    """Whether the chain template runs `node`: a table op on static float, bool or integer
    operands and result (integers only through INTEGER_OPS), in a supported variant of its
    attributes."""
    if node.op not in OPS or any(graph.users(Value(node.name, k)) for k in range(1, len(node.outputs))):
        return False  # only the first result is computed (BatchNormalization's running statistics are unread)
    out = node.outputs[0]
    values = graph.inputs_of(node.name)
    read = [v for k, v in enumerate(values) if k not in TYPE_ONLY.get(node.op, ())]
    types = [graph.type_of(v) for v in read if v is not None]
    cast_from = "iu" if node.op in CASTS else ""
    if not value_ok(out) or not all((value_ok(t) or (t.is_static and t.dtype.kind in cast_from))
                                    and t.rank <= out.rank for t in types):
        return False
    if node.op in QDQ:
        if not _qdq_ok(graph, node):
            return False
    elif node.op not in INTEGER_OPS and any(is_integer(t) for t in (out, *types)):
        return False
    if node.op in PER_CHANNEL and not all(
            v is None or graph.type_of(v).rank == 1 for k, v in enumerate(values) if k in PER_CHANNEL[node.op]):
        return False
    args = ["x"] * len(values)
    consts = [graph.constant_value(v) for v in values]
    return OPS[node.op](args, node, consts) is not None


class Loader:
    """Emits one load per operand value at the current logical index, and literal splats;
    the loaded values are named `prefix` and a number (two loaders of one kernel, at two
    indices, take two prefixes)."""

    def __init__(self, graph: Graph, index: Sequence[str], out_shape: Sequence[int], mask: str,
                 params: list[Value | Table], blocks: Sequence[str] | None = None, prefix: str = "x") -> None:
        self.graph = graph
        self.blocks = set(index if blocks is None else blocks)
        self.index = list(index)
        self.out_shape = [int(d) for d in out_shape]
        self.mask = mask
        self.params = params
        self.lines: list[str] = []
        self.names: dict[tuple[Value, tuple[int, ...] | None], str] = {}
        self.prefix = prefix

    def __call__(self, value: Value, dims: tuple[int, ...] | None = None) -> str:
        """The value's element at the current index: broadcast numpy-style, or (`dims`) a
        tensor spanning just those dims of the result."""
        const = self.graph.constant_value(value)
        if isinstance(const, Splat) and const.dtype.kind in "fb":
            return literal(float(const.value)) if const.dtype.kind == "f" else repr(bool(const.value))
        if isinstance(const, Splat) and const.dtype.name in INTEGERS:
            return f"tl.full([], {int(const.value)}, {triton_dtype(const.dtype)})"
        if (value, dims) in self.names:
            return self.names[value, dims]
        t = self.graph.type_of(value)
        if value not in self.params:
            self.params.append(value)
        param = f"in{self.params.index(value)}"
        var = f"{self.prefix}{len(self.names)}"
        index = broadcast_index(t, self.index, self.out_shape) if dims is None else [self.index[d] for d in dims]
        where = offset(t, index)
        if any(i in self.blocks for i in index if i is not None):
            load = f"tl.load({param} + {where}, mask={self.mask})"
        else:  # a scalar per program (a broadcast scalar, a per-batch value): no block mask
            load = f"tl.load({param} + {where})"
        if t.dtype.name in ("float16", "bfloat16"):
            load += ".to(tl.float32)"
        self.lines.append(f"{var} = {load}  # {self.graph.value_name(value)}: {t}")
        self.names[value, dims] = var
        return var


def emit_chain(graph: Graph, nodes: Sequence[Node], load: Loader, env: dict[Value, str], prefix: str = "v"
               ) -> tuple[list[str], str]:
    """Lines computing `nodes` in order (inputs from `env` or `load`); the last result's name
    (results are named `prefix` and a number: two chains of one kernel take two prefixes)."""
    lines: list[str] = []
    var = ""
    for k, node in enumerate(nodes):
        values = graph.inputs_of(node.name)
        rank = len(node.outputs[0].shape)
        unread = TYPE_ONLY.get(node.op, frozenset())
        args = ["None" if v is None or slot in unread else env[v] if v in env
                else load(v, operand_dims(node, slot, rank, graph.type_of(v))) for slot, v in enumerate(values)]
        consts = [graph.constant_value(v) for v in values]
        expr = OPS[node.op](args, node, consts)
        assert expr is not None, node
        var = f"{prefix}{len(env)}"
        lines.extend(load.lines)
        load.lines.clear()
        lines.append(f"{var} = {expr}  # {node.name} ({node.op})")
        env[Value(node.name)] = var
    return lines, var


def store_expr(var: str, t: TensorType) -> str:
    return var if t.dtype.name in ("float32", "bool") else f"{var}.to({triton_dtype(t.dtype)})"


def block_lines(shape: Sequence[int], names: Sequence[str]) -> list[str]:
    """Lines giving a program's block of flat indices into a tensor of `shape` (`offs`, in
    int64 where int32 could overflow), its `mask` of those inside, and the logical index."""
    numel = int(np.prod(shape, dtype=np.int64))
    start = "tl.program_id(0) * BLOCK" if numel < 2**31 - 2**20 else "tl.program_id(0).to(tl.int64) * BLOCK"
    lines = [f"offs = {start} + tl.arange(0, BLOCK)", f"mask = offs < {numel}"]
    return lines + (unravel("offs", shape, names) if shape else [])


def chain_kernel(graph: Graph, nodes: Sequence[Node], fn_name: str) -> tuple[str, list[Value | Table]]:
    """Source of a kernel running `nodes` in order over the logical elements of its result, all
    of one shape: elementwise nodes, and heads (a movement op reading its operand from memory
    at a remapped index: a chain's first node, or one of a group merged into the chain, as
    LLaMA's rotary Concat into the Mul and Add after it); parameters: one pointer per
    external operand or head's table (returned), then the result's."""
    out_t = nodes[-1].outputs[0]
    shape = [int(d) for d in out_t.shape]
    names = [f"i{d}" for d in range(len(shape))]
    params: list[Value | Table] = []
    load = Loader(graph, names, shape, "mask", params)
    env: dict[Value, str] = {}
    body: list[str] = []
    for k, node in enumerate(nodes):
        operands = graph.inputs_of(node.name)
        if node.op in HEADS and (operands[0] if operands else None) not in env:
            lines, var = HEADS[node.op](graph, node, names, params)
            body += lines + [f"h{k} = {var}  # {node.name} ({node.op})"]  # a later head reuses the names
            env[Value(node.name)] = f"h{k}"
            continue
        more, _ = emit_chain(graph, [node], load, env)
        body += more
    var = env[Value(nodes[-1].name)]
    where = offset(out_t, names) if shape else "offs"  # a rank-0 result: lane 0 of a block
    lines = block_lines(shape, names) + body
    lines.append(f"tl.store(out0 + {where}, {store_expr(var, out_t)}, mask=mask)  # {out_t}")
    source = jit_function(fn_name, len(params), lines)
    return source, params

