"""The row-reduction template: Softmax, LogSoftmax, LayerNormalization, InstanceNormalization
(a row per image and channel, scaled and shifted per channel), the global pools and the ONNX
reductions (REDUCE_OPS) with constant axes.

One program per row (every index of the kept dims); the row (the reduced dims, flattened) is
one block of BLOCK >= its length, read through the operand's encoding and masked to the
logical length, so a row over a tiled dim never reads the padding (whose contents are unknown
after an elementwise op). Statistics are computed in float32.

A kernel computes its group's nodes in order (fusion.py): float and bool row ops over one
row (the same dims of operands of one shape), and the elementwise nodes around them, each of
the row's shape (a block, masked) or of one value per row (scalars per program, loaded apart
from the row's operands). A prologue is the chain that computes a row op's row, in registers
where the row would be loaded (lanes past the row set to the op's neutral value); an epilogue
goes on from a reduction's one value per row to the whole row where the reduction keeps its
dims (`widens`): RMSNorm's square, mean, rsqrt and scaling are one kernel, and so are a
softmax and the sdpa guard's all(x == -inf) over the same row (`merges`), which loads it
once. TopK and the scans run alone.

ReduceMax and ReduceMin also run on bool (ONNX opset 20: any and all; torch's safe-softmax
guard in transformers' sdpa attention reduces a bool row this way): the row is loaded as 0/1
integers, masked-off lanes holding the reduction's neutral element (BOOL_NEUTRAL), reduced by
max or min and stored as bool. Integer rows reduce in their own type (INTEGER_REDUCE_OPS: sums,
products, extremes), wrapping as NumPy's do; an empty row gives the op's neutral element (the
type's extreme for ReduceMax and ReduceMin), as on the NumPy backend.

CumSum, ArgMax and ArgMin walk the row in scan order (reversed for `reverse` and
`select_last_index`), on float rows and on integer ones in their own type (the position
ids and end-of-text tokens that text models compute from their inputs): CumSum is a
`tl.cumsum` of the row (shifted by one for `exclusive`); ArgMax/ArgMin take the first index
in scan order holding the row's extreme, or its first NaN, as NumPy does.

TopK (a constant K, `largest` 0 or 1; `sorted` 0 is given sorted, which ONNX allows) sorts
the row with `tl.sort` on unique int64 keys: the value mapped to an order-preserving integer
(float32 bits flipped by sign, -0.0 made 0.0 and every NaN the largest key, as NumPy's
argsort puts NaN after +inf; an integer narrower than 64 bits as is; negated as `-1 - v` for
`largest`), times BLOCK, plus the index, so that equal values keep the lower index first and
padded lanes (the largest int64) sort last. An int64 row is sorted twice, least significant half first (a
radix sort of two digits): by (low 32 bits, index), then by (high 32 bits, rank in the first
pass) with the index carried in the low bits. The first K indices are stored and the values
are read back from the operand at them, so they are its own bits (-0.0 and NaN payloads
kept). A row longer than TOPK_MAX_BLOCK (a vocabulary's logits; not int64) is read in pieces:
each step sorts the best K keys so far with the next BLOCK - K elements, the index taking the
row's index bits. uint64 rows, and int64 rows longer than a block, run on the NumPy backend.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.types import TensorType, Value
from ...layout.targets import GpuTarget
from .codegen import jit_function
from .elementwise import Loader, emit_chain, store_expr
from .layout_ops import constant_ints
from .indexing import broadcast_index, is_float, is_integer, next_pow2, offset, parameter, register_dtype, unravel

MAX_BLOCK = 16384
"""Longest row one block holds; longer rows run on the NumPy backend."""

_SAFE_MAX = "tl.where(tl.abs(tl.max({x}, axis=0)) == float('inf'), 0.0, tl.max({x}, axis=0))"
REDUCE_OPS: dict[str, tuple[str, str]] = {
    "ReduceMean": ("tl.sum({x}, axis=0) / {n}", "0.0"),
    "ReduceSum": ("tl.sum({x}, axis=0)", "0.0"),
    "ReduceMax": ("tl.max({x}, axis=0)", "-float('inf')"),
    "ReduceMin": ("tl.min({x}, axis=0)", "float('inf')"),
    "ReduceL1": ("tl.sum(tl.abs({x}), axis=0)", "0.0"),
    "ReduceL2": ("tl.sqrt(tl.sum({x} * {x}, axis=0))", "0.0"),
    "ReduceSumSquare": ("tl.sum({x} * {x}, axis=0)", "0.0"),
    "ReduceLogSum": ("tl.log(tl.sum({x}, axis=0))", "0.0"),
    # in float64: no partial product over- or underflows float32 (numpy's does, in its order)
    "ReduceProd": ("tl.reduce({x}.to(tl.float64), 0, libm.multiply).to(tl.float32)", "1.0"),
    # shifted by the row's largest value; an infinite or empty row is not shifted (its answer is infinite)
    "ReduceLogSumExp": (f"{_SAFE_MAX} + tl.log(tl.sum(tl.exp({{x}} - {_SAFE_MAX}), axis=0))", "-float('inf')"),
    "GlobalAveragePool": ("tl.sum({x}, axis=0) / {n}", "0.0"),
    "GlobalMaxPool": ("tl.max({x}, axis=0)", "-float('inf')"),
}
"""Reductions: op -> (the reduced row `{x}` as an expression, with `{n}` its length; the value
masked-off lanes hold)."""
INTEGER_REDUCE_OPS: dict[str, str] = {
    "ReduceSum": "tl.sum({x}, axis=0)",
    "ReduceMax": "tl.max({x}, axis=0)",
    "ReduceMin": "tl.min({x}, axis=0)",
    "ReduceProd": "tl.reduce({x}, 0, libm.multiply)",
    "ReduceL1": "tl.sum(tl.abs({x}), axis=0)",
    "ReduceSumSquare": "tl.sum({x} * {x}, axis=0)",
    "ReduceMean": "tl.sum({x}, axis=0).to(tl.float64) / {n}",
}
"""Reductions of integer rows, in the row's type (whatever width Triton accumulates in, the
stored result is the wrapped one, as NumPy's is): op -> the reduced row `{x}` (`{n}` its
length). Masked-off lanes hold `_integer_neutral`. ReduceMean is NumPy's float64 mean
truncated: exact sums of rows up to 32 bits (int64 rows stay on the host, where NumPy's
float64 sum rounds in its own order)."""
EXTREMES = frozenset({"ReduceMax", "ReduceMin", "GlobalMaxPool"})
"""Reductions whose answer is NaN when the row holds one (tl.max and tl.min skip it)."""

BOOL_NEUTRAL = {"ReduceMax": 0, "ReduceMin": 1}
"""The reductions ONNX defines on bool, and the value of a lane past the row for each
(False for any, True for all)."""


def axes_of(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The axes the node reduces along (normalized), or None for a variant not handled here."""
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    if node.op in ("Softmax", "LogSoftmax"):
        return (int(node.attrs.get("axis", -1)) % x.rank,)
    if node.op == "LayerNormalization":
        return tuple(range(int(node.attrs.get("axis", -1)) % x.rank, x.rank))
    if node.op == "InstanceNormalization":
        return tuple(range(2, x.rank)) if x.rank > 2 else None
    if node.op in ("GlobalAveragePool", "GlobalMaxPool"):
        return tuple(range(2, x.rank))
    if node.op in ("ArgMax", "ArgMin"):
        return (int(node.attrs.get("axis", 0)) % x.rank,)
    if node.op == "TopK":
        return (int(node.attrs.get("axis", -1)) % x.rank,)
    values = graph.inputs_of(node.name)
    given = len(values) > 1 and values[1] is not None
    axes = graph.constant_value(values[1]) if given else None
    if given and axes is None:
        return None  # axes known only at run time
    if axes is None or np.asarray(axes).size == 0:  # every axis, unless asked for the input back
        return None if node.attrs.get("noop_with_empty_axes", 0) else tuple(range(x.rank))
    return tuple(sorted({int(a) % x.rank for a in np.asarray(axes).reshape(-1)}))


NORMALIZATIONS = frozenset({"LayerNormalization", "InstanceNormalization"})
SCANS = frozenset({"CumSum", "ArgMax", "ArgMin"})
"""Row ops that walk the row in order (see the module docstring)."""
ROW_SHAPED = frozenset({"Softmax", "LogSoftmax", *NORMALIZATIONS})
"""Row ops whose result has the operand's shape: their kernel takes an elementwise epilogue
(the sdpa attention's NaN guard after a softmax, a cast after a layer norm), computed on the
row in registers before the one store."""
TOPK_MAX_BLOCK = 4096
"""Longest TopK row held in one block (its BLOCK): the index takes log2(BLOCK) bits of an
int64 sort key, twice for an int64 row (32 + 2 * 12 bits). Longer rows are read in pieces."""
TOPK_PIECE = 1024
"""The default block of a TopK row read in pieces (larger when 2K is): ptxas took 25 s to
compile a sort of 4096 lanes for sm_90, 4 s one of 1024."""
TOPK_MAX_ROW = 1 << 30
"""Longest TopK row read in pieces: a key is a 33-bit value times the row's index range."""
_INT64_MAX = "9223372036854775807"


def topk_k(graph: Graph, node: Node) -> int | None:
    """TopK's constant K, or None where it is computed at run time (or not one value)."""
    k = constant_ints(graph, node, 1)
    return k[0] if k is not None and len(k) == 1 else None


def topk_in_pieces(graph: Graph, node: Node) -> bool:
    """Whether a TopK row is longer than one block holds: it is then read in pieces."""
    return row_length(graph, node) > TOPK_MAX_BLOCK


def _supports_topk(graph: Graph, node: Node, x: TensorType) -> bool:
    """A static float or integer (not uint64) row of 1..TOPK_MAX_BLOCK elements, or a longer
    one (up to TOPK_MAX_ROW; not int64) with K at most half a block; a constant K in 1..row
    length, `largest` 0 or 1, static results of the operand's dtype and int64."""
    values, order = node.outputs[0], node.outputs[1] if len(node.outputs) > 1 else None
    if not (is_float(x) or is_integer(x)) or x.dtype == np.uint64 or order is None or values.dtype != x.dtype \
            or order.dtype != np.int64:
        return False  # a uint64 value takes all 64 bits of a key
    if not (values.is_static and order.is_static) or any(int(d) == 0 for d in x.shape):
        return False
    if int(node.attrs.get("largest", 1)) not in (0, 1):
        return False
    axis = int(node.attrs.get("axis", -1)) % x.rank
    length, k = int(x.shape[axis]), topk_k(graph, node)
    if k is None or not 1 <= k <= length or any(int(t.shape[axis]) != k for t in (values, order)):
        return False
    return length <= TOPK_MAX_BLOCK or (length <= TOPK_MAX_ROW and x.dtype != np.int64 and 2 * k <= TOPK_MAX_BLOCK)


ROW_OPS = frozenset({"Softmax", "LogSoftmax", *NORMALIZATIONS, *REDUCE_OPS, *SCANS, "TopK"})


def first_row_op(nodes: list[Node]) -> Node:
    """A group's anchor, its first row op: the row every row op of the group reduces, and the
    node its launch configuration is on."""
    return next(n for n in nodes if n.op in ROW_OPS)


def supports(graph: Graph, node: Node) -> bool:
    if node.op not in ROW_OPS:
        return False
    values = graph.inputs_of(node.name)
    x = graph.type_of(values[0]) if values and values[0] is not None else None
    if node.op == "TopK":
        return x is not None and x.is_static and x.rank > 0 and _supports_topk(graph, node, x)
    if x is None or not x.is_static or x.rank == 0 or not _dtypes_ok(node.op, x, node.outputs[0]):
        return False
    if any(graph.users(Value(node.name, k)) for k in range(1, len(node.outputs))):
        return False
    if node.op in NORMALIZATIONS and any(
            v is not None and not (graph.type_of(v).is_static and is_float(graph.type_of(v))) for v in values[1:]):
        return False
    axes = axes_of(graph, node)
    return axes is not None and row_length(graph, node) <= MAX_BLOCK


def takes_epilogue(graph: Graph, node: Node) -> bool:
    """Whether the kernel of `node` computes elementwise nodes after it on its result in
    registers: every row op of its operand's shape, and a float or bool reduction (one value
    per program: RMSNorm's rsqrt of a mean, the sdpa guard's Not of an any); not scans, TopK
    or integer reductions (which widen 32-bit rows in registers)."""
    if node.op in ROW_SHAPED:
        return True
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    return node.op in REDUCE_OPS and (is_float(x) or x.dtype == np.bool_)


def widens(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The row's shape, where the epilogue of a float or bool reduction that keeps its reduced
    dims may go on from its one value per row to the whole row, in registers (RMSNorm's
    x * rsqrt(mean(x * x) + eps) after the mean); None for other row ops."""
    keeps = node.op in ("GlobalAveragePool", "GlobalMaxPool") or node.attrs.get("keepdims", 1)
    if node.op not in REDUCE_OPS or not keeps or not takes_epilogue(graph, node):
        return None
    return tuple(int(d) for d in graph.type_of(graph.inputs_of(node.name)[0]).shape)  # type: ignore[arg-type]


def merges(graph: Graph, inner: Node, outer: Node, value: Value, reader: Node) -> bool:
    """Whether the group of row op `inner`, whose result `value` `reader` reads, can run in the
    kernel of row op `outer` (the sdpa guard's all(x == -inf) in its softmax's kernel): both
    take epilogues (not scans, TopK or integer rows), reduce the same dims of operands of one
    shape, and `value` is what `reader` reads at each element, in registers: of `reader`'s
    shape, or one value per row with the reduced dims kept, read by a node of the row's shape."""
    axes = axes_of(graph, outer) or ()
    if not (takes_epilogue(graph, inner) and takes_epilogue(graph, outer)) or (axes_of(graph, inner) or ()) != axes:
        return False
    row = tuple(int(d) for d in graph.type_of(graph.inputs_of(outer.name)[0]).shape)  # type: ignore[arg-type]
    if tuple(int(d) for d in graph.type_of(graph.inputs_of(inner.name)[0]).shape) != row:  # type: ignore[arg-type]
        return False
    kept = tuple(1 if d in axes else n for d, n in enumerate(row))
    got, wanted = tuple(int(d) for d in graph.type_of(value).shape), tuple(int(d) for d in reader.outputs[0].shape)
    return got == wanted or (got == kept and wanted == row)


def takes_prologue(graph: Graph, node: Node, kind: str, nodes: list[Node]) -> bool:
    """Whether the kernel of `node` computes the group of `nodes` (of `kind`) that gives its
    row, in registers where it would load it: an elementwise chain, before the float and bool
    reductions and the row ops of their operand's shape (not scans, TopK or integer
    reductions, which read their row otherwise)."""
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    return kind == "chain" and (node.op in ROW_SHAPED or node.op in REDUCE_OPS) and (is_float(x) or x.dtype == np.bool_)


def _dtypes_ok(op: str, x: TensorType, out: TensorType) -> bool:
    """Float operand and result; bool ones for the reductions ONNX defines on bool; integer
    rows for the scans (ArgMax/ArgMin: of a float row too, into int64 indices) and the
    reductions of INTEGER_REDUCE_OPS, into their own type."""
    if op in BOOL_NEUTRAL and x.dtype == np.bool_:
        return out.dtype == np.bool_
    if op in ("ArgMax", "ArgMin"):
        return (is_float(x) or is_integer(x)) and out.dtype == np.int64
    if op == "CumSum" and is_integer(x):
        return out.dtype == x.dtype
    if op in INTEGER_REDUCE_OPS and is_integer(x):
        return out.dtype == x.dtype and (op != "ReduceMean" or x.dtype.itemsize <= 4)
    return is_float(x) and is_float(out)


def row_length(graph: Graph, node: Node) -> int:
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    return int(np.prod([int(x.shape[a]) for a in axes_of(graph, node) or ()], dtype=np.int64))


def defaults(graph: Graph, nodes: list[Node], target: GpuTarget) -> dict[str, Any]:
    node = first_row_op(nodes)
    block = max(target.block, next_pow2(row_length(graph, node)))
    if node.op == "TopK" and topk_in_pieces(graph, node):
        block = max(TOPK_PIECE, next_pow2(2 * (topk_k(graph, node) or 1)))
    return {"BLOCK": block, "num_warps": 4 if block <= 2048 else 8, "num_stages": 1}


def check(graph: Graph, nodes: list[Node], config: dict[str, Any]) -> str | None:
    node = first_row_op(nodes)
    length, block = row_length(graph, node), config["BLOCK"]
    if node.op == "TopK" and block > TOPK_MAX_BLOCK:
        return f"BLOCK={block} is longer than a TopK row may be ({TOPK_MAX_BLOCK}: its sort keys' index bits)"
    if node.op == "TopK" and topk_in_pieces(graph, node):
        k = topk_k(graph, node) or 0
        if block < 2 * k:
            return f"BLOCK={block} holds less than twice K={k} (a TopK row read in pieces carries its best K)"
        return None
    if block < length:
        return f"BLOCK={block} is shorter than the row ({length} elements; one block holds a row)"
    return None


def results(nodes: list[Node]) -> list[Value]:
    """The values the kernel writes: TopK's values and indices, else the node's one result."""
    node = nodes[-1]
    return [Value(node.name, k) for k in range(2)] if node.op == "TopK" else [Value(node.name)]


def _load(value: Value, t: TensorType, index: list[str], param: str, other: str) -> str:
    load = f"tl.load({param} + {offset(t, index)}, mask=mask, other={other})"
    return load if t.dtype.name == "float32" else load + ".to(tl.float32)"


def _integer_neutral(op: str, t: TensorType) -> str:
    """What a masked-off lane of an integer row holds: the identity of the op's combination."""
    if op in ("ReduceMax", "ReduceMin"):
        return _extreme(t, highest=op == "ReduceMin")
    return "1" if op == "ReduceProd" else "0"


def _extreme(t: TensorType, highest: bool) -> str:
    """The largest (or lowest) value of t's dtype, as kernel source: what masked-off lanes hold."""
    if is_float(t):
        return "float('inf')" if highest else "-float('inf')"
    info = np.iinfo(t.dtype)
    return repr(int(info.max if highest else info.min))


def _scan(graph: Graph, node: Node, x_t: TensorType, names: list[str], axis: int, length: int) -> list[str]:
    """Lines giving `y`, the CumSum row (stored at `names`) or the ArgMax/ArgMin index."""
    a = names[axis]
    backward = bool(node.attrs.get("reverse" if node.op == "CumSum" else "select_last_index", 0))
    lines = ["s = tl.arange(0, BLOCK)", f"mask = s < {length}", f"{a} = {length - 1} - s" if backward else f"{a} = s"]
    wide = "" if x_t.dtype.name == "float32" or is_integer(x_t) else f".to({register_dtype(x_t)})"
    if node.op == "CumSum":
        index, mask = list(names), "mask"
        if node.attrs.get("exclusive", 0):  # each element takes the sum of those before it in scan order
            index[axis] = f"{a} + 1" if backward else f"{a} - 1"
            mask = "mask & (s > 0)"
        lines.append(f"x = tl.load(in0 + {offset(x_t, index)}, mask={mask}, other=0){wide}")
        return lines + ["y = tl.cumsum(x, axis=0)"]
    other = _extreme(x_t, highest=node.op == "ArgMin")
    lines.append(f"x = tl.load(in0 + {offset(x_t, names)}, mask=mask, other={other}){wide}")
    extreme = "tl.max" if node.op == "ArgMax" else "tl.min"
    lines += [f"best = tl.min(tl.where(mask & (x == {extreme}(x, axis=0)), s, BLOCK), axis=0)",
              "nan = tl.min(tl.where(mask & (x != x), s, BLOCK), axis=0)",
              "best = tl.where(nan < BLOCK, nan, best)"]
    return lines + [f"y = ({length - 1} - best).to(tl.int64)" if backward else "y = best.to(tl.int64)"]


def _topk(graph: Graph, node: Node, x_t: TensorType, names: list[str], axis: int, length: int) -> list[str]:
    """Lines storing TopK's first K values (out0) and int64 indices (out1) of the row (see the
    module docstring: one sort of value-and-index keys, two for an int64 row)."""
    k = topk_k(graph, node)
    largest = bool(int(node.attrs.get("largest", 1)))
    at = lambda i: [i if d == axis else n for d, n in enumerate(names)]  # noqa: E731
    if topk_in_pieces(graph, node):
        return _topk_in_pieces(node, x_t, at, length, k, largest)
    lines = ["s = tl.arange(0, BLOCK)", f"mask = s < {length}",
             f"x = tl.load(in0 + {offset(x_t, at('s'))}, mask=mask, other=0)  # {x_t}"]
    if x_t.dtype.name == "int64":
        flip = "x = -1 - x" if largest else "x = x"
        lines += [flip, "high = x >> 32", "low = x - (high << 32)",  # low: the unsigned low half
                  f"key = tl.sort(tl.where(mask, low * BLOCK + s, {_INT64_MAX}))",
                  "first = key & (BLOCK - 1)",  # the index at each rank of the first pass
                  f"x = tl.load(in0 + {offset(x_t, at('first'))}, mask=mask, other=0)",
                  flip, "high = x >> 32",
                  f"key = tl.sort(tl.where(mask, (high * BLOCK + s) * BLOCK + first, {_INT64_MAX}))"]
    else:
        lines += _order_key(x_t, largest)
        lines.append(f"key = tl.sort(tl.where(mask, v.to(tl.int64) * BLOCK + s, {_INT64_MAX}))")
    return lines + _topk_stores(node, x_t, at, "BLOCK - 1", k)


def _order_key(x_t: TensorType, largest: bool) -> list[str]:
    """Lines mapping the row `x` (not int64) to `v`, an int64 order-preserving key (see the
    module docstring), negated for `largest`."""
    if is_float(x_t):
        lines = ["x = x.to(tl.float32)", "x = tl.where(x == 0, 0.0, x)",  # -0.0 ties with 0.0
                 "bits = x.to(tl.int32, bitcast=True)",
                 "v = tl.where(bits < 0, bits ^ 2147483647, bits)",
                 "v = tl.where(x != x, 2147483647, v).to(tl.int64)"]  # every NaN after +inf, as in NumPy
    else:
        lines = ["v = x.to(tl.int64)"]  # every narrower integer, unsigned ones too, fits
    return lines + (["v = -1 - v"] if largest else [])


def _topk_stores(node: Node, x_t: TensorType, at: Callable[[str], list[str]], index_bits: str, k: int) -> list[str]:
    """Lines storing the first `k` of the sorted `key` (indices in its `index_bits` low bits;
    `s` the block's lanes): the indices, and the values read back from the operand at them."""
    values, order = node.outputs[0], node.outputs[1]
    return [f"index = key & ({index_bits})", f"top = s < {k}",
            f"y = tl.load(in0 + {offset(x_t, at('index'))}, mask=top)",
            f"tl.store(out0 + {offset(values, at('s'))}, y, mask=top)  # {node.name} (TopK): {values}",
            f"tl.store(out1 + {offset(order, at('s'))}, index, mask=top)  # indices: {order}"]


def _topk_in_pieces(node: Node, x_t: TensorType, at: Callable[[str], list[str]], length: int, k: int,
                    largest: bool) -> list[str]:
    """A row longer than a block: each step sorts the best K keys so far (the sorted block's
    first K lanes) with the next BLOCK - K elements of the row. A key is the value's order key
    times the row's index range plus the index, so ties keep the lower index first across
    pieces as within one."""
    span = next_pow2(length)
    lines = ["s = tl.arange(0, BLOCK)", f"key = tl.full([BLOCK], {_INT64_MAX}, tl.int64)",
             f"for start in range(0, {length}, BLOCK - {k}):",
             f"    i = start + s - {k}",
             f"    fresh = (s >= {k}) & (i < {length})",
             f"    x = tl.load(in0 + {offset(x_t, at('i'))}, mask=fresh, other=0)  # {x_t}"]
    lines += ["    " + line for line in _order_key(x_t, largest)]
    lines.append(f"    key = tl.sort(tl.where(s < {k}, key, tl.where(fresh, v * {span} + i, {_INT64_MAX})))")
    return lines + _topk_stores(node, x_t, at, str(span - 1), k)


def _per_row_index(names: list[str], axes: tuple[int, ...], rank: int) -> list[str | None]:
    """Where a value of one element per row lies: its kept dims' indices, the reduced dims at 0
    where it keeps them (its rank is the row's) or dropped."""
    if rank == len(names):
        return [None if d in axes else name for d, name in enumerate(names)]
    return [name for d, name in enumerate(names) if d not in axes]


def _row_op(graph: Graph, node: Node, k: int, operand: str, params: list[Value], names: list[str],
            axes: tuple[int, ...], shape: list[int]) -> list[str]:
    """Lines computing row op `node`, the `k`-th of its kernel, as `y{k}` from its operand's
    row `operand` (masked-off lanes holding the op's neutral value): a float or bool value per
    row, or a row of the operand's shape for softmax and the normalizations."""
    op, values = node.op, graph.inputs_of(node.name)
    x_t = graph.type_of(values[0])  # type: ignore[arg-type]
    length = row_length(graph, node)
    x, y = operand, f"y{k}"
    if op in ("Softmax", "LogSoftmax"):
        lines = [f"m{k} = tl.max({x}, axis=0)", f"e{k} = tl.exp({x} - m{k})", f"t{k} = tl.sum(e{k}, axis=0)"]
        return lines + [f"{y} = e{k} / t{k}" if op == "Softmax" else f"{y} = {x} - m{k} - tl.log(t{k})"]
    if op in NORMALIZATIONS:
        eps = float(node.attrs.get("epsilon", 1e-5))
        # the centered row corrected by its own mean (in registers): a row of equal values
        # centers to exactly 0, as the NumPy kernel's float64 mean gives
        lines = [f"d{k} = tl.where(mask, {x} - tl.sum({x}, axis=0) / {length}, 0.0)",
                 f"d{k} = tl.where(mask, d{k} - tl.sum(d{k}, axis=0) / {length}, 0.0)",
                 f"inv{k} = 1.0 / tl.sqrt(tl.sum(d{k} * d{k}, axis=0) / {length} + {eps!r})", f"{y} = d{k} * inv{k}"]
        for slot, verb in ((1, "*"), (2, "+")):
            value = values[slot] if len(values) > slot else None
            if value is None:
                continue
            t = graph.type_of(value)
            param = parameter(params, value)
            if op == "InstanceNormalization":  # one value per row: its channel's
                load = f"tl.load({param} + {offset(t, [names[1]])})" + (
                    "" if t.dtype.name == "float32" else ".to(tl.float32)")
            else:
                load = _load(value, t, broadcast_index(t, names, shape), param, "0.0")
            lines.append(f"{y} = {y} {verb} {load}  # {graph.value_name(value)}: {t}")
        return lines
    if is_integer(x_t):
        return [f"{y} = {INTEGER_REDUCE_OPS[op].format(x=x, n=length)}"]
    lines = [f"{y} = {REDUCE_OPS[op][0].format(x=x, n=length)}" + (" != 0" if x_t.dtype == np.bool_ else "")]
    if op in EXTREMES and x_t.dtype != np.bool_:  # a NaN in the row is the answer, as in numpy
        lines.append(f"{y} = tl.where(tl.sum(({x} != {x}).to(tl.float32), axis=0) > 0, float('nan'), {y})")
    return lines


def _operand_row(graph: Graph, node: Node, row: Loader, env: dict[Value, str]) -> str:
    """Row op `node`'s operand as a masked row, lanes past it holding the op's neutral value:
    computed in the kernel (`env`) or loaded (through `row`, whose loads other nodes share; an
    integer or bool row loaded with that value, widened for sums)."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    t, op = graph.type_of(value), node.op
    if t.dtype == np.bool_:
        bits = f"{env[value]}.to(tl.int32)" if value in env else f"{row(value)}.to(tl.int32)"
        return f"tl.where(mask, {bits}, {BOOL_NEUTRAL[op]})"
    if is_integer(t):
        load = f"tl.load({parameter(row.params, value)} + {offset(t, row.index)}, mask=mask, " \
               f"other={_integer_neutral(op, t)})"
        # the interpreter refuses a 32-bit sum that overflows; stored, both wrap alike
        return load + ".to(tl.int64)" if t.dtype.itemsize == 4 else load
    other = REDUCE_OPS[op][1] if op in REDUCE_OPS else "-float('inf')" if op in ("Softmax", "LogSoftmax") else "0.0"
    return f"tl.where(mask, {env[value] if value in env else row(value)}, {other})"


def kernel(graph: Graph, nodes: list[Node], fn_name: str) -> tuple[str, list[Value]]:
    """Source of the kernel of a group: one row op (TopK, a scan), or float and bool row ops
    over one row and the elementwise nodes around them (module docstring), in order."""
    anchor = first_row_op(nodes)
    values = graph.inputs_of(anchor.name)
    x_t = graph.type_of(values[0])  # type: ignore[arg-type]
    axes = axes_of(graph, anchor)
    assert axes is not None
    shape = [int(d) for d in x_t.shape]
    length = row_length(graph, anchor)
    names = [f"i{d}" for d in range(len(shape))]
    rows = [d for d in range(len(shape)) if d not in axes]
    lines = ["row = tl.program_id(0)"]
    lines += unravel("row", [shape[d] for d in rows], [names[d] for d in rows])
    params: list[Value] = []
    if anchor.op == "TopK" or anchor.op in SCANS:
        assert nodes == [anchor], "a TopK or a scan runs alone"
        params.append(values[0])  # type: ignore[arg-type]
        if anchor.op == "TopK":
            lines += _topk(graph, anchor, x_t, names, axes[0], length)
            return jit_function(fn_name, len(params), lines, results=2), params
        lines += _scan(graph, anchor, x_t, names, axes[0], length)
        out = anchor.outputs[0]
        cumsum = anchor.op == "CumSum"
        store_index = list(names) if cumsum else _per_row_index(names, axes, len(out.shape))
        mask = ", mask=mask" if cumsum else ""
        lines.append(f"tl.store(out0 + {offset(out, store_index)}, {store_expr('y', out)}{mask})  "
                     f"# {anchor.name} ({anchor.op}): {out}")
        return jit_function(fn_name, len(params), lines), params
    if len(axes) == 1:
        lines += [f"{names[axes[0]]} = tl.arange(0, BLOCK)", f"mask = {names[axes[0]]} < {length}"]
    else:
        lines += ["col = tl.arange(0, BLOCK)", f"mask = col < {length}"]
        lines += unravel("col", [shape[d] for d in axes], [names[d] for d in axes])
    row = Loader(graph, names, shape, "mask", params, blocks=[names[d] for d in axes])  # operands of the row's shape
    per_row: dict[tuple[int, ...], Loader] = {}  # operands of a shape of one element per row: scalar loads
    env: dict[Value, str] = {}
    for k, node in enumerate(nodes):
        if node.op in ROW_OPS:
            operand = _operand_row(graph, node, row, env)
            lines += row.lines
            row.lines.clear()
            lines.append(f"r{k} = {operand}  # {node.name} ({node.op}): its row")
            lines += _row_op(graph, node, k, f"r{k}", params, names, axes, shape)
            env[Value(node.name)] = f"y{k}"
            continue
        out_shape = tuple(int(d) for d in node.outputs[0].shape)
        if out_shape == tuple(shape):
            loader = row
        else:
            loader = per_row.setdefault(out_shape, Loader(
                graph, _per_row_index(names, axes, len(out_shape)), list(out_shape), "mask", params, blocks=[],
                prefix=f"s{len(per_row)}_"))
        computed, _ = emit_chain(graph, [node], loader, env)
        lines += computed
    final = nodes[-1].outputs[0]
    var = env[Value(nodes[-1].name)]
    if [int(d) for d in final.shape] == shape:
        index, mask = list(names), ", mask=mask"
    else:
        index, mask = _per_row_index(names, axes, len(final.shape)), ""
    lines.append(f"tl.store(out0 + {offset(final, index)}, {store_expr(var, final)}{mask})  "
                 f"# {nodes[-1].name} ({nodes[-1].op}): {final}")
    return jit_function(fn_name, len(params), lines), params


def grid(graph: Graph, nodes: list[Node], config: dict[str, Any]) -> tuple[int, ...]:
    """One program per row: the product of the kept dims (rows of no elements included)."""
    node = first_row_op(nodes)
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    axes = axes_of(graph, node) or ()
    return (max(1, int(np.prod([int(d) for k, d in enumerate(x.shape) if k not in axes], dtype=np.int64))),)
