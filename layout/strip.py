"""Strip layouts: the plain graph equivalent to an optimized one.

Ops keep their logical semantics whatever their operands' encodings, so dropping the
encodings gives an equivalent plain graph:
1. a packed constant becomes its logical value (`encoding.unpack`; a packed splat keeps its
   one value at the logical shape);
2. `Pack` and `Unpack` nodes are bypassed and removed;
3. every other output type loses its encoding; devices and launch configurations, which
   belong to a plan, are cleared, and `meta["target"]` is dropped.
Used to plan a graph optimized for one target again for another.
"""
from __future__ import annotations

from ..graph.graph import Graph
from ..graph.types import Splat, Value, freeze
from .encoding import PackedEncoding, unpack


def strip_layouts(graph: Graph) -> Graph:
    """A new plain graph computing what `graph` computes (see module docstring); `graph` is unchanged."""
    plain = graph.copy()
    for node in plain.nodes():
        if node.op == "Constant" and node.outputs[0].encoding is not None:  # (1)
            t = node.outputs[0]
            value = node.attrs["value"]
            if isinstance(value, Splat):
                node.attrs["value"] = Splat(value.value, tuple(t.shape), value.dtype)
            elif isinstance(t.encoding, PackedEncoding):
                node.attrs["value"] = freeze(unpack(value, t.encoding, t.shape))
        if node.op in ("Pack", "Unpack"):  # (2)
            (source,) = plain.inputs_of(node.name)
            plain.replace_all_uses(Value(node.name), source)
            plain.remove_node(node.name)
            continue
        node.outputs = [t.logical() for t in node.outputs]  # (3)
        node.device = None
        node.launch = None
    plain.meta.pop("target", None)
    return plain
