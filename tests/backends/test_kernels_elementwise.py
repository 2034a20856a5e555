"""Elementwise kernels against onnxruntime: activations, math, broadcasting binary and
variadic ops across dtypes, comparisons, Where, Clip and casts."""
import numpy as np
import pytest

from tilefold.backends.numpy.kernels.elementwise import erf_float32

F32 = np.float32


def floats(rng, shape, scale=3.0, dtype=F32):
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    x.flat[:3] = [0.0, -0.5, 2.5]  # a zero, and halves for rounding
    return x


@pytest.mark.parametrize("op, attrs", [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.13}), ("LeakyRelu", {"alpha": 1.7}), ("LeakyRelu", {"alpha": -0.4}),
    ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.45}), ("HardSwish", {}), ("Tanh", {}),
    ("Erf", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("Softplus", {}), ("Elu", {"alpha": 0.7}),
    ("Exp", {}), ("Neg", {}), ("Abs", {}), ("Reciprocal", {}), ("Floor", {}), ("Ceil", {}), ("Round", {}),
    ("Sin", {}), ("Cos", {}), ("Sign", {}), ("IsNaN", {}),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 1/0 and friends: IEEE results, as ONNX wants
def test_unary_float32_ops_match_onnxruntime(check, rng, op, attrs):
    check(op, [floats(rng, (3, 5, 7))], attrs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Sqrt", "Log"])
def test_unary_ops_on_positive_inputs(check, rng, op):
    check(op, [rng.uniform(0.01, 50, (4, 9)).astype(F32)])


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("op", ["Sigmoid", "Erf", "Gelu", "Tanh", "Elu"])
def test_unary_ops_keep_other_float_dtypes(check, rng, op, dtype):
    tolerance = 2e-3 if dtype == np.float16 else 1e-7
    check(op, [floats(rng, (6, 5), 2.0, dtype)], rtol=tolerance, atol=tolerance, reference="onnx")


def test_softplus_is_stable_for_large_inputs(check):
    check("Softplus", [np.array([-100.0, -30.0, 0.0, 30.0, 100.0], F32)])


def test_erf_float32_is_within_a_few_ulp_of_the_double_result(rng):
    from scipy.special import erf

    x = np.concatenate([rng.standard_normal(100_000) * 2, [0.0, 1e-30, -1e-8, 3.99, 4.5, -7.0, np.inf]])
    x = x.astype(F32)
    exact = erf(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(F32)).astype(np.float64)
    assert np.max(np.abs(erf_float32(x) - exact) / ulp) < 16


@pytest.mark.parametrize("positive, negative", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_is_inf_detects_the_requested_signs(check, positive, negative):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, 1e38, -1.5], F32)
    check("IsInf", [x], {"detect_positive": positive, "detect_negative": negative})


def test_sign_and_abs_on_integers(check, rng):
    x = rng.integers(-50, 50, (5, 6)).astype(np.int32)
    check("Sign", [x])
    check("Abs", [x])
    check("Neg", [x.astype(np.int64)])


def test_not(check, rng):
    check("Not", [rng.random((4, 3)) > 0.5])


BROADCASTS = [((3, 4, 5), (3, 4, 5)), ((2, 1, 5), (3, 1)), ((5,), (4, 1, 5)), ((), (3, 2)), ((1, 1), (7,))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BROADCASTS)
def test_arithmetic_broadcasts_like_numpy(check, rng, op, shapes):
    a = floats(rng, shapes[0])
    b = floats(rng, shapes[1]) + np.float32(7.5)  # keep divisors away from zero
    check(op, [a, b], rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_integer_arithmetic(check, rng, op, dtype):
    info = np.iinfo(dtype)
    low = max(info.min, -100)
    a = rng.integers(low, min(info.max, 100), (4, 7)).astype(dtype)
    b = rng.integers(1, min(info.max, 9), (7,)).astype(dtype)
    if info.min < 0:
        b[::2] = -b[::2]  # negative divisors: ONNX integer Div truncates toward zero
    check(op, [a, b], rtol=0, atol=0)


@pytest.mark.parametrize("fmod, dtype", [(0, np.int32), (0, np.int64), (1, np.int32), (1, np.float32), (1, np.float64)])
def test_mod_follows_the_divisor_or_dividend_sign(check, rng, fmod, dtype):
    a = (rng.standard_normal((3, 8)) * 20).astype(dtype)
    b = (rng.integers(1, 7, (8,)) * np.where(np.arange(8) % 2, 1, -1)).astype(dtype)
    check("Mod", [a, b], {"fmod": fmod}, rtol=1e-6)


@pytest.mark.parametrize("base, exponent", [
    (np.float32, np.float32), (np.float32, np.int64), (np.float32, np.int32), (np.int64, np.int64),
    (np.int32, np.float32), (np.float64, np.float64),
])
def test_pow_keeps_the_base_dtype(check, rng, base, exponent):
    a = rng.uniform(0.5, 3.0, (3, 4)).astype(base)
    b = rng.integers(0, 4, (4,)).astype(exponent)
    check("Pow", [a, b], rtol=1e-6)


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparisons_give_bool(check, rng, op, dtype):
    a = rng.integers(-3, 3, (4, 1, 6)).astype(dtype)
    b = rng.integers(-3, 3, (5, 6)).astype(dtype)
    check(op, [a, b])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(check, rng, op):
    check(op, [rng.random((3, 1, 4)) > 0.5, rng.random((5, 4)) > 0.3])


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("count", [1, 2, 4])
def test_variadic_ops_broadcast_all_inputs(check, rng, op, count):
    shapes = [(3, 1, 5), (4, 1), (5,), (1, 4, 5)][:count]
    check(op, [floats(rng, s) for s in shapes], rtol=1e-6)


@pytest.mark.parametrize("op", ["Max", "Min"])  # Sum and Mean are float-only in ONNX
def test_variadic_ops_on_integers(check, rng, op):
    check(op, [rng.integers(-9, 9, (2, 5)).astype(np.int32) for _ in range(3)], rtol=0, atol=0)


def test_prelu_broadcasts_the_slope(check, rng):
    x = floats(rng, (2, 3, 4, 5))
    check("PRelu", [x, rng.standard_normal((3, 1, 1)).astype(F32)])
    check("PRelu", [x, rng.standard_normal((5,)).astype(F32)], consts={1})


def test_where_broadcasts_condition_and_branches(check, rng):
    cond = rng.random((3, 1, 5)) > 0.5
    check("Where", [cond, floats(rng, (4, 5)), floats(rng, (3, 4, 1))])
    check("Where", [cond, rng.integers(0, 9, (5,)).astype(np.int64), np.array(-1, np.int64)])


@pytest.mark.parametrize("bounds", [(-1.0, 2.0), (None, 0.5), (-0.25, None), (None, None), (3.0, -1.0)])
def test_clip_with_optional_bounds(check, rng, bounds):
    args = [floats(rng, (4, 6))] + [None if b is None else np.array(b, F32) for b in bounds]
    check("Clip", args)


def test_clip_on_integers(check, rng):
    check("Clip", [rng.integers(-20, 20, (3, 7)).astype(np.int32), np.array(-5, np.int32), np.array(6, np.int32)])


@pytest.mark.parametrize("source, target", [
    (np.float32, np.float16), (np.float32, np.float64), (np.float64, np.float32), (np.float32, np.int32),
    (np.int64, np.float32), (np.int32, np.int8), (np.float32, np.bool_), (np.bool_, np.float32),
    (np.uint8, np.int64), (np.float32, np.float32),
])
def test_cast_and_cast_like(check, rng, source, target):
    from onnx import helper

    x = (rng.standard_normal((3, 5)) * 50).astype(source)
    check("Cast", [x], {"to": helper.np_dtype_to_tensor_dtype(np.dtype(target))})
    check("CastLike", [x, np.zeros((2,), target)])


def test_identity(check, rng):
    check("Identity", [floats(rng, (2, 3, 4))])


# ---- trigonometric and hyperbolic math, activations -------------------------------------------
DOMAINS = {  # each op on random inputs inside its domain, away from poles
    "Tan": (-1.5, 1.5), "Asin": (-0.999, 0.999), "Acos": (-0.999, 0.999), "Atan": (-40, 40), "Sinh": (-9, 9),
    "Cosh": (-9, 9), "Asinh": (-500, 500), "Acosh": (1, 500), "Atanh": (-0.999, 0.999), "Softsign": (-30, 30),
    "Mish": (-30, 30),
}


@pytest.mark.parametrize("op", sorted(DOMAINS))
def test_math_ops_match_onnxruntime_inside_their_domains(check, rng, op):
    check(op, [rng.uniform(*DOMAINS[op], (4, 5, 6)).astype(F32)], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("op, attrs", [
    ("Selu", {}), ("Selu", {"alpha": 1.3, "gamma": 0.8}), ("Celu", {}), ("Celu", {"alpha": 0.6}),
    ("ThresholdedRelu", {}), ("ThresholdedRelu", {"alpha": -0.4}), ("Shrink", {}),
    ("Shrink", {"bias": 0.3, "lambd": 0.7}),
])
def test_parametric_activations_match_onnxruntime(check, rng, op, attrs):
    check(op, [floats(rng, (3, 5, 7))], attrs, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("op", ["Tan", "Asinh", "Atanh", "Cosh", "Softsign", "Mish", "Selu", "Celu", "Shrink"])
def test_new_math_ops_keep_other_float_dtypes(check, rng, op, dtype):
    tolerance = 2e-3 if dtype == np.float16 else 1e-12
    x = rng.uniform(-0.99, 0.99, (6, 5)).astype(dtype) * (1 if op in ("Atanh", "Tan") else 4)
    check(op, [x], rtol=tolerance, atol=tolerance, reference="onnx")


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_shrink_on_integers_truncates_like_onnxruntime(check, rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -60), 60, (5, 8)).astype(dtype)
    check("Shrink", [x], {"bias": 2.6, "lambd": 3.5}, rtol=0, atol=0)


# ---- bitwise ----------------------------------------------------------------------------
INTEGERS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def integers(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", INTEGERS)
def test_bitwise_ops_broadcast_over_every_integer_type(check, rng, op, dtype):
    check(op, [integers(rng, (3, 1, 6), dtype), integers(rng, (4, 6), dtype)], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", INTEGERS)
def test_bitwise_not(check, rng, dtype):
    check("BitwiseNot", [integers(rng, (5, 7), dtype)], rtol=0, atol=0)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bit_shifts_by_less_than_the_width(check, rng, direction, dtype):
    bits = np.dtype(dtype).itemsize * 8
    x, y = integers(rng, (4, 9), dtype), rng.integers(0, bits, (9,)).astype(dtype)
    check("BitShift", [x, y], {"direction": direction}, rtol=0, atol=0)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shifts_by_the_width_or_more_give_zero(run, rng, direction):
    """ONNX 28 defines these (C leaves them undefined, and onnxruntime masks the amount)."""
    x = integers(rng, (3, 8), np.uint32)
    y = rng.integers(32, 300, (3, 8)).astype(np.uint32)
    y[0] = rng.integers(0, 32, 8)
    (got,) = run("BitShift", [x, y], {"direction": direction})
    shift = (lambda a, b: a << b) if direction == "LEFT" else (lambda a, b: a >> b)
    want = [[shift(int(a), int(b)) % 2**32 if b < 32 else 0 for a, b in zip(*rows)] for rows in zip(x, y)]
    np.testing.assert_array_equal(got, np.array(want, np.uint32))
