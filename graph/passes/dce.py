"""Dead-code elimination: drop every node no graph output depends on (inputs stay)."""
from __future__ import annotations

import networkx as nx

from ..graph import INPUT, Graph
from .pipeline import Pass, PassResult


def _dce(graph: Graph) -> PassResult:
    live: set[str] = set(graph.outputs)
    for name in graph.outputs:
        live |= nx.ancestors(graph.nx, name)
    dead = [n for n in graph.nodes() if n.name not in live and n.op != INPUT]
    for node in reversed(dead):
        graph.remove_node(node.name)
    return PassResult(graph, bool(dead))


dce = Pass("dce", _dce)
