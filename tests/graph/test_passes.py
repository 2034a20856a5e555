"""Simplification passes: shape subgraphs fold away, splats stay splats, BatchNorm folds into
Conv, CSE and DCE; every pass reports `modified` honestly; results match onnxruntime."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.backends.numpy import evaluate_node
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import Graph, Splat, TensorType, Value
from tilefold.graph.passes import (compose_transposes, constant_folding, cse, dce, fold_batchnorm, fold_pads,
                                   run_passes, simplify)
from tilefold.graph.verify import verify_graph

RNG = np.random.default_rng(7)
F32 = np.dtype("float32")


def make_model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "t", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    return model


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_shape_subgraph_folds_to_a_constant_reshape():
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "first"], ["b"], axis=0),
            helper.make_node("Unsqueeze", ["b", "zero"], ["b1"]),
            helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
            helper.make_node("Reshape", ["x", "shape"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])],
        [("first", np.array(0, np.int64)), ("zero", np.array([0], np.int64)), ("minus1", np.array([-1], np.int64))],
    )
    g = simplify(load_onnx(model), evaluate_node, verify=True)
    assert {n.op for n in g.nodes()} == {"Input", "Constant", "Reshape", "Output"}
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    out = tilefold.compile(g)({"x": x})["y"]
    np.testing.assert_array_equal(out, ort_run(model, {"x": x})[0])


def test_splat_weights_stay_splats_through_folding():
    model = make_model(
        [
            helper.make_node("ConstantOfShape", ["wshape"], ["w0"],
                             value=numpy_helper.from_array(np.array([0.25], np.float32))),
            helper.make_node("Mul", ["w0", "two"], ["w1"]),
            helper.make_node("Transpose", ["w1"], ["w"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "w"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
        [("wshape", np.array([7, 5], np.int64)), ("two", np.array(2.0, np.float32))],
    )
    g = simplify(load_onnx(model), evaluate_node, verify=True)
    (matmul,) = [n for n in g.nodes() if n.op == "MatMul"]
    weight = g.constant_value(g.inputs_of(matmul.name)[1])
    assert isinstance(weight, Splat) and weight.shape == (5, 7) and weight.value == 0.5
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(g)({"x": x})["y"], ort_run(model, {"x": x})[0], rtol=1e-6)


def conv_bn_model(splat_params: bool):
    c, f = 3, 8
    w = RNG.standard_normal((f, c, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(f).astype(np.float32)
    if splat_params:
        params = [np.full(f, v, np.float32) for v in (1.5, 0.1, 0.2, 0.9)]
    else:
        params = [RNG.standard_normal(f).astype(np.float32), RNG.standard_normal(f).astype(np.float32),
                  RNG.standard_normal(f).astype(np.float32), RNG.uniform(0.5, 2, f).astype(np.float32)]
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], epsilon=1e-3),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 9, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, f, 9, 7])],
        [("w", w), ("b", b), *zip(["s", "bb", "m", "v"], params)],
    )
    return model


@pytest.mark.parametrize("splat_params", [False, True])
def test_batchnorm_folds_into_conv(splat_params):
    model = conv_bn_model(splat_params)
    g = load_onnx(model)
    result = fold_batchnorm(g)
    assert result.modified
    verify_graph(g)
    assert "BatchNormalization" not in g.op_counts()
    assert not fold_batchnorm(g).modified
    x = RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(g)({"x": x})["y"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_batchnorm_of_splat_conv_keeps_splat_weights():
    model = make_model(
        [
            helper.make_node("ConstantOfShape", ["wshape"], ["w"],
                             value=numpy_helper.from_array(np.array([0.02], np.float32))),
            *[helper.make_node("ConstantOfShape", ["cshape"], [n], value=numpy_helper.from_array(np.array([v], np.float32)))
              for n, v in zip(["s", "bb", "m", "v"], (2.0, 0.5, 0.1, 4.0))],
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        [("wshape", np.array([4, 3, 1, 1], np.int64)), ("cshape", np.array([4], np.int64))],
    )
    g = simplify(load_onnx(model), evaluate_node, verify=True)
    (conv,) = [n for n in g.nodes() if n.op == "Conv"]
    weight = g.constant_value(g.inputs_of(conv.name)[1])
    assert isinstance(weight, Splat) and weight.shape == (4, 3, 1, 1)
    x = RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(g)({"x": x})["y"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def small_graph() -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType((4,), F32))
    t = TensorType((4,), F32)
    a1 = g.add_node("Relu", [x], [t], name="a1")
    a2 = g.add_node("Relu", [x], [t], name="a2")
    s = g.add_node("Add", [Value(a1.name), Value(a2.name)], [t], name="sum")
    g.add_node("Neg", [x], [t], name="unused")
    g.add_output(Value(s.name), "y")
    return g


def test_cse_merges_identical_nodes_and_says_so_once():
    g = small_graph()
    assert cse(g).modified
    assert g.op_counts()["Relu"] == 1
    assert not cse(g).modified
    verify_graph(g)


def test_cse_keeps_the_integer_origin_of_a_merged_constant():
    """Two equal weights, one folded from DequantizeLinear: the one kept remembers its integers,
    so a written model stores them whichever of the two came first."""
    from tilefold.graph.graph import DEQUANTIZED
    from tilefold.graph.ops.quantize import dequantized_value
    from tilefold.graph.types import Dequantized

    q = RNG.integers(-128, 128, (4, 6)).astype(np.int8)
    scale = np.array(0.05, np.float32)
    origin = Dequantized(q, scale, None, 1, 0)
    floats = dequantized_value(origin)
    g = Graph("g")
    x = g.add_input("x", TensorType((3, 4), F32))
    plain = g.add_constant(floats.copy(), name="plain")
    quantized = g.add_constant(floats.copy(), name="quantized", dequantized=origin)
    a = g.add_node("MatMul", [x, plain], [TensorType((3, 6), F32)], {}, name="a")
    b = g.add_node("MatMul", [x, quantized], [TensorType((3, 6), F32)], {}, name="b")
    g.add_output(Value(g.add_node("Add", [Value(a.name), Value(b.name)], [TensorType((3, 6), F32)], {},
                                  name="s").name), "y")
    assert cse(g).modified
    (kept,) = [n for n in g.nodes() if n.op == "Constant"]
    assert kept.attrs[DEQUANTIZED] is origin
    np.testing.assert_array_equal(kept.attrs["value"], floats)


def test_dce_drops_what_no_output_needs_but_keeps_inputs():
    g = small_graph()
    assert dce(g).modified
    assert "unused" not in g and "x" in g
    assert not dce(g).modified


def test_passes_leave_results_unchanged():
    g = small_graph()
    x = RNG.standard_normal(4).astype(np.float32)
    before = tilefold.compile(g.copy())({"x": x})["y"]
    run_passes(g, [constant_folding(evaluate_node), cse, dce], verify=True, fixed_point=True)
    np.testing.assert_array_equal(tilefold.compile(g)({"x": x})["y"], before)
    np.testing.assert_array_equal(before, 2 * np.maximum(x, 0))


def test_identity_and_dropout_are_bypassed():
    model = make_model(
        [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Dropout", ["a"], ["b"]),
         helper.make_node("Relu", ["b"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    g = simplify(load_onnx(model), evaluate_node, verify=True)
    assert set(g.op_counts()) == {"Input", "Relu", "Output"}


@pytest.mark.parametrize("perms, left", [
    (((2, 0, 1, 3), (1, 2, 0, 3), (0, 2, 1, 3)), 1),  # PyTorch's head merge: the first two cancel
    (((0, 2, 1, 3), (0, 2, 1, 3)), 0),  # a swap and its inverse: nothing left
    (((3, 2, 1, 0), None), 0),  # a perm, then ONNX's default (the reversal)
    (((1, 0, 2, 3), (0, 1, 3, 2)), 1),
])
def test_chained_transposes_compose_into_one_or_none(perms, left):
    nodes, name, shape = [], "x", [2, 3, 4, 5]
    for i, perm in enumerate(perms):
        attrs = {} if perm is None else {"perm": list(perm)}
        out = "y" if i == len(perms) - 1 else f"t{i}"
        nodes.append(helper.make_node("Transpose", [name], [out], **attrs))
        name, shape = out, [shape[p] for p in (perm or (3, 2, 1, 0))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    g = load_onnx(model)
    run_passes(g, [compose_transposes, dce], verify=True, fixed_point=True)
    assert g.op_counts().get("Transpose", 0) == left
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(tilefold.compile(g)({"x": x})["y"], ort_run(model, {"x": x})[0])


def _pad_conv_model(pads, mode="constant", fill=None, conv_pads=(1, 0, 0, 1), second_reader=False):
    """x -> Pad(pads, mode, fill) -> Conv(3x3, conv_pads) [and Relu of the Pad] -> outputs."""
    inits = [("pads", np.array(pads, np.int64)), ("w", RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))]
    pad_inputs = ["x", "pads"]
    if fill is not None:
        inits.append(("fill", np.array(fill, np.float32)))
        pad_inputs.append("fill")
    nodes = [helper.make_node("Pad", pad_inputs, ["p"], mode=mode),
             helper.make_node("Conv", ["p", "w"], ["y"], pads=list(conv_pads))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list("nchw"))]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list("nchw")))
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 7])], outputs, inits)


@pytest.mark.parametrize("fill", [None, 0.0])
def test_a_zero_pad_of_the_spatial_dims_becomes_the_convs_padding(fill):
    """TensorFlow-style "same" padding (Pad -> Conv, MobileNetV2 and EfficientNet through
    torch.fx): the Conv reads the Pad's input with its pads grown; no Pad is left."""
    model = _pad_conv_model([0, 0, 1, 0, 0, 0, 0, 2], fill=fill)
    g = simplify(load_onnx(model), evaluate_node, verify=True)
    assert "Pad" not in g.op_counts()
    (conv,) = [n for n in g.nodes() if n.op == "Conv"]
    assert list(conv.attrs["pads"]) == [2, 0, 0, 3]
    x = RNG.standard_normal((2, 3, 6, 7)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(g)({"x": x})["y"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["channels", "fill", "reflect", "crop"])
def test_pads_that_are_not_a_convs_zero_padding_stay(case):
    pads = {"channels": [0, 1, 1, 0, 0, 0, 1, 0], "crop": [0, 0, -1, 0, 0, 0, 1, 0]}.get(case, [0, 0, 1, 1, 0, 0, 1, 1])
    model = _pad_conv_model(pads, mode="reflect" if case == "reflect" else "constant",
                            fill=0.5 if case == "fill" else None)
    if case == "channels":  # the Conv then reads 4 channels
        model.graph.initializer[1].CopyFrom(numpy_helper.from_array(RNG.standard_normal((4, 4, 3, 3)).astype(np.float32), "w"))
    g = simplify(load_onnx(model), evaluate_node, verify=True)
    assert g.op_counts()["Pad"] == 1
    x = RNG.standard_normal((2, 3, 6, 7)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(g)({"x": x})["y"], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_pad_read_by_something_else_too_stays_for_that_reader_only():
    model = _pad_conv_model([0, 0, 1, 1, 0, 0, 1, 1], second_reader=True)
    g = simplify(load_onnx(model), evaluate_node, verify=True)
    (pad,) = [n for n in g.nodes() if n.op == "Pad"]
    assert [g.node(name).op for name, _ in g.users(Value(pad.name))] == ["Relu"]
    x = RNG.standard_normal((2, 3, 6, 7)).astype(np.float32)
    got, want = tilefold.compile(g)({"x": x}), ort_run(model, {"x": x})
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["r"], want[1])


def test_an_empty_pad_is_bypassed_and_fold_pads_says_so():
    model = _pad_conv_model([0] * 8, mode="reflect")
    g = load_onnx(model)
    first = fold_pads(g)
    assert first.modified and "Pad" not in first.graph.op_counts()
    assert not fold_pads(first.graph).modified


def test_folding_log_of_zero_gives_minus_infinity_without_a_warning():
    """IEEE results are the op's answer when folded, as when run: no NumPy RuntimeWarning."""
    import warnings

    model = make_model(
        [helper.make_node("Log", ["c"], ["l"]), helper.make_node("Add", ["x", "l"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [("c", np.array([0.0, 1.0, 2.0], np.float32))],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = tilefold.load(model)
    assert [n.op for n in graph.nodes() if n.op not in ("Input", "Output", "Constant")] == ["Add"]
    x = np.random.default_rng(5).standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(tilefold.compile(graph)({"x": x})["y"], ort_run(model, {"x": x})[0])


def test_bfloat16_constants_fold_through_float32_with_one_rounding():
    """The NumPy kernels have no bfloat16: folding widens the operands (exactly), computes in
    float32 and rounds the result once, as the Triton kernels do; Transpose moves bits alone."""
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(11)
    w, s = rng.standard_normal((5, 3)).astype(bf16), rng.standard_normal((1, 5)).astype(bf16)
    g = Graph("bf16")
    x = g.add_input("x", TensorType((2, 3), bf16))
    t = g.add_node("Transpose", [g.add_constant(w, name="w")], [TensorType((3, 5), bf16)], {"perm": [1, 0]})
    scaled = g.add_node("Mul", [Value(t.name), g.add_constant(s, name="s")], [TensorType((3, 5), bf16)])
    g.add_output(Value(g.add_node("MatMul", [x, Value(scaled.name)], [TensorType((2, 5), bf16)]).name), "y")
    g = simplify(g, evaluate_node, verify=True)
    (folded,) = [g.constant_value(v) for v in g.inputs_of(next(n for n in g.nodes() if n.op == "MatMul").name)[1:]]
    assert folded.dtype == bf16
    want = (w.astype(np.float32).T * s.astype(np.float32)).astype(bf16)
    np.testing.assert_array_equal(folded.view(np.uint16), want.view(np.uint16))
