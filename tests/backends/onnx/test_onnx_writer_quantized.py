"""A quantized (QDQ) model's weights stay integers in the file tilefold writes: a constant
folded from DequantizeLinear at load keeps its integers (`Dequantized`), and the writer
stores them and the DequantizeLinear again instead of the floats, in either form, whatever
layout the weight was packed into; tilefold computes the packed buffer again when it reads
the file. Where the floats no longer match the integers, the floats are written."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import tilefold
from tilefold.backends.onnx import save_onnx
from tilefold.bench.models import qdq_cnn_model
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import Graph, TensorType, Value
from tilefold.graph.graph import DEQUANTIZED
from tilefold.graph.ops.quantize import dequantized_value
from tilefold.graph.types import Dequantized

from .conftest import run_ort

TARGETS = ("cpu", "gpu", "gpu-padded")


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).integers(-3, 4, (2, 3, 8, 8)).astype(np.float32)}


def _ort_as_written(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """onnxruntime running the file's ops as written (its fused integer kernels round otherwise)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (y,) = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)
    return y


def test_a_dequantized_weight_remembers_its_integers_at_load():
    graph = tilefold.load(qdq_cnn_model())
    source = {t.name: numpy_helper.to_array(t) for t in qdq_cnn_model().graph.initializer}
    weights = {n.name: n for n in graph.constants() if DEQUANTIZED in n.attrs}
    assert sorted(weights) == ["w0", "w1"]
    for name, node in weights.items():
        d = node.attrs[DEQUANTIZED]
        np.testing.assert_array_equal(d.data, source[f"{name}q"])
        assert d.data.dtype == np.int8 and d.axis == 0
        np.testing.assert_array_equal(dequantized_value(d), node.attrs["value"])
    # w0's zero point is all zeros, w1 has none
    np.testing.assert_array_equal(weights["w0"].attrs[DEQUANTIZED].zero_point, source["z_w0"])
    assert weights["w1"].attrs[DEQUANTIZED].zero_point is None


@pytest.mark.parametrize("form", ["logical", "packed"])
@pytest.mark.parametrize("target", TARGETS)
def test_optimized_qdq_weights_are_written_as_int8(tmp_path, target, form, facts):
    opt = tilefold.optimize(tilefold.load(qdq_cnn_model()), target)
    path = tmp_path / "qdq.onnx"
    written = save_onnx(opt.graph, path, form=form)
    model = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    floats = [n for n, a in inits.items() if a.dtype == np.float32 and a.size > 64]
    assert floats == []  # no weight is stored as floats
    assert sorted(a.size for a in inits.values() if a.dtype == np.int8 and a.size > 64) == [8 * 32, 32 * 27]
    assert written.weight_bytes < 2000  # 5,000 bytes with the weights as floats
    assert [n.op_type for n in model.graph.node].count("DequantizeLinear") == 4
    feeds = _feeds(seed=7)
    want = tilefold.compile(opt.graph)(feeds)["y"]
    np.testing.assert_array_equal(_ort_as_written(path, feeds), want)
    again = load_onnx(path)
    assert facts(again) == facts(opt.graph)  # the packed buffers computed again, bit for bit
    np.testing.assert_array_equal(tilefold.compile(again)(feeds)["y"], want)


def test_floats_that_no_longer_match_their_integers_are_written_as_floats(tmp_path):
    """A pass that changed a weight but kept its origin must not get the old weight written."""
    rng = np.random.default_rng(3)
    q = rng.integers(-8, 8, (6, 5)).astype(np.int8)
    scale = (2.0 ** rng.integers(-3, 1, 6)).astype(np.float32)
    origin = Dequantized(q, scale, None, 0, 0)
    g = Graph("changed")
    x = g.add_input("x", TensorType((6, 5), np.float32))
    for name, value in (("kept", dequantized_value(origin)), ("changed", dequantized_value(origin) * 3)):
        w = g.add_constant(value, name=name, dequantized=origin)
        g.add_output(Value(g.add_node("Add", [x, w], [TensorType((6, 5), np.float32)], name=f"{name}_add").name),
                     f"y_{name}")
    path = tmp_path / "changed.onnx"
    save_onnx(g, path)
    inits = {t.name: numpy_helper.to_array(t).dtype for t in onnx.load(path).graph.initializer}
    assert inits["kept.quantized"] == np.int8
    assert "changed.quantized" not in inits and inits["changed"] == np.float32
    feeds = {"x": rng.standard_normal((6, 5)).astype(np.float32)}
    want = tilefold.compile(g)(feeds)
    got = run_ort(path, feeds)
    for name in ("y_kept", "y_changed"):
        np.testing.assert_array_equal(got[name], want[name])


def test_a_reshaped_weight_keeps_a_per_tensor_origin_only():
    q = np.arange(12, dtype=np.int8).reshape(3, 4)
    per_tensor = Dequantized(q, np.array(0.5, np.float32), None, 1, 0)
    per_axis = Dequantized(q, np.array([0.5, 1.0, 2.0], np.float32), None, 0, 0)
    reshaped = per_tensor.reshaped((2, 6))
    np.testing.assert_array_equal(dequantized_value(reshaped), dequantized_value(per_tensor).reshape(2, 6))
    assert per_axis.reshaped((2, 6)) is None


@pytest.mark.parametrize("data", [np.arange(-3, 3, dtype=np.int32), np.array(3, np.int8)])
def test_a_per_tensor_origin_ignores_the_default_axis_of_low_rank_data(data):
    """DequantizeLinear's axis defaults to 1, past the rank of a 1-D bias or a scalar: per tensor
    it means nothing, and the value is onnx.reference's."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    scale, zero = np.array(0.25, np.float32), np.array(1, data.dtype)
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in (("q", data), ("s", scale), ("z", zero))])
    (want,) = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])).run(None, {})
    got = dequantized_value(Dequantized(data, scale, zero, 1, 0))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
