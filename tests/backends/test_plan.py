"""The memory plan: sizes from encodings, lifetimes from the schedule, a valid arena whose
size lies between the live peak and the no-reuse total, checked against an independent
recount by reference counting."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tilefold
from tilefold.backends.assign import assign_devices
from tilefold.backends.plan import ALIGN, plan_memory
from tilefold.bench.models import mlp_model
from tilefold.graph.errors import InputError
from tilefold.graph.graph import CONSTANT, INPUT, OUTPUT, Graph
from tilefold.graph.types import TensorType, Value
from tilefold.layout.encoding import PackedEncoding


def _recount_peak(graph: Graph, dims: dict[str, int]) -> dict[str, int]:
    """Live bytes per device by simulating the schedule with reference counts: a buffer is
    allocated when its node runs and freed once its last reader has run."""
    schedule = [n for n in graph.nodes() if n.op not in (INPUT, OUTPUT, CONSTANT)]
    readers = {}
    for node in schedule:
        for v in graph.inputs_of(node.name):
            if v is not None:
                readers[v] = readers.get(v, 0) + 1
    outputs = set(graph.output_values())
    live: dict[Value, tuple[str, int]] = {}
    owner: dict[Value, Value] = {}
    peak: dict[str, int] = {}
    for node in schedule:
        for slot, t in enumerate(node.outputs):
            v = Value(node.name, slot)
            shape = tuple(dims.get(d, 1) if isinstance(d, str) else d for d in t.shape)
            size = TensorType(shape, t.dtype, t.encoding).nbytes()
            source = graph.inputs_of(node.name)[0] if graph.inputs_of(node.name) else None
            src_t = graph.type_of(source) if source is not None else None
            if (node.op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout") and slot == 0
                    and source is not None and src_t.encoding == t.encoding
                    and graph.node(source.node).device == node.device
                    and TensorType(tuple(dims.get(d, 1) if isinstance(d, str) else d for d in src_t.shape),
                                   src_t.dtype, src_t.encoding).nbytes() == size):
                owner[v] = owner.get(source, source)
                continue
            owner[v] = v
            live[v] = (node.device or "cpu", size)
        by_device: dict[str, int] = {}
        for device, size in live.values():
            by_device[device] = by_device.get(device, 0) + size
        for device, total in by_device.items():
            peak[device] = max(peak.get(device, 0), total)
        for v in graph.inputs_of(node.name):
            if v is None:
                continue
            readers[v] -= 1
        # A buffer dies when no value it backs has readers left.
        for root in list(live):
            backed = [w for w, r in owner.items() if r == root]
            if all(readers.get(w, 0) == 0 and w not in outputs for w in backed):
                del live[root]
    return peak


def _check_arena(plan) -> None:
    for device in plan.devices.values() if hasattr(plan, "devices") else [plan]:
        bufs = device.buffers
        for i, a in enumerate(bufs):
            assert a.offset % ALIGN == 0
            assert a.offset + a.nbytes <= device.arena_bytes
            for b in bufs[i + 1:]:
                if a.overlaps_in_time(b):
                    assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)
        assert device.peak_live_bytes <= device.arena_bytes <= device.naive_bytes


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_peak_matches_an_independent_recount_and_the_arena_is_valid(target):
    graph = tilefold.optimize(tilefold.load(mlp_model(batch="n", sizes=(50, 70, 30, 9), seed=2)), target).graph
    plan = plan_memory(graph, {"n": 13})
    _check_arena(plan)
    assert plan.devices["cpu"].peak_live_bytes == _recount_peak(graph, {"n": 13})["cpu"]
    assert plan.devices["cpu"].arena_bytes < plan.devices["cpu"].naive_bytes


def test_a_light_cnn_reuses_buffers_and_matches_the_recount():
    from tilefold.bench.models import light_model

    graph = tilefold.optimize(tilefold.load(light_model("squeezenet", random_weights=True, seed=0)), "cpu").graph
    plan = plan_memory(graph)
    _check_arena(plan)
    cpu = plan.devices["cpu"]
    assert cpu.peak_live_bytes == _recount_peak(graph, {})["cpu"]
    assert cpu.arena_bytes < 0.5 * cpu.naive_bytes


def test_padded_sizes_follow_the_encoding_formula():
    model = mlp_model(batch=5, sizes=(40, 24, 33, 7), seed=1)
    # every anchor wrapped in padded 16x16 tiles (gpu-padded: tests/conftest.py); propagated,
    # this MLP's matmuls write their results row-major and no runtime buffer is padded
    graph = tilefold.optimize(tilefold.load(model), "gpu-padded").before
    plan = plan_memory(graph)
    checked = 0
    for buf in plan.devices["cpu"].buffers:
        t = graph.type_of(buf.value)
        enc = t.encoding
        if isinstance(enc, PackedEncoding) and enc.inner_tiles:
            tiles = dict(zip(enc.inner_dims_pos, enc.inner_tiles))
            padded = math.prod(-(-d // tiles[i]) * tiles[i] if i in tiles else d for i, d in enumerate(t.shape))
            assert buf.nbytes == padded * t.dtype.itemsize
            assert buf.logical_bytes == math.prod(t.shape) * t.dtype.itemsize
            checked += 1
    assert checked >= 3
    assert plan.devices["cpu"].padding_bytes > 0


def test_views_take_no_memory_and_constants_and_inputs_stay_out_of_the_arena():
    g = Graph("views")
    x = g.add_input("x", TensorType((6, 8), np.float32))
    w = g.add_constant(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), name="w")
    y = Value(g.add_node("MatMul", [x, w], [TensorType((6, 8), np.float32)], name="mm").name)
    shape = g.add_constant(np.array([48], dtype=np.int64), name="shape")
    r = Value(g.add_node("Reshape", [y, shape], [TensorType((48,), np.float32)], {"allowzero": 0}, name="flat").name)
    z = Value(g.add_node("Relu", [r], [TensorType((48,), np.float32)], name="relu").name)
    g.add_output(z, "z")
    plan = plan_memory(g).devices["cpu"]
    assert [b.value.node for b in plan.buffers] == ["mm", "relu"]
    assert plan.buffers[0].end == 2  # the reshape's reader extends the matmul buffer's life
    assert plan.constant_bytes == 8 * 8 * 4 + 8 and plan.input_bytes == 6 * 8 * 4


def test_each_device_gets_its_own_arena(monkeypatch):
    from tilefold.backends.devices import DEVICE_KINDS, DeviceKind

    monkeypatch.setitem(DEVICE_KINDS, "accel", DeviceKind("accel", "gpu", lambda i: True, lambda g, n: n.op != "Relu"))
    placed = assign_devices(tilefold.load(mlp_model(batch=4, sizes=(16, 16, 16), seed=0)), "accel,cpu")
    plan = plan_memory(placed)
    assert set(plan.devices) == {"accel", "cpu"}
    _check_arena(plan)
    for name, device in plan.devices.items():
        assert all(placed.node(b.value.node).device == name for b in device.buffers)
        assert device.peak_live_bytes == _recount_peak(placed, {}).get(name, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=1, max_size=40))
def test_greedy_placement_never_overlaps_live_buffers(spans):
    from tilefold.backends.plan import Buffer, DevicePlan, _place

    buffers = [Buffer(Value(f"v{i}"), "cpu", size, size, start, start + length)
               for i, (size, start, length) in enumerate(spans)]
    placed, arena = _place(buffers)
    device = DevicePlan("cpu", placed, arena_bytes=arena)
    _check_arena(device)
    assert device.peak_live_bytes == max(device.live_bytes(s) for s in range(41))


def _chain_with_a_bystander() -> Graph:
    """a = Exp(x); b = Neg(a); c = Tanh(x) (reads x only); d = Sigmoid(b); outputs c and d."""
    g = Graph("fused")
    t = TensorType((4, 16), np.float32)
    x = g.add_input("x", t)
    a = Value(g.add_node("Exp", [x], [t], name="a").name)
    b = Value(g.add_node("Neg", [a], [t], name="b").name)
    c = Value(g.add_node("Tanh", [x], [t], name="c").name)
    d = Value(g.add_node("Sigmoid", [b], [t], name="d").name)
    g.add_output(c, "c")
    g.add_output(d, "d")
    return g


def test_a_schedule_runs_a_fused_group_in_one_step_and_its_operands_live_until_then():
    g = _chain_with_a_bystander()
    plain = {b.value.node: b for b in plan_memory(g).devices["cpu"].buffers}
    assert (plain["a"].start, plain["a"].end) == (0, 1)  # dead once b has run
    fused = plan_memory(g, schedule=[["a"], ["c"], ["b", "d"]])
    device = fused.devices["cpu"]
    spans = {b.value.node: (b.start, b.end) for b in device.buffers}
    assert device.steps == 3
    # a is read by b, which runs in the fused kernel at step 2: a must outlive c's step
    assert spans == {"a": (0, 2), "c": (1, 3), "b": (2, 2), "d": (2, 3)}
    _check_arena(fused)
    buffers = {b.value.node: b for b in device.buffers}
    assert buffers["a"].offset != buffers["c"].offset


@pytest.mark.parametrize("schedule, message", [
    ([["a"], ["b", "d"]], "schedule never runs node 'c'"),
    ([["a"], ["c", "a"], ["b", "d"]], "schedule runs node 'a' twice"),
])
def test_a_schedule_must_run_every_node_once(schedule, message):
    with pytest.raises(InputError, match=message):
        plan_memory(_chain_with_a_bystander(), schedule=schedule)


def test_an_executor_names_its_views():
    g = Graph("ident")
    t = TensorType((8, 8), np.float32)
    x = g.add_input("x", t)
    e = Value(g.add_node("Exp", [x], [t], name="e").name)
    i = Value(g.add_node("Identity", [e], [t], name="same").name)
    g.add_output(Value(g.add_node("Neg", [i], [t], name="n").name), "y")
    assert [b.value.node for b in plan_memory(g).devices["cpu"].buffers] == ["e", "n"]
    assert [b.value.node for b in plan_memory(g, views=set()).devices["cpu"].buffers] == ["e", "same", "n"]
