"""QuantizeLinear and DequantizeLinear in Triton chain kernels: the ONNX conformance cases of
float32 data (per tensor and per axis, 8- and 16-bit types, int32 into DequantizeLinear)
bit for bit, and a quantized conv stack on the gpu target's NCHWc16 layout, its per-channel
scales read along the packed channels. Blocked scales and float16 data stay on the NumPy
backend (their division rounds in float16)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tilefold
from tilefold.backends.triton import TritonExecutable
from tilefold.backends.triton.elementwise import supports
from tilefold.bench.models import qdq_cnn_model
from tilefold.frontends.onnx import load_onnx

from .conftest import _array, _with_constant_operands, conformance_cases

QDQ = {"QuantizeLinear", "DequantizeLinear"}
_UNSUPPORTED_TYPES = re.compile(r"(?i)e4m3|e5m2|e8m0|float4|int4|int2|bf16|bfloat16")
CASES = [c for c in conformance_cases(lambda ops: ops <= QDQ) if not _UNSUPPORTED_TYPES.search(c.name)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_case_runs_in_a_kernel_or_says_it_does_not(case, device):
    inputs, (expected, *_) = case.data_sets[0]
    model = _with_constant_operands(case.model, inputs)
    graph = load_onnx(model)
    (node,) = [n for n in graph.nodes() if n.op in QDQ]
    exe = TritonExecutable(graph, device=device)
    got = exe({model.graph.input[0].name: _array(inputs[0])})
    blocked_or_half = bool(node.attrs.get("block_size")) or "float16" in case.name
    assert supports(graph, node) == (not blocked_or_half), case.name
    assert (node.name in exe.fallback_nodes) == blocked_or_half
    (y,) = got.values()
    want = _array(expected)
    assert y.dtype == want.dtype
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
def test_saturation_halves_and_nan_as_the_numpy_kernel(kit, device, dtype):
    from tilefold.graph import Graph, TensorType

    x = np.array([[0.5, 1.5, -2.5, 3e38, -3e38, np.nan, np.inf, 7.49]], np.float32)
    g = Graph("q")
    v = g.add_input("x", TensorType(x.shape, np.float32))
    scale = g.add_constant(np.array(0.5, np.float32), name="scale")
    zero = g.add_constant(np.array(3, dtype), name="zero")
    q = kit.add(g, "QuantizeLinear", [v, scale, zero], name="q")
    g.add_output(q, "q")
    g.add_output(kit.add(g, "DequantizeLinear", [q, scale, zero], name="dq"), "y")
    got, want = kit.run_both(g, {"x": x}, device, fuse=False)
    for name in ("q", "y"):
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name], want[name])


def test_a_quantized_conv_stack_on_the_gpu_layout(device):
    graph = tilefold.load(qdq_cnn_model())
    opt = tilefold.optimize(graph, "gpu").graph
    x = np.random.default_rng(3).integers(-3, 4, (2, 3, 8, 8)).astype(np.float32)
    exe = TritonExecutable(opt, device=device)
    assert exe.fallback_nodes == []
    np.testing.assert_array_equal(exe({"x": x})["y"], tilefold.compile(graph)({"x": x})["y"])
