"""Device assignment: requests with fallback, affinities, transfers, per-device layouts.

A test device kind `accel` (the gpu target's layouts with padded tiles, tests/conftest.py;
NumPy memory) lacks Relu, so fallback, transfers and per-device encodings can be checked on
any machine; the real `interp` device is checked in tests/backends/triton/."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import tilefold
from tilefold.backends.assign import Placement, assign_devices, check_placement
from tilefold.backends.devices import DEVICE_KINDS, DeviceKind, parse_request, present
from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.place import place
from tilefold.bench.models import mlp_model
from tilefold.graph import InputError, UnsupportedOpError, VerifyError
from tilefold.graph.graph import CONSTANT
from tilefold.graph.types import Value


@pytest.fixture
def accel(monkeypatch: pytest.MonkeyPatch) -> DeviceKind:
    kind = DeviceKind("accel", "gpu-padded", lambda i: i == 0, lambda graph, node: node.op != "Relu")
    monkeypatch.setitem(DEVICE_KINDS, "accel", kind)
    absent = DeviceKind("absent", "gpu-padded", lambda i: False, lambda graph, node: True)
    monkeypatch.setitem(DEVICE_KINDS, "absent", absent)
    return kind


@pytest.fixture(scope="module")
def mlp():
    model = mlp_model(batch=5, sizes=(40, 24, 33, 7), seed=3)
    return model, tilefold.load(model)


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((5, 40)).astype(np.float32)}


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_a_request_is_an_ordered_choice_and_the_first_present_device_wins(accel):
    assert [d.name for d in present("absent,accel,cpu")] == ["accel", "cpu"]
    assert [d.name for d in parse_request(["cpu"])] == ["cpu"]


@pytest.mark.parametrize("request_, message", [
    ("tpu", "unknown device 'tpu'"),
    ("cpu:1", "cpu takes no index"),
    ("cuda:x", "the index must be a number"),
    ("absent", "no usable device in 'absent'"),
    ("", "empty device request"),
])
def test_bad_requests_fail_with_one_line(accel, request_, message):
    with pytest.raises(InputError, match=message) as info:
        present(request_)
    assert "\n" not in str(info.value)


def test_a_node_the_device_lacks_falls_back_to_the_next_choice(accel, mlp):
    _, graph = mlp
    placed = assign_devices(graph, "accel,cpu")
    devices = {n.op: n.device for n in placed.nodes() if n.op in ("MatMul", "Relu")}
    assert devices == {"MatMul": "accel", "Relu": "cpu"}
    check_placement(placed)


def test_transfers_are_explicit_counted_and_one_per_value_and_device(accel, mlp):
    _, graph = mlp
    placed = assign_devices(graph, "accel,cpu")
    placement = Placement.of(placed)
    # x in, each Relu out and back, y out: 1 + 2 + 2 + 1 transfers.
    assert placement.transfers == {("cpu", "accel"): 3, ("accel", "cpu"): 3}
    assert placement.transfer_bytes[("cpu", "accel")] == 4 * 5 * (40 + 24 + 33)
    for node in placed.nodes():
        if node.op == "Transfer":
            (source,) = placed.inputs_of(node.name)
            same = [u for u, _ in placed.users(source)
                    if placed.node(u).op == "Transfer" and placed.node(u).attrs["target"] == node.attrs["target"]]
            assert same == [node.name]


def test_recorded_devices_are_kept_and_existing_transfers_rebuilt_not_stacked(accel, mlp):
    _, graph = mlp
    once = assign_devices(graph, "accel,cpu")
    twice = assign_devices(once, "cpu")
    assert Placement.of(twice) == Placement.of(once)
    moved = assign_devices(once, "cpu", {"op:MatMul": "cpu", "op:Add": "cpu"})
    assert Placement.of(moved).transfer_count == 0


def test_affinity_by_op_kind_and_by_name_pattern(accel, mlp):
    _, graph = mlp
    placed = assign_devices(graph, "cpu", {"op:Add": "accel", "matmul1": "accel"})
    by_name = {n.name: n.device for n in placed.nodes()}
    assert {by_name[n.name] for n in placed.nodes() if n.op == "Add"} == {"accel"}
    assert by_name["matmul1"] == "accel" and by_name["matmul0"] == "cpu"


def test_an_affinity_that_matches_nothing_is_an_error(accel, mlp):
    _, graph = mlp
    with pytest.raises(InputError, match="'conv\\*' matches no node"):
        assign_devices(graph, "cpu", {"conv*": "accel"})


def test_an_op_no_device_can_run_is_an_error(accel, mlp):
    _, graph = mlp
    with pytest.raises(UnsupportedOpError, match="no device in 'accel' has a kernel for op Relu"):
        assign_devices(graph, "accel")


def test_a_weight_read_on_two_devices_is_packed_once_per_device(accel):
    model = mlp_model(batch=4, sizes=(32, 32), seed=1)
    graph = tilefold.load(model)
    # The same weight read by a MatMul on each device.
    x = graph.inputs_of("matmul0")[0]
    w = graph.inputs_of("matmul0")[1]
    twin = graph.add_node("MatMul", [x, w], [graph.node("matmul0").outputs[0]], name="twin")
    total = graph.add_node("Add", [graph.output_values()[0], Value(twin.name)],
                           [graph.node("matmul0").outputs[0]], name="total")
    graph.set_input(graph.outputs[0], 0, Value(total.name))
    result = place(graph, "cpu", {"twin": "accel"})
    after = result.after
    weights = [n for n in after.nodes() if n.op == CONSTANT and n.outputs[0].shape == (32, 32)]
    assert sorted(n.device for n in weights) == ["accel", "cpu"]
    packed = {n.device: n.outputs[0].encoding for n in weights}
    assert packed["accel"] is not None and packed["accel"].inner_tiles == (16, 16)
    feeds = {"x": np.random.default_rng(7).standard_normal((4, 32)).astype(np.float32)}
    got = NumpyExecutable(after)(feeds)["y"]  # the test device's memory is host memory
    want = tilefold.compile(graph)(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device, affinity", [
    ("accel,cpu", None),
    ("cpu", {"op:MatMul": "accel"}),
    ("cpu", {"matmul[02]": "accel,cpu", "op:Add": "accel"}),
])
def test_mixed_placements_give_the_single_device_results(accel, mlp, device, affinity):
    model, graph = mlp
    result = place(graph, device, affinity, verify=True)
    after = result.after
    devices = {n.device for n in after.nodes() if n.op in ("MatMul", "Add", "Relu", "Pack", "Unpack")}
    assert devices == {"accel", "cpu"}
    accel_anchors = [n for n in after.nodes() if n.op == "MatMul" and n.device == "accel"]
    weights = [after.type_of(after.inputs_of(n.name)[1]).encoding for n in accel_anchors]
    assert weights and all(w is not None and w.inner_tiles == (16, 16) for w in weights)  # accel's tiles
    for seed in (0, 1):
        feeds = _feeds(seed)
        np.testing.assert_allclose(NumpyExecutable(after)(feeds)["y"], _onnxruntime(model, feeds)["y"],
                                   rtol=1e-4, atol=1e-5)


def test_an_edge_across_devices_without_a_transfer_is_caught(accel, mlp):
    _, graph = mlp
    placed = assign_devices(graph, "accel,cpu")
    relu = next(n for n in placed.nodes() if n.op == "Relu")
    (moved,) = placed.inputs_of(relu.name)
    placed.set_input(relu.name, 0, placed.inputs_of(moved.node)[0])  # bypass the transfer
    with pytest.raises(VerifyError, match=f"{relu.name}.* on cpu reads .* from accel without a transfer"):
        check_placement(placed)


def test_two_devices_of_one_kind_are_named_apart_with_transfers_between_them(mlp):
    _, graph = mlp
    placed = assign_devices(graph, "interp:0", {"op:Relu": "interp:1"})
    check_placement(placed)
    assert placed.meta["devices"] == ["cpu", "interp", "interp:1"]
    assert {n.device for n in placed.nodes() if n.op == "Relu"} == {"interp:1"}
    assert {n.device for n in placed.nodes() if n.op == "MatMul"} == {"interp"}
    routes = Placement.of(placed).transfers
    relus = sum(1 for n in placed.nodes() if n.op == "Relu")
    assert routes[("interp", "interp:1")] == relus and routes[("interp:1", "interp")] == relus
    assert routes[("cpu", "interp")] == 1 and routes[("interp", "cpu")] == 1


def test_a_recorded_interp_0_is_kept_under_its_canonical_name(mlp):
    _, graph = mlp
    recorded = graph.copy()
    recorded.node("matmul1").device = "interp:0"
    placed = assign_devices(recorded, "cpu")
    assert placed.node("matmul1").device == "interp" and placed.node("matmul0").device == "cpu"
