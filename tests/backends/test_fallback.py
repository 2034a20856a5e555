"""The OnnxReference kernel: ops tilefold has no kernel for run through onnx.reference,
only when the fallback is allowed, with results equal to onnxruntime's."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tilefold.backends.numpy import NumpyExecutable
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import UnsupportedOpError


def model_with(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "fallback", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def onnxruntime_outputs(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.fixture
def quantize_model():
    """Relu -> DynamicQuantizeLinear (three outputs, not a tilefold op) -> Cast and Neg."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("DynamicQuantizeLinear", ["r"], ["q", "scale", "zero"]),
        helper.make_node("Cast", ["q"], ["wide"], to=TensorProto.FLOAT),
        helper.make_node("Neg", ["wide"], ["y"]),
    ]
    return model_with(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 7]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])],
    )


def test_an_op_without_a_kernel_runs_through_onnx_reference(quantize_model):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 7)).astype(np.float32)
    exe = NumpyExecutable(load_onnx(quantize_model), debug=True)
    assert [exe.graph.node(n).attrs["onnx_op"] for n in exe.fallback_nodes] == ["DynamicQuantizeLinear"]
    got = exe({"x": x})
    y, scale = onnxruntime_outputs(quantize_model, {"x": x})
    np.testing.assert_array_equal(got["y"], y)
    np.testing.assert_allclose(got["scale"], scale, rtol=1e-6)
    assert got["scale"].dtype == np.float32 and got["scale"].shape == ()


def test_the_fallback_can_be_disabled(quantize_model):
    with pytest.raises(UnsupportedOpError, match="DynamicQuantizeLinear.*fallback") as info:
        NumpyExecutable(load_onnx(quantize_model), allow_fallback=False)
    assert "\n" not in str(info.value)


def test_fallback_results_never_alias_their_inputs():
    # onnx.reference's Flatten returns a reshaped view of its input; the kernel must copy it.
    from tilefold.backends.numpy import KERNELS, KernelSpec
    from tilefold.graph import Graph, TensorType

    proto = helper.make_node("Flatten", ["x"], ["y"], axis=1)
    out = TensorType((2, 12), np.dtype(np.float32))
    attrs = {"onnx_op": "Flatten", "domain": "", "proto": proto.SerializeToString(), "opset": 21,
             "output_types": (out,)}
    node = Graph().add_node("OnnxReference", [], [out], attrs, name="flatten")
    run = KERNELS["OnnxReference"].build(KernelSpec(node, [TensorType((2, 3, 4), np.dtype(np.float32))], [None]))
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    y = run(x)
    np.testing.assert_array_equal(y, x.reshape(2, 12))
    assert not np.shares_memory(y, x)


def test_fallback_with_a_missing_optional_input():
    """An RNN (no tilefold kernel) whose bias and sequence lengths are left out, before its initial state."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    weights = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w", (1, 5, 4)), ("r", (1, 5, 5)), ("h0", (1, 2, 5)))]
    model = model_with(
        [helper.make_node("RNN", ["x", "w", "r", "", "", "h0"], ["y"], hidden_size=5)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1, 2, 5])],
        weights,
    )
    exe = NumpyExecutable(load_onnx(model), debug=True)
    assert exe.fallback_nodes
    np.testing.assert_allclose(exe({"x": x})["y"], onnxruntime_outputs(model, {"x": x})[0], rtol=1e-5)
