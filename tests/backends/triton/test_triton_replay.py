"""Replay (replay.py): an executable whose kernels run on one Triton device records its first
run and replays the recorded launches after it (a CUDA graph per stretch of kernels on a GPU),
with host steps, transfers and the copies of host values between them. Every replayed run
gives the NumPy backend's outputs on its own fresh inputs, launches kernels only, counts the
same transfers as a run step by step, and still raises for an index out of range; a schedule
over two devices runs step by step and says why."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tilefold
from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable
from tilefold.backends.triton.executor import check_arena
from tilefold.bench.models import mlp_model
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import Graph
from tilefold.graph.errors import InputError
from tilefold.graph.types import TensorType

F32 = np.float32


def _replays(exe: TritonExecutable, segments: int = 1, others: int = 0) -> bool:
    """Whether `exe` replays its record: `segments` stretches of kernels (one CUDA graph each on
    a GPU) and `others` steps that run as they are."""
    kernels = sum(step.plan is not None for step in exe.steps)
    what = f"{segments} CUDA graph{'s' if segments > 1 else ''} per run" if exe.kind == "cuda" else \
        f"{kernels} recorded launches in {segments} segment{'s' if segments > 1 else ''}"
    rest = f", {others} other step{'s' if others > 1 else ''} run each time" if others else ""
    return exe.launch_path == what + rest


MODELS = {
    "transformer layer": (lambda kit: kit.tiny_transformer(seed=3), (2, 5, 24)),
    "cnn": (lambda kit: kit.small_cnn(seed=4), (2, 3, 9, 9)),
}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("target", [None, "gpu"], ids=["plain", "packed"])
def test_replayed_runs_match_the_numpy_backend_on_fresh_inputs(kit, device, model, target):
    build, shape = MODELS[model]
    graph = load_onnx(build(kit))
    if target:
        graph = tilefold.optimize(graph, target).graph  # padded packed buffers: the pads are refilled
    exe = TritonExecutable(graph, device=device)
    reference = NumpyExecutable(graph)
    assert exe.launch_path.startswith("step by step on the first run")
    rng = np.random.default_rng(5)
    for run in range(3):
        for arena in exe.arenas.values():
            arena.fill_(0xFF)  # whatever the arena held, a replay writes every byte it reads
        x = rng.standard_normal(shape).astype(F32)
        kit.assert_close(exe({"x": x}), reference({"x": x}), rtol=1e-4, atol=1e-5)
        assert _replays(exe), (run, exe.launch_path)
    check_arena(exe)


def test_a_replayed_run_launches_the_kernels_alone(kit):
    """Views and shapes known at compile time were fixed by the first run: breaking every
    other step after it changes nothing."""
    graph = tilefold.optimize(load_onnx(kit.tiny_transformer(seed=6)), "gpu").graph
    exe = TritonExecutable(graph, device="interp")
    x = np.random.default_rng(7).standard_normal((2, 5, 24)).astype(F32)
    first = exe({"x": x})
    others = [step for step in exe.steps if step.plan is None]
    assert {step.group.kind for step in others} == {"view"}

    def broken(args):
        raise AssertionError("a replay ran a step that is not a kernel")

    for step in others:
        step.run = broken
    launched = []
    (segment,) = exe._record.segments
    for step, args in segment.launches:
        original = step.run
        step.run = lambda args, original=original, name=step.group.anchor.name: launched.append(name) or original(args)
    np.testing.assert_array_equal(exe({"x": x})["y"], first["y"])
    assert launched == [step.group.anchor.name for step in exe.steps if step.plan is not None]


@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
def test_replay_counts_the_same_transfers_as_a_run_step_by_step(kit, device, as_tensor):
    graph = tilefold.optimize(load_onnx(kit.small_cnn(seed=8)), "gpu").graph
    replayed = TritonExecutable(graph, device=device)
    stepped = TritonExecutable(graph, device=device, replay=False)
    assert stepped.launch_path == "step by step (replay=False)"
    rng = np.random.default_rng(9)
    for _ in range(3):
        x = rng.standard_normal((2, 3, 9, 9)).astype(F32)
        feed = torch.from_numpy(x).to(replayed.torch_device) if as_tensor else x
        np.testing.assert_allclose(replayed({"x": feed})["y"], stepped({"x": feed})["y"], rtol=1e-6, atol=1e-6)
    assert (replayed.transfers, replayed.transfer_bytes) == (stepped.transfers, stepped.transfer_bytes)
    assert replayed.transfers == 3 * (1 if as_tensor else 2)  # the output leaves; a numpy input comes in


def test_a_replayed_scatter_starts_from_each_runs_data(kit, device):
    """A scatter's result buffer is refilled with its data operand before each launch."""
    g = Graph("scatter")
    data = g.add_input("data", TensorType((6, 5), F32))
    ids = g.add_constant(np.array([[4], [0], [2]], np.int64), name="ids")
    updates = g.add_input("updates", TensorType((3, 5), F32))
    g.add_output(kit.add(g, "ScatterND", [data, ids, updates], name="scatter"), "y")
    exe = TritonExecutable(g, device=device)
    rng = np.random.default_rng(10)
    for _ in range(3):
        feeds = {"data": rng.standard_normal((6, 5)).astype(F32), "updates": rng.standard_normal((3, 5)).astype(F32)}
        np.testing.assert_array_equal(exe(feeds)["y"], NumpyExecutable(g)(feeds)["y"])
    assert _replays(exe), exe.launch_path


def test_an_index_out_of_range_in_a_replayed_run_is_still_an_error(kit, device):
    g = Graph("lookup")
    table = np.random.default_rng(11).standard_normal((7, 3)).astype(F32)
    ids = g.add_input("ids", TensorType((2, 4), np.int64))
    picked = kit.add(g, "Gather", [g.add_constant(table, name="table"), ids], {"axis": 0}, name="lookup")
    g.add_output(kit.add(g, "Relu", [picked]), "y")
    exe = TritonExecutable(g, device=device)
    good = np.random.default_rng(12).integers(-7, 7, (2, 4))
    for _ in range(2):
        np.testing.assert_array_equal(exe({"ids": good})["y"], np.maximum(table[good], 0))
    assert _replays(exe), exe.launch_path
    bad = good.copy()
    bad[1, 2] = 9
    with pytest.raises(InputError, match=r"node 'lookup' \(op Gather\).*out of range \[-7, 6\]"):
        exe({"ids": bad})
    np.testing.assert_array_equal(exe({"ids": good})["y"], np.maximum(table[good], 0))


def test_each_input_shape_of_a_symbolic_graph_records_its_own_run(kit):
    model = mlp_model(batch="N", sizes=(20, 33, 7), seed=13)
    graph = tilefold.optimize(tilefold.load(model), "gpu").graph
    exe = TritonExecutable(graph, device="interp")
    rng = np.random.default_rng(14)
    for batch in (3, 3, 17, 3, 17):
        x = rng.standard_normal((batch, 20)).astype(F32)
        kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}))
    assert len(exe._variants) == 2
    assert all(_replays(inner) for inner in exe._variants.values())


def test_keep_runs_step_by_step_and_leaves_the_record_alone(kit):
    graph = load_onnx(kit.small_cnn(seed=15))
    exe = TritonExecutable(graph, device="interp")
    rng = np.random.default_rng(16)
    xs = [rng.standard_normal((2, 3, 9, 9)).astype(F32) for _ in range(3)]
    exe({"x": xs[0]})
    record = exe._record
    kept: dict = {}
    np.testing.assert_allclose(exe.run({"x": xs[1]}, keep=kept)["y"], NumpyExecutable(graph)({"x": xs[1]})["y"],
                               rtol=1e-4, atol=1e-5)
    assert kept and exe._record is record
    np.testing.assert_allclose(exe({"x": xs[2]})["y"], NumpyExecutable(graph)({"x": xs[2]})["y"],
                               rtol=1e-4, atol=1e-5)


def _matmul_diagonal_relu(kit, host: bool) -> tuple[Graph, np.ndarray]:
    """MatMul -> a diagonal Einsum (no template runs it: the NumPy backend; on the host where
    `host`, with no Transfer, so the Relu's kernel reads a host value) -> Relu."""
    g = Graph("mixed")
    x = g.add_input("x", TensorType((4, 6), F32))
    w = np.random.default_rng(17).standard_normal((6, 4)).astype(F32)
    m = kit.add(g, "MatMul", [x, g.add_constant(w, name="w")], name="mm")
    diagonal = kit.add(g, "Einsum", [m], {"equation": "ii->i"}, name="diagonal")
    if host:
        g.node("diagonal").device = "cpu"
    g.add_output(kit.add(g, "Relu", [diagonal], name="relu"), "y")
    return g, w


@pytest.mark.parametrize("host", [False, True], ids=["fallback", "host"])
def test_steps_that_are_not_kernels_run_between_replayed_segments(kit, device, host):
    g, w = _matmul_diagonal_relu(kit, host)
    exe = TritonExecutable(g, device=device)
    stepped = TritonExecutable(g, device=device, replay=False)
    for x in np.random.default_rng(18).standard_normal((3, 4, 6)).astype(F32):
        np.testing.assert_allclose(exe({"x": x})["y"], np.maximum(np.diag(x @ w), 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(stepped({"x": x})["y"], np.maximum(np.diag(x @ w), 0), rtol=1e-5, atol=1e-5)
    assert _replays(exe, segments=2, others=1), exe.launch_path
    assert (exe.transfers, exe.transfer_bytes) == (stepped.transfers, stepped.transfer_bytes)


def test_a_placed_model_replays_with_its_transfers_in_and_out(kit):
    """`tilefold.compile` puts a Transfer after each input and before each output."""
    model = mlp_model(batch=5, sizes=(20, 33, 7), seed=19)
    graph = tilefold.optimize(tilefold.load(model), "gpu").graph
    exe = tilefold.compile(graph, device="interp")
    assert {s.group.kind for s in exe.steps if s.plan is None} == {"transfer", "numpy"}
    rng = np.random.default_rng(20)
    for _ in range(3):
        x = rng.standard_normal((5, 20)).astype(F32)
        kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}))
    assert _replays(exe, others=2), exe.launch_path
    assert exe.transfers == 3 * 2


def test_two_devices_run_step_by_step_and_say_why(kit):
    model = mlp_model(batch=5, sizes=(20, 33, 7), seed=21)
    split = tilefold.compile(tilefold.load(model), device="interp", affinity={"op:Relu": "interp:1"})
    x = np.random.default_rng(22).standard_normal((5, 20)).astype(F32)
    for _ in range(2):
        kit.assert_close(split({"x": x}), kit.ort_outputs(model, {"x": x}))
    assert split.launch_path == "step by step (its steps run on 2 Triton devices)"
    assert split._record is None


@pytest.mark.parametrize("replay", [True, False], ids=["replayed", "step-by-step"])
def test_a_strided_tensor_input_is_read_as_its_elements(kit, device, replay):
    """A transposed torch tensor is not a dense buffer: the kernels read a dense copy."""
    model = mlp_model(batch=6, sizes=(20, 33, 7), seed=23)
    exe = TritonExecutable(tilefold.optimize(tilefold.load(model), "gpu").graph, device=device, replay=replay)
    for seed in (24, 25, 26):
        x = torch.from_numpy(np.random.default_rng(seed).standard_normal((20, 6)).astype(F32)).t()
        assert not x.is_contiguous()
        kit.assert_close(exe({"x": x.to(exe.torch_device)}), kit.ort_outputs(model, {"x": x.numpy()}))
