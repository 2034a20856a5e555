"""Two real devices on one machine: `cpu` (NumPy kernels, cpu target) and `interp` (Triton
kernels under the interpreter, gpu target). Mixed placements by name pattern and by op kind,
fallback for ops the Triton backend lacks, and a weight read on both devices all give the
single-device results; transfers are explicit and each device gets its own memory plan."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.backends.plan import plan_memory
from tilefold.backends.triton.executor import executor_memory
from tilefold.cli import main
from tilefold.graph.graph import CONSTANT


def _feeds(model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _devices(graph) -> dict[str, set[str]]:
    by_op: dict[str, set[str]] = {}
    for node in graph.nodes():
        if node.op not in ("Input", "Output", "Constant", "Transfer", "Pack", "Unpack"):
            by_op.setdefault(node.op, set()).add(node.device)
    return by_op


@pytest.mark.parametrize("device, affinity, expect", [
    ("interp,cpu", None, {"Conv": {"interp"}, "Relu": {"interp"}}),
    ("cpu", {"op:Conv": "interp"}, {"Conv": {"interp"}, "Gemm": {"cpu"}}),
    ("interp", {"conv_1": "cpu", "op:Gemm": "cpu"}, {"Gemm": {"cpu"}}),
])
def test_mixed_cnn_placements_give_onnxruntime_results(kit, device, affinity, expect):
    model = kit.small_cnn(seed=4)
    opt = tilefold.optimize(tilefold.load(model), device=device, affinity=affinity)
    placed = _devices(opt.graph)
    for op, devices in expect.items():
        assert placed[op] == devices, (op, placed)
    interp_convs = [n for n in opt.graph.nodes() if n.op == "Conv" and n.device == "interp"]
    assert all(n.outputs[0].encoding is not None and n.outputs[0].encoding.inner_tiles == (16,) for n in interp_convs)
    exe = tilefold.compile(opt.graph, device=device, affinity=affinity)
    for seed in (0, 1):
        feeds = _feeds(model, seed)
        kit.assert_close(exe(feeds), kit.ort_outputs(model, feeds), rtol=1e-4, atol=1e-4)


def test_an_op_the_triton_backend_lacks_falls_back_to_the_cpu_with_transfers(kit):
    """float64 math (a row sum between Casts), which Triton kernels leave to the host: the
    product moves there and the sums back."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((6, 3)).astype(np.float32), "w")
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Cast", ["h"], ["h64"], to=TensorProto.DOUBLE),
             helper.make_node("ReduceSum", ["h64", "one"], ["s64"], keepdims=0),
             helper.make_node("Cast", ["s64"], ["c"], to=TensorProto.FLOAT), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "float64", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [w, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    opt = tilefold.optimize(tilefold.load(model), device="interp,cpu")
    assert _devices(opt.graph) == {"MatMul": {"interp"}, "Cast": {"cpu"}, "ReduceSum": {"cpu"}, "Relu": {"interp"}}
    assert opt.placement.transfers == {("cpu", "interp"): 2, ("interp", "cpu"): 2}
    feeds = _feeds(model, 5)
    kit.assert_close(tilefold.compile(opt.graph, device="interp,cpu")(feeds), kit.ort_outputs(model, feeds))


def test_a_weight_read_on_both_devices_is_packed_once_per_device(kit):
    model = kit.tiny_transformer(seed=1, dim=32)  # 32x32 weights: the gpu target tiles them
    graph = tilefold.load(model)
    # The value projection on the CPU, everything else under the interpreter: wq/wk/wv are
    # distinct weights, so share one by pointing the key projection at the query's weight.
    query = next(n for n in graph.nodes() if n.op == "MatMul" and graph.inputs_of(n.name)[1].node == "wq")
    key = next(n for n in graph.nodes() if n.op == "MatMul" and graph.inputs_of(n.name)[1].node == "wk")
    graph.set_input(key.name, 1, graph.inputs_of(query.name)[1])
    opt = tilefold.optimize(graph, device="interp", affinity={key.name: "cpu"})
    copies = [n for n in opt.graph.nodes() if n.op == CONSTANT and n.name.startswith("wq")]
    assert sorted(n.device for n in copies) == ["cpu", "interp"]
    interp_copy = next(n for n in copies if n.device == "interp")
    assert interp_copy.outputs[0].encoding.inner_tiles == (16, 16)
    feeds = _feeds(model, 3)
    single = tilefold.compile(graph)(feeds)
    kit.assert_close(tilefold.compile(opt.graph, device="interp", affinity={key.name: "cpu"})(feeds), single,
                 rtol=1e-4, atol=1e-5)


def test_each_device_has_its_own_memory_plan(kit):
    opt = tilefold.optimize(tilefold.load(kit.small_cnn(seed=2)), device="cpu", affinity={"op:Conv": "interp"})
    plan = executor_memory(opt.graph)  # the Triton executor's schedule: what it allocates
    assert set(plan.devices) == {"cpu", "interp"}
    assert opt.memory.to_dict() == plan.to_dict()
    assert set(plan_memory(opt.graph).devices) == {"cpu", "interp"}  # in graph order: the same devices
    for name, device in plan.devices.items():
        assert device.buffers and all(opt.graph.node(b.value.node).device == name for b in device.buffers)
        assert device.peak_live_bytes <= device.arena_bytes <= device.naive_bytes
    assert plan.devices["interp"].padding_bytes > 0  # 8 and 20 channels padded to 16 and 32


def test_cli_shows_placement_transfers_and_memory(kit, tmp_path, capsys):
    path = tmp_path / "cnn.onnx"
    path.write_bytes(kit.small_cnn(seed=3).SerializeToString())
    assert main(["optimize", str(path), "--device", "cpu", "--affinity", "op:Conv=interp", "--report", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["placement"]["nodes"]["interp"] >= 2 and data["placement"]["transfers"] >= 2
    assert set(data["memory"]) == {"cpu", "interp"}
    assert main(["run", str(path), "--device", "interp,cpu", "--affinity", "op:Gemm=cpu",
                 "--compare", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert "device placement" in out and "interpreter" in out and "match" in out


@pytest.mark.parametrize("argv, message", [
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--device", "cpu", "--affinity", "nothing*=interp"], "'nothing*' matches no node"),
])
def test_bad_device_requests_are_one_line_errors(kit, tmp_path, capsys, argv, message):
    path = tmp_path / "cnn.onnx"
    path.write_bytes(kit.small_cnn().SerializeToString())
    assert main(["run", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
