"""tilefold: a graph-level tensor-layout optimizer.

    g = tilefold.load("model.onnx")          # ONNX file -> Graph (simplified)
    exe = tilefold.compile(g, device="cpu")  # NumPy backend
    outputs = exe({"input": x})              # dict of named numpy arrays

    opt = tilefold.optimize(g, target="cpu") # packed layouts, folded into the weights
    opt.report                               # runtime layout ops and bytes, before/after
    exe = tilefold.compile(opt.graph)        # same outputs, less layout traffic
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .graph import Graph, TilefoldError
from .graph.passes.pipeline import simplify

if TYPE_CHECKING:
    from .layout.report import LayoutReport

__version__ = "0.1.0"


def load(model: str | os.PathLike | bytes | Any, *, simplify_graph: bool = True, progress: bool = False) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a Graph, simplified by default."""
    from .backends.numpy import evaluate_node
    from .frontends.onnx import load_onnx

    graph = load_onnx(model, progress=progress)
    return simplify(graph, evaluate_node) if simplify_graph else graph


@dataclass
class Optimized:
    """What `optimize` returns: the optimized graph, its layout report, and the graph before
    propagation (every anchor wrapped in Pack/Unpack: the baseline the report compares with)."""

    graph: Graph
    report: LayoutReport
    before: Graph

    def _repr_html_(self) -> str:
        return self.report._repr_html_()


def optimize(graph: Graph | str | os.PathLike, target: str = "cpu", *, verify: bool = False) -> Optimized:
    """Give the anchors (Conv, MatMul, Gemm) the target's packed layouts and fold the layout
    changes into the weights; `graph` is left unchanged.

    `graph` may also be a path, read with `load`. `target` names a registered tiling policy
    (built in: "cpu", "gpu"); `verify` runs the IR verifier after every pass. The optimized
    graph computes the same outputs and runs with `compile`.
    """
    import time

    from .layout import optimize as optimize_layout
    from .layout.report import LayoutReport

    load_seconds = None
    if not isinstance(graph, Graph):
        start = time.perf_counter()
        graph = load(graph)
        load_seconds = time.perf_counter() - start
    result = optimize_layout(graph, target, verify=verify)
    return Optimized(result.after, LayoutReport.from_result(result, load_seconds=load_seconds), result.before)


def compile(graph: Graph, *, device: str = "cpu", allow_fallback: bool = True, debug: bool = False):
    """Compile a Graph for a device; the result is called with a dict of named inputs."""
    if device != "cpu":
        raise TilefoldError(f"unknown device {device!r}: this version runs on 'cpu' (NumPy) only")
    from .backends.numpy import NumpyExecutable

    return NumpyExecutable(graph, allow_fallback=allow_fallback, debug=debug)


def run(model: str | os.PathLike | Graph, feeds: dict[str, Any], *, device: str = "cpu") -> dict[str, Any]:
    """Load (if needed), compile and run once."""
    graph = model if isinstance(model, Graph) else load(model)
    return compile(graph, device=device)(feeds)


__all__ = ["Graph", "Optimized", "TilefoldError", "compile", "load", "optimize", "run", "__version__"]
