"""load_onnx: ONNX models of every supported opset become the same opset-21 Graph."""
from __future__ import annotations

import collections
import glob
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator

from tilefold.frontends import onnx_prepare
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import CONSTANT, INPUT, OUTPUT, Graph, TensorType, Value
from tilefold.graph import registry
from tilefold.graph.registry import OpDef
from tilefold.graph.verify import verify_graph

LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))
F32 = np.dtype("float32")


def onnx_op_counts(graph: Graph) -> dict[str, int]:
    """Compute ops of a Graph by their ONNX name (OnnxReference nodes by the op they run)."""
    counts: collections.Counter[str] = collections.Counter()
    for node in graph.nodes():
        if node.op in (INPUT, OUTPUT, CONSTANT):
            continue
        counts[node.attrs["onnx_op"] if node.op == "OnnxReference" else node.op] += 1
    return dict(counts)


def compute_nodes(graph: Graph) -> list:
    return [n for n in graph.nodes() if n.op not in (INPUT, OUTPUT, CONSTANT)]


def declared_shape(info: onnx.ValueInfoProto) -> tuple:
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in info.type.tensor_type.shape.dim)


# ---- the light model zoo -------------------------------------------------------------------


def test_all_nine_light_models_are_found():
    assert len(LIGHT) == 9


@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p)[6:-5] for p in LIGHT])
def test_light_model_loads_with_the_ops_of_its_opset21_form(path):
    original = onnx.load(path)
    converted = version_converter.convert_version(original, 21)
    graph = load_onnx(path)
    verify_graph(graph)

    expected = collections.Counter(n.op_type for n in converted.graph.node if n.op_type != "Constant")
    assert onnx_op_counts(graph) == dict(expected)
    constants = len(converted.graph.initializer) + sum(n.op_type == "Constant" for n in converted.graph.node)
    assert graph.op_counts()[CONSTANT] == constants

    weights = {t.name for t in original.graph.initializer}
    inputs = [i for i in original.graph.input if i.name not in weights]
    assert graph.inputs == [i.name for i in inputs]
    for info in inputs:
        assert graph.input_types()[info.name] == TensorType(declared_shape(info), F32)
    assert graph.output_names() == [o.name for o in original.graph.output]
    out_type = graph.type_of(graph.output_values()[0])
    assert out_type.shape == declared_shape(original.graph.output[0])
    assert graph.meta["opset"] == 9 and graph.meta["ir_version"] == 3
    assert graph.meta["producer"].startswith("onnx-caffe2")


def test_initializer_values_become_read_only_constants():
    path = next(p for p in LIGHT if "resnet50" in p)
    original = onnx.load(path)
    graph = load_onnx(path)
    for tensor in original.graph.initializer:
        value = graph.constant_value(Value(tensor.name))
        np.testing.assert_array_equal(value, numpy_helper.to_array(tensor))
        assert not value.flags.writeable


# ---- one model at several opsets -----------------------------------------------------------


def structure(graph: Graph) -> list[tuple]:
    """Ops in order with their output types and what they read (constants by value)."""
    rows = []
    for node in compute_nodes(graph):
        reads = []
        for value in graph.inputs_of(node.name):
            const = graph.constant_value(value)
            if value is None:
                reads.append(None)
            elif const is not None:
                reads.append(("const", str(const.dtype), np.asarray(const).round(4).tolist()))
            else:
                producer = graph.node(value.node)
                reads.append((producer.op if producer.op != "OnnxReference" else producer.attrs["onnx_op"], value.slot))
        op = node.attrs["onnx_op"] if node.op == "OnnxReference" else node.op
        rows.append((op, tuple(str(t) for t in node.outputs), tuple(reads)))
    return rows


def test_a_model_written_at_every_opset_from_9_to_21_loads_to_one_graph(conv_block):
    graphs = {opset: load_onnx(conv_block(opset)) for opset in range(9, 22)}
    reference = structure(graphs[21])
    assert [row[0] for row in reference] == ["Conv", "Clip", "ReduceMean", "Unsqueeze", "Split"]
    assert reference[-1][1] == ("float32[Nx3x1]", "float32[Nx5x1]")
    for opset, graph in graphs.items():
        verify_graph(graph)
        assert structure(graph) == reference, f"opset {opset}"
        assert graph.meta["opset"] == opset


def test_a_newer_opset_is_converted_down_to_21(conv_block):
    model = conv_block(21)
    model.opset_import[0].version = 22
    graph = load_onnx(model)
    assert structure(graph) == structure(load_onnx(conv_block(21)))
    assert graph.meta["opset"] == 22


# ---- types ---------------------------------------------------------------------------------


def test_symbolic_dims_are_strings_and_unknown_dims_get_fresh_names():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None, 4])
    node = helper.make_node("Relu", ["x"], ["y"])
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    graph = load_onnx(model)
    shape = graph.input_types()["x"].shape
    assert shape[0] == "batch" and isinstance(shape[1], str) and shape[1] != "batch" and shape[2] == 4
    assert graph.type_of(graph.output_values()[0]).shape == shape
    assert load_onnx(model).input_types()["x"].shape == shape  # deterministic


def test_unknown_output_types_come_from_the_registry(monkeypatch):
    """A registered op whose output ONNX cannot type (a custom-domain input) uses registry inference."""
    monkeypatch.setitem(registry.REGISTRY, "Relu", OpDef(
        "Relu", infer=lambda a, t, c: [TensorType(t[0].shape, t[0].dtype)], layout="agnostic"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="com.example"),
             helper.make_node("Relu", ["m"], ["y"])]
    graph_proto = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                    value_info=[helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, "k"])])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.example", 3)])
    graph = load_onnx(model)
    mystery, relu = compute_nodes(graph)
    assert (mystery.op, mystery.attrs["domain"], mystery.attrs["opset"]) == ("OnnxReference", "com.example", 3)
    assert relu.op == "Relu" and relu.outputs == [TensorType((2, "k"), F32)]


def test_registered_ops_get_their_opset21_schema_defaults(monkeypatch):
    monkeypatch.setitem(registry.REGISTRY, "LeakyRelu", OpDef(
        "LeakyRelu", infer=lambda a, t, c: [TensorType(t[0].shape, t[0].dtype)]))
    monkeypatch.setitem(registry.REGISTRY, "Conv", OpDef(
        "Conv", infer=lambda a, t, c: [t[0]], min_inputs=2, max_inputs=3))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], name="leaky"),
             helper.make_node("Conv", ["a", "w"], ["y"], name="conv", strides=[2, 2], auto_pad="SAME_UPPER")]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w]),
        opset_imports=[helper.make_opsetid("", 21)])
    graph = load_onnx(model)
    leaky, conv = graph.node("leaky"), graph.node("conv")
    assert leaky.attrs == {"alpha": pytest.approx(0.01)} and isinstance(leaky.attrs["alpha"], float)
    assert conv.attrs == {"group": 1, "auto_pad": "SAME_UPPER", "strides": (2, 2)}
    assert conv.outputs == [TensorType((1, 4, 4, 4), F32)]  # onnx shape inference, not the stub above
    assert conv.origin == "conv" and conv.out_names == ["y"]


def test_unregistered_ops_become_onnx_reference_nodes_that_onnx_reference_can_run():
    rng = np.random.default_rng(1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    node = helper.make_node("Hardmax", ["x"], ["y"], axis=0)  # not in tilefold's op list
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 13)])
    (ref,) = compute_nodes(load_onnx(model))
    assert ref.op == "OnnxReference" and ref.attrs["onnx_op"] == "Hardmax" and ref.attrs["opset"] == 21
    assert ref.attrs["output_types"] == (TensorType((3, 4), F32),) and ref.origin == "Hardmax#0"
    proto = onnx.NodeProto()
    proto.ParseFromString(ref.attrs["proto"])
    single = helper.make_model(
        helper.make_graph([proto], "one", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 21)])
    data = rng.standard_normal((3, 4)).astype(np.float32)
    (got,) = ReferenceEvaluator(single).run(None, {"x": data})
    np.testing.assert_array_equal(got, (data == data.max(axis=0)).astype(np.float32))


# ---- constants, inputs, outputs --------------------------------------------------------------


@pytest.mark.parametrize("attr, value, expected", [
    ("value", numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3)), np.arange(6, dtype=np.int32).reshape(2, 3)),
    ("value_float", 1.5, np.array(1.5, np.float32)),
    ("value_floats", [1.0, -2.5], np.array([1.0, -2.5], np.float32)),
    ("value_int", 7, np.array(7, np.int64)),
    ("value_ints", [3, 1, 2], np.array([3, 1, 2], np.int64)),
    ("value_string", "hi", np.array("hi", dtype=object)),
    ("value_strings", ["a", "bc"], np.array(["a", "bc"], dtype=object)),
    ("sparse_value", helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0, 6.0], np.float32), "v"),
        numpy_helper.from_array(np.array([1, 4], np.int64), "i"), [2, 3]),
     np.array([[0, 5, 0], [0, 6, 0]], np.float32)),
])
def test_constant_nodes_of_every_form_become_constants(attr, value, expected):
    node = helper.make_node("Constant", [], ["c"], **{attr: value})
    elem = helper.np_dtype_to_tensor_dtype(expected.dtype) if expected.dtype != object else TensorProto.STRING
    model = helper.make_model(
        helper.make_graph([node], "g", [], [helper.make_tensor_value_info("c", elem, None)]),
        opset_imports=[helper.make_opsetid("", 21)])
    graph = load_onnx(model)
    value_out = graph.constant_value(graph.output_values()[0])
    assert value_out.dtype == expected.dtype and value_out.shape == expected.shape
    np.testing.assert_array_equal(value_out, expected)
    assert not value_out.flags.writeable


def test_an_initializer_listed_as_an_input_is_a_constant():
    w = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")
    infos = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "w")]
    model = helper.make_model(
        helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", infos,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w]),
        opset_imports=[helper.make_opsetid("", 9)], ir_version=3)
    graph = load_onnx(model)
    assert graph.inputs == ["x"]
    np.testing.assert_array_equal(graph.constant_value(Value("w")), [1.0, 2.0])


def test_graph_inputs_and_initializers_can_be_outputs_directly():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y, x]),
        opset_imports=[helper.make_opsetid("", 21)])
    model.graph.initializer.append(numpy_helper.from_array(np.array([4.0], np.float32), "k"))
    model.graph.output.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, [1]))
    graph = load_onnx(model)
    assert graph.output_names() == ["y", "x", "k"]
    assert graph.output_values()[1:] == [Value("x"), Value("k")]
    assert graph.node("k").op == CONSTANT
    verify_graph(graph)


def test_bytes_and_model_protos_load_like_files(tmp_path, conv_block):
    model = conv_block(13)
    path = tmp_path / "block.onnx"
    onnx.save(model, path)
    from_file = load_onnx(path)
    assert structure(load_onnx(model.SerializeToString())) == structure(from_file)
    assert structure(load_onnx(model)) == structure(from_file)
    assert from_file.meta["source"] == str(path) and from_file.name == "block"
    assert model.opset_import[0].version == 13  # the caller's proto is left as it was


def test_an_unsorted_graph_is_sorted():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Exp", ["a"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["a"], name="first")]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 21)])
    assert [n.name for n in compute_nodes(load_onnx(model))] == ["first", "second"]


def test_model_local_functions_are_inlined():
    fn = helper.make_function(
        "local", "Swishish", ["a"], ["b"],
        [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["b"])],
        opset_imports=[helper.make_opsetid("", 18)])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Swishish", ["x"], ["y"], domain="local")], "g", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], functions=[fn])
    graph = load_onnx(model)
    assert onnx_op_counts(graph) == {"Sigmoid": 1, "Mul": 1}
    assert graph.type_of(graph.output_values()[0]) == TensorType((4,), F32)


# ---- external data and large weights ---------------------------------------------------------


def test_external_data_loads_and_equals_the_original(tmp_path, conv_block):
    model = conv_block(17)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    assert (tmp_path / "m.data").stat().st_size > 0
    graph = load_onnx(tmp_path / "m.onnx")
    for name, array in weights.items():
        np.testing.assert_array_equal(graph.constant_value(Value(name)), array)
    assert structure(graph) == structure(load_onnx(conv_block(17)))


def test_large_initializers_skip_the_onnx_tools_and_come_back(monkeypatch, conv_block):
    """Large weights are held out of the protobuf the C++ tools see (the 2 GB limit)."""
    monkeypatch.setattr(onnx_prepare, "STRIP_BYTES", 64)
    model = conv_block(9)
    held_out: list[str] = []
    real_strip = onnx_prepare._strip

    def spy(m, held=()):
        light, large = real_strip(m, held)
        held_out.extend(large)
        assert all(t.name not in large for t in light.graph.initializer)
        return light, large

    monkeypatch.setattr(onnx_prepare, "_strip", spy)
    graph = load_onnx(model)
    assert held_out == ["w"]
    np.testing.assert_array_equal(graph.constant_value(Value("w")), numpy_helper.to_array(model.graph.initializer[0]))
    assert graph.inputs == ["x"]
    monkeypatch.undo()
    assert structure(graph) == structure(load_onnx(conv_block(9)))


def test_progress_bar_goes_to_stderr(capsys, conv_block):
    load_onnx(conv_block(21), progress=True)
    captured = capsys.readouterr()
    assert "node" in captured.err and captured.out == ""


def test_shapes_computed_from_static_shapes_are_followed():
    """ReduceMean's axes come from Range(1, Size(Shape(x))): onnx alone loses the result's rank."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["shape"], ["rank"]),
             helper.make_node("Range", ["one", "rank", "one"], ["axes"]),
             helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [one]),
        opset_imports=[helper.make_opsetid("", 21)])
    graph = load_onnx(model)
    assert onnx_op_counts(graph) == {"Shape": 1, "Size": 1, "Range": 1, "ReduceMean": 1}  # nothing folded away
    assert graph.type_of(graph.output_values()[0]) == TensorType((2,), F32)
    verify_graph(graph)
