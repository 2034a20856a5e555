"""compose_transposes: a Transpose of a Transpose becomes one Transpose with the composed
perm, or nothing when that is the identity.

PyTorch's decompositions chain permutes (a bmm's head merge arrives as three, the first two
cancelling each other); layout propagation then sees one relabeling where it would have had
to move three. Only unencoded values are rewritten: layout/ owns packed ones.
"""
from __future__ import annotations

from ..graph import Graph
from ..ops.tensor import transpose_perm
from ..types import Value
from .pipeline import Pass, PassResult


def _compose(graph: Graph) -> PassResult:
    modified = False
    for node in graph.nodes():
        if node.op != "Transpose" or node.name not in graph:
            continue
        source = graph.inputs_of(node.name)[0]
        inner = graph.node(source.node) if source is not None else None
        if inner is None or inner.op != "Transpose":
            continue
        x = graph.inputs_of(inner.name)[0]
        if x is None or graph.type_of(x).encoding is not None or any(
                t.encoding is not None for t in (*inner.outputs, *node.outputs)):
            continue
        rank = graph.type_of(x).rank
        outer = transpose_perm(node.attrs, rank)
        perm = tuple(transpose_perm(inner.attrs, rank)[i] for i in outer)  # out[i] = x[inner[outer[i]]]
        if perm == tuple(range(rank)):
            graph.replace_all_uses(Value(node.name), x)
            graph.remove_node(node.name)
        else:
            node.attrs["perm"] = perm
            graph.set_input(node.name, 0, x)
        modified = True
    return PassResult(graph, modified)


compose_transposes = Pass("compose_transposes", _compose)
