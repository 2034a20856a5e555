"""split_projections: a Split of a Linear layer's features read through a permute becomes one
Linear layer per piece, computing what onnxruntime computes for the model as written; a
Split of the last dim, or of weights known only at run time, is left alone."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold

RNG = np.random.default_rng(23)
SIDE, C = 4, 16


def modulation(head: str = "Gemm", permute: bool = True, weights_at_run_time: bool = False):
    """FocalNet's modulation, shrunk: a Linear layer's (pixels, 2C + 3) result viewed as an
    NHWC map, permuted to NCHW and split into query, context and 3 gates; the context goes
    through a conv that the query multiplies, the gates are an output."""
    features = 2 * C + 3
    node = helper.make_node
    w = (RNG.standard_normal((C, features)) * 0.3).astype(np.float32)
    if head == "GemmT":
        linear = node("Gemm", ["x", "w", "b"], ["h"], transB=1)
        w = np.ascontiguousarray(w.T)
    elif head == "Gemm":
        linear = node("Gemm", ["x", "w", "b"], ["h"])
    elif head == "MatMulAdd":  # torch.onnx's Linear layer
        linear = [node("MatMul", ["x", "w"], ["hw"]), node("Add", ["hw", "b"], ["h"])]
    elif head == "traced":  # torch's: the map's rows merged for a Gemm
        linear = [node("Reshape", ["x", "rows"], ["xr"]), node("Gemm", ["xr", "w", "b"], ["h"])]
    else:
        linear = node("MatMul", ["x", "w"], ["h"])
    axis = 1 if permute else 3
    nodes = [*(linear if isinstance(linear, list) else [linear]),
             node("Reshape", ["h", "image"], ["m"]),
             *([node("Transpose", ["m"], ["t"], perm=[0, 3, 1, 2])] if permute else [node("Identity", ["m"], ["t"])]),
             node("Split", ["t", "sizes"], ["q", "ctx", "gates"], axis=axis)]
    if permute:
        nodes += [node("Conv", ["ctx", "wc"], ["cc"], pads=[1, 1, 1, 1]), node("Mul", ["q", "cc"], ["y"])]
    else:
        nodes += [node("Mul", ["q", "ctx"], ["y"])]
    weights = {"b": RNG.standard_normal(features).astype(np.float32),
               "image": np.array([1, SIDE, SIDE, features], np.int64), "sizes": np.array([C, C, 3], np.int64),
               "wc": (RNG.standard_normal((C, C, 3, 3)) * 0.2).astype(np.float32),
               "rows": np.array([SIDE * SIDE, C], np.int64)}
    x_shape = [1, SIDE, SIDE, C] if head == "traced" else [SIDE * SIDE, C]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if weights_at_run_time:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
    else:
        weights["w"] = w
    graph = helper.make_graph(nodes, "modulation", inputs,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "gates")],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), w


def run_against_onnxruntime(model, feeds):
    g = tilefold.load(model)
    got = tilefold.compile(g)(feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, ref in zip(("y", "gates"), want):
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    return g


@pytest.mark.parametrize("head, anchor, biases", [
    ("Gemm", "Gemm", 0), ("GemmT", "Gemm", 0), ("MatMul", "MatMul", 0), ("MatMulAdd", "MatMul", 3),
    ("traced", "MatMul", 3),  # the Gemm of merged rows is a MatMul of the map and an Add first
])
def test_a_split_of_permuted_features_becomes_one_linear_layer_per_piece(head, anchor, biases):
    model, _ = modulation(head)
    shape = (1, SIDE, SIDE, C) if head == "traced" else (SIDE * SIDE, C)
    g = run_against_onnxruntime(model, {"x": RNG.standard_normal(shape).astype(np.float32)})
    counts = g.op_counts()
    assert counts.get("Split", 0) == 0 and counts[anchor] == 3 and counts.get("Add", 0) == biases
    widths = sorted(n.outputs[0].shape[-1] for n in g.nodes() if n.op == anchor)
    assert widths == [3, C, C]


def test_a_split_of_the_last_dim_is_left_alone():
    """The pieces are column blocks of the result, read in place: nothing to gain."""
    model, _ = modulation(permute=False)
    g = run_against_onnxruntime(model, {"x": RNG.standard_normal((SIDE * SIDE, C)).astype(np.float32)})
    assert g.op_counts().get("Split") == 1 and g.op_counts().get("Gemm") == 1


def test_weights_known_only_at_run_time_are_left_alone():
    model, w = modulation(weights_at_run_time=True)
    feeds = {"x": RNG.standard_normal((SIDE * SIDE, C)).astype(np.float32), "w": w}
    g = run_against_onnxruntime(model, feeds)
    assert g.op_counts().get("Split") == 1
