"""load_onnx on bad input: one error each, of the right kind, in one line that says what is wrong."""
from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefold.frontends.onnx import load_onnx
from tilefold.graph import ModelError, UnsupportedOpError

RESNET = glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_resnet50.onnx"))[0]


def fails(model, kind: type[Exception], *fragments: str) -> str:
    """Load `model`, expecting `kind` with a one-line message holding every fragment."""
    with pytest.raises(kind) as info:
        load_onnx(model)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and len(message) < 400, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def tiny(nodes, inputs=("x",), outputs=("y",), inits=(), opset=21, **graph_kw) -> onnx.ModelProto:
    return helper.make_model(
        helper.make_graph(
            nodes, "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
            list(inits), **graph_kw),
        opset_imports=[helper.make_opsetid("", opset)])


def external_model(tmp_path, location: str) -> str:
    """A model whose weight `w` lives in external file `location`; returns the model's path."""
    model = tiny([helper.make_node("Add", ["x", "w"], ["y"])],
                 inits=[numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")])
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "24")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    onnx.save(model, path)
    return str(path)


# ---- not a model ---------------------------------------------------------------------------


def test_random_bytes_are_not_an_onnx_model():
    fails(np.random.default_rng(0).bytes(4096), ModelError, "<bytes>", "not an ONNX model")


def test_a_text_file_is_not_an_onnx_model(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is plain text,\nnot a protobuf\n")
    fails(path, ModelError, str(path), "not an ONNX model")


def test_another_protobuf_is_not_an_onnx_model():
    path = RESNET.replace(".onnx", "_output_0.pb")  # a TensorProto
    fails(path, ModelError, path, "not an ONNX model", "no graph")


def test_a_truncated_file_is_refused(tmp_path):
    data = open(RESNET, "rb").read()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) * 3 // 5])
    fails(path, ModelError, str(path), "truncated")


def test_a_missing_file(tmp_path):
    fails(tmp_path / "absent.onnx", ModelError, "absent.onnx", "no such file")


def test_a_directory(tmp_path):
    fails(tmp_path, ModelError, str(tmp_path), "directory")


def test_an_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    fails(path, ModelError, "empty.onnx", "empty")


def test_something_that_is_no_model():
    fails(3.5, ModelError, "float")


# ---- external data -------------------------------------------------------------------------


def test_a_missing_external_data_file(tmp_path):
    fails(external_model(tmp_path, "weights.bin"), ModelError, "'w'", "'weights.bin'", "no such file")


def test_an_external_data_file_too_short(tmp_path):
    path = external_model(tmp_path, "weights.bin")
    (tmp_path / "model" / "weights.bin").write_bytes(b"\0" * 10)
    fails(path, ModelError, "'w'", "10 bytes")


def test_an_absolute_external_data_location_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\1" * 64)
    fails(external_model(tmp_path, str(secret)), ModelError, "'w'", str(secret), "absolute", "arbitrary files")


def test_an_external_data_location_escaping_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\1" * 64)
    fails(external_model(tmp_path, "../secret.bin"), ModelError, "'w'", "'../secret.bin'", "outside", "arbitrary files")


def test_a_symlink_pointing_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\1" * 64)
    path = external_model(tmp_path, "link.bin")
    os.symlink(tmp_path / "secret.bin", tmp_path / "model" / "link.bin")
    fails(path, ModelError, "'w'", "'link.bin'", "outside")


def test_external_data_without_a_folder_is_refused(tmp_path):
    data = open(external_model(tmp_path, "weights.bin"), "rb").read()
    fails(data, ModelError, "'w'", "external", "path")


# ---- malformed graphs ----------------------------------------------------------------------


def test_a_graph_with_a_cycle():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Exp", ["b"], ["y"], name="third")]
    fails(tiny(nodes), ModelError, "cycle", "node 'first' (op Add) reads 'b' from node 'second' (op Relu)",
          "which reads 'a' from node 'first'")


def test_a_dangling_input():
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")]
    fails(tiny(nodes), ModelError, "node 'add' (op Add)", "'nowhere'", "no node, graph input or initializer")


def test_a_dangling_graph_output():
    fails(tiny([helper.make_node("Relu", ["x"], ["y"])], outputs=("y", "z")), ModelError, "graph output 'z'")


def test_a_tensor_produced_twice():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Exp", ["x"], ["y"], name="b")]
    fails(tiny(nodes), ModelError, "'y'", "node 'b' (op Exp)", "twice")


def test_an_unsupported_subgraph_op():
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "branch", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3])])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    node = helper.make_node("If", ["c"], ["y"], name="choose", then_branch=branch, else_branch=branch)
    model = tiny([node], inputs=("x",))
    model.graph.input.append(cond)
    fails(model, UnsupportedOpError, "node 'choose' (op If)", "subgraphs")


def test_a_checker_failure_names_the_node():
    node = helper.make_node("Transpose", ["x"], ["y"], name="flip", perm=1.5)
    fails(tiny([node]), ModelError, "invalid ONNX model", "perm", "flip")


def test_an_opset_the_converter_cannot_reach():
    fails(tiny([helper.make_node("Relu", ["x"], ["y"])], opset=99), ModelError, "opset 99", "opset 21")


def test_an_input_without_a_shape():
    model = tiny([helper.make_node("Relu", ["x"], ["y"])])
    model.graph.input[0].type.tensor_type.ClearField("shape")
    fails(model, ModelError, "graph input 'x'", "no shape")


def test_a_sequence_input():
    model = tiny([helper.make_node("SequenceAt", ["s", "i"], ["y"])], inputs=())
    model.graph.input.extend([
        helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
    ])
    fails(model, UnsupportedOpError, "graph input 's'", "sequence", "tensors only")


def test_an_output_whose_type_nothing_can_infer():
    node = helper.make_node("Mystery", ["x"], ["y"], name="what", domain="com.example")
    model = tiny([node])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    fails(model, ModelError, "node 'what' (op Mystery)", "output 'y'", "unknown")
