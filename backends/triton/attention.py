"""The attention template: softmax(Q K^T ...) V as one kernel (flash attention), so the
scores and the probabilities, a (sequence x sequence) matrix per head, never reach memory.

fusion.py hands it a run of three groups, each read by the next alone (`spans`): a matmul
group of the scores (MatMul(Q, K^T) and its elementwise epilogue: a scale, a padding mask
added, a causal Where), a row group of one Softmax over the scores' last dim, alone or with
one of two guards that give 0 for a row the softmax leaves NaN (torch's sdpa decomposition's
Where(all(x == -inf), 0, p), the ONNX exporter's Where(IsNaN(p), 0, p)), and a matmul group of
the product with V (and its epilogue). Each program holds BLOCK_M rows of Q whole (the head
dim in one BLOCK_D block) and walks the keys BLOCK_N at a time with the online softmax: it
keeps each row's running maximum m and sum l of exp(s - m), rescales its accumulator of P V
when m grows, and divides by l at the end. The running maximum is read as 0 while a row has
seen nothing but -inf, so a row masked off entirely gives l = 0: 0 / 0 = NaN as ONNX's
Softmax gives, or 0 under a guard (GUARDS: such a row is exactly one whose l is 0, since any
finite score contributes exp(0) = 1 to l).

Grouped query attention repeats each key and value head for several query heads (an Expand
between views: transformers' repeat_kv). The kernel reads K^T and V through those views and
the Expand (`read_through`: the query head's batch index mapped back to its key head's), so the
repeated tensors are never written and the Expands' kernels go (`absorbs`). Likewise it
computes the float Casts and scalar scales on the way to Q, K^T or V on the tiles it loads:
a float16 or bfloat16 model's attention traced on the CPU upcasts Q, K and V to float32 and
scales Q and K before the scores, three kernels a layer otherwise.

Scores and statistics are float32; Q, K and V are read in their storage dtype through their
encodings (tiled heads, a transposed K), and float16 or bfloat16 probabilities are narrowed
to V's dtype for the second product, as flash attention does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.ops.tensor import RESHAPES, transpose_perm
from ...graph.types import Splat, TensorType, Value
from ...layout.targets import GpuTarget
from .codegen import jit_function
from .elementwise import Loader, emit_chain, store_expr
from .indexing import broadcast_index, is_float, next_pow2, offset, parameter, strides, triton_dtype, unravel

HEAD_LIMIT = 256
"""The largest head dim (of Q and K, or of V) a program holds in one block."""

GUARDS = {None: "{o}", "masked": "tl.where({l} == 0.0, 0.0, {o})",
          "nan": "tl.where(({l} == 0.0) | ({l} != {l}), 0.0, {o})"}
"""The result from the row sums l: a row of -inf alone has l = 0; a softmax row is NaN
entirely or nowhere, and exactly where l is 0 or NaN (an infinity or a NaN among the
scores)."""

KINDS = ("matmul", "reduce", "matmul")
"""The kinds of the groups an attention kernel replaces, in order."""

MOVES = frozenset({*RESHAPES, "Transpose", "Expand"})
VIEWS = MOVES - {"Expand"}


@dataclass(frozen=True)
class Parts:
    """The roles of an attention group's nodes (in topological order within each role)."""

    scores: Node
    score_chain: list[Node]
    softmax: Node
    guard: str | None
    """None, "masked" (a row of -inf alone gives 0) or "nan" (a row whose softmax is NaN
    gives 0)."""
    product: Node
    epilogue: list[Node]
    through: tuple[list[Node], list[Node], list[Node]] = ([], [], [])
    """The nodes the kernel reads Q, K^T and V through (`read_through`)."""


def _constant(graph: Graph, value: Value | None) -> float | None:
    """The one value of a constant operand (a splat, or any array of one value), else None."""
    const = graph.constant_value(value) if value is not None else None
    if isinstance(const, Splat):
        return float(const.value)
    if not isinstance(const, np.ndarray) or not const.size or const.dtype.kind in "biuSUO":
        return None
    values = const.astype(np.float64)  # float16 and bfloat16 too
    return float(values.flat[0]) if (values == values.flat[0]).all() else None


def _producer(graph: Graph, value: Value | None, inside: dict[str, Node], op: str) -> Node | None:
    node = inside.get(value.node) if value is not None and value.slot == 0 else None
    return node if node is not None and node.op == op else None


def _all_minus_inf(graph: Graph, cond: Value | None, x: Value, inside: dict[str, Node]) -> list[Node] | None:
    """The nodes of `cond` = all(x == -inf) over the last dim with that dim kept, as torch
    decomposes it: Not(ReduceMax(Not(Equal(x, -inf)))) or ReduceMin(Equal(x, -inf)); else None."""
    found: list[Node] = []
    outer = _producer(graph, cond, inside, "Not")
    reduce_op = "ReduceMax" if outer is not None else "ReduceMin"
    if outer is not None:
        found.append(outer)
        cond = graph.inputs_of(outer.name)[0]
    reduce = _producer(graph, cond, inside, reduce_op)
    if reduce is None or not reduce.attrs.get("keepdims", 1) or reduce.attrs.get("noop_with_empty_axes", 0):
        return None
    values = graph.inputs_of(reduce.name)
    axes = graph.constant_value(values[1]) if len(values) > 1 and values[1] is not None else None
    rank = len(reduce.outputs[0].shape)
    if axes is None or [int(a) % rank for a in np.asarray(axes).reshape(-1)] != [rank - 1]:
        return None
    found.append(reduce)
    bools = values[0]
    if reduce_op == "ReduceMax":
        inner = _producer(graph, bools, inside, "Not")
        if inner is None:
            return None
        found.append(inner)
        bools = graph.inputs_of(inner.name)[0]
    equal = _producer(graph, bools, inside, "Equal")
    if equal is None:
        return None
    operands = graph.inputs_of(equal.name)
    other = operands[1] if operands[0] == x else operands[0] if operands[1] == x else None
    if other is None or _constant(graph, other) != -np.inf:
        return None
    return found + [equal]


def _keeps_matrix(graph: Graph, node: Node) -> bool:
    """A Transpose, reshape or Expand that leaves an operand's matrix (its last two dims) whole
    and last: a Transpose within them or within the batch dims, a reshape or Expand of the
    batch dims alone."""
    t, out = graph.type_of(graph.inputs_of(node.name)[0]), node.outputs[0]  # type: ignore[arg-type]
    if t.rank < 2 or out.rank < 2:
        return False
    if node.op == "Transpose":
        return sorted(transpose_perm(node.attrs, out.rank)[-2:]) == [out.rank - 2, out.rank - 1]
    return tuple(t.shape[-2:]) == tuple(out.shape[-2:])


def _pointwise_operand(graph: Graph, node: Node) -> Value | None:
    """The operand of a float Cast, or of a Mul or Div by a scalar constant, which the node
    maps element by element (a kernel applies it to a tile it loaded, at any index); None for
    any other node."""
    values, out = graph.inputs_of(node.name), node.outputs[0]
    if not is_float(out) or None in values:
        return None
    if node.op == "Cast":
        return values[0] if is_float(graph.type_of(values[0])) else None  # type: ignore[arg-type]
    if node.op not in ("Mul", "Div") or len(values) != 2:
        return None
    for slot in (0, 1) if node.op == "Mul" else (0,):
        x, c = values[slot], values[1 - slot]
        scalar, shape = graph.type_of(c), graph.type_of(x).shape  # type: ignore[arg-type]
        if graph.constant_value(c) is not None and scalar.numel() == 1 and shape == out.shape:
            return x
    return None


def _step(graph: Graph, node: Node) -> Value | None:
    """The value `read_through` goes on to from `node`, or None where it stops there."""
    if node.op in MOVES:
        return graph.inputs_of(node.name)[0] if _keeps_matrix(graph, node) else None
    return _pointwise_operand(graph, node)


def _computing(path: list[Node]) -> list[Node]:
    """`path` without the views at its end: reading a view's own buffer costs nothing."""
    end = len(path)
    while end and path[end - 1].op in VIEWS:
        end -= 1
    return path[:end]


def read_through(graph: Graph, value: Value | None, inside: Callable[[Node], bool]) -> list[Node]:
    """The nodes, each read by the next alone and taken by `inside`, from operand `value` back
    through views and Expands that keep the matrix dims and through float Casts and scalar
    Muls and Divs (`_pointwise_operand`), up to the last Expand or pointwise node ([] where
    there is none): the kernel loads the first one's operand at the index they map its own to
    and applies the pointwise nodes to the tile. GQA's keys and values, repeated for every
    query head (Expand, Reshape, Transpose), are then never written, nor a half-precision
    model's Q, K and V upcast and scaled."""
    path: list[Node] = []
    while value is not None and value.slot == 0 and len(graph.users(value)) == 1:
        node = graph.node(value.node)
        following = _step(graph, node) if inside(node) else None
        if following is None:
            break
        path.append(node)
        value = following
    return _computing(path)


def _source(graph: Graph, value: Value, path: list[Node]) -> Value:
    return _step(graph, path[-1]) if path else value  # type: ignore[return-value]


def _mapped(graph: Graph, path: list[Node], index: list[str | None], prefix: str
            ) -> tuple[list[str | None], list[str]]:
    """`index` of the operand mapped back through `path` to the Expand's operand, and the lines
    that compute the batch indices a reshape regroups (named `prefix` and numbers)."""
    lines: list[str] = []
    for k, node in enumerate(path):
        if node.op not in MOVES:
            continue  # a pointwise node keeps the index
        t, out = graph.type_of(graph.inputs_of(node.name)[0]), node.outputs[0]  # type: ignore[arg-type]
        if node.op == "Transpose":
            moved: list[str | None] = [None] * t.rank
            for j, dim in enumerate(transpose_perm(node.attrs, out.rank)):
                moved[dim] = index[j]
            index = moved
        elif node.op == "Expand":
            index = broadcast_index(t, index, [int(d) for d in out.shape])  # type: ignore[arg-type]
        else:
            steps = strides([int(d) for d in out.shape[:-2]])
            flat = " + ".join(f"{i} * {step}" for i, step in zip(index, steps) if i is not None) or "0"
            names = [f"{prefix}{k}_{d}" for d in range(t.rank - 2)]
            lines += [f"{prefix}{k} = {flat}", *unravel(f"{prefix}{k}", [int(d) for d in t.shape[:-2]], names)]
            index = [*names, *index[-2:]]
    return index, lines


def _guard(graph: Graph, where: Node, softmax: Node, x: Value, inside: dict[str, Node]
           ) -> tuple[str, list[Node]] | None:
    """Which guard `where` = Where(cond, 0, softmax) is, and its condition's nodes: "masked"
    for torch's all(x == -inf) over the row, "nan" for the ONNX exporter's IsNaN(softmax)."""
    cond, fill, probs = graph.inputs_of(where.name)
    if probs != Value(softmax.name) or _constant(graph, fill) != 0.0:
        return None
    isnan = _producer(graph, cond, inside, "IsNaN")
    if isnan is not None:
        return ("nan", [isnan]) if graph.inputs_of(isnan.name)[0] == Value(softmax.name) else None
    found = _all_minus_inf(graph, cond, x, inside)
    return None if found is None else ("masked", found)


def parts(graph: Graph, nodes: list[Node]) -> Parts | None:
    """The roles of `nodes` (a run of the three groups, in topological order, and the nodes it
    reads K^T and V through), or None where they do not form one attention: two MatMuls, the
    first's result reaching one Softmax over its last dim through elementwise nodes alone, the
    Softmax (or a guard's Where after it) the second's first operand, and nothing else but
    that one's epilogue."""
    products = [n for n in nodes if n.op == "MatMul"]
    if len(products) != 2:
        return None
    names = {n.name for n in nodes}
    operands = [graph.inputs_of(products[0].name)[0], *(graph.inputs_of(n.name)[1] for n in products)]
    paths = tuple(read_through(graph, value, lambda n: n.name in names) for value in operands)
    through = {n.name for path in paths for n in path}
    nodes = [n for n in nodes if n.name not in through]
    inside = {n.name: n for n in nodes}
    softmaxes = [n for n in nodes if n.op == "Softmax"]
    if len(softmaxes) != 1 or nodes[0] is not products[0]:
        return None
    scores, product, softmax = products[0], products[1], softmaxes[0]
    x = graph.inputs_of(softmax.name)[0]
    rank = len(softmax.outputs[0].shape)
    if x is None or x.node not in inside or int(softmax.attrs.get("axis", -1)) % rank != rank - 1:
        return None
    at = {n.name: k for k, n in enumerate(nodes)}
    first = graph.inputs_of(product.name)[0]
    middle = {n.name for n in nodes[at[x.node] + 1:at[product.name]]}
    guard: str | None = None
    if first != Value(softmax.name):
        where = inside.get(first.node) if first is not None and first.slot == 0 else None
        found = _guard(graph, where, softmax, x, inside) if where is not None and where.op == "Where" else None
        if found is None or middle != {softmax.name, where.name, *(n.name for n in found[1])}:  # type: ignore[union-attr]
            return None
        guard = found[0]
    elif middle != {softmax.name}:
        return None
    epilogue = nodes[at[product.name] + 1:]
    kept = {n.name for n in epilogue} | {product.name}  # the values the kernel has after its loop
    reads = [*graph.inputs_of(scores.name), graph.inputs_of(product.name)[1],
             *(v for n in epilogue for v in graph.inputs_of(n.name))]
    if any(v is not None and v.node in inside and v.node not in kept for v in reads):
        return None  # Q, K or V computed in the group, or the scores or probabilities read after it
    return Parts(scores, nodes[1:at[x.node] + 1], softmax, guard, product, epilogue, paths)  # type: ignore[arg-type]


def _matrix(t: TensorType) -> tuple[int, int]:
    return int(t.shape[-2]), int(t.shape[-1])


def _operands(graph: Graph, p: Parts) -> tuple[Value, Value, Value]:
    q, k = graph.inputs_of(p.scores.name)[:2]
    v = graph.inputs_of(p.product.name)[1]
    return q, k, v  # type: ignore[return-value]


def _parts(graph: Graph, nodes: list[Node]) -> Parts:
    """The roles of the nodes of a group `spans` accepted."""
    p = parts(graph, nodes)
    assert p is not None, [n.name for n in nodes]
    return p


def sizes(graph: Graph, p: Parts) -> dict[str, int]:
    """The query rows m, the keys n, the head dims d (of Q and K) and e (of V)."""
    m, n = _matrix(p.scores.outputs[0])
    q = graph.type_of(_operands(graph, p)[0])
    return {"m": m, "n": n, "d": int(q.shape[-1]), "e": int(p.product.outputs[0].shape[-1])}


def spans(graph: Graph, kinds: list[str], nodes: list[Node]) -> bool:
    """Whether one attention kernel runs `nodes` (in topological order: fusion's run of groups
    of `kinds`, each read by the next alone): the roles above, static float operands of one
    dtype, head dims up to HEAD_LIMIT, both products over the same batch dims, one device, and
    a kernel that writes one result (no Split after the product)."""
    p = parts(graph, nodes) if tuple(kinds) == KINDS and nodes[-1].op != "Split" else None
    if p is None or len({n.device for n in nodes}) != 1:
        return False
    types = [graph.type_of(v) for v in _operands(graph, p)]
    if not all(t.is_static and is_float(t) and t.rank >= 2 and t.dtype == types[0].dtype for t in types):
        return False
    if not all(n.outputs[0].is_static and is_float(n.outputs[0]) for n in (p.scores, p.softmax, p.product)):
        return False
    s = sizes(graph, p)
    batch = tuple(p.scores.outputs[0].shape[:-2])
    return s["d"] <= HEAD_LIMIT and s["e"] <= HEAD_LIMIT and tuple(p.product.outputs[0].shape[:-2]) == batch \
        and _matrix(types[1]) == (s["d"], s["n"]) and _matrix(types[2])[0] == s["n"]


def _batch(p: Parts) -> tuple[list[int], list[str]]:
    """The batch dims of the scores (the grid's second axis) and their index names."""
    shape = [int(d) for d in p.scores.outputs[0].shape[:-2]]
    return shape, [f"b{d}" for d in range(len(shape))]


def _index(t: TensorType, batch: list[str], batch_shape: list[int], rows: str, cols: str) -> list[str | None]:
    lead = broadcast_index(TensorType(t.shape[:-2], t.dtype), batch, batch_shape) if t.rank > 2 else []
    return lead + [rows, cols]


def _read(graph: Graph, value: Value, path: list[Node], index: list[str | None], prefix: str
          ) -> tuple[Value, list[str | None], list[str]]:
    """Where the kernel loads operand `value`: the value, the index and the lines computing it
    (the Expand's operand and the mapped index where `path` leads to one)."""
    mapped, lines = _mapped(graph, path, index, prefix)
    return _source(graph, value, path), mapped, lines


def _pointwise(graph: Graph, value: Value, path: list[Node], var: str, index: list[str | None],
               params: list[Value]) -> list[str]:
    """Lines that apply the pointwise nodes of `path` (from its source on) to the tile `var`
    loaded from the source, leaving in `var` the operand's tile in the operand's dtype; as a
    chain kernel computes them (float32 in registers, rounded through narrower results)."""
    pointwise = [node for node in path if node.op not in MOVES]
    if not pointwise:
        return []
    env = {_source(graph, value, path): f"{var}_f"}
    lines = [f"{var}_f = {var}.to(tl.float32)"]
    scalars = Loader(graph, index, [int(d) for d in graph.type_of(value).shape], "mask", params, prefix=f"{var}_c")
    for node in reversed(path):
        if node.op in MOVES:
            env[Value(node.name)] = env[graph.inputs_of(node.name)[0]]  # type: ignore[index]
        else:
            lines += emit_chain(graph, [node], scalars, env, prefix=f"{var}_v")[0]
    return lines + [f"{var} = {store_expr(env[value], graph.type_of(value))}"]


def _named(graph: Graph, value: Value, source: Value) -> str:
    """A load's comment: the operand and its type, and what it is read through."""
    note = f"{graph.value_name(value)}: {graph.type_of(value)}"
    return note if source == value else f"{note}, read from {graph.value_name(source)}: {graph.type_of(source)}"


def kernel(graph: Graph, nodes: list[Node], fn_name: str) -> tuple[str, list[Value]]:
    """Source of the attention kernel of `nodes` and its operand values (Q, K^T, V, then what
    the epilogues read)."""
    p = _parts(graph, nodes)
    s = sizes(graph, p)
    m, n, d, e = s["m"], s["n"], s["d"], s["e"]
    values = _operands(graph, p)
    q_t, v_t = graph.type_of(values[0]), graph.type_of(values[2])
    batch_shape, batch = _batch(p)
    matrices = (("rm[:, None]", "rd[None, :]"), ("rd[:, None]", "rn[None, :]"), ("rn[:, None]", "re[None, :]"))
    indices = [_index(graph.type_of(value), batch, batch_shape, *matrix) for value, matrix in zip(values, matrices)]
    (q_src, q_index, q_lines), (k_src, k_index, k_lines), (v_src, v_index, v_lines) = (
        _read(graph, value, path, index, prefix)
        for value, path, index, prefix in zip(values, p.through, indices, ("qh", "kh", "vh")))
    params: list[Value] = []
    q, k, v = (parameter(params, value) for value in (q_src, k_src, v_src))
    (q_prologue, k_prologue, v_prologue) = (
        _pointwise(graph, value, path, var, index, params)
        for value, path, var, index in zip(values, p.through, ("q", "kt", "vb"), indices))
    precision = ", input_precision=PRECISION" if q_t.dtype.name == "float32" else ""
    narrow = "" if v_t.dtype.name == "float32" else f".to({triton_dtype(v_t.dtype)})"
    lines = ["pid_m = tl.program_id(0)"]
    if batch:
        lines.append("batch = tl.program_id(1)")
        lines += unravel("batch", batch_shape, batch)
    lines += q_lines + k_lines + v_lines + [
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rd = tl.arange(0, BLOCK_D)",
        "re = tl.arange(0, BLOCK_E)",
        f"q = tl.load({q} + {offset(graph.type_of(q_src), q_index)}, "
        f"mask=(rm[:, None] < {m}) & (rd[None, :] < {d}), other=0.0)  # {_named(graph, values[0], q_src)}",
        *q_prologue,
        "m_i = tl.full((BLOCK_M,), -float('inf'), tl.float32)",
        "l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)",
        "acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)",
        f"for n0 in range(0, {n}, BLOCK_N):",
        "    rn = n0 + tl.arange(0, BLOCK_N)",
        f"    kt = tl.load({k} + {offset(graph.type_of(k_src), k_index)}, "
        f"mask=(rd[:, None] < {d}) & (rn[None, :] < {n}), other=0.0)  # {_named(graph, values[1], k_src)}",
        *("    " + line for line in k_prologue),
        f"    s = tl.dot(q, kt{precision})",
        f"    mask = (rm[:, None] < {m}) & (rn[None, :] < {n})",
    ]
    env: dict[Value, str] = {Value(p.scores.name): "s"}
    score = Loader(graph, batch + ["rm[:, None]", "rn[None, :]"], [*batch_shape, m, n], "mask", params,
                   blocks=["rm[:, None]", "rn[None, :]"], prefix="sx")
    body, var = emit_chain(graph, p.score_chain, score, env)
    lines += ["    " + line for line in body]
    lines += [
        f"    s = tl.where(rn[None, :] < {n}, {var or 's'}, -float('inf'))",
        "    m_new = tl.maximum(m_i, tl.max(s, axis=1))",
        "    m_safe = tl.where(m_new == -float('inf'), 0.0, m_new)",
        "    alpha = tl.exp(m_i - m_safe)",
        "    p = tl.exp(s - m_safe[:, None])",
        "    l_i = l_i * alpha + tl.sum(p, axis=1)",
        f"    vb = tl.load({v} + {offset(graph.type_of(v_src), v_index)}, "
        f"mask=(rn[:, None] < {n}) & (re[None, :] < {e}), other=0.0)  # {_named(graph, values[2], v_src)}",
        *("    " + line for line in v_prologue),
        f"    acc = acc * alpha[:, None] + tl.dot(p{narrow}, vb{precision})",
        "    m_i = m_new",
        f"o = {GUARDS[p.guard].format(o='acc / l_i[:, None]', l='l_i[:, None]')}",
        f"mask = (rm[:, None] < {m}) & (re[None, :] < {e})",
    ]
    env[Value(p.product.name)] = "o"
    result = Loader(graph, batch + ["rm[:, None]", "re[None, :]"], [*batch_shape, m, e], "mask", params,
                    blocks=["rm[:, None]", "re[None, :]"], prefix="ox")
    body, var = emit_chain(graph, p.epilogue, result, env)
    lines += body
    final = nodes[-1].outputs[0]
    where = offset(final, batch + ["rm[:, None]", "re[None, :]"])
    lines.append(f"tl.store(out0 + {where}, {store_expr(var or 'o', final)}, mask=mask)  # {final}")
    source = jit_function(fn_name, len(params), lines,
                          ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_E", "PRECISION"))
    return source, params


def grid(graph: Graph, nodes: list[Node], config: dict[str, Any]) -> tuple[int, ...]:
    p = _parts(graph, nodes)
    shape, _ = _batch(p)
    rows = -(-sizes(graph, p)["m"] // config["BLOCK_M"])
    return (rows, int(np.prod(shape, dtype=np.int64))) if shape else (rows,)


def constexprs(config: dict[str, Any]) -> dict[str, Any]:
    return {key: config[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_E")} | \
        {"PRECISION": config.get("input_precision", "ieee")}


FIRST_BLOCK = 64
"""BLOCK_M and BLOCK_N before they shrink to the sequence, or (BLOCK_M) to fill the GPU."""


def defaults(graph: Graph, nodes: list[Node], target: GpuTarget) -> dict[str, Any]:
    """Query and key blocks of up to 64 rows (BLOCK_M halved towards the tile while the grid
    has fewer programs than the target wants), head dims whole; 4 warps."""
    p = _parts(graph, nodes)
    s = sizes(graph, p)
    shape, _ = _batch(p)
    heads = int(np.prod(shape, dtype=np.int64))
    bm = min(FIRST_BLOCK, max(target.block, next_pow2(s["m"])))
    while heads * -(-s["m"] // bm) < target.programs and bm > target.block:
        bm //= 2
    return {"BLOCK_M": bm, "BLOCK_N": min(FIRST_BLOCK, max(target.block, next_pow2(s["n"]))),
            "BLOCK_D": max(target.block, next_pow2(s["d"])), "BLOCK_E": max(target.block, next_pow2(s["e"])),
            "num_warps": 4, "num_stages": 2, "input_precision": "ieee"}


def tiles(graph: Graph, nodes: list[Node]) -> list[tuple[str, TensorType, int, str]]:
    """(what, type, dim, block key) for the matrix dims the kernel reads and writes."""
    p = _parts(graph, nodes)
    found = []
    for what, value, path, keys in zip(("Q", "K^T", "V"), _operands(graph, p), p.through,
                                       (("BLOCK_M", "BLOCK_D"), ("BLOCK_D", "BLOCK_N"), ("BLOCK_N", "BLOCK_E"))):
        t = graph.type_of(value)
        index, _ = _mapped(graph, path, [*(f"b{d}" for d in range(t.rank - 2)), *keys], "x")
        source = _source(graph, value, path)
        found += [(f"{what} ({graph.value_name(source)})", graph.type_of(source), index.index(key), key)
                  for key in keys]
    out = nodes[-1].outputs[0]
    what = f"result ({nodes[-1].name})"
    return found + [(what, out, out.rank - 2, "BLOCK_M"), (what, out, out.rank - 1, "BLOCK_E")]


def check(graph: Graph, nodes: list[Node], config: dict[str, Any]) -> str | None:
    """A head dim longer than its block: a program holds whole rows of Q and of V."""
    s = sizes(graph, _parts(graph, nodes))
    for key, dim, what in (("BLOCK_D", "d", "Q and K"), ("BLOCK_E", "e", "V")):
        if config[key] < s[dim]:
            return f"{key}={config[key]} is shorter than the head dim of {what} ({s[dim]}; one block holds it)"
    return None


def absorbs(graph: Graph, nodes: list[Node], group_of: Callable[[Node], Any]) -> list[Node]:
    """The nodes outside the group the kernel reads Q, K^T and V through (`read_through`):
    views (no kernel), and moves and pointwise nodes that run as movement or chain kernels
    (GQA's Expand, a transpose that copies K); on each operand's way, as far as the kernels of
    the nodes taken (`group_of`: fusion's groups, None for inputs and constants) hold nothing
    else, so that those kernels go."""
    p = parts(graph, nodes)
    if p is None:
        return []

    def runs(node: Node) -> bool:
        group = group_of(node)
        return group is not None and group.kind in ("view", "movement", "chain")

    taken: list[Node] = []
    for value in _operands(graph, p):
        path = read_through(graph, value, runs)
        while path and not all(set(group_of(n).names) <= {m.name for m in path} for n in path):
            path = _computing(path[:-1])
        taken += path
    return taken
