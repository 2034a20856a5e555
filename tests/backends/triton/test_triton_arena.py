"""The Triton executor's memory: one arena per device, of the memory plan's size, every planned
buffer a typed view at its planned offset. The arena's bytes are reused within a run and
across runs, so these tests poison the arena between runs (every byte 0xFF: NaN as float32)
to show that nothing reads a byte it did not write, and check the plan with an independent
recount from the executor's schedule."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilefold
from tilefold.backends.assign import assign_devices
from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.plan import MemoryPlan, plan_memory
from tilefold.backends.triton import TritonExecutable
from tilefold.backends.triton.executor import check_arena
from tilefold.bench.models import mlp_model
from tilefold.graph.errors import VerifyError
from tilefold.graph.types import Value

F32 = np.float32


def _models(kit) -> dict:
    return {
        "mlp": (mlp_model(batch=5, sizes=(20, 33, 17, 7), seed=1), (5, 20)),
        "cnn": (kit.residual_cnn(seed=2), (2, 3, 8, 8)),
        "transformer": (kit.tiny_transformer(seed=3), (2, 5, 24)),
    }


def _placed(model, optimized: bool):
    """The model placed on the interpreter (inputs and outputs on the host, behind transfers),
    optimized for the gpu target or plain."""
    graph = tilefold.load(model)
    return tilefold.optimize(graph, device="interp").graph if optimized else assign_devices(graph, "interp")


@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "gpu"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_outputs_match_the_numpy_executor_run_after_run_from_a_poisoned_arena(kit, name, optimized):
    model, shape = _models(kit)[name]
    graph = _placed(model, optimized)
    exe = TritonExecutable(graph, device="interp")
    reference = NumpyExecutable(tilefold.load(model))
    arena = exe.arenas["interp"]
    rng = np.random.default_rng(40)
    runs = []
    for _ in range(2):
        feeds = {"x": rng.standard_normal(shape).astype(F32)}
        arena.fill_(0xFF)  # NaN everywhere: a read of a byte nobody wrote this run shows
        got = exe(feeds)
        kit.assert_close(got, reference(feeds), rtol=1e-4, atol=1e-5)
        runs.append((feeds, got))
    assert not np.array_equal(runs[0][1]["y"], runs[1][1]["y"])
    # the first run's outputs are the caller's: the second run reused the arena, not them
    kit.assert_close(runs[0][1], reference(runs[0][0]), rtol=1e-4, atol=1e-5)
    assert not np.shares_memory(runs[1][1]["y"], arena.numpy())
    assert exe.fallback_nodes == ["to_cpu_y"]  # the transfer to the host: the only NumPy step
    check_arena(exe)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_the_arena_has_the_plans_size_and_buffers_sit_at_their_planned_offsets(kit, name):
    model, _ = _models(kit)[name]
    graph = _placed(model, optimized=True)
    exe = TritonExecutable(graph, device="interp")
    plan = plan_memory(graph, schedule=exe.schedule, views=exe.views)
    assert exe.memory.to_dict() == plan.to_dict()
    device = plan.devices["interp"]
    arena = exe.arenas["interp"]
    assert arena.numel() == device.arena_bytes and arena.dtype.itemsize == 1
    offsets = {b.value: (b.offset, b.nbytes) for b in device.buffers}
    checked = 0
    for step in exe.steps:
        for value, buf in zip(step.outs, step.buffers):
            if buf is None:
                continue
            t = graph.type_of(value)
            assert (buf.data_ptr() - arena.data_ptr(), buf.numel() * buf.element_size()) == offsets[value]
            assert offsets[value][1] == t.nbytes()  # padding included
            checked += 1
    assert checked == sum(len(s.outs) for s in exe.steps if s.device == "interp" and s.group.kind != "view")
    assert device.arena_bytes < device.naive_bytes


def test_a_fused_groups_operands_live_until_the_group_runs(kit):
    """Planned in graph order, the first Conv's input dies at that Conv; the fused kernel reads
    it at the group's last node. The executor plans its own schedule, so the two differ."""
    model, _ = _models(kit)["cnn"]
    graph = _placed(model, optimized=True)
    exe = TritonExecutable(graph, device="interp")
    fused = next(names for names in exe.schedule if len(names) > 2)
    assert fused == ["block_conv", "block_add", "block_relu"]
    step = exe.schedule.index(fused)
    by_value = {b.value: b for b in exe.memory.devices["interp"].buffers}
    stem = by_value[Value("stem_relu")]
    assert stem.end == step  # read by block_add, which runs inside the fused kernel's step
    intermediate = by_value[Value("block_conv")]
    assert (intermediate.start, intermediate.end) == (step, step)  # planned, never written


def test_constants_and_inputs_stay_out_of_the_arena_and_padding_is_filled(kit):
    model, shape = _models(kit)["cnn"]
    graph = _placed(model, optimized=True)
    exe = TritonExecutable(graph, device="interp")
    arena = exe.arenas["interp"]
    lo, hi = arena.data_ptr(), arena.data_ptr() + arena.numel()
    assert exe._device_consts and all(not lo <= c.data_ptr() < hi for c in exe._device_consts.values())
    x = np.random.default_rng(41).standard_normal(shape).astype(F32)
    arena.fill_(0xFF)
    exe({"x": x})
    # the stem conv's result is packed NCHWc16 over 6 channels: its padding holds zeros
    stem = next(s for s in exe.steps if s.group.anchor.name == "stem_conv")
    (out,) = stem.buffers
    t = graph.type_of(stem.outs[0])
    assert t.encoding is not None and t.encoding.is_padded(t.shape)
    assert out.shape == (2, 1, 8, 8, 16) and not out[..., 6:].any()


def test_a_symbolic_batch_is_planned_with_the_batch_of_each_run(kit):
    model = mlp_model(batch="N", sizes=(20, 33, 7), seed=5)
    graph = tilefold.optimize(tilefold.load(model), "gpu").graph
    exe = TritonExecutable(graph, device="interp")
    placed = graph.copy()  # where the executor runs the nodes, for planning independently
    for node in placed.nodes():
        if node.op not in ("Input", "Output", "Constant"):
            node.device = "interp"
    rng = np.random.default_rng(42)
    sizes = {}
    for batch in (3, 40, 3):
        x = rng.standard_normal((batch, 20)).astype(F32)
        kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}))
        want = plan_memory(placed, {"N": batch}, schedule=exe.schedule, views=exe.views).devices["interp"]
        assert exe.arenas["interp"].numel() == want.arena_bytes
        sizes[batch] = want.arena_bytes
        check_arena(exe)
    assert sizes[40] > sizes[3]


def test_host_steps_keep_numpy_allocation(kit):
    model, shape = _models(kit)["cnn"]
    graph = assign_devices(tilefold.load(model), "interp", {"op:Gemm": "cpu", "head_gap": "cpu"})
    exe = TritonExecutable(graph, device="interp")
    assert set(exe.arenas) == {"interp"}  # the host's plan is reported, not allocated
    host = [s for s in exe.steps if s.device == "cpu"]
    assert {s.group.anchor.op for s in host} >= {"Gemm", "GlobalAveragePool", "Transfer"}
    assert all(b is None for s in host for b in s.buffers)
    x = np.random.default_rng(43).standard_normal(shape).astype(F32)
    kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}), rtol=1e-4, atol=1e-5)


def test_a_device_node_falling_back_to_numpy_writes_into_its_planned_buffer(kit):
    from tilefold.graph import Graph
    from tilefold.graph.types import TensorType

    g = Graph("scan")
    w = np.random.default_rng(44).standard_normal((6, 4)).astype(F32)
    x = g.add_input("x", TensorType((4, 6), F32))
    m = kit.add(g, "MatMul", [x, g.add_constant(w, name="w")], name="mm")
    c = kit.add(g, "Einsum", [m], {"equation": "ii->i"}, name="diagonal")  # not lowered: no template
    g.add_output(kit.add(g, "Relu", [c], name="relu"), "y")
    exe = TritonExecutable(g, device="interp")
    step = next(s for s in exe.steps if s.group.anchor.name == "diagonal")
    assert exe.fallback_nodes == ["diagonal"] and step.device == "interp" and step.buffers[0] is not None
    for seed in (45, 46):
        feeds = {"x": np.random.default_rng(seed).standard_normal((4, 6)).astype(F32)}
        exe.arenas["interp"].fill_(0xFF)
        kit.assert_close(exe(feeds), NumpyExecutable(g)(feeds))
    check_arena(exe)


def _corrupt(plan: MemoryPlan, device: str, written: set[Value]) -> MemoryPlan:
    """The plan with one buffer a step writes moved onto another, live at the same step."""
    buffers = plan.devices[device].buffers
    for i, a in enumerate(buffers):
        for j, b in enumerate(buffers):
            if i != j and {a.value, b.value} <= written and b.nbytes <= a.nbytes and a.overlaps_in_time(b) and a.offset != b.offset:
                moved = list(buffers)
                moved[j] = dataclasses.replace(b, offset=a.offset)
                devices = dict(plan.devices)
                devices[device] = dataclasses.replace(plan.devices[device], buffers=moved)
                return MemoryPlan(devices)
    raise AssertionError("no two buffers live at one step")


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_the_overlap_check_passes_and_catches_a_corrupted_plan(kit, name):
    model, shape = _models(kit)[name]
    graph = _placed(model, optimized=True)
    exe = TritonExecutable(graph, device="interp")
    check_arena(exe)
    written = {v for step in exe.steps for v, buf in zip(step.outs, step.buffers) if buf is not None}
    bad = TritonExecutable(graph, device="interp", memory=_corrupt(exe.memory, "interp", written))
    with pytest.raises(VerifyError, match="share arena bytes on interp") as info:
        check_arena(bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("request_", ["interp", "interp,cpu"])
def test_optimize_reports_the_plan_the_executor_allocates(kit, name, request_):
    """`tilefold.optimize(..., device=...)` plans with the Triton executor's fused schedule."""
    g = tilefold.load(_models(kit)[name][0])
    optimized = tilefold.optimize(g, device=request_)
    exe = tilefold.compile(optimized.graph, device=request_)
    assert optimized.memory.to_dict() == exe.memory.to_dict()
    assert optimized.memory.devices["interp"].arena_bytes == exe.arenas["interp"].numel()
