"""TopK in the row template (reduce.py): both results (values and int64 indices) against the
ONNX conformance cases and the NumPy backend (a stable argsort: equal values keep the lower
index first), over rows of awkward lengths with many ties, every axis, largest 0 and 1, K 1
and the row's length, float16/bfloat16/int32/int64 rows, NaN and -0.0, int64 values past 2**53,
rows longer than a block (read in pieces); and what stays on the host (K computed at run time,
int64 rows longer than TOPK_MAX_BLOCK, uint64)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable, verify_launch
from tilefold.backends.triton.reduce import TOPK_MAX_BLOCK
from tilefold.backends.triton.templates import classify
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import Graph
from tilefold.graph.errors import VerifyError
from tilefold.graph.types import TensorType, Value

BF16 = np.dtype(ml_dtypes.bfloat16)


def _topk_graph(kit, shape, dtype, k: int, axis: int, largest: int, sorted_: int = 1) -> Graph:
    g = Graph("topk")
    x = g.add_input("x", TensorType(shape, dtype))
    top = kit.add(g, "TopK", [x, g.add_constant(np.array([k], np.int64), name="k")],
                  {"axis": axis, "largest": largest, "sorted": sorted_}, name="top")
    g.add_output(top, "values")
    g.add_output(Value(top.node, 1), "indices")
    return g


def _stable_topk(x: np.ndarray, k: int, axis: int, largest: int) -> tuple[np.ndarray, np.ndarray]:
    """ONNX's answer from first principles: sort by (value, index), or (-value, index)."""
    x64 = x.astype(np.float64) if x.dtype.kind == "f" else x
    moved = np.moveaxis(x64, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    order = np.empty(rows.shape, np.int64)
    for r, row in enumerate(rows):
        # np.lexsort: last key primary; descending via negated ranks of the sorted unique values
        rank = np.searchsorted(np.unique(row), row)
        order[r] = np.lexsort((np.arange(row.size), -rank if largest else rank))
    order = np.moveaxis(order.reshape(moved.shape)[..., :k], -1, axis)
    return np.take_along_axis(x, order, axis), order


def _run(kit, g: Graph, x: np.ndarray, device: str) -> tuple[dict, dict]:
    """Triton's results and the NumPy backend's, equal bit for bit (bfloat16, which the NumPy
    backend does not take, against _stable_topk's only: the callers check that)."""
    if x.dtype == BF16:
        exe = TritonExecutable(g, device=device)
        got = exe({"x": x})
        assert exe.fallback_nodes == []
        return got, got
    got, ref = kit.run_both(g, {"x": x}, device)
    for name in ("values", "indices"):
        assert got[name].dtype == ref[name].dtype, name
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    return got, ref


def test_conformance_cases(kit, device):
    """Every TopK conformance case, K made a constant (an initializer), both outputs exactly;
    the uint64 case stays on the host."""
    cases = kit.conformance_cases(lambda ops: ops == {"TopK"})
    ran = 0
    for case in cases:
        for inputs, outputs in case.data_sets:
            model = onnx.ModelProto()
            model.CopyFrom(case.model)
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(inputs[1]), model.graph.input[1].name))
            del model.graph.input[1:]
            exe = TritonExecutable(load_onnx(model), device=device)
            got = exe({model.graph.input[0].name: inputs[0]})
            if inputs[0].dtype == np.uint64:
                assert exe.fallback_nodes != [], case.name
            else:
                assert exe.fallback_nodes == [], case.name
                ran += 1
            for name, want in zip([o.name for o in case.model.graph.output], outputs):
                assert got[name].dtype == want.dtype, case.name
                np.testing.assert_array_equal(got[name], want, err_msg=case.name)
    assert ran >= 6


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint32])
@pytest.mark.parametrize("largest", [0, 1])
def test_rows_of_narrow_and_unsigned_integers(kit, device, dtype, largest):
    """Keys widened to int64 before negation: an unsigned value's `-1 - v` does not wrap."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(5).integers(info.min, info.max, (3, 37), dtype=dtype, endpoint=True)
    x[:, ::7] = info.max  # ties at the type's extremes
    x[:, 3::9] = info.min
    got, _ = _run(kit, _topk_graph(kit, x.shape, dtype, 6, -1, largest), x, device)
    values, order = _stable_topk(x, 6, -1, largest)
    np.testing.assert_array_equal(got["indices"], order)
    np.testing.assert_array_equal(got["values"], values)


@pytest.mark.parametrize("length", [1, 7, 33, 100])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("largest", [0, 1])
def test_rows_with_many_ties(kit, device, length, axis, largest):
    """Small integers as float32: most values repeat, so the index order of ties decides."""
    shape = [3, 2, 4]
    shape[axis] = length
    x = np.random.default_rng(length).integers(-3, 4, shape).astype(np.float32)
    for k in sorted({1, length}):
        got, _ = _run(kit, _topk_graph(kit, x.shape, np.float32, k, axis, largest), x, device)
        values, order = _stable_topk(x, k, axis, largest)
        np.testing.assert_array_equal(got["indices"], order)
        np.testing.assert_array_equal(got["values"], values)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.int32, np.int64])
@pytest.mark.parametrize("largest", [0, 1])
def test_dtypes(kit, device, dtype, largest):
    """Each dtype's rows, ties included, K in the middle, sorted=0 (given sorted) on the middle axis."""
    x = np.random.default_rng(7).integers(-5, 6, (4, 33, 3)).astype(dtype)
    got, _ = _run(kit, _topk_graph(kit, x.shape, dtype, 10, 1, largest, sorted_=0), x, device)
    values, order = _stable_topk(x, 10, 1, largest)
    np.testing.assert_array_equal(got["indices"], order)
    np.testing.assert_array_equal(got["values"], values)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("largest", [0, 1])
def test_integer_extremes(kit, device, dtype, largest):
    """The type's lowest and highest values (no negation overflows), and for int64 values past
    2**53 that differ in the low bits only, or in the high half only (both radix passes decide)."""
    info = np.iinfo(dtype)
    row = [info.min, info.max, 0, -1, 1, info.max, info.min, info.max - 1, info.min + 1]
    if dtype == np.int64:
        row += [2**53 + 1, 2**53, 2**53 + 1, -(2**53) - 1, -(2**53), 2**40 * 3 + 7, 2**40 * 3 + 7 - 2**32,
                (1 << 62) + 5, (1 << 62) + 4]
    x = np.array([row, row[::-1]], dtype)
    n = x.shape[1]
    for k in (1, n):
        got, _ = _run(kit, _topk_graph(kit, x.shape, dtype, k, -1, largest), x, device)
        values, order = _stable_topk(x, k, -1, largest)
        np.testing.assert_array_equal(got["indices"], order)
        np.testing.assert_array_equal(got["values"], values)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_nan_infinities_and_signed_zeros_as_numpy(kit, device, largest, dtype):
    """NaN sorts after +inf (NumPy's argsort; first for largest, last otherwise), NaNs in index
    order; -0.0 and 0.0 tie (index order) and keep their own sign bits in the values."""
    nan, inf = np.nan, np.inf
    x = np.array([[1.0, nan, -inf, 0.0, -0.0, inf, nan, -2.0, -0.0, 3.0, inf],
                  [-0.0, 0.0, -0.0, nan, -nan, -inf, -inf, 5.0, nan, 0.0, 1.0]], dtype)
    got, ref = _run(kit, _topk_graph(kit, x.shape, dtype, x.shape[1], -1, largest), x, device)
    order = ref["indices"]
    assert np.isnan(x[0, order[0, 0 if largest else -1]])  # NaN at the large end
    np.testing.assert_array_equal(np.signbit(got["values"]), np.signbit(np.take_along_axis(x, order, -1)))
    zeros = [i for i in order[0] if x[0, i] == 0]
    assert zeros == sorted(zeros)  # -0.0 and 0.0 tie


@pytest.mark.parametrize("dtype, largest", [(np.float32, 1), (np.int32, 0)])
def test_rows_longer_than_a_block_are_read_in_pieces(kit, device, dtype, largest):
    """A vocabulary-sized row on a GPU; under the interpreter, whose sorts are slow, a row just
    past TOPK_MAX_BLOCK read in blocks of 128 (33 pieces). Few distinct values: ties between
    pieces keep the lower index first."""
    rows, length, k = ((1, TOPK_MAX_BLOCK + 4, 9) if device == "interp" else (3, 50257, 50))
    x = np.random.default_rng(6).integers(-40, 40, (rows, length)).astype(dtype)
    g = _topk_graph(kit, x.shape, dtype, k, -1, largest)
    if device == "interp":
        g.node("top").launch = {"BLOCK": 128}
    got, _ = _run(kit, g, x, device)
    values, order = _stable_topk(x, k, -1, largest)
    np.testing.assert_array_equal(got["indices"], order)
    np.testing.assert_array_equal(got["values"], values)


def test_a_block_must_hold_twice_k_for_a_row_in_pieces(kit):
    g = _topk_graph(kit, (2, TOPK_MAX_BLOCK + 1), np.float32, 40, -1, 1)
    g.node("top").launch = {"BLOCK": 64}
    with pytest.raises(VerifyError, match=r"node 'top'.*BLOCK=64 holds less than twice K=40"):
        verify_launch(g)
    g.node("top").launch = {"BLOCK": 128}
    verify_launch(g)


def test_what_stays_on_the_host(kit):
    """int64 rows longer than TOPK_MAX_BLOCK (their keys take two sorts), a K over half a
    block in a longer row, uint64 rows and K computed at run time: no kernel."""
    for dtype, k, runs in ((np.int64, 3, False), (np.float32, TOPK_MAX_BLOCK // 2 + 1, False),
                           (np.float32, TOPK_MAX_BLOCK // 2, True)):
        long = _topk_graph(kit, (2, TOPK_MAX_BLOCK + 1), dtype, k, -1, 1)
        assert classify(long, long.node("top")) == ("reduce" if runs else "numpy")
    fits = _topk_graph(kit, (2, TOPK_MAX_BLOCK), np.int64, 3, -1, 1)
    assert classify(fits, next(n for n in fits.nodes() if n.op == "TopK")) == "reduce"
    unsigned = _topk_graph(kit, (2, 5), np.uint64, 3, -1, 1)
    assert classify(unsigned, next(n for n in unsigned.nodes() if n.op == "TopK")) == "numpy"
    g = Graph("dynamic_k")
    x = g.add_input("x", TensorType((2, 5), np.float32))
    k = g.add_input("k", TensorType((1,), np.int64))
    top = kit.add(g, "TopK", [x, k], {"axis": -1})
    g.add_output(top, "values")
    assert classify(g, g.node(top.node)) == "numpy"


def test_long_row_at_the_limit(kit, device):
    """A row of TOPK_MAX_BLOCK float32 values with ties (every index bit of the key used)."""
    if device == "interp":
        x = np.random.default_rng(3).integers(0, 50, (1, TOPK_MAX_BLOCK)).astype(np.float32)
    else:
        x = np.random.default_rng(3).integers(0, 50, (5, TOPK_MAX_BLOCK)).astype(np.float32)
    got, _ = _run(kit, _topk_graph(kit, x.shape, np.float32, 100, -1, 1), x, device)
    values, order = _stable_topk(x, 100, -1, 1)
    np.testing.assert_array_equal(got["indices"], order)
    np.testing.assert_array_equal(got["values"], values)


@pytest.mark.parametrize("largest", [0, 1])
def test_numpy_reference_agrees_with_first_principles(kit, largest):
    """The NumPy backend (what run_both compares with) orders ties as _stable_topk does."""
    x = np.random.default_rng(1).integers(-2, 3, (3, 17)).astype(np.int64)
    want = _stable_topk(x, 17, -1, largest)
    got = NumpyExecutable(_topk_graph(kit, x.shape, np.int64, 17, -1, largest))({"x": x})
    np.testing.assert_array_equal(got["indices"], want[1])
    np.testing.assert_array_equal(got["values"], want[0])
