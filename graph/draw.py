"""Drawings of a graph with matplotlib: a layered top-down layout with layout ops marked.

    fig = graph.draw()                             # the whole graph (collapsed when large)
    fig = graph.draw(around="conv3", depth=2)      # a node's neighbourhood
    fig = graph.draw(nodes=[...], path="g.png")    # chosen nodes; also written as a PNG
    fig = draw_comparison(before, after)           # two graphs side by side

Pack, Unpack, Transpose and transfer nodes have their own colours; a packed value (an
output type with an encoding) is a dashed coloured edge, and a node with a packed result
shows its encoding under the op; a node's device is its border colour. Constants are
hidden by default (`constants="fade"` draws them small and grey).

A graph larger than `max_nodes` is collapsed, first by merging chains of single-use nodes
into one box labelled with its size, then, if still too large, by cutting the topological
order into contiguous runs (a quotient of a DAG by intervals of a topological order stays
acyclic); layout and transfer ops keep their own boxes in the first step.

No graphviz: neither `dot` nor its Python bindings are installed here or in CI. networkx
gives the layers (`topological_generations`) and a barycenter sweep orders each layer,
since networkx has no layered crossing reduction.
"""
from __future__ import annotations

import importlib.util
import math
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import networkx as nx

from .errors import TilefoldError
from .graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from .summary import is_transfer

# Style of a node by kind: (fill colour, legend text). Kinds: op names here, else "op".
_STYLE: dict[str, tuple[str, str]] = {
    "Pack": ("#f4a3a3", "Pack"),
    "Unpack": ("#fdd49e", "Unpack"),
    "Transpose": ("#d4b9e6", "Transpose"),
    "transfer": ("#9ecae1", "transfer"),
    INPUT: ("#c7e9c0", "input"),
    OUTPUT: ("#c7e9c0", "output"),
    CONSTANT: ("#eeeeee", "constant"),
    "op": ("#ffffff", "op"),
    "group": ("#e8e8f0", "collapsed run"),
    "group+layout": ("#f9c7c7", "collapsed run with layout ops"),
}
_KEEP = frozenset({"Pack", "Unpack", "Transpose", "transfer", INPUT, OUTPUT})
"""Kinds that keep their own box when chains are merged: they are what a drawing is for."""
_PACKED_EDGE = "#d62728"
_DEVICE_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_DEFAULT_MAX_NODES = 120
_INCHES_PER_UNIT = 1.5  # horizontal scale of the figure
_INCHES_PER_LAYER = 0.75
_CHAR_INCHES = 0.0095  # width of one character per point of font size, with some slack
_GAP = 0.25  # between neighbouring boxes of a row, in units


@dataclass
class Box:
    """One drawn box: a node, or a collapsed run of nodes."""

    key: str
    members: list[str]
    label: str
    kind: str
    device: str | None = None
    static: bool = False  # computed from constants only (a weight's Pack): drawn beside its user
    width: float = 1.0  # in layout units (one unit is _INCHES_PER_UNIT wide)
    cut_in: bool = False  # reads a computed value that is not drawn
    cut_out: bool = False  # its value is read by a node that is not drawn
    layer: int = 0
    x: float = 0.0


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    packed: bool


@dataclass
class Drawing:
    """What `draw` renders: boxes with positions, edges between them, and a title."""

    boxes: dict[str, Box]
    edges: list[Edge]
    title: str
    collapsed: bool = False
    hidden_constants: int = 0
    notes: list[str] = field(default_factory=list)
    fontsize: float = 8.0

    def kinds(self) -> Counter[str]:
        return Counter(box.kind for box in self.boxes.values())


# ---- what to draw -------------------------------------------------------------------------
def plan(
    graph: Graph,
    *,
    around: str | None = None,
    depth: int = 2,
    nodes: Iterable[str] | None = None,
    max_nodes: int = _DEFAULT_MAX_NODES,
    collapse: bool | None = None,
    constants: str = "hide",
    title: str | None = None,
) -> Drawing:
    """Choose, group and place the boxes of a drawing (no matplotlib); see `draw`."""
    if constants not in ("hide", "fade"):
        raise TilefoldError(f"draw: constants={constants!r}; use 'hide' or 'fade'")
    if max_nodes < 2:
        raise TilefoldError(f"draw: max_nodes={max_nodes} is too small (at least 2)")
    selected, scope = _select(graph, around, depth, nodes)
    kept = {n for n in selected if graph.node(n).op != CONSTANT}
    faded = {n for n in selected if graph.node(n).op == CONSTANT and _feeds(graph, n, kept)}
    collapsing = len(kept) > max_nodes if collapse is None else collapse
    if collapsing:
        faded = set()
    shown = kept | (faded if constants == "fade" else set())
    hidden = len(selected - shown)

    groups = [[n] for n in _ordered(graph, shown)]
    notes: list[str] = []
    if collapsing:
        groups = _merge_chains(graph, kept)
        if len(groups) > max_nodes:
            groups = _merge_runs(graph, groups, max_nodes)
        notes.append(f"collapsed {len(kept)} nodes into {len(groups)} boxes")
    boxes, owner = _boxes(graph, groups)
    fontsize = 8.0 if len(boxes) <= 60 else 6.0
    for box in boxes.values():
        longest = max((len(line) for line in box.label.split("\n")), default=0)
        box.width = 0.3 if box.kind == CONSTANT else 0.35 + longest * fontsize * _CHAR_INCHES / _INCHES_PER_UNIT
    _mark_cuts(graph, boxes, owner)
    edges = _edges(graph, owner)
    _place(boxes, edges)

    name = str(graph.meta.get("source", graph.name))
    heading = title if title is not None else f"{os.path.basename(name)}{scope}"
    if notes and title is None:
        heading += f" ({notes[0]})"
    return Drawing(boxes, edges, heading, collapsing, hidden, notes, fontsize)


def _select(graph: Graph, around: str | None, depth: int, nodes: Iterable[str] | None) -> tuple[set[str], str]:
    if around is not None and nodes is not None:
        raise TilefoldError("draw: pass either around= or nodes=, not both")
    if nodes is not None:
        chosen = set(nodes)
        for name in chosen:
            graph.node(name)
        return chosen, f": {len(chosen)} chosen nodes"
    if around is not None:
        graph.node(around)
        computed = graph.nx.subgraph([n for n in graph.nx if graph.node(n).op != CONSTANT])
        reach = nx.single_source_shortest_path_length(computed.to_undirected(as_view=True), around, cutoff=depth)
        chosen = set(reach)
        chosen |= {c for n in chosen for c in graph.nx.predecessors(n) if graph.node(c).op == CONSTANT}
        return chosen, f": around {around} (depth {depth})"
    return set(graph.nx.nodes), ""


def _feeds(graph: Graph, constant: str, kept: set[str]) -> bool:
    return any(user in kept for user in graph.nx.successors(constant))


def _ordered(graph: Graph, names: set[str]) -> list[str]:
    return [n.name for n in graph.nodes() if n.name in names]


def _kind(node: Node) -> str:
    if node.op in _STYLE:
        return node.op
    return "transfer" if is_transfer(node.op) else "op"


def _merge_chains(graph: Graph, kept: set[str]) -> list[list[str]]:
    """Runs u -> v -> ... where each node has one user and the next has one producer
    (within `kept`), on one device, none of them a layout, transfer, input or output node."""
    sub = nx.DiGraph(graph.nx.subgraph(kept))
    groups: list[list[str]] = []
    owner: dict[str, int] = {}
    for name in _ordered(graph, kept):
        node = graph.node(name)
        preds = list(sub.predecessors(name))
        if len(preds) == 1 and preds[0] in owner and _joins(graph, sub, preds[0], node):
            index = owner[preds[0]]
            groups[index].append(name)
        else:
            index = len(groups)
            groups.append([name])
        owner[name] = index
    return groups


def _joins(graph: Graph, sub: nx.DiGraph, pred: str, node: Node) -> bool:
    before = graph.node(pred)
    return (
        sub.out_degree(pred) == 1
        and _kind(before) not in _KEEP
        and _kind(node) not in _KEEP
        and before.device == node.device
    )


def _merge_runs(graph: Graph, groups: list[list[str]], max_nodes: int) -> list[list[str]]:
    """Contiguous runs of a topological order of the groups, at most `max_nodes` of them."""
    owner = {n: i for i, g in enumerate(groups) for n in g}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(groups)))
    for src, dst in graph.nx.subgraph(owner).edges():
        if owner[src] != owner[dst]:
            quotient.add_edge(owner[src], owner[dst])
    order = list(nx.lexicographical_topological_sort(quotient))
    size = math.ceil(len(order) / max_nodes)
    return [[n for i in order[k:k + size] for n in groups[i]] for k in range(0, len(order), size)]


def _boxes(graph: Graph, groups: list[list[str]]) -> tuple[dict[str, Box], dict[str, str]]:
    boxes: dict[str, Box] = {}
    owner: dict[str, str] = {}
    static = _static_nodes(graph)
    for members in groups:
        nodes = [graph.node(n) for n in members]
        devices = {n.device for n in nodes}
        box = Box(members[0], list(members), "", "op", devices.pop() if len(devices) == 1 else None,
                  static=all(n in static for n in members))
        if len(nodes) == 1:
            box.kind, box.label = _kind(nodes[0]), _node_label(nodes[0])
        else:
            counts = Counter(n.op for n in nodes)
            layout = any(_kind(n) in _KEEP - {INPUT, OUTPUT} for n in nodes)
            box.kind = "group+layout" if layout else "group"
            top = ", ".join(f"{op} {k}" for op, k in counts.most_common(3))
            more = ", ..." if len(counts) > 3 else ""
            box.label = f"{len(nodes)} nodes\n{top}{more}"
        boxes[box.key] = box
        owner.update((n, box.key) for n in members)
    return boxes, owner


def _static_nodes(graph: Graph) -> set[str]:
    """Constants and the nodes computed from constants alone."""
    static: set[str] = set()
    for node in graph.nodes():
        preds = list(graph.nx.predecessors(node.name))
        if node.op == CONSTANT or (preds and node.op != OUTPUT and all(p in static for p in preds)):
            static.add(node.name)
    return static


def _node_label(node: Node) -> str:
    if node.op == INPUT:
        return f"{node.name}\n{node.outputs[0]}"
    if node.op == OUTPUT:
        return f"output {node.attrs.get('name', node.name)}"
    if node.op == CONSTANT:
        return ""
    enc = node.outputs[0].encoding if node.outputs else None
    return node.op if enc is None else f"{node.op}\n{short_encoding(enc)}"


def short_encoding(encoding: Any) -> str:
    """An encoding's text without its wrapper: `packed(1:16 pad=0)` -> `1:16`."""
    text = str(encoding)
    if text.startswith("packed(") and text.endswith(")"):
        text = text[len("packed("):-1]
    return text.replace(" pad=0", "").strip() or "permuted"


def _mark_cuts(graph: Graph, boxes: dict[str, Box], owner: dict[str, str]) -> None:
    for box in boxes.values():
        for name in box.members:
            box.cut_in |= any(p not in owner and graph.node(p).op != CONSTANT for p in graph.nx.predecessors(name))
            box.cut_out |= any(u not in owner for u in graph.nx.successors(name))


def _edges(graph: Graph, owner: dict[str, str]) -> list[Edge]:
    seen: dict[tuple[str, str], bool] = {}
    for src, dst, data in graph.nx.subgraph(owner).edges(data=True):
        a, b = owner[src], owner[dst]
        if a == b:
            continue
        packed = graph.node(src).outputs[data["src"]].encoding is not None
        seen[(a, b)] = seen.get((a, b), False) or packed
    return [Edge(a, b, packed) for (a, b), packed in seen.items()]


def _place(boxes: dict[str, Box], edges: list[Edge]) -> None:
    """Layers: computed boxes by topological generation, boxes computed from constants alone
    just above their first user; x by barycenters of the neighbouring rows (sweeps down, up, down)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(boxes)
    dag.add_edges_from((e.src, e.dst) for e in edges)
    computed = dag.subgraph([k for k, b in boxes.items() if not b.static])
    for depth, layer in enumerate(nx.topological_generations(computed)):
        for key in layer:
            boxes[key].layer = depth
    for key in reversed(list(nx.topological_sort(dag))):
        if boxes[key].static and dag.out_degree(key):
            boxes[key].layer = min(boxes[u].layer for u in dag.successors(key)) - 1
    top = min((b.layer for b in boxes.values()), default=0)
    for box in boxes.values():
        box.layer -= top
    rows: dict[int, list[str]] = {}
    for key in boxes:
        rows.setdefault(boxes[key].layer, []).append(key)
    for row in rows.values():
        for i, key in enumerate(row):
            boxes[key].x = i - (len(row) - 1) / 2
    down = sorted(rows)
    for sweep in (down, down[::-1], down):
        for depth in sweep:
            near = dag.predecessors if sweep is down else dag.successors
            _spread(boxes, rows[depth], {k: [boxes[n].x for n in near(k)] for k in rows[depth]})


def _spread(boxes: dict[str, Box], row: list[str], anchors: dict[str, list[float]]) -> None:
    """Put each box of a row near the mean x of its anchors (or where it is, without any),
    without overlaps, the row centred on where its boxes want to be."""
    index = {k: i for i, k in enumerate(row)}
    wanted = {k: sum(a) / len(a) if a else boxes[k].x for k, a in anchors.items()}
    row.sort(key=lambda k: (wanted[k], index[k]))
    xs: list[float] = []
    for prev, k in zip([None] + row[:-1], row):
        least = -math.inf if prev is None else xs[-1] + (boxes[prev].width + boxes[k].width) / 2 + _GAP
        xs.append(max(wanted[k], least))
    shift = sum(wanted[k] - x for k, x in zip(row, xs)) / max(1, len(row))
    for k, x in zip(row, xs):
        boxes[k].x = x + shift


# ---- rendering ----------------------------------------------------------------------------
def draw(
    graph: Graph,
    *,
    around: str | None = None,
    depth: int = 2,
    nodes: Iterable[str] | None = None,
    max_nodes: int = _DEFAULT_MAX_NODES,
    collapse: bool | None = None,
    constants: str = "hide",
    ax: Any = None,
    path: str | os.PathLike | None = None,
    title: str | None = None,
) -> Any:
    """Draw `graph` (or the part chosen by `around`/`depth` or `nodes`) top-down; returns the
    matplotlib Figure. More than `max_nodes` nodes are collapsed unless `collapse=False`
    (`collapse=True` always collapses). `ax`: draw into these axes; `path`: also write a PNG."""
    _require_matplotlib()
    drawing = plan(graph, around=around, depth=depth, nodes=nodes, max_nodes=max_nodes,
                   collapse=collapse, constants=constants, title=title)
    if ax is None:
        figure = _figure(*_size(drawing))
        ax = figure.add_subplot()
    render(drawing, ax)
    if path is not None:
        save_png(ax.figure, path)
    return ax.figure


def draw_comparison(
    before: Graph,
    after: Graph,
    *,
    path: str | os.PathLike | None = None,
    titles: Sequence[str] | None = None,
    **options: Any,
) -> Any:
    """`before` and `after` side by side, each titled with its runtime Pack/Unpack and
    Transpose counts; `options` go to `plan` for both (around=, nodes=, max_nodes=, ...)."""
    _require_matplotlib()
    drawings = []
    for k, graph in enumerate((before, after)):
        heading = titles[k] if titles is not None else f"{('before', 'after')[k]}: {layout_counts(graph)}"
        drawings.append(plan(graph, title=heading, **options))
    sizes = [_size(d) for d in drawings]
    figure = _figure(sum(w for w, _ in sizes), max(h for _, h in sizes))
    axes = figure.subplots(1, 2, width_ratios=[w for w, _ in sizes])
    for drawing, ax in zip(drawings, axes):
        render(drawing, ax)
    if path is not None:
        save_png(figure, path)
    return figure


def layout_counts(graph: Graph) -> str:
    """`12 Pack, 10 Unpack, 0 Transpose` (then transfers, if any) over the nodes that read a
    computed value. Transposes that only relabel a buffer count too: which ones move data is
    layout/report.py's to say, and graph/ does not import layout/."""
    counts: Counter[str] = Counter()
    for node in graph.nodes():
        if node.op in ("Pack", "Unpack", "Transpose") or is_transfer(node.op):
            source = graph.inputs_of(node.name)[0] if node.arity else None
            if source is not None and graph.constant_value(source) is None:
                counts[node.op] += 1
    parts = [f"{counts[op]} {op}" for op in ("Pack", "Unpack", "Transpose")]
    parts += [f"{n} {op}" for op, n in counts.items() if is_transfer(op)]
    return ", ".join(parts)


def _require_matplotlib() -> None:
    """matplotlib is imported only when drawing: graph/ itself needs numpy and networkx only."""
    if importlib.util.find_spec("matplotlib") is None:
        raise TilefoldError("drawing a graph needs matplotlib: pip install matplotlib")


def _size(drawing: Drawing) -> tuple[float, float]:
    if not drawing.boxes:
        return 4.0, 3.0
    left, right = _extent(drawing)
    layers = 1 + max(b.layer for b in drawing.boxes.values())
    width = min(28.0, max(5.0, _INCHES_PER_UNIT * (right - left) + 1.5))
    height = min(48.0, max(3.0, _INCHES_PER_LAYER * layers + 1.2))
    return width, height


def _extent(drawing: Drawing) -> tuple[float, float]:
    boxes = drawing.boxes.values()
    return min(b.x - b.width / 2 for b in boxes), max(b.x + b.width / 2 for b in boxes)


def _figure(width: float, height: float) -> Any:
    # A Figure outside pyplot: no global figure list, no GUI backend; Agg renders it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def render(drawing: Drawing, ax: Any) -> None:
    """Draw the boxes and edges of `drawing` into matplotlib axes `ax`."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    boxes = drawing.boxes
    ax.set_axis_off()
    ax.set_title(drawing.title, fontsize=10)
    if not boxes:
        ax.text(0.5, 0.5, "(nothing to draw)", ha="center", va="center", transform=ax.transAxes)
        return
    for packed, style in ((False, dict(colors="#888888", linewidths=0.8)),
                          (True, dict(colors=_PACKED_EDGE, linewidths=1.6, linestyles="--"))):
        segments = [((boxes[e.src].x, -boxes[e.src].layer), (boxes[e.dst].x, -boxes[e.dst].layer))
                    for e in drawing.edges if e.packed == packed]
        if segments:
            ax.add_collection(LineCollection(segments, zorder=1, gid="packed-edges" if packed else "edges", **style))
    stubs = [((b.x, -b.layer + dy), (b.x, -b.layer + 2 * dy)) for b in boxes.values()
             for dy, cut in ((0.22, b.cut_in), (-0.22, b.cut_out)) if cut]
    if stubs:
        ax.add_collection(LineCollection(stubs, colors="#888888", linewidths=1.0, linestyles=":", zorder=1,
                                         gid="cut-edges"))
    devices = sorted({b.device for b in boxes.values() if b.device is not None})
    border = {d: _DEVICE_COLOURS[i % len(_DEVICE_COLOURS)] for i, d in enumerate(devices)}
    fontsize = drawing.fontsize
    for box in boxes.values():
        fill = _STYLE[box.kind][0]
        if box.kind == CONSTANT:
            ax.plot([box.x], [-box.layer], "s", color="#bbbbbb", markersize=4, zorder=2, gid=f"{box.kind}:{box.key}")
            continue
        edge = border.get(box.device, "#444444")
        ax.text(box.x, -box.layer, box.label, ha="center", va="center", fontsize=fontsize, zorder=3,
                gid=f"{box.kind}:{box.key}",
                bbox=dict(boxstyle="round,pad=0.3", fc=fill, ec=edge, lw=2.2 if box.device else 0.8))
    left, right = _extent(drawing)
    layers = [-b.layer for b in boxes.values()]
    ax.set_xlim(left - 0.2, right + 0.2)
    ax.set_ylim(min(layers) - 0.6, max(layers) + 0.6)
    present = drawing.kinds()
    handles: list[Any] = [Patch(fc=_STYLE[k][0], ec="#444444", label=_STYLE[k][1])
                          for k in _STYLE if k in present and k not in ("op", INPUT, OUTPUT)]
    if any(e.packed for e in drawing.edges):
        handles.append(Line2D([], [], color=_PACKED_EDGE, ls="--", label="packed value"))
    if stubs:
        handles.append(Line2D([], [], color="#888888", ls=":", label="to or from nodes not drawn"))
    handles += [Patch(fc="white", ec=border[d], lw=2.2, label=f"device {d}") for d in devices]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)


def save_png(figure: Any, path: str | os.PathLike) -> None:
    """Write `figure` as a PNG: to a temporary file beside `path`, then renamed over it."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            figure.savefig(handle, format="png")  # png is rendered by Agg whatever the backend
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


__all__ = ["Box", "Drawing", "Edge", "draw", "draw_comparison", "layout_counts", "plan", "render", "save_png",
           "short_encoding"]
