"""fold_scales: a Mul by a constant scalar of a product's result, reached through reshapes and
transposes, goes into the product's weight and bias (a Gemm's alpha and beta), and the model
still computes what onnxruntime computes for it as written; a scale of a value someone else
reads, of a product of two activations, per channel, or of dequantized integers stays."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold

RNG = np.random.default_rng(31)
T, D, HEADS = 6, 16, 2


def attention_query(head: str = "MatMulAdd", scale: np.ndarray | float = 0.35, extra_reader: bool = False,
                    weight_at_run_time: bool = False):
    """A query as torch's sdpa exports it: a Linear layer, heads split and moved forward, scaled."""
    node = helper.make_node
    w = (RNG.standard_normal((D, D)) * 0.3).astype(np.float32)
    linear = ([node("MatMul", ["x", "w"], ["hw"]), node("Add", ["hw", "b"], ["h"])] if head == "MatMulAdd"
              else [node("Gemm", ["x", "w", "b"], ["h"], alpha=0.5, beta=2.0)])
    nodes = [*linear, node("Reshape", ["h", "heads"], ["r"]), node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
             node("Mul", ["s", "t"], ["y"])]
    outputs = ["y"] + (["h"] if extra_reader else [])
    weights = {"b": RNG.standard_normal(D).astype(np.float32), "heads": np.array([T, HEADS, D // HEADS], np.int64),
               "s": np.asarray(scale, np.float32)}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, D])]
    if weight_at_run_time:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [D, D]))
    else:
        weights["w"] = w
    graph = helper.make_graph(nodes, "query", inputs,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), w


def _check(model, feeds) -> tilefold.Graph:
    """The loaded graph, after checking that it computes onnxruntime's outputs."""
    g = tilefold.load(model)
    got = tilefold.compile(g)(feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    return g


@pytest.mark.parametrize("head", ["MatMulAdd", "Gemm"])
def test_a_scaled_query_folds_its_scale_into_the_linear_layer(head):
    model, _ = attention_query(head)
    g = _check(model, {"x": RNG.standard_normal((T, D)).astype(np.float32)})
    assert [n.op for n in g.nodes() if n.op == "Mul"] == []
    if head == "Gemm":
        (gemm,) = [n for n in g.nodes() if n.op == "Gemm"]
        assert gemm.attrs["alpha"] == pytest.approx(0.5 * 0.35) and gemm.attrs["beta"] == pytest.approx(2.0 * 0.35)


@pytest.mark.parametrize("case", ["read_elsewhere", "per_head", "weight_at_run_time"])
def test_a_scale_that_cannot_move_into_weights_stays(case):
    scale = RNG.uniform(0.5, 1.5, (HEADS, 1, 1)) if case == "per_head" else 0.35
    model, w = attention_query(scale=scale, extra_reader=case == "read_elsewhere",
                               weight_at_run_time=case == "weight_at_run_time")
    feeds = {"x": RNG.standard_normal((T, D)).astype(np.float32)}
    if case == "weight_at_run_time":
        feeds["w"] = w
    g = _check(model, feeds)
    assert [n.op for n in g.nodes() if n.op == "Mul"] == ["Mul"]


def test_a_dequantized_weight_keeps_its_integers_and_its_scale_stays():
    """A weight folded from DequantizeLinear is written back as integers: scaling it would
    turn it into floats, so the Mul stays."""
    node = helper.make_node
    q = RNG.integers(-100, 100, (D, D)).astype(np.int8)
    nodes = [node("DequantizeLinear", ["wq", "ws"], ["w"]), node("MatMul", ["x", "w"], ["h"]),
             node("Mul", ["h", "s"], ["y"])]
    graph = helper.make_graph(nodes, "quantized", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(np.float32(0.02), "ws"),
                               numpy_helper.from_array(np.float32(0.35), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = RNG.standard_normal((T, D)).astype(np.float32)
    g = tilefold.load(model)  # onnxruntime runs this MatMul on quantized activations: NumPy is the reference
    np.testing.assert_allclose(tilefold.compile(g)({"x": x})["y"], (x @ (q * np.float32(0.02))) * np.float32(0.35),
                               rtol=1e-5, atol=1e-5)
    assert [n.op for n in g.nodes() if n.op == "Mul"] == ["Mul"]


@pytest.mark.parametrize("axis", [-1, 0])
def test_the_scaled_pieces_of_a_fused_projection_scale_their_columns(axis):
    """GPT-2's fused query, key and value: one Linear layer split into three; the query and the
    key are scaled, so their columns of the weight and bias are. A split across rows (axis 0)
    is not a set of columns: its scales stay."""
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["hw"]), node("Add", ["hw", "b"], ["h"]),
             node("Split", ["h"], ["q", "k", "v"], axis=axis, num_outputs=3),
             node("Mul", ["q", "s"], ["qs"]), node("Mul", ["s", "k"], ["ks"])]
    weights = {"w": (RNG.standard_normal((D, 3 * D)) * 0.3).astype(np.float32),
               "b": RNG.standard_normal(3 * D).astype(np.float32), "s": np.float32(0.42)}
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3 * T, D])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("qs", "ks", "v")],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    g = _check(model, {"x": RNG.standard_normal((3 * T, D)).astype(np.float32)})
    assert len([n for n in g.nodes() if n.op == "Mul"]) == (0 if axis == -1 else 2)
