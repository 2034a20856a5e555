"""QuantizeLinear and DequantizeLinear against onnx.reference, bit for bit: per tensor, per
axis and in blocks, every integer type, values past the saturation bounds, halves that round
to even, and a float16 scale. NaN, which ONNX leaves undefined for integer results (the
reference's float-to-int cast differs between machines), becomes the type's lowest value."""
import numpy as np
import pytest

from tilefold.graph import ModelError, UnsupportedOpError

F32 = np.float32
TYPES = [np.int8, np.uint8, np.int16, np.uint16]


def _scale(rng, shape, dtype=F32):
    return rng.uniform(0.02, 0.5, shape).astype(dtype)


def _zero(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -20), min(info.max, 20) + 1, shape).astype(dtype)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("how", ["tensor", "axis", "block"])
def test_quantize_saturates_and_rounds_halves_to_even(check, rng, dtype, how):
    x = (rng.standard_normal((2, 6, 5)) * 40).astype(F32)
    x[0, 0, :3] = [0.5, 1.5, -2.5]
    x[1, 1, :2] = [1e6, -1e6]  # past every bound, yet within the reference's int32 cast
    shape, attrs = {"tensor": ((), {}), "axis": ((6,), {"axis": 1}),
                    "block": ((2, 6, 2), {"axis": 2, "block_size": 3})}[how]
    scale = np.ones(shape, F32) if how == "tensor" else _scale(rng, shape)
    check("QuantizeLinear", [x, scale, _zero(rng, shape, dtype)], attrs, consts={1, 2}, reference="onnx",
          rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [*TYPES, np.int32])
@pytest.mark.parametrize("how", ["tensor", "axis", "block"])
def test_dequantize(check, rng, dtype, how):
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, (3, 4, 5)).astype(dtype)
    shape, attrs = {"tensor": ((1,), {}), "axis": ((5,), {"axis": -1}),
                    "block": ((2, 4, 5), {"axis": 0, "block_size": 2})}[how]
    zero = None if dtype == np.int32 else _zero(rng, shape, dtype)
    check("DequantizeLinear", [x, _scale(rng, shape), zero], attrs, consts={1, 2}, reference="onnx", rtol=0, atol=0)


@pytest.mark.parametrize("dtype", TYPES)
def test_quantize_sends_nan_to_the_lowest_value(run, dtype):
    x = np.array([np.nan, 1.0, -np.inf, np.inf, 3e38], F32)
    (y,) = run("QuantizeLinear", [x, np.array(0.5, F32), np.zeros((), dtype)])
    info = np.iinfo(dtype)
    assert y.dtype == dtype and y.tolist() == [info.min, 2, info.min, info.max, info.max]


def test_quantize_without_a_zero_point_gives_uint8_and_a_computed_scale_works(check, rng):
    x = (rng.standard_normal((4, 3)) * 100).astype(F32)
    (y,) = check("QuantizeLinear", [x, _scale(rng, (3,))], {"axis": 1}, reference="onnx", rtol=0, atol=0)
    assert y.dtype == np.uint8 and y.min() == 0 and y.max() == 255


def test_float16_data_and_scale(check, rng):
    x = (rng.standard_normal((3, 8)) * 10).astype(np.float16)
    scale = _scale(rng, (8,), np.float16)
    (q,) = check("QuantizeLinear", [x, scale, _zero(rng, (8,), np.int8)], {"axis": 1}, consts={1, 2},
                 reference="onnx", rtol=0, atol=0)
    check("DequantizeLinear", [q, scale, _zero(rng, (8,), np.int8)], {"axis": 1}, reference="onnx", rtol=0, atol=0)


def test_a_scale_that_fits_no_mode_is_one_line(run, rng):
    x = rng.standard_normal((2, 6)).astype(F32)
    with pytest.raises(ModelError) as info:
        run("DequantizeLinear", [rng.integers(-9, 9, (2, 6)).astype(np.int8), _scale(rng, (4,))], {"axis": 1},
            consts={1})
    assert "per-axis scale float32[4] does not match input int8[2x6] on axis 1" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises((ModelError, UnsupportedOpError)) as info:
        run("QuantizeLinear", [x, _scale(rng, (2, 6, 1))], {"axis": 1}, consts={1})
    assert "QuantizeLinear" in str(info.value) and "\n" not in str(info.value)
