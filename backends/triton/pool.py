"""MaxPool and AveragePool (2-D) as chain heads: each result element reduces its window.

The window loops (r, s) are unrolled by Triton; every tap is a masked load through the
operand's encoding (NCHWc16 or plain), so the image border reads nothing: MaxPool's masked
taps are -inf (a NaN tap gives NaN, as in the NumPy backend and PyTorch, whatever the Triton
version's default), AveragePool's are 0 and count (count_include_pad=0) or not. Padding of a packed
operand is never read: taps are masked to the logical image. Elementwise nodes after the
pool fuse into the same kernel like any chain.
"""
from __future__ import annotations

from ...graph.graph import Graph, Node
from ...graph.types import Value
from .indexing import NAN, is_float, offset, parameter


def supports(graph: Graph, node: Node) -> bool:
    if node.op not in ("MaxPool", "AveragePool") or node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return False
    if len(node.outputs) > 1 and graph.users(Value(node.name, 1)):
        return False  # MaxPool's Indices output
    x = graph.inputs_of(node.name)[0]
    if x is None:
        return False
    t = graph.type_of(x)
    return t.rank == 4 and t.is_static and is_float(t) and node.outputs[0].is_static


def pool_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Lines reducing the window of result element (n, c, oh, ow) into `x_p`."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    t = graph.type_of(value)
    h, w = int(t.shape[2]), int(t.shape[3])
    kh, kw = (int(k) for k in node.attrs["kernel_shape"])
    sh, sw = (int(s) for s in node.attrs.get("strides") or (1, 1))
    dh, dw = (int(d) for d in node.attrs.get("dilations") or (1, 1))
    pt, pl = (int(p) for p in (node.attrs.get("pads") or (0, 0, 0, 0))[:2])
    param = parameter(params, value)
    is_max = node.op == "MaxPool"
    widen = ".to(tl.float32)" if t.dtype.name != "float32" else ""
    n, c, oh, ow = names
    where = offset(t, [n, c, "ih", "iw"])
    start = "-float('inf')" if is_max else "0.0"
    lines = [f"x_p = tl.full([BLOCK], {start}, tl.float32)  # {node.name} ({node.op}) over "
             f"{graph.value_name(value)}: {t}"]
    if not is_max:
        lines.append("taps = tl.zeros([BLOCK], dtype=tl.float32)")
    lines += [
        f"for r in range({kh}):",
        f"    ih = {oh} * {sh} - {pt} + r * {dh}",
        f"    for s in range({kw}):",
        f"        iw = {ow} * {sw} - {pl} + s * {dw}",
        f"        ok = mask & (ih >= 0) & (ih < {h}) & (iw >= 0) & (iw < {w})",
    ]
    if is_max:
        load = f"tl.load({param} + {where}, mask=ok, other=-float('inf')){widen}"
        lines.append(f"        x_p = tl.maximum(x_p, {load}{NAN})")
    else:
        lines += [f"        x_p += tl.load({param} + {where}, mask=ok, other=0.0){widen}",
                  "        taps += tl.where(ok, 1.0, 0.0)"]
        if int(node.attrs.get("count_include_pad", 0)):
            # the divisor counts padding taps, not taps past the padded extent (ceil_mode)
            pb, pr = (int(p) for p in (node.attrs.get("pads") or (0, 0, 0, 0))[2:])
            lines[-1] = f"        taps += tl.where((ih < {h + pb}) & (iw < {w + pr}), 1.0, 0.0)"
        lines.append("x_p = x_p / tl.maximum(taps, 1.0)")
    return lines, "x_p"
