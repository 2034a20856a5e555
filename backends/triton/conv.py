"""The convolution template: 1-D and 2-D Conv as an implicit GEMM, on channel-tiled (NCHWc16,
NCWc16) or plain operands, with a fused epilogue.

The GEMM: rows are output pixels (n, oh, ow) -- (n, ow) for a 1-D conv -- columns output
channels of one group, the sum runs over the kernel window (r, s), or (s), and the group's
input channels in BLOCK_K slices. A row's input pixel is (oh * stride - pad + r * dilation,
...), masked to the image (where some tap can leave it), so zero padding is never
materialized; channels are masked to the
group, so the padding of a channel-tiled buffer is never read. Each program computes BLOCK_M
pixels x BLOCK_N channels; the bias and the fused elementwise nodes (BatchNorm's scale and
shift, activation, residual add) are applied before the one store.

ConvTranspose is the same GEMM gathering instead of striding: output pixel p takes input
pixel (p + pad - tap * dilation) / stride for the taps where that divides (the others are
masked, so a stride-2 kernel skips 3 of 4 taps of a 2-D window), over the weight's
(C, F/g, *k) layout.

The code is written over a list of spatial dims, so a 1-D conv (Whisper's input stem,
Wav2Vec2's feature extractor and positional conv) has one window loop and no H index at
all. The gpu target tiles 2-D convs only, so 1-D ones come plain from `optimize`; a
channel-tiled 1-D operand is read all the same. 3-D convs are not taken (`supports` is False
for rank 5: untested here, and no target tiles them); they run on the NumPy backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...graph.graph import Graph, Node
from ...graph.ops.shapes import transposed_window
from ...graph.types import TensorType, Value
from ...layout.targets import GpuTarget
from .codegen import jit_function
from .elementwise import Loader, emit_chain, store_expr
from .indexing import filling_blocks, is_float, next_pow2, offset, unravel

N_IDX, F_IDX = "pn[:, None]", "rf[None, :]"
SPATIAL_RANKS = frozenset({1, 2})
"""Numbers of spatial dims the template runs (1-D and 2-D convs)."""


def supports(graph: Graph, node: Node) -> bool:
    """A 1-D or 2-D Conv with explicit padding, or ConvTranspose, on static float operands of
    one dtype."""
    if node.op not in ("Conv", "ConvTranspose"):
        return False
    if node.op == "Conv" and node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return False
    values = graph.inputs_of(node.name)
    types = [graph.type_of(v) if v is not None else None for v in values]
    x, w = types[0], types[1]
    if x is None or w is None or x.rank - 2 not in SPATIAL_RANKS or w.rank != x.rank:
        return False
    if not (x.is_static and w.is_static):
        return False
    out = node.outputs[0]
    bias = types[2] if len(types) > 2 else None
    return out.is_static and is_float(x) and is_float(w) and x.dtype == w.dtype and (bias is None or bias.is_static)


@dataclass(frozen=True)
class Geometry:
    """A Conv's sizes; spatial tuples hold one entry per spatial dim, outermost first."""

    n: int
    c: int
    f: int
    cg: int
    group: int
    size: tuple[int, ...]
    kernel: tuple[int, ...]
    out: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    """Padding at the start of each spatial dim (the end's follows from `out`)."""
    transposed: bool = False
    """ConvTranspose: output pixel p takes input pixel (p + pad - tap * dilation) / stride
    where that divides; the weight is (C, F/g, *k)."""

    @property
    def fg(self) -> int:
        return self.f // self.group

    @property
    def pixels(self) -> int:
        """Rows of the GEMM: output pixels over the whole batch."""
        return self.n * int(np.prod(self.out, dtype=np.int64))

    @property
    def letters(self) -> str:
        """Names of the spatial dims ("hw" or "w"): `p*` output, `i*` input indices."""
        return "dhw"[3 - len(self.size):]

    @property
    def taps(self) -> str:
        """Names of the kernel window loops ("rs" or "s")."""
        return "qrs"[3 - len(self.size):]


def geometry(graph: Graph, node: Node) -> Geometry:
    """The sizes of Conv or ConvTranspose `node`, read from its static operand and result
    types and attributes."""
    x = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    w = graph.type_of(graph.inputs_of(node.name)[1])  # type: ignore[arg-type]
    nd = x.rank - 2
    group = int(node.attrs.get("group", 1))
    size, kernel = tuple(int(d) for d in x.shape[2:]), tuple(int(d) for d in w.shape[2:])
    transposed = node.op == "ConvTranspose"
    if transposed:
        f, cg = int(w.shape[1]) * group, int(w.shape[0]) // group
        pads = transposed_window(node.op, node.attrs, size, kernel)[1]
    else:
        f, cg = int(w.shape[0]), int(w.shape[1])
        pads = tuple(int(p) for p in node.attrs.get("pads") or (0,) * (2 * nd))[:nd]
    return Geometry(
        n=int(x.shape[0]), c=int(x.shape[1]), f=f, cg=cg, group=group, size=size, kernel=kernel,
        out=tuple(int(d) for d in node.outputs[0].shape[2:]),
        strides=tuple(int(s) for s in node.attrs.get("strides") or (1,) * nd),
        dilations=tuple(int(d) for d in node.attrs.get("dilations") or (1,) * nd), pads=tuple(pads),
        transposed=transposed)


def tiles(graph: Graph, nodes: list[Node]) -> list[tuple[str, TensorType, int, str]]:
    node = nodes[0]
    values = graph.inputs_of(node.name)
    x, w = graph.type_of(values[0]), graph.type_of(values[1])  # type: ignore[arg-type]
    out = nodes[-1].outputs[0]
    outputs, inputs = (1, 0) if nodes[0].op == "ConvTranspose" else (0, 1)  # the weight's channel dims
    return [(f"operand 0 ({graph.value_name(values[0])})", x, 1, "BLOCK_K"),  # type: ignore[arg-type]
            (f"operand 1 ({graph.value_name(values[1])})", w, outputs, "BLOCK_N"),  # type: ignore[arg-type]
            (f"operand 1 ({graph.value_name(values[1])})", w, inputs, "BLOCK_K"),  # type: ignore[arg-type]
            (f"result ({nodes[-1].name})", out, 1, "BLOCK_N")]


def defaults(graph: Graph, nodes: list[Node], target: GpuTarget) -> dict[str, Any]:
    """As the matmul's: pixels by filters per group, blocks that fill the GPU's programs."""
    g = geometry(graph, nodes[0])
    bm, bn = filling_blocks(g.pixels, g.fg, g.group, target)
    tile = target.block
    bk = min(max(tile, next_pow2(g.cg)), 2 * tile if nodes[0].outputs[0].dtype.itemsize >= 4 else 4 * tile)
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 8 if bm * bn >= 128 * 128 else 4,
            "num_stages": 3, "input_precision": "ieee"}


def _input_index(g: Geometry, d: int) -> str:
    """Input coordinate along spatial dim `d` of the current output pixel and window tap:
    p * stride - pad + tap * dilation, with the unit factors and a zero pad left out."""
    p, tap = f"p{g.letters[d]}", g.taps[d]
    stride, pad, dilation = g.strides[d], g.pads[d], g.dilations[d]
    expr = p if stride == 1 else f"{p} * {stride}"
    expr += f" - {pad}" if pad else ""
    expr += f" + {tap}" if dilation == 1 else f" + {tap} * {dilation}"
    return f"({expr})"


def _transposed_index(g: Geometry, d: int) -> list[str]:
    """Lines giving the input coordinate `i*` of ConvTranspose along spatial dim `d` from its
    numerator `t*` = p + pad - tap * dilation (a valid tap where it divides by the stride)."""
    letter, tap = g.letters[d], g.taps[d]
    pad, dilation, stride = g.pads[d], g.dilations[d], g.strides[d]
    numerator = f"p{letter}" + (f" + {pad}" if pad > 0 else f" - {-pad}" if pad < 0 else "")
    numerator += f" - {tap}" if dilation == 1 else f" - {tap} * {dilation}"
    return [f"t{letter} = {numerator}", f"i{letter} = t{letter}" if stride == 1 else f"i{letter} = t{letter} // {stride}"]


def _in_image(g: Geometry, d: int) -> list[str]:
    """Bounds checks of input coordinate `i*` along spatial dim `d`, leaving out those no tap
    can fail (no padding before; the last output's last tap inside the image). ConvTranspose
    checks its numerator: not negative, divisible by the stride, and inside the image."""
    i = f"i{g.letters[d]}"
    if g.transposed:
        t = f"t{g.letters[d]}"
        divides = [f"({t} % {g.strides[d]} == 0)"] if g.strides[d] > 1 else []
        return [f"({t} >= 0)", *divides, f"({i} < {g.size[d]})"]
    checks = [f"({i} >= 0)"] if g.pads[d] else []
    last = (g.out[d] - 1) * g.strides[d] - g.pads[d] + (g.kernel[d] - 1) * g.dilations[d]
    return checks + ([f"({i} < {g.size[d]})"] if last >= g.size[d] else [])


def _window_loops(g: Geometry) -> tuple[list[str], str]:
    """Lines opening one loop per kernel dim (each computing its input coordinate) and the
    row mask of the innermost one; the indentation of the loops' body."""
    lines: list[str] = []
    for d, (tap, letter) in enumerate(zip(g.taps, g.letters)):
        indent = "    " * d
        coordinate = _transposed_index(g, d) if g.transposed else [f"i{letter} = {_input_index(g, d)}"]
        lines += [f"{indent}for {tap} in range({g.kernel[d]}):", *(f"{indent}    {line}" for line in coordinate)]
    body = "    " * len(g.kernel)
    checks = [f"(pm < {g.pixels})"] + [c for d in range(len(g.kernel)) for c in _in_image(g, d)]
    lines.append(f"{body}row_ok = {' & '.join(checks)}")
    return lines, body


def kernel(graph: Graph, nodes: list[Node], fn_name: str) -> tuple[str, list[Value]]:
    """Source of the implicit-GEMM kernel of Conv `nodes[0]` with its epilogue `nodes[1:]`;
    parameters: X, W, the bias if any, then the epilogue's operands (returned), the result."""
    node = nodes[0]
    values = graph.inputs_of(node.name)
    x_t, w_t = graph.type_of(values[0]), graph.type_of(values[1])  # type: ignore[arg-type]
    g = geometry(graph, node)
    x_index = [N_IDX, "(cg0 + rc)[None, :]", *(f"i{letter}[:, None]" for letter in g.letters)]
    w_index = (["(cg0 + rc)[:, None]", "rfg[None, :]", *g.taps] if g.transposed
               else ["rf[None, :]", "rc[:, None]", *g.taps])
    precision = ", input_precision=PRECISION" if x_t.dtype.name == "float32" else ""
    window, body = _window_loops(g)
    lines = [
        "pid_m = tl.program_id(0)", "pid_n = tl.program_id(1)", "grp = tl.program_id(2)",
        "pm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        *unravel("pm", (g.n, *g.out), ["pn", *(f"p{letter}" for letter in g.letters)]),
        "rfg = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        f"rf = grp * {g.fg} + rfg",
        f"f_ok = rfg < {g.fg}",
        f"cg0 = grp * {g.cg}",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        *window,
        f"{body}for c0 in range(0, {g.cg}, BLOCK_K):",
        f"{body}    rc = c0 + tl.arange(0, BLOCK_K)",
        f"{body}    c_ok = rc < {g.cg}",
        f"{body}    a = tl.load(in0 + {offset(x_t, x_index)}, mask=row_ok[:, None] & c_ok[None, :], other=0.0)"
        f"  # {graph.value_name(values[0])}: {x_t}",  # type: ignore[arg-type]
        f"{body}    b = tl.load(in1 + {offset(w_t, w_index)}, mask=c_ok[:, None] & f_ok[None, :], other=0.0)"
        f"  # {graph.value_name(values[1])}: {w_t}",  # type: ignore[arg-type]
        f"{body}    acc += tl.dot(a, b{precision})",
        f"mask = (pm[:, None] < {g.pixels}) & f_ok[None, :]",
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
    index = [N_IDX, F_IDX, *(f"p{letter}[:, None]" for letter in g.letters)]
    loader = Loader(graph, index, [int(d) for d in out.shape], "mask", params)
    chain, var = emit_chain(graph, nodes[1:], loader, {Value(node.name): "acc"})
    lines += chain
    final = nodes[-1].outputs[0]
    lines.append(f"tl.store(out0 + {offset(final, index)}, {store_expr(var or 'acc', final)}, mask=mask)  # {final}")
    source = jit_function(fn_name, len(params), lines, ("BLOCK_M", "BLOCK_N", "BLOCK_K", "PRECISION"))
    return source, params


def grid(graph: Graph, nodes: list[Node], config: dict[str, Any]) -> tuple[int, ...]:
    g = geometry(graph, nodes[0])
    return (-(-g.pixels // config["BLOCK_M"]), -(-g.fg // config["BLOCK_N"]), g.group)


def constexprs(config: dict[str, Any]) -> dict[str, Any]:
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "PRECISION": config.get("input_precision", "ieee")}
