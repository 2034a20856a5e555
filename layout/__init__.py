"""Layout: packed encodings, targets (tiling policies), materialization and propagation.

    result = optimize(graph, "cpu")   # LayoutResult: .before (every anchor wrapped), .after

`before` is the graph right after materialization, with explicit Pack/Unpack around every
anchor; `after` is the graph after propagation and folding, never moving more layout bytes
at run time than `before`: where greedy propagation leaves layout ops, it runs again with
Transposes relabeled in the other order and the cheaper result is kept; where it overshoots,
it runs once more with Unpacks kept out of growing ops, else `after` is `before` with its
weights folded.
layout/report.py compares them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..graph import Graph
from ..graph.graph import INPUT, OUTPUT
from ..graph.types import Value
from ..graph.passes.pipeline import PipelineLog


@dataclass
class LayoutResult:
    before: Graph
    after: Graph
    target: str
    log: PipelineLog = field(default_factory=PipelineLog)


def optimize(graph: Graph, target: str = "cpu", *, verify: bool = False) -> LayoutResult:
    """Choose the target's layouts for the anchors and fold the layout changes away.

    `graph` is left unchanged; both returned graphs are new. A graph already optimized for
    this target (`graph.meta["target"]`, kept by the ONNX writer) comes back as it is (a copy), as both
    `before` and `after`, with an empty log; one optimized for another target is stripped to
    its plain equivalent (`strip.strip_layouts`) and planned again. A target that asks for it
    (`Target.kernel_passes`: gpu) has its graph passes run first (Linear layers of one
    activation merged, rotate_half gathered).
    """
    from ..graph.passes.dce import dce
    from ..graph.passes.pipeline import run_passes
    from .materialize import materialize
    from .propagate import fold_constant_layouts, propagate
    from .report import GraphLayout
    from .strip import strip_layouts
    from .targets import get_target

    chosen = get_target(target)
    log = PipelineLog()
    if graph.meta.get("target") == chosen.name:
        same = graph.copy()
        return LayoutResult(same, same, chosen.name, log)
    if graph.meta.get("target"):
        graph = strip_layouts(graph)
    graph = graph.copy()
    if chosen.kernel_passes:
        graph = run_passes(graph, [*chosen.kernel_passes, dce], verify=verify, log=log)
    before = materialize(graph, chosen, verify=verify, log=log)
    wrapped = GraphLayout.of(before).bytes()
    # propagation is greedy: an Unpack it pushed into a fork or through a growing op that
    # never met a Pack can cost more than the wrapped anchors it started from. Then once more
    # with Unpacks kept out of growing ops (Mamba's scan broadcasts each step to (B, I, L, N));
    # else the wrapped anchors, their weights folded. The order in which Transposes are
    # relabeled matters too (`propagate`'s late_relabel): where the first order leaves layout
    # ops inside the graph (not a Pack of an input or an Unpack into an output), the other is
    # tried, and the cheaper kept
    def inside(g: Graph, layout: GraphLayout) -> bool:
        def boundary(name: str) -> bool:
            if g.node(name).op == "Pack":
                return g.node(g.inputs_of(name)[0].node).op == INPUT
            return all(g.node(user).op == OUTPUT for user, _ in g.users(Value(name)))
        return not all(boundary(op.node) for op in layout.ops)

    for grow in (True, False):
        after = propagate(before.copy(), chosen, verify=verify, log=log, grow=grow)
        layout = GraphLayout.of(after)
        if inside(after, layout):
            other = propagate(before.copy(), chosen, verify=verify, log=log, grow=grow, late_relabel=False)
            other_layout = GraphLayout.of(other)
            if (other_layout.bytes(), len(other_layout.ops)) < (layout.bytes(), len(layout.ops)):
                after, layout = other, other_layout
        if layout.bytes() <= wrapped:
            break
    else:
        after = fold_constant_layouts(before.copy(), verify=verify, log=log)
    after.meta["target"] = chosen.name
    return LayoutResult(before, after, chosen.name, log)
