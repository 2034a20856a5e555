"""tilefold: a graph-level tensor-layout optimizer.

    g = tilefold.load("model.onnx")          # ONNX file -> Graph (simplified)
    exe = tilefold.compile(g, device="cpu")  # NumPy backend
    outputs = exe({"input": x})              # dict of named numpy arrays
"""
from __future__ import annotations

import os
from typing import Any

from .graph import Graph, TilefoldError
from .graph.passes.pipeline import simplify

__version__ = "0.1.0"


def load(model: str | os.PathLike | bytes | Any, *, simplify_graph: bool = True, progress: bool = False) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a Graph, simplified by default."""
    from .backends.numpy import evaluate_node
    from .frontends.onnx import load_onnx

    graph = load_onnx(model, progress=progress)
    return simplify(graph, evaluate_node) if simplify_graph else graph


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


__all__ = ["Graph", "TilefoldError", "compile", "load", "run", "__version__"]
