"""OneHot (a chain head) and the scatters (ScatterElements, ScatterND, the older Scatter) as
Triton kernels: the ONNX conformance cases, and fresh random inputs against the NumPy backend
or NumPy itself, with awkward sizes, negative and repeated indices, and every data dtype."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilefold.backends.triton import TritonExecutable
from tilefold.graph import Graph
from tilefold.graph.types import TensorType

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [F32, np.float16, BF16, np.int32, np.int64]
REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@pytest.mark.parametrize("op", ["OneHot", "ScatterElements", "ScatterND", "Scatter"])
def test_conformance_cases_run_in_kernels(kit, device, op):
    """Every case the loader reads (the older Scatter is loaded as ScatterElements); OneHot's
    bfloat16 case, which the loader cannot convert, built by hand."""
    least = 2 if op == "Scatter" else 4
    kit.check_conformance(op, device, keep=lambda case: "bfloat16" not in case.name, least=least)
    if op == "OneHot":
        kit.check_conformance(op, device, keep=lambda case: "bfloat16" in case.name, by_hand=True)


def _one_hot_graph(kit, indices: np.ndarray, depth: int, values: np.ndarray, axis: int) -> Graph:
    g = Graph("one_hot")
    x = g.add_input("x", TensorType(indices.shape, indices.dtype))
    hot = kit.add(g, "OneHot", [x, g.add_constant(np.array(depth, np.int64), name="depth"),
                                g.add_constant(values, name="values")], {"axis": axis})
    g.add_output(hot, "y")
    return g


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_one_hot_wraps_negative_indices_and_leaves_out_of_range_rows_off(kit, device, axis, index_dtype):
    depth = 5
    indices = np.array([[0, 4, -1, -5, 5, -6, 7], [2, -2, 3, 1, 100, -100, 0]], index_dtype)
    values = np.array([-2.5, 3.0], F32)
    got, want = kit.run_both(_one_hot_graph(kit, indices, depth, values, axis), {"x": indices}, device)
    np.testing.assert_array_equal(got["y"], want["y"])
    moved = np.moveaxis(got["y"], axis, -1)
    assert (moved[..., :] == -2.5).all(-1)[[0, 0, 1, 1], [4, 5, 4, 5]].all()  # 5, -6, 100, -100: all off
    assert moved[0, 2, 4] == 3.0 and moved[0, 3, 0] == 3.0  # -1 and -5 count from depth


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_hot_values_of_every_dtype(kit, device, dtype):
    indices = np.array([[3, -1, 9], [0, 2, -7]], np.int64)
    values = np.array([-3, 7], np.int64).astype(dtype)  # [off, on]
    g = _one_hot_graph(kit, indices, 4, values, 1)
    exe = TritonExecutable(g, device=device)
    got = exe({"x": indices})["y"]
    assert exe.fallback_nodes == [] and got.dtype == np.dtype(dtype)
    want = np.where(np.arange(4)[None, :, None] == (indices % 4)[:, None, :], 7, -3)
    want[:, :, 2] = [[-3] * 4, [-3] * 4]  # 9 and -7 lie outside [-4, 4)
    np.testing.assert_array_equal(got.astype(np.int64), want)


def _reference(data: np.ndarray, rows: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    """NumPy's scatter in float64 (or the integer type), rounded to the data's dtype once."""
    exact = data.astype(np.int64 if data.dtype.kind == "i" else np.float64)
    if reduction == "none":
        exact[rows] = updates
    else:
        REDUCE[reduction].at(exact, rows, updates.astype(exact.dtype))
    return exact.astype(data.dtype)


def _data(rng: np.random.Generator, shape: tuple, dtype, reduction: str) -> np.ndarray:
    """Random values of `dtype`; for mul, magnitudes near one (no overflow in float16)."""
    if np.dtype(dtype).kind == "i":
        return rng.integers(-9, 10, shape).astype(dtype)
    if reduction == "mul":
        return (rng.uniform(0.6, 1.4, shape) * rng.choice([-1, 1], shape)).astype(dtype)
    return (rng.standard_normal(shape) * 3).astype(dtype)


def _tolerance(dtype, reduction: str) -> dict:
    """Exact but for a float sum or product, whose order the atomics decide."""
    if np.dtype(dtype).kind == "i" or reduction in ("none", "max", "min"):
        return {"rtol": 0, "atol": 0}
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == F32 else {"rtol": 2e-2, "atol": 5e-2}


def _run(g: Graph, feeds: dict, device: str) -> np.ndarray:
    exe = TritonExecutable(g, device=device)
    y = exe(feeds)["y"]
    assert exe.fallback_nodes == []
    return y


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, -3])
def test_scatter_elements_with_repeated_negative_indices(kit, device, reduction, dtype, axis):
    """Data 3x7x5, indices and updates 2x4x3 (smaller than data off the axis), all three graph
    inputs; positions repeat (several times) except under reduction none."""
    rng = np.random.default_rng([len(reduction), axis + 3, np.dtype(dtype).num])
    data_shape, shape = (3, 7, 5), (2, 4, 3)
    size = data_shape[axis]
    if reduction == "none":  # distinct positions along the axis, half of them negative
        lines = [size if d == axis % 3 else s for d, s in enumerate(shape)]
        along = np.take(np.argsort(rng.random(lines), axis=axis), np.arange(shape[axis]), axis=axis)
        indices = along - size * (rng.random(shape) < 0.5)
    else:
        indices = rng.integers(-size, size, shape)
    data, updates = _data(rng, data_shape, dtype, reduction), _data(rng, shape, dtype, reduction)
    g = Graph("scatter_elements")
    d, i, u = (g.add_input(n, TensorType(a.shape, a.dtype)) for n, a in (("d", data), ("i", indices),
                                                                         ("u", updates)))
    g.add_output(kit.add(g, "ScatterElements", [d, i, u], {"axis": axis, "reduction": reduction}), "y")
    got = _run(g, {"d": data, "i": indices, "u": updates}, device)
    grid = list(np.indices(shape))
    grid[axis % 3] = indices % size
    want = _reference(data, tuple(grid), updates, reduction)
    assert got.dtype == data.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **_tolerance(dtype, reduction))


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatter_nd_with_repeated_negative_indices(kit, device, reduction, dtype, k):
    """Data 7x3x6, indices 2x3xk (int32) addressing the first k dims, updates of the slices."""
    rng = np.random.default_rng([len(reduction), k, np.dtype(dtype).num])
    data_shape = (7, 3, 6)
    extents = np.array(data_shape[:k])
    if reduction == "none":
        flat = rng.permutation(int(np.prod(extents)))[:6]
        indices = np.stack(np.unravel_index(flat, data_shape[:k]), -1).reshape(2, 3, k)
        indices = indices - extents * (rng.random(indices.shape) < 0.5)
    else:
        indices = rng.integers(-extents, extents, (2, 3, k))
    indices = indices.astype(np.int32)
    data = _data(rng, data_shape, dtype, reduction)
    updates = _data(rng, (2, 3, *data_shape[k:]), dtype, reduction)
    g = Graph("scatter_nd")
    d = g.add_input("d", TensorType(data.shape, data.dtype))
    s = kit.add(g, "ScatterND", [d, g.add_constant(indices, name="i"), g.add_constant(updates, name="u")],
                {"reduction": reduction})
    g.add_output(s, "y")
    got = _run(g, {"d": data}, device)
    rows = tuple((indices % extents).reshape(-1, k).T)
    want = _reference(data, rows, updates.reshape(6, *data_shape[k:]), reduction)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **_tolerance(dtype, reduction))


@pytest.mark.parametrize("reduction", ["max", "min", "add", "mul"])
def test_nan_in_data_or_updates_wins_like_the_numpy_backend(kit, device, reduction):
    data = np.array([[1.0, np.nan, -2.0, 0.5, -np.inf]], F32)
    data[0, 1] = -np.abs(data[0, 1])  # a NaN with its sign bit set (as x86 makes them): no bit order tricks
    indices = np.array([[0, 1, 1, 3, 0, 4, 2]], np.int64)
    updates = np.array([[np.nan, 4.0, -3.0, 2.0, 5.0, 7.0, -np.nan]], F32)
    g = Graph("nan")
    d = g.add_input("d", TensorType(data.shape, F32))
    s = kit.add(g, "ScatterElements", [d, g.add_constant(indices, name="i"), g.add_constant(updates, name="u")],
                {"axis": 1, "reduction": reduction})
    g.add_output(s, "y")
    got, want = kit.run_both(g, {"d": data}, device)
    np.testing.assert_array_equal(got["y"], want["y"])
    assert np.isnan(got["y"][0, [0, 1, 2]]).all()


def test_a_scatter_between_chains_leaves_its_data_to_other_readers_and_reruns_afresh(kit, device):
    """Exp -> ScatterElements (add) -> Relu, the Exp also an output: the scatter writes a copy;
    a second run gives the same result (the copy is made before every launch)."""
    rng = np.random.default_rng(4)
    g = Graph("between")
    x = g.add_input("x", TensorType((4, 6), F32))
    e = kit.add(g, "Exp", [x], name="exp")
    index = rng.integers(-6, 6, (4, 9))
    s = kit.add(g, "ScatterElements", [e, g.add_constant(index, name="index"),
                                       g.add_constant(rng.standard_normal((4, 9)).astype(F32), name="up")],
                {"axis": 1, "reduction": "add"}, name="scatter")
    g.add_output(kit.add(g, "Relu", [s]), "y")
    g.add_output(e, "e")
    x_val = rng.standard_normal((4, 6)).astype(F32)
    exe = TritonExecutable(g, device=device)
    first = exe({"x": x_val})
    again = exe({"x": x_val})
    assert exe.fallback_nodes == [] and "scatter" in [n for step in exe.steps for n in step.group.names]
    want = kit.run_both(g, {"x": x_val}, device)[1]
    for got in (first, again):
        np.testing.assert_allclose(got["e"], np.exp(x_val), rtol=1e-6)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)


def test_variants_without_a_kernel_stay_on_the_host(kit, device):
    """Float indices for OneHot run in a kernel (truncated, as the NumPy backend does); a
    scatter-add of int8 data (no atomics, no checked swaps of bytes) does not."""
    g = Graph("host")
    x = g.add_input("x", TensorType((3,), F32))
    values = g.add_constant(np.array([0, 1], F32), name="values")
    fixed = g.add_constant(np.array(4, np.int64), name="four")
    g.add_output(kit.add(g, "OneHot", [x, fixed, values], name="float_indices"), "a")
    small = g.add_constant(np.arange(6, dtype=np.int8), name="small")
    g.add_output(kit.add(g, "ScatterElements", [small, g.add_constant(np.array([1], np.int64), name="at"),
                                                g.add_constant(np.array([9], np.int8), name="nine")],
                         {"reduction": "add"}, name="int8_scatter"), "b")
    exe = TritonExecutable(g, device=device)
    got = exe({"x": np.array([1.7, -1.2, 5.0], F32)})
    assert exe.fallback_nodes == ["int8_scatter"]
    np.testing.assert_array_equal(got["a"], np.eye(4, dtype=F32)[[1, 3]].tolist() + [[0] * 4])
    np.testing.assert_array_equal(got["b"], [0, 10, 2, 3, 4, 5])
