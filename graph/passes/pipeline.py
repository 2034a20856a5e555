"""Pass infrastructure: a pass is a named `Graph -> PassResult`; a pipeline runs and times them.

A pass mutates the graph it is given and reports honestly whether it changed anything,
so fixed-point loops stop. The pipeline can verify after every pass (tests and debug
runs do) and keeps a dump of the op counts after each pass.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..graph import Graph, Node
from ..types import ConstValue

Evaluate = Callable[[Node, list[ConstValue | None]], list[ConstValue]]
"""Runs one node on constant inputs (missing optional inputs are None)."""


@dataclass
class PassResult:
    graph: Graph
    modified: bool


@dataclass(frozen=True)
class Pass:
    name: str
    fn: Callable[[Graph], PassResult]

    def __call__(self, graph: Graph) -> PassResult:
        return self.fn(graph)


@dataclass
class PassRecord:
    name: str
    seconds: float
    modified: bool
    nodes_after: int


@dataclass
class PipelineLog:
    records: list[PassRecord] = field(default_factory=list)

    def seconds_by_pass(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for r in self.records:
            totals[r.name] = totals.get(r.name, 0.0) + r.seconds
        return totals


def graph_pass(name: str) -> Callable[[Callable[[Graph], PassResult]], Pass]:
    """Decorator: turn `fn(graph) -> PassResult` into a named Pass."""

    def wrap(fn: Callable[[Graph], PassResult]) -> Pass:
        return Pass(name, fn)

    return wrap


def run_passes(
    graph: Graph,
    passes: Sequence[Pass],
    *,
    verify: bool = False,
    fixed_point: bool = False,
    max_rounds: int = 10,
    log: PipelineLog | None = None,
) -> Graph:
    """Run `passes` in order (repeatedly until none modifies, with `fixed_point`)."""
    from ..verify import verify_graph

    log = log if log is not None else PipelineLog()
    if verify:
        verify_graph(graph, context="pipeline input")
    for _ in range(max_rounds if fixed_point else 1):
        changed = False
        for p in passes:
            start = time.perf_counter()
            result = p(graph)
            graph = result.graph
            log.records.append(PassRecord(p.name, time.perf_counter() - start, result.modified, len(graph)))
            changed |= result.modified
            if verify:
                verify_graph(graph, context=f"after pass {p.name}")
        if not changed:
            break
    return graph


def simplify(
    graph: Graph, evaluate: "Evaluate", *, verify: bool = False, log: PipelineLog | None = None
) -> Graph:
    """The standard clean-up: fold constants (shape subgraphs, splats), fold BatchNorm, drop
    empty Pads and fold zero Pads into the Convs that read them, lower Einsums to MatMuls,
    compose chained Transposes, sink merges of leading dims (batch and heads; a Linear layer's
    rows, its Gemm becoming a MatMul and an Add), compose chains of Reshapes and
    Transposes holding two Transposes or more into one Transpose, compose chained Reshapes,
    split a Linear layer whose features are split after a permute into one per piece, make a
    Tile of size-1 dims an Expand, fold a scalar Mul of a product into its weights (attention's
    query and key scales), CSE, DCE.

    `evaluate` runs one node on constant inputs; graph/ does not import a backend, so the
    caller passes the NumPy backend's (tilefold.load does).
    """
    from .broadcasts import tile_as_expand
    from .cse import cse
    from .dce import dce
    from .einsum import lower_einsum
    from .fold import constant_folding, fold_batchnorm
    from .pads import fold_pads
    from .reshapes import compose_reshapes, sink_batch_merges
    from .projections import split_projections
    from .scales import fold_scales
    from .shuffles import compose_shuffles
    from .transposes import compose_transposes

    passes = [constant_folding(evaluate), fold_batchnorm, fold_pads, lower_einsum, compose_transposes,
              sink_batch_merges, compose_shuffles, compose_reshapes, split_projections, tile_as_expand,
              fold_scales, cse, dce]
    return run_passes(graph, passes, verify=verify, fixed_point=True, log=log)
