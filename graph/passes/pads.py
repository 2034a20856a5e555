"""Pads that need no node of their own.

- A Pad whose pads are all zero returns its input unchanged: it is bypassed (torch.fx keeps
  MobileNetV2's `F.pad(x, (0, 0, 0, 0))`).
- A constant Pad that fills zeros around the spatial dims only, read by a Conv, is that
  Conv's padding: the Conv reads the Pad's input with its own pads grown by the Pad's
  (TensorFlow-style "same" padding exported as Pad -> Conv: MobileNetV2, EfficientNet). The
  Pad stays while something else reads it (DCE removes it otherwise).
"""
from __future__ import annotations

from typing import Any

from ..graph import Graph, Node
from ..ops.tensor import pad_widths
from ..types import Value, as_array
from .pipeline import Pass, PassResult


def constant_widths(graph: Graph, pad: Node) -> list[tuple[int, int]] | None:
    """The Pad's (begin, end) per dim when its pads and axes are constants, else None."""
    values = graph.inputs_of(pad.name) + [None] * 3
    rank = graph.type_of(values[0]).rank  # type: ignore[arg-type]
    pads, axes = graph.constant_value(values[1]), graph.constant_value(values[3])
    if pads is None or (values[3] is not None and axes is None):
        return None
    return pad_widths(rank, [int(v) for v in as_array(pads).reshape(-1)],
                      None if axes is None else [int(v) for v in as_array(axes).reshape(-1)])


def constant_fill(graph: Graph, pad: Node) -> Any:
    """A Pad's constant_value as a Python scalar of the data's dtype (0 when absent), or None
    when it is computed at run time or is not one element."""
    values = graph.inputs_of(pad.name) + [None, None]
    dtype = graph.type_of(values[0]).dtype  # type: ignore[arg-type]
    if values[2] is None:
        return dtype.type(0).item()
    const = graph.constant_value(values[2])
    if const is None or as_array(const).size != 1:
        return None
    return as_array(const).reshape(-1)[0].astype(dtype).item()


def _fills_zeros(graph: Graph, pad: Node) -> bool:
    """A constant-mode Pad whose fill value is absent or zero."""
    return pad.attrs.get("mode", "constant") == "constant" and constant_fill(graph, pad) == 0


def _into_conv(graph: Graph, pad: Node, widths: list[tuple[int, int]], conv: Node) -> None:
    """Make `conv` read the Pad's input with the Pad's spatial amounts added to its pads."""
    spatial = widths[2:]
    own = list(conv.attrs.get("pads") or [0] * (2 * len(spatial)))
    grown = [own[d] + spatial[d][0] for d in range(len(spatial))] + \
            [own[len(spatial) + d] + spatial[d][1] for d in range(len(spatial))]
    conv.attrs = {**conv.attrs, "pads": grown}
    graph.set_input(conv.name, 0, graph.inputs_of(pad.name)[0])


def _fold_pads(graph: Graph) -> PassResult:
    modified = False
    for pad in graph.nodes():
        if pad.op != "Pad" or pad.name not in graph:
            continue
        widths = constant_widths(graph, pad)
        if widths is None:
            continue
        out, source = Value(pad.name), graph.inputs_of(pad.name)[0]
        if all(w == (0, 0) for w in widths) and source is not None and graph.type_of(source) == graph.type_of(out):
            graph.replace_all_uses(out, source)
            graph.remove_node(pad.name)
            modified = True
            continue
        if widths[:2] != [(0, 0), (0, 0)] or any(b < 0 or e < 0 for b, e in widths) or not _fills_zeros(graph, pad):
            continue
        for name, slot in graph.users(out):
            conv = graph.node(name)
            if conv.op == "Conv" and slot == 0 and conv.attrs.get("auto_pad", "NOTSET") == "NOTSET":
                _into_conv(graph, pad, widths, conv)
                modified = True
    return PassResult(graph, modified)


fold_pads = Pass("fold_pads", _fold_pads)
