"""Ops newer than opset 21 (RMSNormalization, Attention, RotaryEmbedding of opset 23, Swish of
24) load as the ONNX functions that define them and run on tilefold's kernels, plain and
optimized, with onnxruntime's results; a newer op that no function defines, or whose function
is control flow, is a one-line error naming it. The ONNX conformance cases of these ops run in
tests/backends/test_conformance.py."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import UnsupportedOpError

F = TensorProto.FLOAT


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(23)


def _model(nodes, inputs, outputs, inits=(), opset=23) -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(nodes, "newer", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, F, None) for n in outputs], list(inits)),
        opset_imports=[helper.make_opsetid("", opset)])
    return model


def _against_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """tilefold's outputs, plain and optimized for both targets, checked against onnxruntime's
    (which runs these ops natively); returns onnxruntime's."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    graph = tilefold.load(model)
    assert not {n.op for n in graph.nodes()} & {"RMSNormalization", "Attention", "RotaryEmbedding", "Swish",
                                                 "OnnxReference"}
    for g in (graph, tilefold.optimize(graph, "cpu").graph, tilefold.optimize(graph, "gpu").graph):
        got = tilefold.compile(g)(feeds)
        for name, ref in want.items():
            np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)
    return want


def test_rms_normalization_matches_its_formula_and_onnxruntime(rng):
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    model = _model([helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-5)],
                   [("x", F, [2, 5, 16])], ["y"], [numpy_helper.from_array(scale, "scale")])
    want = _against_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_allclose(want, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * scale, rtol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
def test_grouped_query_attention_with_a_padding_mask(rng, causal):
    """4 query heads over 2 key/value heads, a boolean mask hiding the last two keys."""
    q = rng.standard_normal((2, 4, 6, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 6, 8)).astype(np.float32) for _ in range(2))
    mask = np.ones((2, 1, 6, 6), bool)
    mask[..., 4:] = False
    model = _model([helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], is_causal=causal)],
                   [("q", F, q.shape), ("k", F, k.shape), ("v", F, v.shape), ("mask", TensorProto.BOOL, mask.shape)],
                   ["y"])
    _against_onnxruntime(model, {"q": q, "k": k, "v": v, "mask": mask})


def test_rotary_embedding_from_position_ids(rng):
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)  # batch, heads, sequence, head size
    cos, sin = (rng.uniform(-1, 1, (10, 4)).astype(np.float32) for _ in range(2))
    positions = rng.integers(0, 10, (2, 5)).astype(np.int64)
    model = _model([helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"])],
                   [("x", F, x.shape), ("pos", TensorProto.INT64, positions.shape)], ["y"],
                   [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")])
    _against_onnxruntime(model, {"x": x, "pos": positions})


def test_swish_of_opset_24(rng):
    x = rng.standard_normal((3, 7)).astype(np.float32) * 4
    model = _model([helper.make_node("Swish", ["x"], ["y"], alpha=1.5)], [("x", F, x.shape)], ["y"], opset=24)
    got = tilefold.compile(tilefold.load(model))({"x": x})["y"]
    np.testing.assert_allclose(got, x / (1 + np.exp(-1.5 * x)), rtol=1e-5, atol=1e-6)


def _one_line(model: onnx.ModelProto, *fragments: str) -> None:
    with pytest.raises(UnsupportedOpError) as info:
        load_onnx(model)
    message = str(info.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def test_a_newer_op_with_no_function_body_is_one_line():
    model = _model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT32, name="cast_bits")],
                   [("x", F, [2, 3])], ["y"], opset=26)
    _one_line(model, "node 'cast_bits' (op BitCast)", "no ONNX function body")


def test_a_newer_op_whose_function_is_control_flow_is_one_line():
    """LinearAttention's function body is a Scan over the sequence."""
    shape = [1, 3, 8]  # batch, tokens, heads * head size
    model = _model([helper.make_node("LinearAttention", ["q", "k", "v"], ["y", "state"], name="lin",
                                     q_num_heads=2, kv_num_heads=2)],
                   [(n, F, shape) for n in "qkv"], ["y", "state"], opset=27)
    _one_line(model, "node 'lin' (op LinearAttention)", "Scan (control flow)")
