"""Shared helpers for the ONNX writer tests: onnxruntime runs and exact graph comparison."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tilefold.graph import Graph, Splat, TensorType


def run_ort(model: str | os.PathLike | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs by name (CPU provider, one thread pool of 2)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 2
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _fact(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes() if value.dtype != object else value.tolist())
    if isinstance(value, Splat):
        return ("splat", value.value, value.shape, value.dtype.str)
    if isinstance(value, TensorType):
        return ("type", value.shape, value.dtype.str, value.encoding)
    if isinstance(value, (tuple, list)):
        return tuple(_fact(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _fact(v)) for k, v in value.items()))
    if isinstance(value, np.generic):
        return (value.dtype.str, value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a `Dequantized` origin
        return (type(value).__name__, _fact(dataclasses.asdict(value)))
    return value


def graph_facts(graph: Graph) -> list[Any]:
    """Everything that makes a graph what it is, in its topological order, comparable with ==."""
    facts: list[Any] = [graph.name, list(graph.inputs), list(graph.outputs), graph.meta.get("target")]
    for node in graph.nodes():
        facts.append((node.name, node.op, _fact(node.attrs), _fact(node.outputs),
                      tuple(graph.inputs_of(node.name)), node.origin, tuple(node.out_names), node.device,
                      _fact(node.launch)))
    return facts


@pytest.fixture
def mlp_path(tmp_path: Path) -> Path:
    from tilefold.bench.models import mlp

    return mlp(tmp_path / "mlp.onnx", batch=4, sizes=(40, 72, 24, 10), seed=3)


@pytest.fixture
def ort_run():
    """`ort_run(model, feeds)`: onnxruntime's outputs by name."""
    return run_ort


@pytest.fixture
def facts():
    """`facts(graph)`: the graph's structure, attributes, types and annotations, for ==."""
    return graph_facts
