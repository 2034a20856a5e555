"""Common-subexpression elimination: merge pure nodes with the same op, attributes and inputs.

Constants merge too when they hold the same data (splats by value and shape; arrays up to
`MAX_CONST_BYTES` by content, so merging stays cheap). The one kept takes a merged one's
`DEQUANTIZED` origin when it has none: the same floats, so the same integers give them.
"""
from __future__ import annotations

from typing import Any, Hashable

import numpy as np

from ..graph import CONSTANT, DEQUANTIZED, INPUT, OUTPUT, Graph, Node
from ..registry import get
from ..types import Splat, Value
from .pipeline import Pass, PassResult

MAX_CONST_BYTES = 1 << 16


def freeze_attr(value: Any) -> Hashable:
    """A hashable stand-in for an attribute value (arrays by content)."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze_attr(v)) for k, v in value.items()))
    return value


def _key(graph: Graph, node: Node) -> Hashable | None:
    if node.op in (INPUT, OUTPUT):
        return None
    if node.op == CONSTANT:
        value = node.attrs["value"]
        if isinstance(value, Splat):
            return ("splat", value.value, value.shape, value.dtype.str)
        if value.nbytes > MAX_CONST_BYTES:
            return None
        return ("const", freeze_attr(value))
    if not get(node.op, node).pure:
        return None
    return (node.op, freeze_attr(node.attrs), tuple(graph.inputs_of(node.name)), len(node.outputs))


def _cse(graph: Graph) -> PassResult:
    seen: dict[Hashable, Node] = {}
    modified = False
    for node in graph.nodes():
        key = _key(graph, node)
        if key is None:
            continue
        first = seen.setdefault(key, node)
        if first is node or first.outputs != node.outputs:
            continue
        if DEQUANTIZED in node.attrs:
            first.attrs.setdefault(DEQUANTIZED, node.attrs[DEQUANTIZED])
        for k in range(len(node.outputs)):
            graph.replace_all_uses(Value(node.name, k), Value(first.name, k))
        graph.remove_node(node.name)
        modified = True
    return PassResult(graph, modified)


cse = Pass("cse", _cse)
