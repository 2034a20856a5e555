"""Several Triton devices in one compiled program, tested without a GPU as two interpreter
devices (`interp:0` = `interp`, and `interp:1`), with the host (`cpu`) in the mix: each node
runs on its own device behind explicit Transfer nodes, each device has its own arena, and the
outputs equal the single-device NumPy results on fresh random inputs."""
from __future__ import annotations

import numpy as np
import pytest

import tilefold
from tilefold.backends.assign import Placement, assign_devices
from tilefold.backends.devices import canonical, parse_request, present
from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable
from tilefold.backends.triton.executor import check_arena
from tilefold.bench.models import mlp_model
from tilefold.cli import main
from tilefold.graph.errors import TilefoldError
from tilefold.graph.graph import CONSTANT
from tilefold.graph.types import Value

F32 = np.float32
COMPUTE = ("MatMul", "Add", "Relu", "Conv", "MaxPool", "GlobalAveragePool", "Flatten", "Gemm")


def _mlp():
    return mlp_model(batch=5, sizes=(20, 33, 17, 7), seed=7), (5, 20)


def _devices_by_op(graph) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for node in graph.nodes():
        if node.op in COMPUTE:
            found.setdefault(node.op, set()).add(node.device)
    return found


def _check_runs(kit, model, shape, exe, seeds=(0, 1)) -> None:
    """Outputs equal the NumPy executor's on the unplaced model, run after run; each run
    counts exactly the placement's transfers; the arenas pass the overlap check."""
    reference = NumpyExecutable(tilefold.load(model))
    placement = Placement.of(exe.graph)
    for seed in seeds:
        feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(F32)}
        before = exe.transfers, exe.transfer_bytes
        for arena in exe.arenas.values():
            arena.fill_(0xFF)
        kit.assert_close(exe(feeds), reference(feeds), rtol=1e-4, atol=1e-5)
        assert exe.transfers - before[0] == placement.transfer_count
        assert exe.transfer_bytes - before[1] == sum(placement.transfer_bytes.values())
    check_arena(exe)
    for name, arena in exe.arenas.items():
        assert arena.numel() == exe.memory.devices[name].arena_bytes


def test_interp_is_indexed_and_plain_interp_is_interp_0():
    assert [d.name for d in parse_request("interp:0,interp:1,interp")] == ["interp", "interp:1", "interp"]
    assert parse_request("interp:0") == parse_request("interp")
    assert [d.name for d in present("interp:3,cpu")] == ["interp:3", "cpu"]
    assert canonical("interp:0") == "interp" and canonical("cuda") == "cuda:0"
    with pytest.raises(TilefoldError, match="the index must be a number"):
        parse_request("interp:x")


@pytest.mark.parametrize("device, affinity, expect", [
    ("interp", {"op:Relu": "interp:1"},
     {"MatMul": {"interp"}, "Add": {"interp"}, "Relu": {"interp:1"}}),
    ("interp:0", {"matmul1": "interp:1", "add1": "interp:1", "relu1": "interp:1"},
     {"MatMul": {"interp", "interp:1"}, "Relu": {"interp", "interp:1"}}),
    ("interp:1,cpu", {"op:MatMul": "interp:0", "add2": "cpu"},
     {"MatMul": {"interp"}, "Add": {"interp:1", "cpu"}, "Relu": {"interp:1"}}),
], ids=["by-op", "by-pattern", "with-cpu"])
@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "gpu"])
def test_an_mlp_split_across_two_interpreter_devices(kit, device, affinity, expect, optimized):
    model, shape = _mlp()
    graph = tilefold.load(model)
    if optimized:  # each device's target plans its own nodes first
        graph = tilefold.optimize(graph, device=device, affinity=affinity).graph
    exe = tilefold.compile(graph, device=device, affinity=affinity)
    assert isinstance(exe, TritonExecutable)
    placed = _devices_by_op(exe.graph)
    for op, devices in expect.items():
        assert placed[op] == devices, (op, placed)
    triton = {d for ds in placed.values() for d in ds} - {"cpu"}
    assert set(exe.arenas) == triton == {"interp", "interp:1"}
    routes = Placement.of(exe.graph).transfers
    assert routes.get(("interp", "interp:1"), 0) + routes.get(("interp:1", "interp"), 0) >= 1
    assert {s.device for s in exe.steps} == {"cpu", "interp", "interp:1"}
    assert exe.fallback_nodes == [s.group.anchor.name for s in exe.steps if s.device == "cpu"]
    _check_runs(kit, model, shape, exe)


@pytest.mark.parametrize("device, affinity, expect", [
    ("interp", {"op:Conv": "interp:1"},
     {"Conv": {"interp:1"}, "Relu": {"interp"}, "MaxPool": {"interp"}, "Gemm": {"interp"}}),
    ("interp", {"block_*": "interp:1", "head_*": "interp:1"},
     {"Conv": {"interp", "interp:1"}, "Add": {"interp:1"}, "MaxPool": {"interp"}}),
    ("interp,cpu", {"stem_*": "interp:1", "op:Gemm": "cpu", "pool": "cpu"},
     {"Conv": {"interp", "interp:1"}, "MaxPool": {"cpu"}, "Gemm": {"cpu"}}),
], ids=["by-op", "by-pattern", "with-cpu"])
@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "gpu"])
def test_a_residual_cnn_split_across_two_interpreter_devices(kit, device, affinity, expect, optimized):
    model = kit.residual_cnn(seed=8)
    graph = tilefold.load(model)
    if optimized:
        graph = tilefold.optimize(graph, device=device, affinity=affinity).graph
    exe = tilefold.compile(graph, device=device, affinity=affinity)
    placed = _devices_by_op(exe.graph)
    for op, devices in expect.items():
        assert placed[op] == devices, (op, placed)
    if optimized:  # the gpu target packs every interpreter conv's result, on either device
        convs = [n for n in exe.graph.nodes() if n.op == "Conv" and n.device != "cpu"]
        assert convs and all(n.outputs[0].encoding is not None and n.outputs[0].encoding.inner_tiles == (16,)
                             for n in convs)
    assert set(exe.arenas) == {"interp", "interp:1"}
    _check_runs(kit, model, (2, 3, 8, 8), exe)


def test_a_weight_used_on_both_devices_is_a_constant_on_each(kit):
    model, shape = mlp_model(batch=5, sizes=(32, 48, 17, 7), seed=7), (5, 32)  # a 32x48 weight: tiled
    graph = tilefold.load(model)
    x = graph.inputs_of("matmul0")[0]
    w = graph.inputs_of("matmul0")[1]
    twin = graph.add_node("MatMul", [x, w], [graph.node("matmul0").outputs[0]], name="twin")
    both = graph.add_node("Add", [Value("matmul0"), Value(twin.name)], [graph.node("matmul0").outputs[0]],
                          name="both")
    graph.set_input("add0", 0, Value(both.name))
    affinity = {"twin": "interp:1"}
    opt = tilefold.optimize(graph, device="interp", affinity=affinity)
    copies = [n for n in opt.graph.nodes() if n.op == CONSTANT and n.outputs[0].shape == (32, 48)]
    assert sorted(n.device for n in copies) == ["interp", "interp:1"]
    assert all(n.outputs[0].encoding is not None and n.outputs[0].encoding.inner_tiles == (16, 16) for n in copies)
    exe = tilefold.compile(opt.graph, device="interp", affinity=affinity)
    assert {d for d, _ in exe._device_consts if _.node.startswith(w.node)} == {"interp", "interp:1"}
    reference = NumpyExecutable(graph)
    for seed in (2, 3):
        feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(F32)}
        kit.assert_close(exe(feeds), reference(feeds), rtol=1e-4, atol=1e-5)
    check_arena(exe)


def test_reading_another_triton_devices_buffer_without_a_transfer_is_refused():
    model, _ = _mlp()
    placed = assign_devices(tilefold.load(model), "interp", {"op:Relu": "interp:1"})
    relu = next(n for n in placed.nodes() if n.op == "Relu")
    (moved,) = placed.inputs_of(relu.name)
    placed.set_input(relu.name, 0, placed.inputs_of(moved.node)[0])  # bypass the transfer
    with pytest.raises(TilefoldError, match=f"{relu.name}.* on interp:1 reads .* from interp without a Transfer"):
        TritonExecutable(placed, device="interp")


def test_the_cli_runs_a_placement_over_two_interpreter_devices_and_the_host(kit, tmp_path, capsys):
    path = tmp_path / "cnn.onnx"
    path.write_bytes(kit.residual_cnn(seed=9).SerializeToString())
    assert main(["run", str(path), "--device", "interp:0,cpu", "--affinity", "op:Conv=interp:1",
                 "--affinity", "op:Gemm=cpu", "--compare", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert "device placement" in out and "interp:1" in out and "interpreter" in out and "match" in out
