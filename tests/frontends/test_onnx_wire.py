"""onnx_wire: a model file's large initializers are read straight into arrays, and the model
loads to exactly the graph that the ordinary protobuf read gives; any layout the walk does not
expect falls back to the ordinary read."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefold.frontends import onnx_prepare, onnx_wire
from tilefold.frontends.onnx import load_onnx
from tilefold.frontends.onnx_read import read_model
from tilefold.graph import CONSTANT, Value
from tilefold.graph.errors import ModelError

MIN = 64  # hold out payloads from 64 bytes (the loader's threshold is 4 KiB)


def weights_model(rng: np.random.Generator) -> onnx.ModelProto:
    """x + w0 + ..., with weights of several element types and storage forms."""
    arrays = {
        "w_f32": rng.standard_normal((4, 5, 3)).astype(np.float32),
        "w_f16": rng.standard_normal((4, 5, 3)).astype(np.float16),
        "w_f64": rng.standard_normal((4, 5, 3)),
        "w_i64": rng.integers(-9, 9, (4, 5, 3)),
        "w_small": rng.standard_normal((3,)).astype(np.float32),  # 12 bytes: stays in the protobuf
    }
    inits = [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    # the same float32 values stored as float_data, not raw_data: nothing to hold out
    inits.append(helper.make_tensor("w_floats", TensorProto.FLOAT, (4, 5, 3),
                                    rng.standard_normal(60).astype(np.float32).tolist()))
    nodes, last = [], "x"
    for k, t in enumerate(inits):
        cast = f"c{k}"
        nodes.append(helper.make_node("Cast", [t.name], [cast], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Add", [last, cast], [f"s{k}"]))
        last = f"s{k}"
    graph = helper.make_graph(nodes, "weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 5, 3))],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, (4, 5, 3))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def split_of(path, min_bytes: int = MIN) -> onnx_wire.Split | None:
    with open(path, "rb", buffering=0) as f:
        return onnx_wire.read_split(f, min_bytes)


def constants(graph) -> dict[str, np.ndarray]:
    return {n.name: n.attrs["value"] for n in graph.nodes() if n.op == CONSTANT}


def structure(graph) -> list:
    return [(n.name, n.op, n.outputs) for n in graph.nodes()]


def test_the_light_model_is_the_model_without_the_held_payloads(tmp_path):
    model = weights_model(np.random.default_rng(0))
    onnx.save(model, tmp_path / "m.onnx")
    split = split_of(tmp_path / "m.onnx")
    light = onnx.ModelProto.FromString(split.light)
    held = {light.graph.initializer[i].name: p for i, p in split.payloads.items()}
    assert sorted(held) == ["w_f16", "w_f32", "w_f64", "w_i64"]
    for original, stripped in zip(model.graph.initializer, light.graph.initializer):
        if original.name in held:
            assert held[original.name].tobytes() == original.raw_data
            assert not stripped.HasField("raw_data")
            stripped.raw_data = original.raw_data
        assert stripped == original
    assert light.graph.node == model.graph.node and light.opset_import == model.opset_import
    source = read_model(tmp_path / "m.onnx", hold_out_bytes=MIN)  # what load_onnx reads
    assert sorted(source.arrays) == sorted(held)
    assert all(not t.HasField("raw_data") for t in source.model.graph.initializer if t.name in held)


def test_a_file_loads_to_the_graph_its_model_proto_gives(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_prepare, "STRIP_BYTES", MIN)
    model = weights_model(np.random.default_rng(1))
    onnx.save(model, tmp_path / "m.onnx")
    from_file, from_proto = load_onnx(tmp_path / "m.onnx"), load_onnx(model)
    a, b = constants(from_file), constants(from_proto)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
        np.testing.assert_array_equal(a[name], b[name])
        assert not a[name].flags.writeable
    assert structure(from_file) == structure(from_proto)
    held = [a[name] for name in ("w_f16", "w_f32", "w_f64", "w_i64")]
    assert not any(np.shares_memory(x, y) for i, x in enumerate(held) for y in held[i + 1:])  # each its own buffer


def test_held_weights_keep_their_values_through_optimize_and_run(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_prepare, "STRIP_BYTES", MIN)
    model = weights_model(np.random.default_rng(2))
    onnx.save(model, tmp_path / "m.onnx")
    import tilefold
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(3).standard_normal((4, 5, 3)).astype(np.float32)
    got = tilefold.run(tmp_path / "m.onnx", {"x": x})
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-6)


def test_a_payload_that_is_not_a_plain_array_goes_back_into_its_tensor():
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=(2, 3))  # dims want 24 bytes
    bf16 = TensorProto(name="b", data_type=TensorProto.BFLOAT16, dims=(4,))  # not a numpy dtype
    graph = helper.make_graph([], "g", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, (2, 3))],
                              [tensor, bf16])
    model = helper.make_model(graph)
    arrays = onnx_wire.attach(model, {0: np.arange(10, dtype=np.uint8), 1: np.arange(8, dtype=np.uint8)})
    assert arrays == {}
    assert model.graph.initializer[0].raw_data == bytes(range(10))
    assert model.graph.initializer[1].raw_data == bytes(range(8))


def test_a_graph_field_given_twice_falls_back_to_the_ordinary_read(tmp_path, monkeypatch):
    """Protobuf merges a repeated message field: the second graph adds its initializers."""
    monkeypatch.setattr(onnx_prepare, "STRIP_BYTES", MIN)
    model = weights_model(np.random.default_rng(4))
    extra = onnx.ModelProto()
    extra.graph.initializer.append(numpy_helper.from_array(np.ones(40, np.float32), "unused"))
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString() + extra.SerializeToString())
    assert split_of(tmp_path / "m.onnx") is None
    graph = load_onnx(tmp_path / "m.onnx")
    want = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(graph.constant_value(Value("w_f32")), want)


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_raw_data_given_twice_falls_back(tmp_path):
    """The last raw_data would win; the walk leaves that to protobuf."""
    tensor = numpy_helper.from_array(np.zeros(40, np.float32), "w").SerializeToString() + field(9, bytes(range(160)))
    graph = field(2, b"g") + field(5, tensor)  # name, initializer
    head = onnx.ModelProto(ir_version=10, opset_import=[helper.make_opsetid("", 21)])
    data = head.SerializeToString() + field(7, graph)
    (tmp_path / "m.onnx").write_bytes(data)
    parsed = onnx.ModelProto.FromString(data)
    assert parsed.graph.initializer[0].raw_data == bytes(range(160))
    assert split_of(tmp_path / "m.onnx") is None


@pytest.mark.parametrize("cut", [1, 100, -700, -1])
def test_a_truncated_file_gives_the_ordinary_error(tmp_path, cut):
    model = weights_model(np.random.default_rng(5))
    data = model.SerializeToString()
    (tmp_path / "m.onnx").write_bytes(data[:cut])
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_onnx(tmp_path / "m.onnx")
    with pytest.raises(ModelError) as from_bytes:
        load_onnx(data[:cut])
    with pytest.raises(ModelError) as from_file:
        load_onnx(tmp_path / "m.onnx")
    assert str(from_file.value).split(": ", 1)[1] == str(from_bytes.value).split(": ", 1)[1]


def test_a_file_of_another_kind_gives_the_ordinary_error(tmp_path):
    (tmp_path / "m.onnx").write_bytes(np.random.default_rng(6).bytes(50_000))
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_onnx(tmp_path / "m.onnx")


# ---- external data -------------------------------------------------------------------------------
def test_external_initializers_are_read_straight_into_arrays(tmp_path):
    from tilefold.frontends.onnx_read import load_external_data

    model = weights_model(np.random.default_rng(7))
    want = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    saved = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    external = sorted(t.name for t in saved.graph.initializer if onnx.external_data_helper.uses_external_data(t))
    assert external == ["w_f16", "w_f32", "w_f64", "w_i64", "w_small"]  # (onnx keeps float_data inline)
    source = read_model(tmp_path / "m.onnx", hold_out_bytes=MIN)
    load_external_data(source)
    assert sorted(source.arrays) == external
    for tensor in source.model.graph.initializer:
        if tensor.name not in external:
            continue
        assert not onnx.external_data_helper.uses_external_data(tensor) and not tensor.HasField("raw_data")
        got = source.arrays[tensor.name]
        assert got.dtype == want[tensor.name].dtype
        np.testing.assert_array_equal(got, want[tensor.name])
    graph = load_onnx(tmp_path / "m.onnx")
    for name, array in want.items():
        np.testing.assert_array_equal(graph.constant_value(Value(name)), array)


def test_an_external_file_behind_a_symbolic_link_is_left_to_onnx(tmp_path):
    """onnx's loader refuses symbolic links, even inside the model's folder; so does tilefold."""
    model = weights_model(np.random.default_rng(8))
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    (tmp_path / "m.data").rename(tmp_path / "real.data")
    (tmp_path / "m.data").symlink_to(tmp_path / "real.data")
    with pytest.raises(ModelError, match="cannot load external data"):
        load_onnx(tmp_path / "m.onnx")
