"""The layout report: runtime layout traffic before propagation and after, and what folded.

    report = LayoutReport.from_result(layout.optimize(graph, "cpu"))
    report.to_dict()["layout_ops_after"]     # standalone runtime layout ops left

Definitions (the issue's, made exact):
1. A standalone runtime layout op is a `Pack` or `Unpack` node whose input is not a
   constant, or a `Transpose` of a non-constant value that moves data. A Transpose does
   not move data when its result's encoding is its input's encoding `.permuted(perm)` (a
   relabeling of one buffer), or more generally when both buffers hold the elements in the
   same order (only size-1 dims move, or a tile spans its whole dim).
2. The bytes an op moves are the bytes of the buffer it writes, padding included
   (`TensorType.nbytes()` of its result). With a symbolic dim the op is counted but its
   bytes are unknown: byte totals are then lower bounds (`*_bytes_exact` says so).
3. A layout change fused into an anchor: an anchor (registry layout kind "anchor") that
   reads a non-constant operand in the identity layout and writes a packed result, or reads
   a packed one and writes identity (the first conv reading NCHW and writing NHWC). It is
   not a standalone op; its bytes (the operands read in the other layout) are reported apart.
4. Packs folded into constants: Pack/Unpack nodes of `before` that read a constant and are
   gone from `after` (the engine folded them into new, packed constants).
5. Weight bytes: constants' stored bytes, padding of their encodings included; a splat
   stores one element. Their logical size (splats at full size) is reported apart.
"""
from __future__ import annotations

import html
import io
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ..graph import Graph, Node, Splat, TensorType
from ..graph.ops.tensor import transpose_perm
from ..graph.registry import REGISTRY
from . import LayoutResult
from .encoding import PackedEncoding, ceil_div

LAYOUT_OPS = ("Pack", "Unpack", "Transpose")
_IDENTITY = PackedEncoding((), ())


@dataclass(frozen=True)
class LayoutOp:
    """One standalone runtime layout op (definition 1), or one fused layout change (3)."""

    node: str
    op: str
    type: str  # its result type, encoding included
    bytes: int | None  # None: a symbolic dim (definition 2)
    origin: str | None = None


@dataclass
class GraphLayout:
    """The layout facts of one graph: its runtime layout ops, fused changes and constants."""

    nodes: int
    ops: list[LayoutOp]
    fused: list[LayoutOp]
    weight_bytes: int
    weight_logical_bytes: int
    constants: int
    packed_constants: int
    splats: int
    constant_layout_ops: int  # Pack/Unpack of a constant still left to run

    def count(self, op: str | None = None) -> int:
        return sum(1 for o in self.ops if op is None or o.op == op)

    def bytes(self, op: str | None = None) -> int:
        """Bytes written by the standalone ops (of one kind); a lower bound unless `exact`."""
        return sum(o.bytes or 0 for o in self.ops if op is None or o.op == op)

    @property
    def exact(self) -> bool:
        return all(o.bytes is not None for o in self.ops)

    @property
    def fused_bytes(self) -> int:
        return sum(o.bytes or 0 for o in self.fused)

    @classmethod
    def of(cls, graph: Graph) -> GraphLayout:
        ops: list[LayoutOp] = []
        fused: list[LayoutOp] = []
        constant_layout_ops = 0
        for node in _in_order(graph):
            if node.op in LAYOUT_OPS:
                source = graph.inputs_of(node.name)[0]
                if source is not None and graph.constant_value(source) is not None:
                    constant_layout_ops += node.op != "Transpose"
                elif node.op != "Transpose" or moves_data(node, graph.type_of(source)):  # type: ignore[arg-type]
                    ops.append(_record(node, node.outputs[0].nbytes()))
            elif _is_anchor(node):
                fuses, moved = _fused_change(graph, node)
                if fuses:
                    fused.append(_record(node, moved))
        constants = list(graph.constants())
        return cls(
            nodes=len(graph),
            ops=ops,
            fused=fused,
            weight_bytes=sum(_stored_bytes(n) for n in constants),
            weight_logical_bytes=sum(_logical_bytes(n.outputs[0]) for n in constants),
            constants=len(constants),
            packed_constants=sum(1 for n in constants if n.outputs[0].encoding is not None),
            splats=sum(1 for n in constants if isinstance(n.attrs["value"], Splat)),
            constant_layout_ops=constant_layout_ops,
        )


def _in_order(graph: Graph) -> list[Node]:
    """Nodes in creation order: deterministic, and cheaper than a topological sort."""
    return sorted((data["node"] for _, data in graph.nx.nodes(data=True)), key=lambda n: n.order)


def _record(node: Node, nbytes: int | None) -> LayoutOp:
    return LayoutOp(node.name, node.op, str(node.outputs[0]), nbytes, node.origin)


def _is_anchor(node: Node) -> bool:
    opdef = REGISTRY.get(node.op)
    return opdef is not None and opdef.layout == "anchor"


def _fused_change(graph: Graph, node: Node) -> tuple[bool, int | None]:
    """Whether an anchor fuses a layout change (definition 3), and the bytes of the
    non-constant operands it reads in another kind of layout (identity vs packed) than it writes."""
    if not node.outputs:
        return False, None
    packed_out = node.outputs[0].encoding is not None
    moved: list[int | None] = []
    for value in graph.inputs_of(node.name):
        if value is None or graph.constant_value(value) is not None:
            continue
        t = graph.type_of(value)
        if (t.encoding is not None) != packed_out:
            moved.append(t.nbytes())
    if not moved:
        return False, None
    return True, None if any(b is None for b in moved) else sum(b for b in moved if b is not None)


def _stored_bytes(node: Node) -> int:
    value = node.attrs["value"]
    if isinstance(value, Splat):
        return value.dtype.itemsize
    declared = node.outputs[0].nbytes()
    return declared if declared is not None else int(value.nbytes)


def _logical_bytes(t: TensorType) -> int:
    return (t.numel() or 0) * t.dtype.itemsize


# ---- does a Transpose move data? (definition 1) ----------------------------------------
def moves_data(node: Node, source: TensorType) -> bool:
    """Whether a Transpose node's result buffer differs in element order from its input's.
    Exact but for one conservative case: a tile of a size-1 dim holds padding that another
    dim's padding may happen to match byte for byte; that counts as a move."""
    result = node.outputs[0]
    rank = source.rank
    perm = transpose_perm(node.attrs, rank)
    relabeled = (source.encoding or _IDENTITY).permuted(perm)
    if relabeled.same_layout(result.encoding or _IDENTITY):
        return False
    return _element_order(source, tuple(range(rank))) != _element_order(result, perm)


Axis = tuple[int, Any, int]  # (dim of the transpose's input, size, step in that dim's elements)


def _element_order(t: TensorType, labels: tuple[int, ...]) -> list[Axis]:
    """The buffer's axes, outermost first, as (input dim, size, step); size-1 axes dropped and
    an axis merged into the one before it when together they walk one dim contiguously. A
    tile of a size-1 dim holds one element and padding whichever dim it is: labeled -1."""
    enc = t.encoding
    shape = t.shape
    labels = tuple(-1 if size == 1 else label for label, size in zip(labels, shape))
    tiles = enc.tiles() if enc is not None else {}
    order = enc.outer_perm(len(shape)) if enc is not None else range(len(shape))
    axes: list[Axis] = []
    for d in order:
        size = shape[d]
        if d in tiles:
            size = ceil_div(size, tiles[d]) if isinstance(size, int) else f"ceil({size}/{tiles[d]})"
        axes.append((labels[d], size, tiles.get(d, 1)))
    if enc is not None:
        axes += [(labels[d], tile, 1) for d, tile in zip(enc.inner_dims_pos, enc.inner_tiles)]
    merged: list[Axis] = []
    for axis in axes:
        if axis[1] == 1:
            continue
        if merged:
            dim, size, step = merged[-1]
            if dim == axis[0] and isinstance(size, int) and isinstance(axis[1], int):
                if step == axis[1] * axis[2]:
                    merged[-1] = (dim, size * axis[1], axis[2])
                    continue
                if dim == -1:  # two padded tiles of size-1 dims: still one element, then padding
                    merged[-1] = (dim, size * axis[1], 1)
                    continue
        merged.append(axis)
    return merged


# ---- the report ---------------------------------------------------------------------------
@dataclass
class LayoutReport:
    """Runtime layout traffic before propagation (every anchor wrapped) and after, what
    folded into constants, weight bytes, and the time of each pass (see module docstring)."""

    name: str
    target: str
    before: GraphLayout
    after: GraphLayout
    folded_packs: int
    pass_seconds: dict[str, float] = field(default_factory=dict)
    load_seconds: float | None = None

    @classmethod
    def from_result(cls, result: LayoutResult, *, load_seconds: float | None = None) -> LayoutReport:
        return cls(
            name=str(result.after.meta.get("source", result.after.name)),
            target=result.target,
            before=GraphLayout.of(result.before),
            after=GraphLayout.of(result.after),
            folded_packs=folded_packs(result.before, result.after),
            pass_seconds=result.log.seconds_by_pass(),
            load_seconds=load_seconds,
        )

    @property
    def optimize_seconds(self) -> float:
        return sum(self.pass_seconds.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; the `layout_*` counts and byte totals are ints."""
        data: dict[str, Any] = {"model": self.name, "target": self.target}
        for when, g in (("before", self.before), ("after", self.after)):
            data[f"layout_ops_{when}"] = g.count()
            data[f"layout_bytes_{when}"] = g.bytes()
            data[f"layout_bytes_{when}_exact"] = g.exact
            for op in LAYOUT_OPS:
                data[f"{op.lower()}_ops_{when}"] = g.count(op)
                data[f"{op.lower()}_bytes_{when}"] = g.bytes(op)
            data[f"fused_layout_changes_{when}"] = len(g.fused)
            data[f"fused_layout_bytes_{when}"] = g.fused_bytes
            data[f"weight_bytes_{when}"] = g.weight_bytes
            data[f"weight_logical_bytes_{when}"] = g.weight_logical_bytes
            data[f"packed_constants_{when}"] = g.packed_constants
            data[f"constant_layout_ops_{when}"] = g.constant_layout_ops
            data[f"nodes_{when}"] = g.nodes
        data["folded_packs"] = self.folded_packs
        data["layout_ops_left"] = [asdict(o) for o in self.after.ops]
        data["fused_layout_changes"] = [asdict(o) for o in self.after.fused]
        data["pass_seconds"] = dict(self.pass_seconds)
        data["optimize_seconds"] = self.optimize_seconds
        data["load_seconds"] = self.load_seconds
        return data

    # ---- rendering --------------------------------------------------------------------
    def rows(self) -> list[tuple[str, str, str]]:
        """(what, before, after) lines shared by the terminal table and the HTML table."""
        b, a = self.before, self.after

        def nbytes(g: GraphLayout, op: str | None = None) -> str:
            return ("" if g.exact else ">= ") + _human(g.bytes(op))

        rows = [("runtime layout ops", str(b.count()), str(a.count()))]
        for op in LAYOUT_OPS:
            if b.count(op) or a.count(op):
                rows.append((f"  {op}", f"{b.count(op)} ({nbytes(b, op)})", f"{a.count(op)} ({nbytes(a, op)})"))
        rows += [
            ("  bytes they write", nbytes(b), nbytes(a)),
            ("fused into anchors", f"{len(b.fused)} ({_human(b.fused_bytes)})",
             f"{len(a.fused)} ({_human(a.fused_bytes)})"),
            ("packs folded into weights", "", str(self.folded_packs)),
            ("layout ops on constants", str(b.constant_layout_ops), str(a.constant_layout_ops)),
            ("constants (packed, splats)", f"{b.constants} ({b.packed_constants}, {b.splats})",
             f"{a.constants} ({a.packed_constants}, {a.splats})"),
            ("weight bytes stored", _human(b.weight_bytes), _human(a.weight_bytes)),
            ("weight bytes logical", _human(b.weight_logical_bytes), _human(a.weight_logical_bytes)),
            ("nodes", str(b.nodes), str(a.nodes)),
        ]
        return rows

    def timing_rows(self) -> list[tuple[str, str]]:
        rows = [] if self.load_seconds is None else [("load", _ms(self.load_seconds))]
        rows += [(name, _ms(sec)) for name, sec in self.pass_seconds.items()]
        return rows + [("optimize (all passes)", _ms(self.optimize_seconds))]

    def title(self) -> str:
        return f"layout report: {os.path.basename(self.name)} (target {self.target})"

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.markup import escape
        from rich.table import Table

        table = Table("", "before (wrapped)", "after (propagated)", title=escape(self.title()),
                      caption="runtime: Pack, Unpack, data-moving Transpose of a computed value")
        for row in self.rows():
            table.add_row(*(escape(c) for c in row))
        timing = Table("pass", "time", title="time per pass")
        for row in self.timing_rows():
            timing.add_row(*(escape(c) for c in row))
        parts: list[Any] = [table]
        if self.after.ops:
            left = Table("node", "op", "result", "bytes", title="standalone layout ops left")
            for o in self.after.ops[:20]:
                left.add_row(escape(o.node), o.op, escape(o.type), _human(o.bytes) if o.bytes is not None else "?")
            parts.append(left)
        return Group(*parts, timing)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """The table as text in IPython terminals (instead of the dataclass's fields)."""
        from rich.console import Console

        console = Console(file=io.StringIO(), width=120, record=True, color_system=None, force_jupyter=False)
        console.print(self)
        printer.text(console.export_text().rstrip())

    def _repr_html_(self) -> str:
        def table(head: Iterable[str], rows: Iterable[Iterable[str]], caption: str) -> str:
            cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
            body = "".join(
                "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row) + "</tr>"
                for row in rows
            )
            return f"<table><caption>{html.escape(caption)}</caption><tr>{cells}</tr>{body}</table>"

        parts = [table(("", "before (wrapped)", "after (propagated)"), self.rows(), self.title())]
        if self.after.ops:
            parts.append(table(("node", "op", "result", "bytes"),
                               ((o.node, o.op, o.type, "?" if o.bytes is None else _human(o.bytes))
                                for o in self.after.ops), "standalone layout ops left"))
        parts.append(table(("pass", "time"), self.timing_rows(), "time per pass"))
        return "<div>" + "".join(parts) + "</div>"


def folded_packs(before: Graph, after: Graph) -> int:
    """Pack/Unpack nodes of `before` reading a constant that `after` no longer runs (definition 4)."""
    count = 0
    for node in _in_order(before):
        if node.op not in ("Pack", "Unpack"):
            continue
        source = before.inputs_of(node.name)[0]
        if source is None or before.constant_value(source) is None:
            continue
        if node.name not in after or after.node(node.name).op != node.op:
            count += 1
    return count


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms"


__all__ = ["GraphLayout", "LayoutOp", "LayoutReport", "folded_packs", "moves_data"]
