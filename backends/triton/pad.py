"""Pad as a chain head, when its pads, axes and constant_value are constants.

Result index i along a dim padded by (before, after) reads the operand at j = i - before (a
negative `before` crops: j starts past 0). Where j may fall outside the operand's [0, n), the
mode decides what is read (MODES):

1. constant: the load is masked off there and the element is constant_value (0 when absent;
   NaN and inf included);
2. edge: j clamped to [0, n - 1];
3. reflect: j reflected about both ends without repeating them (period 2n - 2, what numpy's
   'reflect' gives for pads of any size; an operand of one element reads it everywhere);
4. wrap: j modulo n.

The per-dim amounts come from `pad_widths`, the helper the NumPy kernel and the simplify pass
use, so the backends agree on axes and on negative pads. Every read lands inside the logical
operand and goes through its encoding (indexing.offset), so a packed operand's padding is
never read. A pad copies: float16 and bfloat16 round trip through float32 exactly, bool and
integer values are stored as loaded; elementwise nodes after the Pad fuse into its kernel.
"""
from __future__ import annotations

from typing import Callable

from ...graph.errors import VerifyError
from ...graph.graph import Graph, Node
from ...graph.passes.pads import constant_fill, constant_widths
from ...graph.types import Value
from .indexing import literal, offset, parameter, value_ok


def _lifted(j: str, lift: int) -> str:
    return f"({j} + {lift})" if lift else j


def _edge(j: str, n: int, lift: int) -> str:
    return f"tl.minimum(tl.maximum({j}, 0), {n - 1})"


def _wrap(j: str, n: int, lift: int) -> str:
    return f"{_lifted(j, lift)} % {n}"


def _reflect(j: str, n: int, lift: int) -> str:
    period = 2 * n - 2
    k = f"({_lifted(j, lift)} % {period})"
    return f"tl.where({k} < {n}, {k}, {period} - {k})"


Remap = Callable[[str, int, int], str]
"""(source index j, operand length n, a multiple of the period making j + it >= 0) -> index in [0, n)."""

MODES: dict[str, tuple[Remap, Callable[[int], int]] | None] = {
    "constant": None,
    "edge": (_edge, lambda n: 1),
    "wrap": (_wrap, lambda n: n),
    "reflect": (_reflect, lambda n: 2 * n - 2),
}
"""Mode -> (remap of an index that may lie outside the operand, its period given n > 1);
constant masks instead. Along a dim of one element every mode reads that element."""


def widths(graph: Graph, node: Node) -> list[tuple[int, int]] | None:
    """(before, after) per dim when pads and axes are constants, else None."""
    try:
        return constant_widths(graph, node)
    except VerifyError:
        return None


def supports(graph: Graph, node: Node) -> bool:
    """A Pad of a static float, bool, int32 or int64 operand of rank >= 1 with constant pads
    and axes (and constant_value in constant mode); edge, reflect and wrap need an operand
    with elements along every dim they extend (the NumPy kernel refuses the others)."""
    x = graph.inputs_of(node.name)[0] if node.op == "Pad" and len(node.outputs) == 1 else None
    if x is None:
        return False
    t = graph.type_of(x)
    mode = node.attrs.get("mode", "constant")
    if mode not in MODES or t.rank == 0 or not value_ok(t) or not value_ok(node.outputs[0]):
        return False
    found = widths(graph, node)
    if found is None:
        return False
    if mode == "constant":
        return constant_fill(graph, node) is not None
    return all(int(n) > 0 for n, (b, e) in zip(t.shape, found) if b > 0 or e > 0)


def _source(name: str, before: int) -> str:
    return name if before == 0 else f"{name} - {before}" if before > 0 else f"{name} + {-before}"


def pad_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Lines reading result element `names` of the Pad into `x_pad`."""
    value = graph.inputs_of(node.name)[0]
    found = widths(graph, node)
    assert value is not None and found is not None
    t = graph.type_of(value)
    mode = node.attrs.get("mode", "constant")
    lines = [f"# {node.name} (Pad, {mode}) over {graph.value_name(value)}: {t}"]
    index: list[str | None] = list(names)
    inside: list[str] = []
    for d, (before, after) in enumerate(found):
        if (before, after) == (0, 0):
            continue
        n = int(t.shape[d])
        index[d] = f"j{d}"
        lines.append(f"j{d} = {_source(names[d], before)}")
        if before <= 0 and after <= 0:
            continue  # a crop reads inside the operand
        rule = MODES[mode]
        if rule is None:
            inside += [f"(j{d} >= 0)"] * (before > 0) + [f"(j{d} < {n})"] * (after > 0)
            continue
        remap, period = rule if n > 1 else MODES["edge"]  # type: ignore[misc]
        lift = -(-max(before, 0) // period(n)) * period(n)
        lines.append(f"j{d} = {remap(f'j{d}', n, lift)}")
    where = f"{parameter(params, value)} + {offset(t, index)}"
    wide = ".to(tl.float32)" if t.dtype.name in ("float16", "bfloat16") else ""
    if not inside:
        return lines + [f"x_pad = tl.load({where}, mask=mask){wide}"], "x_pad"
    lines.append(f"inside = {' & '.join(inside)}")
    return lines + [f"x_pad = tl.where(inside, tl.load({where}, mask=mask & inside){wide}, "
                    f"{literal(constant_fill(graph, node))})"], "x_pad"
