"""Shared by the kernel tests: run one ONNX node with tilefold's NumPy backend and compare it
with onnxruntime (or onnx.reference) on the same inputs."""
from __future__ import annotations

import zlib
from typing import Any, Callable, Collection, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tilefold.backends.numpy import NumpyExecutable
from tilefold.frontends.onnx import load_onnx


def node_model(op: str, args: Sequence[np.ndarray | None], attrs: dict[str, Any], n_outputs: int,
               consts: Collection[int] = (), opset: int = 21) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model over `args` (None = a missing optional input; the positions in
    `consts` become initializers, which kernel factories see as constants) and its feeds."""
    names, inputs, inits, feeds = [], [], [], {}
    for i, arg in enumerate(args):
        if arg is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if i in consts:
            inits.append(numpy_helper.from_array(np.asarray(arg), name))
        else:
            arg = np.asarray(arg)
            elem = helper.np_dtype_to_tensor_dtype(arg.dtype)
            inputs.append(helper.make_tensor_value_info(name, elem, list(arg.shape)))
            feeds[name] = arg
    while names and not names[-1]:
        names.pop()
    outs = [f"out{k}" for k in range(n_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], op.lower(), inputs, [helper.make_empty_tensor_value_info(o) for o in outs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), feeds


def reference_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], reference: str) -> list[np.ndarray]:
    if reference == "onnx":
        return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def tilefold_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from the NumPy backend: no fallback, debug aliasing checks, and
    read-only inputs (the executor binds them so), so a kernel writing into one fails."""
    exe = NumpyExecutable(load_onnx(model), allow_fallback=False, debug=True)
    assert not exe.fallback_nodes
    got = exe(feeds)
    return [got[o.name] for o in model.graph.output]


def run_node(op: str, args: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None, *,
             consts: Collection[int] = (), n_outputs: int = 1) -> list[np.ndarray]:
    """tilefold's outputs of one node, for tests whose reference is written out by hand."""
    return tilefold_outputs(*node_model(op, args, attrs or {}, n_outputs, consts))


def check_node(op: str, args: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None, *,
               consts: Collection[int] = (), n_outputs: int = 1, rtol: float = 1e-5, atol: float = 1e-6,
               reference: str = "onnxruntime", opset: int = 21) -> list[np.ndarray]:
    """Run `op` on `args` in tilefold (no fallback, debug aliasing checks, read-only inputs)
    and in the reference; assert same dtypes, shapes and values. Returns tilefold's outputs."""
    model, feeds = node_model(op, args, attrs or {}, n_outputs, consts, opset)
    expected = reference_outputs(model, feeds, reference)
    got = tilefold_outputs(model, feeds)
    results = []
    for k, want in enumerate(expected):
        have = got[k]
        assert have.dtype == want.dtype, f"{op} output {k}: dtype {have.dtype}, expected {want.dtype}"
        assert have.shape == want.shape, f"{op} output {k}: shape {have.shape}, expected {want.shape}"
        np.testing.assert_allclose(have, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{op} output {k}")
        results.append(have)
    return results


@pytest.fixture
def check() -> Callable[..., list[np.ndarray]]:
    return check_node


@pytest.fixture
def run() -> Callable[..., list[np.ndarray]]:
    return run_node


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded per test, so each test draws its own fresh inputs."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
