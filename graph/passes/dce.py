"""Dead-code elimination: drop every node no graph output depends on (inputs stay)."""
from __future__ import annotations

from ..graph import INPUT, Graph
from .pipeline import Pass, PassResult


def _dce(graph: Graph) -> PassResult:
    live: set[str] = set(graph.outputs)
    stack = list(graph.outputs)
    pred = graph.nx.pred
    while stack:  # one walk up from all outputs at once
        for src in pred[stack.pop()]:
            if src not in live:
                live.add(src)
                stack.append(src)
    if all(name in live or graph.node(name).op == INPUT for name in graph.nx):
        return PassResult(graph, False)  # (no topological sort when nothing is dead)
    dead = [n for n in graph.nodes() if n.name not in live and n.op != INPUT]
    for node in reversed(dead):
        graph.remove_node(node.name)
    return PassResult(graph, True)


dce = Pass("dce", _dce)
