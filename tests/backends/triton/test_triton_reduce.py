"""The row-reduction template (Softmax, LogSoftmax, LayerNormalization, ReduceMean/Sum/Max/Min)
against numpy and the NumPy backend, including rows over a tiled dim whose padding holds
garbage (an elementwise result's padding is unknown): the kernel must mask it."""
from __future__ import annotations

import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable
from tilefold.graph import Graph
from tilefold.graph.types import Splat, TensorType
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32
ENC = PackedEncoding((1, 2), (16, 16), pad=0.0)


def _operand(kit, g: Graph, shape, packed: bool):
    """x, or Pack(x) + 3.0: a packed value whose padding holds 3.0, not zero."""
    x = g.add_input("x", TensorType(shape, F32))
    if not packed:
        return x
    p = kit.add(g, "Pack", [x], {"encoding": ENC}, encoding=ENC)
    three = g.add_constant(Splat(3.0, (1,), F32), name="three")
    return kit.add(g, "Add", [p, three], encoding=ENC.with_pad(None)), 3.0


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("packed", [False, True])
def test_softmax_rows(kit, device, op, axis, packed):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 19, 37)).astype(F32) * 3
    g = Graph(op)
    v = _operand(kit, g, x.shape, packed)
    shift = 0.0
    if packed:
        v, shift = v
    y = kit.add(g, op, [v], {"axis": axis})
    g.add_output(y, "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    want = _softmax(x + shift, axis)
    want = np.log(want) if op == "LogSoftmax" else want
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_layer_norm_last_axis(kit, device, with_bias, packed):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 33)).astype(F32)
    gamma = rng.uniform(0.5, 1.5, 33).astype(F32)
    beta = rng.standard_normal(33).astype(F32)
    g = Graph("ln")
    v = _operand(kit, g, x.shape, packed)
    shift = 0.0
    if packed:
        v, shift = v
    inputs = [v, g.add_constant(gamma, name="gamma")] + ([g.add_constant(beta, name="beta")] if with_bias else [])
    g.add_output(kit.add(g, "LayerNormalization", inputs, {"axis": -1, "epsilon": 1e-5}), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    z = x + shift
    want = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5) * gamma
    want = want + (beta if with_bias else 0)
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_layer_norm_of_a_row_of_equal_values_is_its_bias_exactly(kit, device, packed):
    """A float32 mean of equal values can miss them by a bit, which 1/sqrt(epsilon) turns
    into 2e-4 of the output (a random model found it; onnxruntime gives the bias exactly)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 33)).astype(F32)
    x[:, 1, :] = rng.uniform(-2000, 2000, (3, 1)).astype(F32)  # one value per row
    gamma = rng.uniform(0.5, 1.5, 33).astype(F32)
    beta = rng.standard_normal(33).astype(F32)
    g = Graph("ln")
    v = _operand(kit, g, x.shape, packed)
    v = v[0] if packed else v
    inputs = [v, g.add_constant(gamma, name="gamma"), g.add_constant(beta, name="beta")]
    g.add_output(kit.add(g, "LayerNormalization", inputs, {"axis": -1, "epsilon": 1e-5}), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    for out in (got["y"], ref["y"]):  # the Triton kernel, the NumPy kernel
        np.testing.assert_array_equal(out[:, 1], np.broadcast_to(beta, (3, 33)))


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axis,keepdims", [(2, 1), (1, 0), (-1, 0)])
@pytest.mark.parametrize("packed", [False, True])
def test_reduce_one_axis(kit, device, op, axis, keepdims, packed):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 21, 35)).astype(F32)
    g = Graph(op)
    v = _operand(kit, g, x.shape, packed)
    shift = 0.0
    if packed:
        v, shift = v
    axes = g.add_constant(np.array([axis], np.int64), name="axes")
    g.add_output(kit.add(g, op, [v, axes], {"keepdims": keepdims}), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    fn = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[op]
    want = fn(x + shift, axis=axis, keepdims=bool(keepdims))
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-5)


def test_reduce_over_several_axes_and_global_average_pool_on_nchwc16(kit, device):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 21, 5, 7)).astype(F32)
    enc = PackedEncoding((1,), (16,))
    g = Graph("pool")
    p = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": enc}, encoding=enc)
    p = kit.add(g, "Add", [p, g.add_constant(Splat(1.0, (1,), F32), name="one")], encoding=enc.with_pad(None))
    g.add_output(kit.add(g, "GlobalAveragePool", [p]), "pooled")
    axes = g.add_constant(np.array([1, 3], np.int64), name="axes")
    g.add_output(kit.add(g, "ReduceSum", [p, axes], {"keepdims": 0}), "summed")
    got, ref = kit.run_both(g, {"x": x}, device)
    np.testing.assert_allclose(got["pooled"], (x + 1).mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["summed"], (x + 1).sum(axis=(1, 3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["summed"], ref["summed"], rtol=1e-5, atol=1e-5)


def _bool_rows(shape, axis: int) -> np.ndarray:
    """Random bits, with rows along `axis` all False, all True and one True among False."""
    x = np.random.default_rng(5).random(shape) < 0.5
    x = np.moveaxis(x, axis, -1).copy()
    x[0, 0], x[0, 1], x[1, 0] = False, True, False
    x[1, 0, -1] = True
    return np.moveaxis(x, -1, axis)


@pytest.mark.parametrize("op, fn", [("ReduceMax", np.any), ("ReduceMin", np.all)])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_bool_reductions_are_any_and_all(kit, device, op, fn, axis, keepdims):
    """Rows of 37 (past a power of two: the masked-off lanes must not decide) along the last
    axis and a middle one."""
    x = _bool_rows((3, 37, 37), axis)
    g = Graph(op)
    v = g.add_input("x", TensorType(x.shape, np.bool_))
    axes = g.add_constant(np.array([axis], np.int64), name="axes")
    g.add_output(kit.add(g, op, [v, axes], {"keepdims": keepdims}), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    want = fn(x, axis=axis, keepdims=bool(keepdims))
    assert got["y"].dtype == np.bool_
    np.testing.assert_array_equal(got["y"], want)
    np.testing.assert_array_equal(got["y"], ref["y"])
    assert want.any() and not want.all()


def test_bool_reduction_of_a_packed_operand(kit, device):
    """Any over a channel axis tiled by 16 (21 channels): the tile's padding is not read."""
    x = _bool_rows((2, 21, 3, 4), 1)
    enc = PackedEncoding((1,), (16,))
    g = Graph("packed_any")
    p = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, np.bool_))], {"encoding": enc}, encoding=enc)
    p = kit.add(g, "Not", [kit.add(g, "Not", [p], encoding=enc.with_pad(None))], encoding=enc.with_pad(None))
    axes = g.add_constant(np.array([1], np.int64), name="axes")
    g.add_output(kit.add(g, "ReduceMin", [p, axes], {"keepdims": 0}), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    np.testing.assert_array_equal(got["y"], x.all(axis=1))
    np.testing.assert_array_equal(got["y"], ref["y"])


def test_bool_sum_stays_on_numpy(kit, device):
    """ReduceSum is not defined on bool by ONNX: no kernel claims it."""
    from tilefold.backends.triton import TritonExecutable
    from tilefold.backends.triton.reduce import supports

    g = Graph("sum")
    v = g.add_input("x", TensorType((2, 5), np.bool_))
    axes = g.add_constant(np.array([1], np.int64), name="axes")
    y = kit.add(g, "ReduceSum", [v, axes], {"keepdims": 0}, name="sum")
    g.add_output(y, "y")
    assert not supports(g, g.node("sum"))
    assert TritonExecutable(g, device=device).fallback_nodes == ["sum"]


@pytest.mark.parametrize("fuse", [True, False])
def test_sdpa_safe_softmax_guard(kit, device, fuse):
    """torch's safe softmax as transformers' sdpa attention traces it: rows of scores all -inf
    (fully masked) give 0, not NaN: Equal(s, -inf) -> Not -> ReduceMax (any) -> Not ->
    Where(., 0, Softmax(s)), bool[1,H,S,S] -> bool[1,H,S,1]; every node in a Triton kernel."""
    from tilefold.backends.triton import TritonExecutable

    shape = (1, 2, 5, 5)
    s = np.random.default_rng(6).standard_normal(shape).astype(F32)
    s[0, 0, 1] = -np.inf
    s[0, 1, 3, :2] = -np.inf
    g = Graph("sdpa_guard")
    scores = g.add_input("s", TensorType(shape, F32))
    ninf = g.add_constant(np.array(-np.inf, F32), name="ninf")
    zero = g.add_constant(np.array(0.0, F32), name="zero")
    axes = g.add_constant(np.array([-1], np.int64), name="axes")
    masked = kit.add(g, "Equal", [scores, ninf], name="eq")
    kept = kit.add(g, "Not", [masked], name="kept")
    any_kept = kit.add(g, "ReduceMax", [kept, axes], {"keepdims": 1}, name="any")
    all_masked = kit.add(g, "Not", [any_kept], name="all_masked")
    soft = kit.add(g, "Softmax", [scores], {"axis": -1}, name="softmax")
    g.add_output(kit.add(g, "Where", [all_masked, zero, soft], name="where"), "p")
    got, ref = kit.run_both(g, {"s": s}, device, fuse=fuse)
    np.testing.assert_array_equal(got["p"][0, 0, 1], np.zeros(5, F32))
    assert np.isfinite(got["p"]).all()
    np.testing.assert_allclose(got["p"], ref["p"], rtol=1e-6, atol=1e-7)
    exe = TritonExecutable(g, device=device, fuse=fuse)
    assert exe.fallback_nodes == [] and any(step.plan is not None and "any" in step.plan.nodes for step in exe.steps)


def _cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX CumSum by a sequential NumPy loop over the axis (the reference)."""
    moved = np.moveaxis(x, axis, 0)
    order = range(moved.shape[0] - 1, -1, -1) if reverse else range(moved.shape[0])
    out, total = np.empty_like(moved), np.zeros_like(moved[0])
    for k in order:
        if exclusive:
            out[k] = total
        total = total + moved[k]
        if not exclusive:
            out[k] = total
    return np.moveaxis(out, 0, axis)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, F32, np.int8, np.uint16])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [1, -1])
def test_cumsum_along_a_row_in_every_direction(kit, device, dtype, exclusive, reverse, axis):
    """Position ids (a cumulative count of real tokens) in int64 and int32, exactly, with values
    past float32's 2**24; float rows within rounding of a sequential sum; int8 and uint16 sums
    that wrap, as NumPy's do."""
    rng = np.random.default_rng(20)
    if dtype == F32:
        x = rng.standard_normal((2, 9, 13)).astype(F32)
    elif np.dtype(dtype).itemsize < 4:
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (2, 9, 13), dtype=dtype, endpoint=True)
    else:
        x = rng.integers(-2**30, 2**30, (2, 9, 13)).astype(dtype)
    if dtype == np.int32:
        x //= 64  # sums of 13 stay inside int32
    g = Graph("cumsum")
    xv = g.add_input("x", TensorType(x.shape, dtype))
    a = g.add_constant(np.array(axis, np.int64), name="axis")
    g.add_output(kit.add(g, "CumSum", [xv, a], {"exclusive": exclusive, "reverse": reverse}), "y")
    got, _ = kit.run_both(g, {"x": x}, device)
    want = _cumsum(x, axis, bool(exclusive), bool(reverse))
    assert got["y"].dtype == dtype
    if dtype == F32:
        np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got["y"], want)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims", [(1, 1), (-1, 0)])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("dtype", [F32, np.int32, np.int64, np.uint8, np.int16])
def test_arg_extremes_take_the_first_or_last_tie_and_the_first_nan(kit, device, op, axis, keepdims, last, dtype):
    """Rows of few distinct values (ties everywhere); float rows with a NaN, whose index is
    the answer (NumPy's rule; with select_last_index, the last NaN)."""
    rng = np.random.default_rng(21)
    x = rng.integers(-3, 3, (2, 11, 9)).astype(dtype)
    if dtype == F32:
        x[0, 4, 2] = x[1, 7, 5] = x[1, 2, 5] = np.nan
    g = Graph("arg")
    xv = g.add_input("x", TensorType(x.shape, dtype))
    g.add_output(kit.add(g, op, [xv], {"axis": axis, "keepdims": keepdims, "select_last_index": last}), "y")
    got, _ = kit.run_both(g, {"x": x}, device)
    fn = np.argmax if op == "ArgMax" else np.argmin
    size = x.shape[axis]
    want = size - 1 - fn(np.flip(x, axis), axis=axis, keepdims=bool(keepdims)) if last else \
        fn(x, axis=axis, keepdims=bool(keepdims))
    assert got["y"].dtype == np.int64
    np.testing.assert_array_equal(got["y"], want)


@pytest.mark.parametrize("op", ["CumSum", "ArgMax", "ArgMin"])
def test_scan_conformance_cases(kit, device, op):
    """Every case on float32, int32 or int64 data (most CumSum cases are float64, which Triton
    kernels do not compute in: those run on the NumPy backend)."""
    kit.check_conformance(op, device, keep=lambda case: kit.first_input(case).dtype in (F32, np.int32, np.int64),
                          rtol=1e-6, atol=1e-6, least=2)


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
                                "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "GlobalAveragePool"])
def test_reduction_conformance_cases(kit, device, op):
    """Every float32 case (those that ask for the input back with empty axes are no
    reductions: they run on the NumPy backend)."""
    kit.check_conformance(op, device, rtol=1e-5, atol=1e-6, keep=lambda case: kit.first_input(case).dtype == F32
                          and "empty_axes_input_noop" not in case.name)


INTEGER_REDUCTIONS = {"ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min, "ReduceProd": np.prod,
                      "ReduceL1": lambda x, **kw: np.sum(np.abs(x), **kw),
                      "ReduceSumSquare": lambda x, **kw: np.sum(x * x, **kw),
                      "ReduceMean": lambda x, dtype, **kw: np.mean(x, **kw).astype(dtype)}


@pytest.mark.parametrize("op", sorted(INTEGER_REDUCTIONS))
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint16])
@pytest.mark.parametrize("axes,keepdims", [((1,), 1), ((0, 2), 0)])
def test_integer_rows_reduce_in_their_own_type_and_wrap(kit, device, op, dtype, axes, keepdims):
    """Values across the whole type (int64 past float64's 2**53): sums, products and squares
    that overflow wrap as NumPy's do, bit for bit; means are NumPy's float64 mean truncated
    (int64 means stay on the host)."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(22).integers(info.min, info.max, (3, 7, 5), dtype=dtype, endpoint=True)
    g = Graph("int_reduce")
    xv = g.add_input("x", TensorType(x.shape, dtype))
    g.add_output(kit.add(g, op, [xv, g.add_constant(np.array(axes, np.int64), name="axes")],
                         {"keepdims": keepdims}, name="reduce"), "y")
    if op == "ReduceMean" and dtype == np.int64:
        exe = TritonExecutable(g, device=device)
        got, want = exe({"x": x}), NumpyExecutable(g)({"x": x})
        assert exe.fallback_nodes == ["reduce"]
    else:
        got, want = kit.run_both(g, {"x": x}, device)
    assert got["y"].dtype == dtype
    np.testing.assert_array_equal(got["y"], want["y"])
    in_type = {} if op in ("ReduceMax", "ReduceMin") else {"dtype": dtype}
    with np.errstate(over="ignore"):
        expected = INTEGER_REDUCTIONS[op](x, axis=axes, keepdims=bool(keepdims), **in_type)
    np.testing.assert_array_equal(got["y"], expected)


@pytest.mark.parametrize("axis,keepdims", [(1, 0), (-1, 1)])
def test_reduce_prod_of_a_packed_operand_is_the_float64_product_rounded(kit, device, axis, keepdims):
    """Rows of 21 or 35 factors of both signs near 1, read from 16x16 tiles whose padding holds
    3.0 (masked off: a padded lane counts as 1): the exact product rounded to float32; the NumPy
    backend's float32 product, rounded once per factor, agrees to 35 float32 epsilons."""
    rng = np.random.default_rng(30)
    x = (rng.choice([-1.0, 1.0], (2, 21, 35)) * rng.uniform(0.8, 1.25, (2, 21, 35)) - 3.0).astype(F32)
    g = Graph("prod")
    v, shift = _operand(kit, g, x.shape, True)
    g.add_output(kit.add(g, "ReduceProd", [v, g.add_constant(np.array([axis], np.int64), name="axes")],
                         {"keepdims": keepdims}), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    exact = np.prod((x + F32(shift)).astype(np.float64), axis=axis, keepdims=bool(keepdims))
    np.testing.assert_allclose(got["y"], exact.astype(F32), rtol=2e-7, atol=0)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=35 * 1.2e-7, atol=0)


def test_reduce_prod_of_zeros_infinities_nan_and_partial_products_past_float32(kit, device):
    """A zero, inf * 0 (NaN), a NaN, a row of infinities of mixed signs; and 1e30 * 1e30 *
    1e-30 * 1e-30, which is 1: the product runs in float64, so no partial product overflows
    (NumPy's float32 one gives inf there) or underflows."""
    rows = np.array([[2.0, 0.0, -3.0, 5.0], [np.inf, 0.0, 1.0, 1.0], [1.0, np.nan, 2.0, 0.0],
                     [-np.inf, np.inf, 2.0, -1.0], [1e30, 1e30, 1e-30, 1e-30], [1e-30, 1e-30, 1e30, -1e30]], F32)
    g = Graph("prod_special")
    rv = g.add_input("r", TensorType(rows.shape, F32))
    g.add_output(kit.add(g, "ReduceProd", [rv, g.add_constant(np.array([1], np.int64), name="axes")],
                         {"keepdims": 0}), "y")
    exe = TritonExecutable(g, device=device)
    got = exe({"r": rows})["y"]
    assert exe.fallback_nodes == []
    np.testing.assert_array_equal(got, [-0.0, np.nan, np.nan, np.inf, 1.0, -1.0])
    assert np.signbit(got[0])


def test_global_max_pool_and_log_sum_exp_of_infinite_rows(kit, device):
    """GlobalMaxPool over NCHW and over NCHWc16 tiles whose padding holds garbage (NaN
    answers where a map holds one); ReduceLogSumExp of rows all -inf and holding +inf."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2, 19, 37)).astype(F32).reshape(2, 19, 37, 1)
    x[1, 3, 5, 0] = np.nan
    g = Graph("global_max")
    packed, shift = _operand(kit, g, x.shape[:3], True)
    g.add_output(kit.add(g, "GlobalMaxPool", [kit.add(g, "Unsqueeze", [packed, g.add_constant(
        np.array([3], np.int64), name="axes")])]), "packed")
    got, _ = kit.run_both(g, {"x": x[..., 0]}, device)
    want = np.max(x + shift, axis=(2, 3), keepdims=True)
    np.testing.assert_array_equal(got["packed"], want)
    rows = rng.standard_normal((3, 6)).astype(F32)
    rows[0] = -np.inf
    rows[1, 2] = np.inf
    g = Graph("lse")
    rv = g.add_input("r", TensorType(rows.shape, F32))
    g.add_output(kit.add(g, "ReduceLogSumExp", [rv, g.add_constant(np.array([1], np.int64), name="axes")],
                         {"keepdims": 0}), "y")
    got, _ = kit.run_both(g, {"r": rows}, device)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(got["y"], np.log(np.exp(rows.astype(np.float64)).sum(1)), rtol=1e-6)


@pytest.mark.parametrize("packed", [False, True])
def test_instance_normalization_per_image_and_channel(kit, device, packed):
    """Rows over a 2-D map, scaled and shifted per channel; a map of equal values gives its
    channel's bias exactly; the ONNX conformance cases too."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 19, 37)).astype(F32).reshape(2, 19, 37, 1) * 4
    x[1, 2] = 0.75
    scale, bias = rng.standard_normal(19).astype(F32), rng.standard_normal(19).astype(F32)
    g = Graph("instance_norm")
    v = _operand(kit, g, x.shape[:3], packed)
    shift = 0.0
    if packed:
        v, shift = v
        v = kit.add(g, "Unpack", [v])
    image = kit.add(g, "Unsqueeze", [v, g.add_constant(np.array([3], np.int64), name="axes")])
    g.add_output(kit.add(g, "InstanceNormalization", [image, g.add_constant(scale, name="scale"),
                                                       g.add_constant(bias, name="bias")], {"epsilon": 1e-3}), "y")
    got, _ = kit.run_both(g, {"x": x[..., 0]}, device)
    y = (x + shift).astype(np.float64)
    mean, var = y.mean(axis=(2, 3), keepdims=True), y.var(axis=(2, 3), keepdims=True)
    want = (y - mean) / np.sqrt(var + 1e-3) * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got["y"][1, 2], np.full((37, 1), bias[2], F32))
    kit.check_conformance("InstanceNormalization", device, rtol=1e-5, atol=1e-5)
