"""LRN as a chain head: each result element divides its operand by the sum of squares over a
window of channels, `(bias + alpha / size * sum) ** beta`.

The `size` channel taps are unrolled by Triton; each is a masked load at the tap's logical
channel, through the operand's encoding, so channels past either end read nothing (zero, as
ONNX pads) and a channel-tiled operand is read across its tiles. Elementwise nodes after the
LRN fuse into the same kernel like any chain.
"""
from __future__ import annotations

from ...graph.graph import Graph, Node
from ...graph.types import Value
from .indexing import is_float, offset, parameter


def supports(graph: Graph, node: Node) -> bool:
    x = graph.inputs_of(node.name)[0]
    if node.op != "LRN" or x is None or len(node.outputs) != 1:
        return False
    t = graph.type_of(x)
    return t.rank >= 3 and t.is_static and is_float(t) and node.outputs[0].is_static


def lrn_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Lines computing the LRN of result element `names` into `x_l`."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    t = graph.type_of(value)
    size = int(node.attrs["size"])
    alpha, beta, bias = (float(node.attrs.get(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    before = (size - 1) // 2
    channels = int(t.shape[1])
    param = parameter(params, value)
    widen = ".to(tl.float32)" if t.dtype.name != "float32" else ""
    tap = [names[0], "cc", *names[2:]]
    return [
        f"x_c = tl.load({param} + {offset(t, names)}, mask=mask){widen}  # {node.name} (LRN) over "
        f"{graph.value_name(value)}: {t}",
        "squares = tl.zeros([BLOCK], dtype=tl.float32)",
        f"for k in range({size}):",
        f"    cc = {names[1]} - {before} + k",
        f"    ok = mask & (cc >= 0) & (cc < {channels})",
        f"    x_k = tl.load({param} + {offset(t, tap)}, mask=ok, other=0.0){widen}",
        "    squares += x_k * x_k",
        f"x_l = x_c / tl.exp2({beta!r} * tl.log2({bias!r} + {alpha / size!r} * squares))",
    ], "x_l"
