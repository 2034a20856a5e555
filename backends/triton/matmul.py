"""The matmul template: MatMul (batched, broadcast) and Gemm, on packed or plain operands,
with a fused epilogue.

Each program computes one BLOCK_M x BLOCK_N block of the result, accumulating in float32
over BLOCK_K slices of k (programs ordered GROUP_M row blocks at a time, for L2 reuse). Operands are read through their encodings (indexing.py): the gpu
target's mmt4d operands ([M/16, K/16, 16, 16] tiles) and row-major or transposed ones
(Gemm transA/transB, a Transpose relabeled into the encoding) alike, every read masked to the
logical extent, so padding of any kind never reaches the sum. The epilogue (Gemm's alpha,
beta*C; then the fused elementwise nodes: bias, activation, residual add, folded BatchNorm's
scale and shift) runs on the accumulator before the one store, or, where a Split of the
result along its rows or columns ends the group (GPT-2's query, key and value), before one
masked store per part, each at its index in its part, through its part's encoding. Where
elementwise nodes read every part of a Split into equal column parts at one index (LLaMA's
SiLU(gate) * up of its merged gate and up projections: `pairs`), the kernel holds each
part's columns of a block in an accumulator of its own (one tl.dot per part on the rows it
loads once), runs the nodes before the Split once per part at that part's columns, then the
nodes after it, and stores only their result. Where elementwise nodes read one column part
alone (a parallel block's GELU of its MLP part, that projection merged with the attention's:
Phi, GPT-NeoX, Falcon; `part_epilogue`), the kernel stores the other parts as they are and
computes those nodes on that part's columns of the block, storing their result instead.

A norm of the rows that only this product reads (a pre-norm transformer's first Linear
layers) is a prologue (`takes_prologue`): a LayerNormalization (GPT-2, ViT, CLIP, ConvNeXt),
whose mean and deviation the kernel finds in two passes over k before the product, or a row
group around a sum over k (RMSNorm: LLaMA, Mistral, Qwen2, Gemma, T5), whose sum takes one
pass; each block of rows is then computed as it is loaded. The norm's kernel and its result's
buffer go, for one or two more reads of the rows, which stay in L2 across the programs of a
row block. Where nodes after the product read the norm's result too (a post-norm layer's
LayerNorm is its next residual: BERT, BART), the kernel also writes it (`shares_prologue`):
the programs of the first block column store each block of rows they compute; the norm's
kernel goes, its buffer stays.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.types import TensorType, Value
from ...layout.targets import GpuTarget
from . import split
from .codegen import jit_function
from .elementwise import OPS, Loader, emit_chain, store_expr
from .indexing import broadcast_index, filling_blocks, is_float, next_pow2, offset, parameter, triton_dtype, unravel

M_IDX, N_IDX = "rm[:, None]", "rn[None, :]"


def supports(graph: Graph, node: Node) -> bool:
    if node.op not in ("MatMul", "Gemm") or not node.outputs[0].is_static:
        return False
    values = graph.inputs_of(node.name)
    types = [graph.type_of(v) if v is not None else None for v in values]
    a, b = types[0], types[1]
    if a is None or b is None or a.rank < 2 or b.rank < 2 or not (a.is_static and b.is_static):
        return False
    if not (is_float(a) and is_float(b) and is_float(node.outputs[0])) or a.dtype != b.dtype:
        return False
    if node.op == "Gemm" and len(types) > 2 and types[2] is not None:
        return types[2].is_static and is_float(types[2])
    return True


def anchor(nodes: list[Node]) -> Node:
    """The group's MatMul or Gemm (after a layer norm it computes as a prologue)."""
    return next(n for n in nodes if n.op in ("MatMul", "Gemm"))


def _prologue(nodes: list[Node]) -> list[Node]:
    """The nodes the kernel computes before its anchor (a row group that gives its rows)."""
    return nodes[:nodes.index(anchor(nodes))]


def _rows(graph: Graph, nodes: list[Node]) -> Value | None:
    """The tensor a row group computes its rows from: the first operand of its nodes, of the
    rows' shape, that the group does not compute itself (a norm's operand)."""
    inside = {n.name for n in nodes}
    shape = tuple(nodes[-1].outputs[0].shape)
    return next((v for n in nodes for v in graph.inputs_of(n.name)
                 if v is not None and v.node not in inside and tuple(graph.type_of(v).shape) == shape), None)


def _row_sum(graph: Graph, nodes: list[Node]) -> Node | None:
    """The ReduceSum or ReduceMean of a row group (RMSNorm's mean of squares) whose kernel a
    matmul can run as it reads its rows: a sum over the last dim, kept, of float rows, with
    elementwise nodes before it (of the row's shape) and after it (of the row's shape, or of
    one value per row), the last of the row's shape. None otherwise."""
    from .reduce import axes_of, first_row_op

    anchor_ = first_row_op(nodes)
    x = graph.type_of(graph.inputs_of(anchor_.name)[0])  # type: ignore[arg-type]
    if anchor_.op not in ("ReduceSum", "ReduceMean") or not anchor_.attrs.get("keepdims", 1) or \
            not is_float(x) or axes_of(graph, anchor_) != (x.rank - 1,):
        return None
    row, kept = tuple(x.shape), tuple(anchor_.outputs[0].shape)
    others = [n for n in nodes if n is not anchor_]
    if not all(n.op in OPS and tuple(n.outputs[0].shape) in (row, kept) for n in others):
        return None
    before = nodes[:nodes.index(anchor_)]
    if any(tuple(n.outputs[0].shape) != row for n in before) or tuple(nodes[-1].outputs[0].shape) != row:
        return None
    return anchor_ if _rows(graph, nodes) is not None else None


def takes_prologue(graph: Graph, node: Node, kind: str, nodes: list[Node]) -> bool:
    """Whether the kernel of matmul `node` computes the group of `nodes` (of `kind`) that gives
    its first operand, which the anchor reads as its rows (not Gemm's transA): a
    LayerNormalization alone over its operand's last dim (a float one, its scale and bias
    vectors of that length), or a row group around a sum over the last dim (`_row_sum`:
    RMSNorm). The kernel then finds each row's statistics in passes over k before the product,
    and computes each block of rows as it loads it."""
    if kind != "reduce" or (node.op == "Gemm" and node.attrs.get("transA", 0)):
        return False
    if _row_sum(graph, nodes) is not None:
        return True
    if len(nodes) != 1 or nodes[0].op != "LayerNormalization":
        return False
    norm = nodes[0]
    values = graph.inputs_of(norm.name)
    x = graph.type_of(values[0])  # type: ignore[arg-type]
    if int(norm.attrs.get("axis", -1)) % x.rank != x.rank - 1 or not (x.is_static and is_float(x)):
        return False
    return all(v is None or (graph.type_of(v).is_static and is_float(graph.type_of(v)) and
                             tuple(graph.type_of(v).shape) == (int(x.shape[-1]),)) for v in values[1:3])


def shares_prologue(graph: Graph, node: Node, kind: str, nodes: list[Node]) -> bool:
    """Whether the kernel of matmul `node` can also write the result of the prologue `nodes`
    (`takes_prologue`): each of its rows once, which holds where every matrix of the result
    reads its own matrix of rows (the rows' batch dims are the result's: no broadcast)."""
    rows = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    return tuple(rows.shape[:-2]) == tuple(node.outputs[0].shape[:-2])


def _written(graph: Graph, nodes: list[Node]) -> list[Value]:
    """The prologue's result where nodes outside the group read it too (the kernel writes it)."""
    prologue = _prologue(nodes)
    if not prologue:
        return []
    inside, value = {n.name for n in nodes}, Value(prologue[-1].name)
    return [value] if any(user not in inside for user, _ in graph.users(value)) else []


def _operand_dims(node: Node) -> tuple[tuple[str, str], tuple[str, str]]:
    """Which of m/n/k each matrix dim of A and B is."""
    a = ("k", "m") if node.op == "Gemm" and node.attrs.get("transA", 0) else ("m", "k")
    b = ("n", "k") if node.op == "Gemm" and node.attrs.get("transB", 0) else ("k", "n")
    return a, b


def sizes(graph: Graph, node: Node) -> dict[str, int]:
    out = node.outputs[0]
    a_t = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    a_dims, _ = _operand_dims(node)
    k = int(a_t.shape[-2 + a_dims.index("k")])
    return {"m": int(out.shape[-2]), "n": int(out.shape[-1]), "k": k}


def tiles(graph: Graph, nodes: list[Node]) -> list[tuple[str, TensorType, int, str]]:
    """(what, type, dim, block key) for every matrix dim a block of the kernel reads or
    writes: the launch verifier checks that blocks cover whole tiles."""
    node = anchor(nodes)
    values = graph.inputs_of(node.name)
    if _prologue(nodes):  # the rows are computed from the row group's operand
        values = [_rows(graph, _prologue(nodes)), *values[1:]]
    a_dims, b_dims = _operand_dims(node)
    keys = {"m": "BLOCK_M", "n": "BLOCK_N", "k": "BLOCK_K"}
    found = []
    for slot, dims in ((0, a_dims), (1, b_dims)):
        t = graph.type_of(values[slot])  # type: ignore[arg-type]
        for j, letter in enumerate(dims):
            found.append((f"operand {slot} ({graph.value_name(values[slot])})", t, t.rank - 2 + j, keys[letter]))
    for k, out in enumerate(nodes[-1].outputs):
        what = f"result ({nodes[-1].name}" + (f", part {k})" if _splits(nodes) else ")")
        found += [(what, out, out.rank - 2, "BLOCK_M"), (what, out, out.rank - 1, "BLOCK_N")]
    for value in _written(graph, nodes):
        t, what = graph.type_of(value), f"result ({value.node})"
        found += [(what, t, t.rank - 2, "BLOCK_M"), (what, t, t.rank - 1, "BLOCK_K")]
    for value in _part_writes(graph, nodes):
        t, what = graph.type_of(value), f"result ({value.node}, part {value.slot})"
        found += [(what, t, t.rank - 2, "BLOCK_M"), (what, t, t.rank - 1, "BLOCK_N")]
    return found


def _splits(nodes: list[Node]) -> bool:
    return len(nodes) > 1 and nodes[-1].op == "Split"


def _inner_split(nodes: list[Node]) -> Node | None:
    return next((n for n in nodes[:-1] if n.op == "Split"), None)


def _one_part(graph: Graph, nodes: list[Node]) -> tuple[Node, int] | None:
    """The Split inside the group one of whose parts alone the nodes after it read (that
    part's epilogue: `part_epilogue`), and that part; None otherwise."""
    found = _inner_split(nodes)
    if found is None:
        return None
    read = {v.slot for n in nodes[nodes.index(found) + 1:] for v in graph.inputs_of(n.name)
            if v is not None and v.node == found.name}
    return (found, read.pop()) if len(read) == 1 and len(found.outputs) > 1 else None


def _paired(graph: Graph, nodes: list[Node]) -> tuple[Node, int] | None:
    """The Split inside the group whose parts the nodes after it read side by side, and their
    count (`pairs`), or None."""
    found = _inner_split(nodes)
    return (found, len(found.outputs)) if found is not None and _one_part(graph, nodes) is None else None


def part_epilogue(graph: Graph, nodes: list[Node]) -> bool:
    """Whether elementwise nodes after a product whose Split cuts its columns may read one
    part alone, as that part's epilogue: the kernel computes them on the part's columns of
    each block and stores their result instead of the part."""
    if not _splits(nodes):
        return False
    rank = nodes[-1].outputs[0].rank
    return int(nodes[-1].attrs.get("axis", 0)) % rank == rank - 1


def _part_writes(graph: Graph, nodes: list[Node]) -> list[Value]:
    """The parts of a Split with a part's epilogue (`_one_part`) that the kernel writes as they are."""
    part = _one_part(graph, nodes)
    return [] if part is None else [Value(part[0].name, k) for k in range(len(part[0].outputs)) if k != part[1]]


def pairs(graph: Graph, nodes: list[Node]) -> bool:
    """Whether elementwise nodes after a MatMul whose Split cuts its columns into equal parts
    may read every part at one index (LLaMA's SiLU(gate) * up of its merged gate and up
    projections): the kernel then holds each part's columns of a block in its own accumulator
    (one product per part, the rows loaded once), and the parts are never written."""
    if not _splits(nodes) or anchor(nodes).op != "MatMul":
        return False
    parts = split.sizes(graph, nodes[-1]) or []
    rank = nodes[-1].outputs[0].rank
    return int(nodes[-1].attrs.get("axis", 0)) % rank == rank - 1 and len(parts) >= 2 and len(set(parts)) == 1


def _group_sizes(graph: Graph, nodes: list[Node]) -> dict[str, int]:
    """The anchor's m and k, and the columns n of one part of the kernel's result: the
    product's, or one part's where the kernel holds its Split's parts side by side."""
    s = sizes(graph, anchor(nodes))
    paired = _paired(graph, nodes)
    return {**s, "n": s["n"] // paired[1]} if paired else s


def takes_split(graph: Graph, nodes: list[Node], node: Node) -> bool:
    """Whether Split `node` of the group's result ends the group: one the split template runs,
    along the result's rows or columns (the kernel then stores each part itself)."""
    if node.op != "Split" or any(n.op == "Split" for n in nodes) or not split.supports(graph, node):
        return False
    rank = nodes[-1].outputs[0].rank
    return int(node.attrs.get("axis", 0)) % rank >= rank - 2


def results(nodes: list[Node]) -> list[Value]:
    """The values the kernel writes: each part of a Split that ends the group, else the last
    node's result."""
    return split.results(nodes) if _splits(nodes) else [Value(nodes[-1].name)]


def defaults(graph: Graph, nodes: list[Node], target: GpuTarget) -> dict[str, Any]:
    """Blocks from the shapes (`filling_blocks`: up to 128 x 128, smaller where the grid would
    leave the GPU idle), BLOCK_K two tiles for 4-byte types, four for 2-byte ones."""
    node = anchor(nodes)
    s = _group_sizes(graph, nodes)
    bm, bn = filling_blocks(s["m"], s["n"], _matrices(node.outputs[0]), target)
    tile = target.block
    itemsize = node.outputs[0].dtype.itemsize
    bk = min(max(tile, next_pow2(s["k"])), tile * (2 if itemsize >= 4 else 4))
    warps = 8 if bm * bn >= 128 * 128 else 4
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": warps, "num_stages": 3,
            "input_precision": "ieee"}


def _matrices(out: TensorType) -> int:
    """How many matrices the batch dims of `out` hold: the grid's second axis."""
    return int(np.prod(_batch(out)[0], dtype=np.int64))


def _batch(out: TensorType) -> tuple[list[int], list[str]]:
    shape = [int(d) for d in out.shape[:-2]]
    return shape, [f"b{d}" for d in range(len(shape))]


def _operand_index(t: TensorType, dims: tuple[str, str], batch: list[str], batch_shape: list[int],
                   loop: dict[str, str]) -> list[str | None]:
    lead = broadcast_index(TensorType(t.shape[:-2], t.dtype), batch, batch_shape) if t.rank > 2 else []
    return lead + [loop[d] for d in dims]


def kernel(graph: Graph, nodes: list[Node], fn_name: str) -> tuple[str, list[Value]]:
    """Source of the matmul kernel of `nodes` (anchor, then epilogue) and its operand values."""
    node, prologue = anchor(nodes), _prologue(nodes)
    values = graph.inputs_of(node.name)
    operand_t = graph.type_of(values[0])  # type: ignore[arg-type]
    if prologue:  # the rows are computed from the row group's operand as they are loaded
        values = [_rows(graph, prologue), *values[1:]]
    a_t, b_t = graph.type_of(values[0]), graph.type_of(values[1])  # type: ignore[arg-type]
    out = node.outputs[0]
    paired = _paired(graph, nodes)
    count = paired[1] if paired else 1
    s = _group_sizes(graph, nodes)
    batch_shape, batch = _batch(out)
    a_dims, b_dims = _operand_dims(node)
    a_loop = {"m": "rm[:, None]", "k": "rk[None, :]"}
    a_off = offset(a_t, _operand_index(a_t, a_dims, batch, batch_shape, a_loop))
    b_mask = f"(rk[:, None] < {s['k']}) & (rn[None, :] < {s['n']})"  # the columns of one part
    lines = swizzle(s["m"], s["n"])
    if batch:
        lines.append("batch = tl.program_id(1)")
        lines += unravel("batch", batch_shape, batch)
    a_load = f"tl.load(in0 + {a_off}, mask=({_bounds(a_loop, a_dims, s)}), other=0.0)"
    params: list[Value] = [values[0], values[1]]  # type: ignore[list-item]
    lines += [
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
    ]
    normalize: list[str] = []
    loaded = [f"    a = {a_load}  # {graph.value_name(values[0])}: {a_t}"]
    if len(prologue) == 1 and prologue[0].op == "LayerNormalization":
        before, normalize = _norm_lines(graph, prologue[0], a_load, s["k"], params)
        lines += before
    elif prologue:
        index = batch + ["rm[:, None]", "rk[None, :]"]
        before, normalize = _row_sum_lines(graph, prologue, index, [*batch_shape, s["m"], s["k"]], s["k"], params)
        lines += before
        loaded = []  # the group's nodes load what they read
    if prologue and operand_t.dtype.name != "float32":  # the norm is float32; the product reads the operand's type
        normalize.append(f"    a = a.to({triton_dtype(operand_t.dtype)})")
    written = _written(graph, nodes)
    if written:  # the norm's result, by the first column of blocks
        where = offset(operand_t, batch + ["rm[:, None]", "rk[None, :]"])
        slot = len(results(nodes))
        normalize.append(f"    tl.store(out{slot} + {where}, {store_expr('a', operand_t)}, "
                         f"mask=({_bounds(a_loop, a_dims, s)}) & (pid_n == 0))  # {graph.value_name(written[0])}: "
                         f"{operand_t}")
    accs = ["acc"] if count == 1 else [f"acc{j}" for j in range(count)]
    columns = ["rn[None, :]"] + [f"(rn[None, :] + {j * s['n']})" for j in range(1, count)]
    precision = ", input_precision=PRECISION" if b_t.dtype.name == "float32" else ""
    lines += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in accs]
    lines += [f"for k0 in range(0, {s['k']}, BLOCK_K):", "    rk = k0 + tl.arange(0, BLOCK_K)", *loaded, *normalize]
    for j, (acc, cols) in enumerate(zip(accs, columns)):
        b_off = offset(b_t, _operand_index(b_t, b_dims, batch, batch_shape, {"k": "rk[:, None]", "n": cols}))
        tile = "b" if count == 1 else f"b_{j}"  # b0, b1, ...: the batch indices
        note = f"{graph.value_name(values[1])}: {b_t}"
        lines += [f"    {tile} = tl.load(in1 + {b_off}, mask=({b_mask}), other=0.0)  # {note}",
                  f"    {acc} += tl.dot(a, {tile}{precision})"]
    lines.append(f"mask = (rm[:, None] < {s['m']}) & (rn[None, :] < {s['n']})")
    after = nodes[nodes.index(node) + 1:]
    if paired:  # the nodes before the Split once per part, at its columns; then the rest on the parts
        cut = after.index(paired[0])
        env: dict[Value, str] = {}
        for j, (acc, cols) in enumerate(zip(accs, columns)):
            part = Loader(graph, batch + [M_IDX, cols], [*batch_shape, s["m"], s["n"] * count], "mask", params,
                          blocks=[M_IDX, cols], prefix=f"c{j}_")
            body, var = emit_chain(graph, after[:cut], part, {Value(node.name): acc}, prefix=f"p{j}_")
            lines += body
            env[Value(paired[0].name, j)] = var or acc
        after = after[cut + 1:]
    else:
        env = {Value(node.name): "acc"}
    load = Loader(graph, batch + [M_IDX, N_IDX], [*batch_shape, s["m"], s["n"]], "mask", params, blocks=[M_IDX, N_IDX])
    lines += _gemm_epilogue(graph, node, values, load)
    parts = nodes[-1] if _splits(nodes) else None
    part = _one_part(graph, nodes)
    if part is not None:  # the nodes through the Split here, those after it on its one part
        parts, tail, after = part[0], after[after.index(part[0]) + 1:], after[:after.index(part[0]) + 1]
    body, var = emit_chain(graph, after[:-1] if parts else after, load, env)
    lines += body
    var = var or "acc"
    if part is not None:
        lines += _part_lines(graph, part, tail, batch, [*batch_shape, s["m"]], var, params,
                             len(results(nodes)) + len(written))
    elif parts is None:
        final = nodes[-1].outputs[0]
        where = offset(final, batch + [M_IDX, N_IDX])
        lines.append(f"tl.store(out0 + {where}, {store_expr(var, final)}, mask=mask)  # {final}")
    else:
        lines += split.part_stores(graph, parts, batch + [M_IDX, N_IDX], var, narrow=True)
    source = jit_function(fn_name, len(params), lines, ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "PRECISION"),
                          results=len(results(nodes)) + len(written) + len(_part_writes(graph, nodes)))
    return source, params


def _part_lines(graph: Graph, part: tuple[Node, int], tail: list[Node], batch: list[str], rows: list[int],
                var: str, params: list[Value], first: int) -> list[str]:
    """The stores of a Split one part of which the `tail` nodes read alone (`_one_part`): each
    other part of `var` as it is (pointers `first` on, in order), then the tail computed on
    that part's columns of the block (its constants indexed by the part's own columns), its
    result stored as the kernel's first (`out0`). `rows`: the result's dims before its columns."""
    node, j = part
    widths = split.sizes(graph, node) or []
    slots: list[int | None] = [None if k == j else first + k - (k > j) for k in range(len(node.outputs))]
    lines = split.part_stores(graph, node, batch + [M_IDX, N_IDX], var, narrow=True, slots=slots)
    low, width = sum(widths[:j]), widths[j]
    cols = f"(rn[None, :] - {low})"
    lines.append(f"pmask = mask & (rn[None, :] >= {low}) & (rn[None, :] < {low + width})")
    load = Loader(graph, batch + [M_IDX, cols], [*rows, width], "pmask", params, blocks=[M_IDX, cols], prefix="q")
    body, out = emit_chain(graph, tail, load, {Value(node.name, j): var}, prefix="e")
    final = tail[-1].outputs[0]
    return lines + body + [f"tl.store(out0 + {offset(final, batch + [M_IDX, cols])}, {store_expr(out or var, final)}, "
                           f"mask=pmask)  # {final}"]


def _norm_lines(graph: Graph, norm: Node, a_load: str, k: int, params: list[Value]) -> tuple[list[str], list[str]]:
    """The layer norm of the rows, as the row template computes it: lines before the product
    (each row's mean, then the mean and the sum of squares of its deviations from it, which
    correct the mean and give 1 / sqrt(var + epsilon): two passes over k), and the lines that
    normalize a loaded block `a`, scaled and shifted, in float32 (lanes past k are 0: the
    scale and the shift are loaded as 0 there)."""
    x = graph.type_of(graph.inputs_of(norm.name)[0])  # type: ignore[arg-type]
    widen = "" if x.dtype.name == "float32" else ".to(tl.float32)"
    eps = float(norm.attrs.get("epsilon", 1e-5))
    before = [
        "mean = tl.zeros((BLOCK_M,), dtype=tl.float32)",
        f"for k0 in range(0, {k}, BLOCK_K):",
        "    rk = k0 + tl.arange(0, BLOCK_K)",
        f"    mean += tl.sum({a_load}{widen}, axis=1)",
        f"mean = mean / {k}",
        "shift = tl.zeros((BLOCK_M,), dtype=tl.float32)",
        "square = tl.zeros((BLOCK_M,), dtype=tl.float32)",
        f"for k0 in range(0, {k}, BLOCK_K):",
        "    rk = k0 + tl.arange(0, BLOCK_K)",
        f"    d = tl.where(rk[None, :] < {k}, {a_load}{widen} - mean[:, None], 0.0)",
        "    shift += tl.sum(d, axis=1)",
        "    square += tl.sum(d * d, axis=1)",
        f"shift = shift / {k}",
        f"rstd = 1.0 / tl.sqrt(tl.maximum(square / {k} - shift * shift, 0.0) + {eps!r})",
        "mean = mean + shift",
    ]
    normalize = [f"    a = (a{widen} - mean[:, None]) * rstd[:, None]  # {norm.name} (LayerNormalization)"]
    for slot, verb in ((1, "*"), (2, "+")):
        values = graph.inputs_of(norm.name)
        value = values[slot] if len(values) > slot else None
        if value is not None:
            t = graph.type_of(value)
            vector = (f"tl.load({parameter(params, value)} + {offset(t, ['rk[None, :]'])}, "
                      f"mask=rk[None, :] < {k}, other=0.0)")
            normalize.append(f"    a = a {verb} {vector}{'' if t.dtype.name == 'float32' else '.to(tl.float32)'}"
                             f"  # {graph.value_name(value)}: {t}")
    return before, normalize


def _row_sum_lines(graph: Graph, nodes: list[Node], index: list[str], shape: list[int], k: int, params: list[Value]
                   ) -> tuple[list[str], list[str]]:
    """A row group around a sum over k (`_row_sum`: RMSNorm), as the row template computes it:
    lines before the product (the nodes before the sum on each block of rows, summed over k in
    one pass; then the nodes of one value per row), and the lines that compute the group's
    row-shaped nodes on a loaded block, named `a`, in float32 (lanes past k 0)."""
    total = _row_sum(graph, nodes)
    assert total is not None
    at = nodes.index(total)
    kept = tuple(total.outputs[0].shape)
    per_row = [n for n in nodes[at + 1:] if tuple(n.outputs[0].shape) == kept]
    rows = [n for n in nodes[at + 1:] if tuple(n.outputs[0].shape) != kept]
    blocks = ["rm[:, None]", "rk[None, :]"]
    first = Loader(graph, index, shape, "mask", params, blocks=blocks, prefix="p")
    body, var = emit_chain(graph, nodes[:at], first, {}, prefix="w")
    x = var or first(graph.inputs_of(total.name)[0])  # type: ignore[arg-type]
    before = [
        "total = tl.zeros((BLOCK_M,), dtype=tl.float32)",
        f"for k0 in range(0, {k}, BLOCK_K):",
        "    rk = k0 + tl.arange(0, BLOCK_K)",
        f"    mask = (rm[:, None] < {shape[-2]}) & (rk[None, :] < {k})",
        *("    " + line for line in body + first.lines),
        f"    total += tl.sum(tl.where(mask, {x}, 0.0), axis=1)",
        f"total = total{' / ' + str(k) if total.op == 'ReduceMean' else ''}",
    ]
    env: dict[Value, str] = {Value(total.name): "total[:, None]"}
    row_index = [*index[:-1], "0"]
    per = Loader(graph, row_index, [*shape[:-1], 1], "rm[:, None] < " + str(shape[-2]), params,
                 blocks=["rm[:, None]"], prefix="q")
    lines, _ = emit_chain(graph, per_row, per, env, prefix="r")
    before += lines
    row = Loader(graph, index, shape, "mask", params, blocks=blocks, prefix="x")
    inner = dict(env)  # the nodes before the sum again, on the block of rows being loaded
    again, _ = emit_chain(graph, nodes[:at], row, inner, prefix="u")
    body, var = emit_chain(graph, rows, row, inner, prefix="y")
    normalize = [f"    mask = (rm[:, None] < {shape[-2]}) & (rk[None, :] < {k})",
                 *("    " + line for line in again + body), f"    a = tl.where(rk[None, :] < {k}, {var}, 0.0)"]
    return before, normalize


def swizzle(m: int, n: int) -> list[str]:
    """Program id -> (pid_m, pid_n), GROUP_M row blocks at a time, so programs that run
    together share operand blocks in L2 (Triton's matmul tutorial ordering)."""
    return [
        "pid = tl.program_id(0)",
        f"blocks_m = ({m} + BLOCK_M - 1) // BLOCK_M",
        f"blocks_n = ({n} + BLOCK_N - 1) // BLOCK_N",
        "group = GROUP_M * blocks_n",
        "first_m = (pid // group) * GROUP_M",
        "rows = tl.minimum(blocks_m - first_m, GROUP_M)",
        "pid_m = first_m + (pid % group) % rows",
        "pid_n = (pid % group) // rows",
    ]


def _bounds(loop: dict[str, str], dims: tuple[str, str], s: dict[str, int]) -> str:
    return " & ".join(f"({loop[d]} < {s[d]})" for d in dims)


def _gemm_epilogue(graph: Graph, node: Node, values: list[Value | None], load: Loader) -> list[str]:
    if node.op != "Gemm":
        return []
    lines = []
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    if alpha != 1.0:
        lines.append(f"acc = acc * {alpha!r}")
    c = values[2] if len(values) > 2 else None
    if c is not None and beta != 0.0:
        var = load(c)
        lines += load.lines
        load.lines.clear()
        lines.append(f"acc = acc + {var}" if beta == 1.0 else f"acc = acc + {beta!r} * {var}")
    return lines


def grid(graph: Graph, nodes: list[Node], config: dict[str, Any]) -> tuple[int, ...]:
    s, out = _group_sizes(graph, nodes), anchor(nodes).outputs[0]
    cells = -(-s["m"] // config["BLOCK_M"]) * -(-s["n"] // config["BLOCK_N"])
    return (cells, _matrices(out)) if out.rank > 2 else (cells,)


def constexprs(config: dict[str, Any]) -> dict[str, Any]:
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "GROUP_M": config.get("GROUP_M", 8), "PRECISION": config.get("input_precision", "ieee")}
