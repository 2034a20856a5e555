"""Reductions and ArgMax/ArgMin against onnxruntime: axes constant or computed at run
time, keepdims, noop_with_empty_axes, integer dtypes, empty sets and ties."""
import numpy as np
import pytest

OPS = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes", [[1], [0, 2], [-1], [-3, 1], None])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("const_axes", [False, True])
def test_reductions_over_axes(check, rng, op, axes, keepdims, const_axes):
    x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    args = [x] + ([] if axes is None else [np.array(axes, np.int64)])
    check(op, args, {"keepdims": keepdims}, consts={1} if const_axes else (), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reductions_keep_integer_dtypes(check, rng, op, dtype):
    x = rng.integers(-4, 5, (3, 4, 2)).astype(dtype)
    check(op, [x, np.array([0, 2], np.int64)], {"keepdims": 0}, rtol=0, atol=0)


@pytest.mark.parametrize("op", OPS)
def test_empty_axes_with_noop_returns_the_input(check, rng, op):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    check(op, [x, np.array([], np.int64)], {"noop_with_empty_axes": 1})
    check(op, [x], {"noop_with_empty_axes": 1})


@pytest.mark.parametrize("op, expected", [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf),
                                          ("ReduceMin", np.inf)])
def test_reducing_an_empty_set_gives_the_identity(run, op, expected):
    (y,) = run(op, [np.zeros((2, 0, 3), np.float32), np.array([1], np.int64)], {"keepdims": 1})
    assert y.shape == (2, 1, 3) and y.dtype == np.float32
    np.testing.assert_array_equal(y, np.full((2, 1, 3), expected, np.float32))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_and_min_reduce_booleans(run, rng, op):
    x = rng.random((3, 5)) > 0.7
    (y,) = run(op, [x, np.array([1], np.int64)], {"keepdims": 0})
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, x.any(axis=1) if op == "ReduceMax" else x.all(axis=1))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reductions_with_ties(check, rng, op, axis, keepdims, last):
    x = rng.integers(0, 3, (4, 5, 3)).astype(np.int32)  # many ties: select_last_index matters
    check(op, [x], {"axis": axis, "keepdims": keepdims, "select_last_index": last}, rtol=0, atol=0)


def test_arg_max_on_floats(check, rng):
    check("ArgMax", [rng.standard_normal((3, 7)).astype(np.float32)], {"axis": 1})


@pytest.mark.parametrize("axis, k", [(-1, 3), (0, 2), (1, 5)])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_top_k_with_ties_takes_the_lower_index_first(check, rng, axis, k, largest, dtype):
    x = rng.integers(-3, 4, (4, 6, 5)).astype(dtype)  # many ties
    check("TopK", [x, np.array([k], np.int64)], {"axis": axis, "largest": largest}, consts=[1], n_outputs=2,
          rtol=0, atol=0)


NORMS = ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", NORMS)
@pytest.mark.parametrize("axes", [[1], [0, 2], [-1], None])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("const_axes", [False, True])
def test_norm_and_log_reductions_over_axes(check, rng, op, axes, keepdims, const_axes):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x) + np.float32(0.1)  # a positive sum
    args = [x] + ([] if axes is None else [np.array(axes, np.int64)])
    check(op, args, {"keepdims": keepdims}, consts={1} if const_axes else (), rtol=2e-6, atol=1e-6)


def test_log_sum_exp_does_not_overflow_on_large_inputs(check, rng):
    x = (rng.standard_normal((4, 6)) * 30 + np.array([[100.0], [-100.0], [0.0], [300.0]])).astype(np.float32)
    x[2, 1] = -np.inf
    check("ReduceLogSumExp", [x, np.array([1], np.int64)], rtol=1e-6)


@pytest.mark.parametrize("op", NORMS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_norm_and_log_reductions_on_integers(check, rng, op, dtype):
    x = rng.integers(-4 if op not in ("ReduceLogSum", "ReduceLogSumExp") else 1, 9, (3, 4, 2)).astype(dtype)
    check(op, [x, np.array([0, 2], np.int64)], {"keepdims": 0}, rtol=0, atol=0)


@pytest.mark.parametrize("op", NORMS)
def test_float16_norms(check, rng, op):
    x = rng.uniform(0.1, 4.0, (4, 8)).astype(np.float16)
    check(op, [x, np.array([1], np.int64)], rtol=1e-3, atol=1e-3, reference="onnx")


@pytest.mark.parametrize("op, exact", [
    ("ReduceL2", lambda x: np.sqrt(np.sum(np.square(x), axis=1))),
    ("ReduceLogSumExp", lambda x: np.log(np.sum(np.exp(x), axis=1))),
])
def test_float16_norms_compute_wide(run, rng, op, exact):
    """Squares of 256 and more, and exp of 12 and more, overflow float16; these results do not
    (onnx.reference's float16 answer is inf)."""
    x = (rng.uniform(0.5, 1.0, (4, 8)) * np.where(np.arange(8) % 2, 300, 20)).astype(np.float16)
    (got,) = run(op, [x, np.array([1], np.int64)], {"keepdims": 0})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, exact(x.astype(np.float64)).astype(np.float16), rtol=1e-3)


@pytest.mark.parametrize("op, expected", [("ReduceL1", 0.0), ("ReduceL2", 0.0), ("ReduceSumSquare", 0.0),
                                          ("ReduceLogSum", -np.inf), ("ReduceLogSumExp", -np.inf)])
def test_norms_of_an_empty_set(run, op, expected):
    (y,) = run(op, [np.zeros((2, 0, 3), np.float32), np.array([1], np.int64)], {"keepdims": 0})
    assert y.shape == (2, 3) and y.dtype == np.float32
    np.testing.assert_array_equal(y, np.full((2, 3), expected, np.float32))
