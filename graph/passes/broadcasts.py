"""tile_as_expand: a Tile that repeats only size-1 dims is an Expand.

torch's `x.repeat(1, n, 1)` of a (1, 1, C) query (SwiftFormer's additive attention) reaches
tilefold as a Tile. Tile has no iteration signature (in general it repeats whole blocks), so
layout stops at it, and the product that reads it runs on plain copies. Repeating a size-1
dim is a broadcast, which Expand states and layout/ carries through.
"""
from __future__ import annotations

import numpy as np

from ..graph import Graph
from ..ops.shapes import const_ints
from ..types import Value
from .pipeline import Pass, PassResult


def _tile_as_expand(graph: Graph) -> PassResult:
    changed = False
    for node in graph.nodes():
        if node.op != "Tile" or node.name not in graph:
            continue
        x, repeats = graph.inputs_of(node.name)
        t, out = graph.type_of(x), node.outputs[0]
        counts = const_ints(graph.constant_value(repeats))
        if counts is None or not out.is_static or len(counts) != t.rank:
            continue
        if any(n != 1 and d != 1 for n, d in zip(counts, t.shape)):
            continue
        shape = graph.add_constant(np.array(out.shape, np.int64), name=f"{node.name}_shape")
        expand = graph.add_node("Expand", [x, shape], [out], name=node.name, origin=node.origin)
        graph.replace_all_uses(Value(node.name), Value(expand.name))
        graph.remove_node(node.name)
        changed = True
    return PassResult(graph, changed)


tile_as_expand = Pass("tile_as_expand", _tile_as_expand)
