"""Resize against onnxruntime: the common NCHW shapes, every mode, dtypes, run-time scales
and sizes, older opsets (Upsample-9, Resize-11/13), and its one-line errors."""
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tilefold.backends.numpy import NumpyExecutable
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import TensorType, TilefoldError, VerifyError, registry

from .conftest import reference_outputs, tilefold_outputs

F32 = np.float32


def normal(rng, *shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


def scales(*values):
    return np.array(values, F32)


def sizes(*values):
    return np.array(values, np.int64)


CASES = [
    # (input shape, scales, sizes, attrs)
    ((2, 3, 5, 4), scales(1, 1, 2, 2), None, {"mode": "nearest"}),
    ((2, 3, 5, 4), scales(1, 1, 2, 2), None, {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                               "nearest_mode": "floor"}),
    ((1, 2, 5, 7), None, sizes(1, 2, 9, 4), {"mode": "nearest", "nearest_mode": "ceil"}),
    ((1, 2, 6, 6), None, sizes(1, 2, 8, 9), {"mode": "nearest", "nearest_mode": "round_prefer_ceil",
                                             "coordinate_transformation_mode": "half_pixel"}),
    ((2, 3, 5, 4), scales(1, 1, 2, 2), None, {"mode": "linear"}),
    ((2, 3, 5, 4), None, sizes(2, 3, 9, 7), {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    ((2, 3, 5, 4), None, sizes(2, 3, 9, 1), {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ((1, 3, 8, 8), scales(1, 1, 0.5, 0.75), None, {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}),
    ((1, 2, 6, 5), scales(1, 1, 1.5, 2), None, {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}),
    ((1, 2, 6, 5), scales(1, 1, 2, 2), None, {"mode": "cubic"}),
    ((1, 2, 6, 5), None, sizes(1, 2, 4, 11), {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}),
    ((1, 2, 6, 5), scales(1, 1, 2, 3), None, {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}),
    ((1, 3, 16, 12), None, sizes(1, 3, 5, 4), {"mode": "linear", "antialias": 1}),
    ((1, 3, 16, 12), scales(1, 1, 0.5, 0.25), None, {"mode": "linear", "antialias": 1}),
    ((1, 3, 16, 12), None, sizes(1, 3, 6, 5), {"mode": "cubic", "antialias": 1}),
    ((2, 7, 5, 6), scales(2, 3), None, {"mode": "linear", "axes": [3, 2]}),
    ((2, 3, 5, 6), None, sizes(7, 7), {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}),
    ((2, 3, 5, 6), None, sizes(7, 7), {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}),
    ((2, 4, 9), scales(1, 1, 2.5), None, {"mode": "linear"}),  # 1-D spatial
    ((1, 2, 3, 4, 5), scales(1, 1, 2, 2, 2), None, {"mode": "linear"}),  # trilinear
]


@pytest.mark.parametrize("shape, scale, size, attrs", CASES)
@pytest.mark.parametrize("consts", [(1, 2, 3), ()])
def test_resize(check, rng, shape, scale, size, attrs, consts):
    args = [normal(rng, *shape), None, scale, size]
    check("Resize", args, attrs, consts=consts, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_tf_crop_and_resize_fills_outside_with_extrapolation_value(check, rng, mode):
    roi = np.array([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4], F32)  # part of the crop lies outside
    args = [normal(rng, 2, 3, 6, 5), roi, None, sizes(2, 3, 7, 6)]
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.5}
    (out,) = check("Resize", args, attrs, consts=(1, 2, 3), rtol=1e-5, atol=1e-5)
    assert (out == 7.5).any()


@pytest.mark.parametrize("dtype, mode, reference", [
    (np.float16, "linear", "onnxruntime"), (np.uint8, "nearest", "onnxruntime"), (np.int32, "nearest", "onnxruntime"),
    (np.float64, "cubic", "onnx"),  # onnxruntime has no float64 Resize
    (np.uint8, "linear", "onnx"),  # onnxruntime's integer linear is off by one against round-half-even
])
def test_resize_dtypes(check, rng, dtype, mode, reference):
    x = (normal(rng, 1, 2, 5, 6) * 60 + 100).astype(dtype)
    # onnx.reference computes cubic weights with cubic_coeff_a as a float32: float32-close
    tolerance = {np.float16: 2e-3, np.float64: 1e-5}.get(dtype, 1e-6)
    check("Resize", [x, None, scales(1, 1, 2, 1.5)], {"mode": mode}, consts=(2,), rtol=tolerance, atol=tolerance,
          reference=reference)


def test_scales_of_one_leave_the_input_as_a_fresh_buffer(run, rng):
    x = normal(rng, 2, 3, 4)
    (out,) = run("Resize", [x, None, scales(1, 1, 1)], {"mode": "linear"}, consts=(2,))
    np.testing.assert_array_equal(out, x)


def _converted(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _old_model(op: str, opset: int, inputs: list, attrs: dict, feeds: dict, rng) -> tuple:
    x = normal(rng, 2, 3, 4, 5)
    feeds = {"x": x, **feeds}
    graph = helper.make_graph(
        [helper.make_node(op, ["x", *inputs], ["y"], **attrs)], "old",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info("y")],
    )
    return _converted(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])), feeds


@pytest.mark.parametrize("op, opset, inputs, attrs, extra", [
    ("Upsample", 9, ["s"], {"mode": "nearest"}, {"s": scales(1, 1, 2, 3)}),
    ("Upsample", 9, ["s"], {"mode": "linear"}, {"s": scales(1, 1, 2, 2)}),
    ("Resize", 10, ["s"], {"mode": "linear"}, {"s": scales(1, 1, 1.5, 2.5)}),
    ("Resize", 10, ["s"], {"mode": "nearest"}, {"s": scales(1, 1, 1.5, 2.5)}),
    # align_corners with whole extents: onnxruntime divides by the rounded extent, ONNX's
    # reference (and so its conformance data, which tilefold follows) by the unrounded one
    ("Resize", 11, ["roi", "s"], {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
     {"roi": np.zeros(0, F32), "s": scales(1, 1, 2, 1.6)}),
    ("Resize", 11, ["roi", "s", "sz"], {"mode": "nearest", "nearest_mode": "floor"},
     {"roi": np.zeros(0, F32), "s": np.zeros(0, F32), "sz": sizes(2, 3, 7, 9)}),
    ("Resize", 13, ["", "s"], {"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"},
     {"s": scales(1, 1, 2, 2)}),
])
def test_older_opsets_arrive_as_resize_and_run(rng, op, opset, inputs, attrs, extra):
    model, feeds = _old_model(op, opset, inputs, attrs, {k: v for k, v in extra.items()}, rng)
    assert load_onnx(model).op_counts().get("Resize") == 1
    (want,) = reference_outputs(model, feeds, "onnxruntime")
    (have,) = tilefold_outputs(model, feeds)
    assert have.shape == want.shape
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("args, attrs, message", [
    ([None, scales(1, 1, 2, 2), sizes(2, 3, 8, 8)], {}, "exactly one of scales"),
    ([None, None, None], {}, "needs scales or sizes"),
    ([None, scales(2, 2), None], {}, r"must hold 4 values"),
    ([None, None, sizes(8, 8, 8)], {"axes": [2, 3]}, r"must hold 2 values"),
    ([None, scales(1, 1, 2, 2), None], {"mode": "area"}, "unknown mode 'area'"),
    ([None, None, sizes(2, 3, 8, 8)], {"coordinate_transformation_mode": "tf_crop_and_resize"}, "needs a roi"),
])
def test_bad_resize_is_one_line_error(rng, args, attrs, message):
    x = normal(rng, 2, 3, 4, 4)
    names = ["x"] + [f"in{i}" if a is not None else "" for i, a in enumerate(args, 1)]
    inits = [numpy_helper.from_array(a, n) for a, n in zip(args, names[1:]) if a is not None]
    graph = helper.make_graph(
        [helper.make_node("Resize", names, ["y"], **attrs)], "bad",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(TilefoldError, match=message) as info:
        NumpyExecutable(load_onnx(model), allow_fallback=False)
    assert "\n" not in str(info.value) and "Resize" in str(info.value)


def test_registry_rejects_both_scales_and_sizes():
    x = TensorType((1, 3, 4, 4), np.dtype(F32))
    with pytest.raises(VerifyError, match="exactly one of scales"):
        registry.infer("Resize", {}, [x, None, TensorType((4,), np.dtype(F32)), TensorType((4,), np.dtype(np.int64))])
