"""The convolution template: 2-D Conv as an implicit GEMM, on NCHWc16 or plain operands, with
a fused epilogue.

The GEMM: rows are output pixels (n, oh, ow), columns output channels of one group, the sum
runs over the kernel window (r, s) and the group's input channels in BLOCK_K slices. A row's
input pixel is (oh * stride - pad + r * dilation, ...), masked to the image, so zero padding
is never materialized; channels are masked to the group, so the padding of an NCHWc16
buffer is never read. Each program computes BLOCK_M pixels x BLOCK_N channels; the bias and
the fused elementwise nodes (BatchNorm's scale and shift, activation, residual add) are
applied before the one store.
"""
from __future__ import annotations

from typing import Any

from ...graph.graph import Graph, Node
from ...graph.types import TensorType, Value
from .elementwise import Loader, emit_chain, store_expr
from .indexing import is_float, next_pow2, offset

N_IDX, F_IDX, H_IDX, W_IDX = "pn[:, None]", "rf[None, :]", "poh[:, None]", "pw[:, None]"


def supports(graph: Graph, node: Node) -> bool:
    if node.op != "Conv" or node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return False
    values = graph.inputs_of(node.name)
    types = [graph.type_of(v) if v is not None else None for v in values]
    x, w = types[0], types[1]
    if x is None or w is None or x.rank != 4 or w.rank != 4 or not (x.is_static and w.is_static):
        return False
    out = node.outputs[0]
    bias = types[2] if len(types) > 2 else None
    return out.is_static and is_float(x) and is_float(w) and x.dtype == w.dtype and (bias is None or bias.is_static)


def geometry(graph: Graph, node: Node) -> dict[str, Any]:
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    w = graph.type_of(graph.inputs_of(node.name)[1])  # type: ignore[arg-type]
    out = node.outputs[0]
    n, c, h, wd = (int(d) for d in x.shape)
    f, cg, r, s = (int(d) for d in w.shape)
    pads = list(node.attrs.get("pads") or (0, 0, 0, 0))
    return {"n": n, "c": c, "h": h, "w": wd, "f": f, "cg": cg, "r": r, "s": s,
            "group": int(node.attrs.get("group", 1)), "fg": f // int(node.attrs.get("group", 1)),
            "oh": int(out.shape[2]), "ow": int(out.shape[3]),
            "strides": list(node.attrs.get("strides") or (1, 1)),
            "dilations": list(node.attrs.get("dilations") or (1, 1)), "pads": pads}


def tiles(graph: Graph, nodes: list[Node]) -> list[tuple[str, TensorType, int, str]]:
    node = nodes[0]
    values = graph.inputs_of(node.name)
    x, w = graph.type_of(values[0]), graph.type_of(values[1])  # type: ignore[arg-type]
    out = nodes[-1].outputs[0]
    return [(f"operand 0 ({graph.value_name(values[0])})", x, 1, "BLOCK_K"),  # type: ignore[arg-type]
            (f"operand 1 ({graph.value_name(values[1])})", w, 0, "BLOCK_N"),  # type: ignore[arg-type]
            (f"operand 1 ({graph.value_name(values[1])})", w, 1, "BLOCK_K"),  # type: ignore[arg-type]
            (f"result ({nodes[-1].name})", out, 1, "BLOCK_N")]


def defaults(graph: Graph, nodes: list[Node], tile: int) -> dict[str, Any]:
    g = geometry(graph, nodes[0])
    pixels = g["n"] * g["oh"] * g["ow"]
    bm = min(128, max(tile, next_pow2(pixels)))
    bn = min(128, max(tile, next_pow2(g["fg"])))
    bk = min(max(tile, next_pow2(g["cg"])), 2 * tile if nodes[0].outputs[0].dtype.itemsize >= 4 else 4 * tile)
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 8 if bm * bn >= 128 * 128 else 4,
            "num_stages": 3, "input_precision": "ieee"}


def kernel(graph: Graph, nodes: list[Node], fn_name: str) -> tuple[str, list[Value]]:
    node = nodes[0]
    values = graph.inputs_of(node.name)
    x_t, w_t = graph.type_of(values[0]), graph.type_of(values[1])  # type: ignore[arg-type]
    g = geometry(graph, node)
    (sh, sw), (dh, dw), (pt, pl) = g["strides"], g["dilations"], g["pads"][:2]
    pixels = g["n"] * g["oh"] * g["ow"]
    ih = f"(poh * {sh} - {pt} + r * {dh})" if (sh, pt, dh) != (1, 0, 1) else "(poh + r)"
    iw = f"(pw * {sw} - {pl} + s * {dw})" if (sw, pl, dw) != (1, 0, 1) else "(pw + s)"
    x_index = [N_IDX, "(cg0 + rc)[None, :]", "ih[:, None]", "iw[:, None]"]
    w_index = ["rf[None, :]", "rc[:, None]", "r", "s"]
    precision = ", input_precision=PRECISION" if x_t.dtype.name == "float32" else ""
    lines = [
        "pid_m = tl.program_id(0)", "pid_n = tl.program_id(1)", "grp = tl.program_id(2)",
        "pm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        f"pn = pm // {g['oh'] * g['ow']}", f"poh = (pm // {g['ow']}) % {g['oh']}", f"pw = pm % {g['ow']}",
        f"rf = grp * {g['fg']} + pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        f"f_ok = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) < {g['fg']}",
        f"cg0 = grp * {g['cg']}",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        f"for r in range({g['r']}):",
        f"    ih = {ih}",
        f"    for s in range({g['s']}):",
        f"        iw = {iw}",
        f"        row_ok = (pm < {pixels}) & (ih >= 0) & (ih < {g['h']}) & (iw >= 0) & (iw < {g['w']})",
        f"        for c0 in range(0, {g['cg']}, BLOCK_K):",
        "            rc = c0 + tl.arange(0, BLOCK_K)",
        f"            c_ok = rc < {g['cg']}",
        f"            a = tl.load(in0 + {offset(x_t, x_index)}, mask=row_ok[:, None] & c_ok[None, :], other=0.0)"
        f"  # {graph.value_name(values[0])}: {x_t}",  # type: ignore[arg-type]
        f"            b = tl.load(in1 + {offset(w_t, w_index)}, mask=c_ok[:, None] & f_ok[None, :], other=0.0)"
        f"  # {graph.value_name(values[1])}: {w_t}",  # type: ignore[arg-type]
        f"            acc += tl.dot(a, b{precision})",
        f"mask = (pm[:, None] < {pixels}) & f_ok[None, :]",
    ]
    params: list[Value] = [values[0], values[1]]  # type: ignore[list-item]
    bias = values[2] if len(values) > 2 else None
    if bias is not None:
        b_t = graph.type_of(bias)
        params.append(bias)
        load = f"tl.load(in2 + {offset(b_t, [F_IDX])}, mask=f_ok[None, :])"
        lines.append(f"acc = acc + {load}{'.to(tl.float32)' if b_t.dtype.name != 'float32' else ''}"
                     f"  # {graph.value_name(bias)}: {b_t}")
    out = node.outputs[0]
    index = [N_IDX, F_IDX, H_IDX, W_IDX]
    loader = Loader(graph, index, [int(d) for d in out.shape], "mask", params)
    body, var = emit_chain(graph, nodes[1:], loader, {Value(node.name): "acc"})
    lines += body
    final = nodes[-1].outputs[0]
    lines.append(f"tl.store(out0 + {offset(final, index)}, {store_expr(var or 'acc', final)}, mask=mask)  # {final}")
    args = [f"in{i}" for i in range(len(params))] + ["out0", "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr",
                                                      "BLOCK_K: tl.constexpr", "PRECISION: tl.constexpr"]
    source = "@triton.jit\ndef {}({}):\n{}\n".format(fn_name, ", ".join(args), "\n".join("    " + x for x in lines))
    return source, params


def grid(graph: Graph, nodes: list[Node], config: dict[str, Any]) -> tuple[int, ...]:
    g = geometry(graph, nodes[0])
    pixels = g["n"] * g["oh"] * g["ow"]
    return (-(-pixels // config["BLOCK_M"]), -(-g["fg"] // config["BLOCK_N"]), g["group"])



def constexprs(config: dict[str, Any]) -> dict[str, Any]:
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "PRECISION": config.get("input_precision", "ieee")}
