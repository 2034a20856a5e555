"""Resize as a Triton chain head (backends/triton/resize.py) against the NumPy backend (the
reference; onnxruntime where it follows ONNX's reference): every mode, coordinate mode and
rounding mode, tf_crop_and_resize's extrapolation, antialiased downscales, `sizes`, float16 and
packed operands; the per-axis tables reach the kernel as Tables outside the arena; integer
Resize, a non-constant `scales` and too many taps stay on the NumPy backend. ONNX's own
conformance cases for Resize run in Triton kernels with their roi, scales and sizes made
constants."""
from __future__ import annotations

import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable, kernel_sources
from tilefold.graph import Graph
from tilefold.graph.types import TensorType, Value
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32
SHAPE = (2, 3, 5, 6)
SCALES = (1.0, 1.0, 1.7, 0.6)
"""An upsampling along H and a downsampling along W, neither by a whole factor."""


def _resize_graph(kit, attrs: dict, scales=SCALES, shape=SHAPE, dtype=F32, roi=None, sizes=None,
                  then_relu: bool = True) -> Graph:
    """x -> Resize(attrs) [-> Relu] -> y, roi/scales/sizes constants."""
    g = Graph("resize")
    x = g.add_input("x", TensorType(shape, dtype))
    inputs: list[Value | None] = [x, None if roi is None else g.add_constant(np.array(roi, F32), name="roi"),
                                  None if scales is None else g.add_constant(np.array(scales, F32), name="scales")]
    if sizes is not None:
        inputs.append(g.add_constant(np.array(sizes, np.int64), name="sizes"))
    y = kit.add(g, "Resize", inputs, attrs, name="up")
    g.add_output(kit.add(g, "Relu", [y], name="relu") if then_relu else y, "y")
    return g


def _feeds(shape=SHAPE, dtype=F32, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(dtype)}


def _check(kit, g: Graph, feeds: dict, device: str, exact: bool = False) -> dict[str, np.ndarray]:
    """Triton (no fallback) against the NumPy backend: bit-exact, or to float32 rounding
    relative to the result's scale (the head sums the taps' tensor product in one pass)."""
    got, want = kit.run_both(g, feeds, device)
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
        if exact:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        else:
            scale = float(np.abs(want[name].astype(F32)).max())
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    return got


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "asymmetric", "align_corners"])
def test_nearest_is_a_bit_exact_gather(kit, device, nearest_mode, coordinates):
    attrs = {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": coordinates}
    _check(kit, _resize_graph(kit, attrs), _feeds(), device, exact=True)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                                         "half_pixel_symmetric"])
def test_interpolation_matches_numpy(kit, device, mode, coordinates):
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
    _check(kit, _resize_graph(kit, attrs), _feeds(seed=1), device)


def test_cubic_coefficient_and_exclude_outside(kit, device):
    attrs = {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}
    _check(kit, _resize_graph(kit, attrs, scales=(1.0, 1.0, 2.0, 2.0)), _feeds(seed=2), device)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_tf_crop_and_resize_takes_the_extrapolation_value_outside(kit, device, mode):
    """A roi reaching past the input on both sides of H and before it along W."""
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.5}
    roi = (0.0, 0.0, -0.3, -0.2, 1.0, 1.0, 1.25, 0.9)
    g = _resize_graph(kit, attrs, scales=(1.0, 1.0, 1.6, 1.5), roi=roi)
    got = _check(kit, g, _feeds(seed=3), device, exact=mode == "nearest")["y"]
    assert (got == 7.5).any() and (got != 7.5).any()
    sources = kernel_sources(g)[0][1]
    assert "outside the input along axis 2" in sources and "outside the input along axis 3" in sources


@pytest.mark.parametrize("mode, scale", [("linear", 0.4), ("cubic", 0.5)])
def test_antialiased_downscale(kit, device, mode, scale):
    """Linear at 0.4 has 4 taps per axis, cubic at 0.5 has 8 (64 in all: the most one runs)."""
    g = _resize_graph(kit, {"mode": mode, "antialias": 1}, scales=(1.0, 1.0, scale, scale), shape=(1, 2, 9, 10))
    _check(kit, g, _feeds((1, 2, 9, 10), seed=4), device)


def test_sizes_with_an_aspect_ratio_policy_and_axes(kit, device):
    attrs = {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}
    g = _resize_graph(kit, attrs, scales=None, sizes=(11, 9))
    assert g.type_of(g.inputs_of("relu")[0]).shape == (2, 3, 8, 9)  # one scale, 1.5: the smaller
    _check(kit, g, _feeds(seed=5), device)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_float16_computes_in_float32_as_numpy_does(kit, device, mode):
    g = _resize_graph(kit, {"mode": mode}, dtype=np.float16)
    _check(kit, g, _feeds(dtype=np.float16, seed=6), device, exact=mode == "nearest")


@pytest.mark.parametrize("enc, read", [
    (PackedEncoding((1,), (4,)), "i0 * 160 + (i1 // 4) * 80 + (i1 % 4) + j2 * 20 + j3 * 4"),
    (PackedEncoding((), (), (0, 2, 3, 1)), "i0 * 120 + i1 + j2 * 30 + j3 * 6"),
], ids=["nchw4c", "nhwc"])
def test_packed_operand_and_result_with_a_fused_epilogue(kit, device, enc, read):
    """Pack (channels tiled by 4, 6 channels: padded; or channels-last) -> Resize -> Add of a
    second input -> Relu -> Unpack: the Resize reads the packed buffer through its encoding,
    and the Add, Relu and Unpack run in its kernel, with the second input's Pack, which the Add
    alone reads at its own index (merged: that packed copy is never written)."""
    g = Graph("packed")
    x = g.add_input("x", TensorType((2, 6, 4, 5), F32))
    b = g.add_input("b", TensorType((2, 6, 8, 10), F32))
    xp = kit.add(g, "Pack", [x], {"encoding": enc}, encoding=enc)
    bp = kit.add(g, "Pack", [b], {"encoding": enc}, encoding=enc)
    scales = g.add_constant(np.array([1, 1, 2, 2], F32), name="scales")
    up = kit.add(g, "Resize", [xp, None, scales], {"mode": "linear"}, encoding=enc, name="up")
    s = kit.add(g, "Add", [up, bp], encoding=enc, name="add")
    r = kit.add(g, "Relu", [s], encoding=enc, name="relu")
    g.add_output(kit.add(g, "Unpack", [r], {"encoding": enc}), "y")
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((2, 6, 4, 5)).astype(F32), "b": rng.standard_normal((2, 6, 8, 10)).astype(F32)}
    _check(kit, g, feeds, device)
    (names, source), = [k for k in kernel_sources(g) if "up" in k[0]]
    assert names == ["pack_1", "up", "add", "relu", "unpack"]
    assert f" + {read}, mask=mask)" in source


def test_tables_are_kernel_parameters_outside_the_arena_and_the_plan(kit):
    g = _resize_graph(kit, {"mode": "cubic"})
    exe = TritonExecutable(g, device="interp")
    exe(_feeds(seed=8))
    (step,) = [s for s in exe.steps if s.plan is not None]
    assert step.ins == [Value("x")] and step.plan.inputs == [Value("x")]
    assert [t.name for t in step.plan.tables] == ["up: source indices along axis 2", "up: weights along axis 2",
                                                  "up: source indices along axis 3", "up: weights along axis 3"]
    assert [t.array.dtype for t in step.plan.tables] == [np.int32, F32] * 2
    arena = exe.arenas["interp"]
    lo, hi = arena.data_ptr(), arena.data_ptr() + arena.numel()
    assert len(step.tables) == 4 and all(not lo <= t.data_ptr() < hi for t in step.tables)
    planned = {b.value for p in exe.memory.devices.values() for b in p.buffers}
    assert planned <= {Value(n.name) for n in g.nodes()}
    assert all(not t.array.flags.writeable for t in step.plan.tables)


def test_integer_resize_stays_on_numpy_and_matches(kit, device):
    g = _resize_graph(kit, {"mode": "nearest"}, then_relu=False, dtype=np.int32)
    x = np.random.default_rng(9).integers(-50, 50, SHAPE).astype(np.int32)
    exe = TritonExecutable(g, device=device)
    np.testing.assert_array_equal(exe({"x": x})["y"], NumpyExecutable(g)({"x": x})["y"])
    assert exe.fallback_nodes == ["up"]


def test_non_constant_scales_stay_on_numpy_and_match(kit, device):
    g = Graph("dynamic_scales")
    x = g.add_input("x", TensorType(SHAPE, F32))
    scales = g.add_input("scales", TensorType((4,), F32))
    y = kit.add(g, "Resize", [x, None, scales], {"mode": "linear"}, name="up")
    g.add_output(y, "y")
    feeds = {**_feeds(seed=10), "scales": np.array([1, 1, 2, 2], F32)}
    exe = TritonExecutable(g, device=device)
    np.testing.assert_allclose(exe(feeds)["y"], NumpyExecutable(g)(feeds)["y"], rtol=1e-6, atol=1e-6)
    assert exe.fallback_nodes == ["up"]


def test_more_taps_than_a_kernel_sums_stay_on_numpy_and_match(kit, device):
    """Cubic antialiased by 0.4 along two axes: 10 x 10 taps."""
    g = _resize_graph(kit, {"mode": "cubic", "antialias": 1}, scales=(1.0, 1.0, 0.4, 0.4), shape=(1, 2, 10, 10))
    feeds = _feeds((1, 2, 10, 10), seed=11)
    exe = TritonExecutable(g, device=device)
    np.testing.assert_allclose(exe(feeds)["y"], NumpyExecutable(g)(feeds)["y"], rtol=1e-6, atol=1e-6)
    assert exe.fallback_nodes == ["up"]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_onnx_upsampling_matches_onnxruntime(kit, device, mode):
    """An ONNX Resize x2 (half_pixel, where onnxruntime follows ONNX's reference)."""
    from onnx import TensorProto, helper, numpy_helper

    import tilefold

    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], F32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode)
    graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 10])], [scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = _feeds((1, 2, 4, 5), seed=12)
    exe = TritonExecutable(tilefold.load(model), device=device)
    kit.assert_close(exe(feeds), kit.ort_outputs(model, feeds), rtol=1e-5, atol=1e-5)
    assert exe.fallback_nodes == []


def test_onnx_conformance_cases_run_in_triton_kernels(device, kit):
    """Every Resize and Upsample case shipped with `onnx` (all modes, coordinate and rounding
    modes, antialias, axes, aspect-ratio policies, crops with extrapolation), within its tolerance."""
    cases = kit.conformance_cases(lambda ops: bool(ops & {"Resize", "Upsample"}))
    assert len(cases) >= 40
    for case in cases:
        for y, expected in kit.run_conformance_case(case, device):
            np.testing.assert_allclose(y, expected, rtol=case.rtol, atol=case.atol, err_msg=case.name)

