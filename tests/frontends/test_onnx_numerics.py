"""Loaded models compute what onnxruntime computes on the original file, on fresh random inputs."""
from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefold.backends.numpy import NumpyExecutable
from tilefold.frontends.onnx import load_onnx
from tilefold.graph.verify import verify_graph



def onnxruntime_outputs(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator, sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    weights = {t.name for t in model.graph.initializer}
    feeds = {}
    for info in model.graph.input:
        if info.name in weights:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else (sizes or {})[d.dim_param] for d in info.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        feeds[info.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def assert_same_outputs(graph, model, feeds, rtol=1e-4, atol=1e-5) -> None:
    verify_graph(graph)
    got = NumpyExecutable(graph)(feeds)
    want = onnxruntime_outputs(model, feeds)
    assert list(got) == list(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("opset", [9, 13, 17, 21])
def test_each_opset_form_computes_what_onnxruntime_computes(opset, conv_block):
    model = conv_block(opset)
    rng = np.random.default_rng(opset)
    assert_same_outputs(load_onnx(model), model, random_feeds(model, rng, {"N": 3}))


def test_external_data_model_matches_onnxruntime(tmp_path, conv_block):
    model = conv_block(17)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    feeds = random_feeds(model, np.random.default_rng(3), {"N": 2})
    # onnx.save moved `model`'s data out; onnxruntime runs a fresh in-memory copy
    assert_same_outputs(load_onnx(path), conv_block(17), feeds)


def test_a_torch_transformer_export_with_dynamic_axes_matches_onnxruntime():
    """Shape arithmetic over constants (torch's Mod in attention) must not lose the Reshape ranks."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    module = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.randn(2, 5, 32),), buffer, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch", 1: "seq"}}, opset_version=17, dynamo=False)
    model = onnx.load_from_string(buffer.getvalue())
    graph = load_onnx(model)
    assert graph.input_types()["x"].shape == ("batch", "seq", 32)
    feeds = random_feeds(model, np.random.default_rng(5), {"batch": 2, "seq": 5})
    assert_same_outputs(graph, model, feeds)


def test_a_model_whose_shapes_need_folding_matches_onnxruntime():
    """Reshape to [rank(x) mod 2, -1]: onnx's data propagation stops at Mod, folding does not."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", [0]), ("two", 2), ("minus", [-1]))]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["shape"], ["rank"]),
             helper.make_node("Unsqueeze", ["rank", "zero"], ["rank1"]),
             helper.make_node("Mod", ["rank1", "two"], ["odd"]),
             helper.make_node("Concat", ["odd", "minus"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts),
        opset_imports=[helper.make_opsetid("", 21)])
    graph = load_onnx(model)
    assert graph.type_of(graph.output_values()[0]).shape == (1, 24)
    assert_same_outputs(graph, model, random_feeds(model, np.random.default_rng(11)))
