"""MaxPool and AveragePool (1-D and 2-D) as chain heads: each result element reduces its window.

The window loops (one per spatial dim) are unrolled by Triton; every tap is a masked load
through the operand's encoding (NCHWc16 or plain), so the image border reads nothing: MaxPool's masked
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
    return t.rank in (3, 4) and t.is_static and is_float(t) and node.outputs[0].is_static


def pool_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Lines reducing the window of result element (n, c, [oh,] ow) into `x_p`."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    t = graph.type_of(value)
    rank = t.rank - 2
    sizes = [int(d) for d in t.shape[2:]]
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    strides = [int(s) for s in node.attrs.get("strides") or (1,) * rank]
    dilations = [int(d) for d in node.attrs.get("dilations") or (1,) * rank]
    pads = [int(p) for p in node.attrs.get("pads") or (0,) * 2 * rank]
    param = parameter(params, value)
    is_max = node.op == "MaxPool"
    widen = ".to(tl.float32)" if t.dtype.name != "float32" else ""
    n, c, *outs = names
    taps = [f"pos{d}" for d in range(rank)]  # the input position in each window dim
    where = offset(t, [n, c, *taps])
    start = "-float('inf')" if is_max else "0.0"
    lines = [f"x_p = tl.full([BLOCK], {start}, tl.float32)  # {node.name} ({node.op}) over "
             f"{graph.value_name(value)}: {t}"]
    if not is_max:
        lines.append("taps = tl.zeros([BLOCK], dtype=tl.float32)")
    for d in range(rank):
        indent = "    " * d
        lines += [f"{indent}for tap{d} in range({kernel[d]}):",
                  f"{indent}    {taps[d]} = {outs[d]} * {strides[d]} - {pads[d]} + tap{d} * {dilations[d]}"]
    body = "    " * rank
    inside = " & ".join(f"({i} >= 0) & ({i} < {size})" for i, size in zip(taps, sizes))
    lines.append(f"{body}ok = mask & {inside}")
    if is_max:
        load = f"tl.load({param} + {where}, mask=ok, other=-float('inf')){widen}"
        lines.append(f"{body}x_p = tl.maximum(x_p, {load}{NAN})")
    else:
        lines.append(f"{body}x_p += tl.load({param} + {where}, mask=ok, other=0.0){widen}")
        if int(node.attrs.get("count_include_pad", 0)):
            # the divisor counts padding taps, not taps past the padded extent (ceil_mode)
            within = " & ".join(f"({i} < {size + end})" for i, size, end in zip(taps, sizes, pads[rank:]))
            lines.append(f"{body}taps += tl.where({within}, 1.0, 0.0)")
        else:
            lines.append(f"{body}taps += tl.where(ok, 1.0, 0.0)")
        lines.append("x_p = x_p / tl.maximum(taps, 1.0)")
    return lines, "x_p"
