"""Pad as a Triton chain head (backends/triton/pad.py) against the NumPy backend, bit-exact (a
pad copies values): every mode, pads larger than the operand, negative pads (crops), `axes`,
constant values NaN, inf and nonzero, packed NCHWc operands with a fused epilogue, float16,
bool and integers; runtime pads or constant_value stay on the NumPy backend. ONNX's own
conformance cases for Pad run in Triton kernels with their pads, constant_value and axes made
constants."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable, kernel_sources
from tilefold.graph import Graph
from tilefold.graph.types import Splat, TensorType, Value
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32
MODES = ["constant", "edge", "reflect", "wrap"]
SHAPE = (2, 3, 4, 5)


def _pad_graph(kit, pads, mode: str = "constant", shape=SHAPE, dtype=F32, value=None, axes=None,
               then_relu: bool = True) -> Graph:
    """x -> Pad(pads, value, axes constants) [-> Relu] -> y."""
    g = Graph("pad")
    x = g.add_input("x", TensorType(shape, dtype))
    inputs: list[Value | None] = [x, g.add_constant(np.array(pads, np.int64), name="pads"),
                                  None if value is None else g.add_constant(np.array(value, dtype), name="value")]
    if axes is not None:
        inputs.append(g.add_constant(np.array(axes, np.int64), name="axes"))
    y = kit.add(g, "Pad", inputs, {"mode": mode}, name="pad")
    g.add_output(kit.add(g, "Relu", [y], name="relu") if then_relu else y, "y")
    return g


def _feeds(shape=SHAPE, dtype=F32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return {"x": rng.random(shape) < 0.5}
    if np.dtype(dtype).kind == "i":
        return {"x": rng.integers(-1000, 1000, shape).astype(dtype)}
    return {"x": rng.standard_normal(shape).astype(dtype)}


def _check(kit, g: Graph, feeds: dict, device: str) -> np.ndarray:
    """Triton (no fallback) equals the NumPy backend bit for bit; the Triton result."""
    got, want = kit.run_both(g, feeds, device)
    assert got["y"].shape == want["y"].shape and got["y"].dtype == want["y"].dtype
    np.testing.assert_array_equal(got["y"], want["y"])
    return got["y"]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_matches_numpy_pad(kit, device, mode):
    pads = [0, 1, 2, 3, 1, 0, 3, 2]
    got = _check(kit, _pad_graph(kit, pads, mode, then_relu=False), feeds := _feeds(), device)
    widths = list(zip(pads[:4], pads[4:]))
    np.testing.assert_array_equal(got, np.pad(feeds["x"], widths, mode=mode))


@pytest.mark.parametrize("mode", MODES)
def test_pads_longer_than_the_operand(kit, device, mode):
    """Several periods of reflect and wrap on each side (numpy's rule for long pads)."""
    g = _pad_graph(kit, [0, 0, 9, 7, 0, 0, 11, 4], mode, then_relu=False)
    got = _check(kit, g, feeds := _feeds(seed=1), device)
    np.testing.assert_array_equal(got, np.pad(feeds["x"], [(0, 0), (0, 0), (9, 11), (7, 4)], mode=mode))


@pytest.mark.parametrize("mode", MODES)
def test_negative_pads_crop(kit, device, mode):
    """Crops on both sides, and a crop on one side of a dim grown on the other."""
    _check(kit, _pad_graph(kit, [0, -1, -1, 2, -1, 0, -2, -1], mode), _feeds(seed=2), device)


@pytest.mark.parametrize("mode", MODES)
def test_a_dim_of_one_element(kit, device, mode):
    _check(kit, _pad_graph(kit, [0, 0, 3, 2, 0, 0, 4, 1], mode, shape=(2, 3, 1, 5)), _feeds((2, 3, 1, 5), seed=3),
           device)


@pytest.mark.parametrize("axes, shape", [([1, 3], (2, 4, 4, 10)), ([-1, -3], (2, 8, 4, 6))])
def test_axes_input(kit, device, axes, shape):
    g = _pad_graph(kit, [1, 2, 0, 3], "reflect", axes=axes)
    assert g.type_of(g.inputs_of("relu")[0]).shape == shape
    _check(kit, g, _feeds(seed=4), device)


@pytest.mark.parametrize("value", [np.nan, np.inf, -2.5, 0.0])
def test_constant_values(kit, device, value):
    g = _pad_graph(kit, [0, 0, 1, 2, 1, 0, 2, 1], value=value, then_relu=False)
    got = _check(kit, g, _feeds(seed=5), device)
    border = np.ones(got.shape, bool)
    border[:, :, 1:5, 2:7] = False
    np.testing.assert_array_equal(got[border], np.full(border.sum(), value, F32))


def test_all_zero_pads_copy(kit, device):
    got = _check(kit, _pad_graph(kit, [0] * 8, "reflect", then_relu=False), feeds := _feeds(seed=6), device)
    np.testing.assert_array_equal(got, feeds["x"])


@pytest.mark.parametrize("mode", MODES)
def test_float16(kit, device, mode):
    g = _pad_graph(kit, [0, 1, 1, 2, 0, 2, 1, 0], mode, dtype=np.float16, value=1.5 if mode == "constant" else None)
    _check(kit, g, _feeds(dtype=np.float16, seed=7), device)


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.int64])
@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_bool_and_integers_are_copied(kit, device, dtype, mode):
    value = {np.bool_: True, np.int32: -7, np.int64: 2**40}[dtype] if mode == "constant" else None
    g = _pad_graph(kit, [1, 0, 2, 1, 0, 2, 1, 2], mode, dtype=dtype, value=value, then_relu=False)
    _check(kit, g, _feeds(dtype=dtype, seed=8), device)


def test_an_integer_pad_fuses_with_a_cast(kit, device):
    g = Graph("int_pad")
    x = g.add_input("x", TensorType((3, 4), np.int32))
    y = kit.add(g, "Pad", [x, g.add_constant(np.array([1, 2, 0, 1], np.int64), name="pads")], {"mode": "wrap"},
                name="pad")
    g.add_output(kit.add(g, "Cast", [y], {"to": onnx.TensorProto.FLOAT}, name="cast"), "y")
    _check(kit, g, _feeds((3, 4), np.int32, seed=9), device)
    assert [names for names, _ in kernel_sources(g)] == [["pad", "cast"]]


ENC = PackedEncoding((1,), (4,))
"""NCHWc4: 6 channels take two tiles, the second half padding."""


@pytest.mark.parametrize("mode", MODES)
def test_packed_operand_padded_spatially_with_a_fused_relu(kit, device, mode):
    """Pack -> Add 3 (the padding's contents are unknown after it) -> Pad of H and W -> Relu ->
    Unpack: the Pad reads the packed buffer through its encoding and never its padding, and the
    Relu and Unpack run in its kernel."""
    g = Graph("packed")
    x = g.add_input("x", TensorType((2, 6, 4, 5), F32))
    xp = kit.add(g, "Pack", [x], {"encoding": ENC}, encoding=ENC)
    shifted = kit.add(g, "Add", [xp, g.add_constant(Splat(3.0, (1,), F32), name="three")],
                      encoding=ENC.with_pad(None))
    pads = g.add_constant(np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64), name="pads")
    value = g.add_constant(np.array(-5.0, F32), name="value")
    padded = kit.add(g, "Pad", [shifted, pads, value], {"mode": mode}, encoding=ENC.with_pad(None), name="pad")
    relu = kit.add(g, "Relu", [padded], encoding=ENC.with_pad(None), name="relu")
    g.add_output(kit.add(g, "Unpack", [relu], {"encoding": ENC}, name="unpack"), "y")
    feeds = _feeds((2, 6, 4, 5), seed=10)
    got = _check(kit, g, feeds, device)
    want = np.pad(feeds["x"] + 3, [(0, 0), (0, 0), (2, 1), (1, 3)], mode=mode,
                  **({"constant_values": -5.0} if mode == "constant" else {}))
    np.testing.assert_array_equal(got, np.maximum(want, 0))
    (names, source), = [k for k in kernel_sources(g) if "pad" in k[0]]
    assert names == ["pad", "relu", "unpack"]
    assert "(i1 // 4) * 80 + (i1 % 4)" in source


def test_packed_operand_padded_along_its_tiled_channels(kit, device):
    """Channels 6 -> 9 (a crop of one, four more in edge mode) of an NCHWc4 operand into an
    NCHWc4 result."""
    g = Graph("channels")
    x = g.add_input("x", TensorType((2, 6, 3, 3), F32))
    xp = kit.add(g, "Pack", [x], {"encoding": ENC}, encoding=ENC)
    pads = g.add_constant(np.array([-1, 4], np.int64), name="pads")
    axes = g.add_constant(np.array([1], np.int64), name="axes")
    padded = kit.add(g, "Pad", [xp, pads, None, axes], {"mode": "edge"}, encoding=ENC, name="pad")
    g.add_output(kit.add(g, "Unpack", [padded], {"encoding": ENC}), "y")
    got = _check(kit, g, feeds := _feeds((2, 6, 3, 3), seed=11), device)
    np.testing.assert_array_equal(got, np.pad(feeds["x"], [(0, 0), (0, 4), (0, 0), (0, 0)], mode="edge")[:, 1:])


def test_runtime_pads_and_fill_stay_on_numpy(kit, device):
    g = Graph("runtime")
    x = g.add_input("x", TensorType(SHAPE, F32))
    value = g.add_input("value", TensorType((), F32))
    fixed = g.add_constant(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), name="fixed")
    g.add_output(kit.add(g, "Pad", [x, fixed, value], {"mode": "constant"}, name="by_value"), "a")
    g.add_output(kit.add(g, "Pad", [x, fixed, value], {"mode": "edge"}, name="edge_ignores_value"), "b")
    feeds = {**_feeds(seed=12), "value": np.array(4.0, F32)}
    exe = TritonExecutable(g, device=device)
    got, want = exe(feeds), NumpyExecutable(g)(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert exe.fallback_nodes == ["by_value"]
    g2 = Graph("runtime_pads")
    x = g2.add_input("x", TensorType(SHAPE, F32))
    g2.add_output(kit.add(g2, "Pad", [x, g2.add_input("pads", TensorType((8,), np.int64))], name="pad"), "y")
    feeds = {**_feeds(seed=13), "pads": np.array([0, 1, 0, 1, 1, 0, 1, 0], np.int64)}
    exe = TritonExecutable(g2, device=device)
    np.testing.assert_array_equal(exe(feeds)["y"], NumpyExecutable(g2)(feeds)["y"])
    assert exe.fallback_nodes == ["pad"]


def test_onnx_conformance_cases_run_in_triton_kernels(device, kit):
    """Every case shipped with `onnx` whose model is Pad alone (each mode, axes, negative axes)."""
    cases = kit.conformance_cases(lambda ops: ops == {"Pad"})
    assert {c.name for c in cases} >= {"test_constant_pad", "test_edge_pad", "test_reflect_pad", "test_wrap_pad",
                                       "test_constant_pad_axes", "test_constant_pad_negative_axes"}
    for case in cases:
        for y, expected in kit.run_conformance_case(case, device):
            np.testing.assert_array_equal(y, expected, err_msg=case.name)

