"""The chain template (fused elementwise ops, Pack, Unpack, Transpose) against the NumPy
backend and plain numpy, on packed and plain operands whose sizes do not divide the tiles."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx.helper import np_dtype_to_tensor_dtype

from tilefold.backends.triton import TritonExecutable, kernel_sources
from tilefold.graph import Graph
from tilefold.graph.types import Splat, TensorType
from tilefold.layout.encoding import PackedEncoding, pack

F32 = np.float32

TILES = PackedEncoding((0, 1), (16, 16), pad=None)
RAGGED = PackedEncoding((1, 0), (8, 4), (1, 0), pad=0.0)
"""Tiles of different sizes in swapped order, outer dims permuted: nothing lines up."""

UNARY = ["Relu", "Neg", "Abs", "Exp", "Sqrt", "Log", "Reciprocal", "Sigmoid", "Tanh", "Erf", "Sin", "Cos",
         "Floor", "Ceil", "HardSwish", "Softplus", "LeakyRelu", "Elu", "HardSigmoid", "Gelu", "Identity",
         "Selu", "Celu", "ThresholdedRelu", "Softsign", "Mish"]
POSITIVE = {"Sqrt", "Log"}


def _unary_graph(kit, op: str, attrs: dict, enc: PackedEncoding | None, shape=(13, 37)) -> Graph:
    g = Graph(op)
    x = g.add_input("x", TensorType(shape, np.float32))
    if enc is not None:
        x = kit.add(g, "Pack", [x], {"encoding": enc}, encoding=enc)
    y = kit.add(g, op, [x], attrs, encoding=None if enc is None else enc.with_pad(None))
    if enc is not None:
        y = kit.add(g, "Unpack", [y])
    g.add_output(y, "y")
    return g


@pytest.mark.parametrize("op", UNARY)
def test_unary_op_on_packed_operand_matches_numpy_backend(op, device, kit):
    rng = np.random.default_rng(abs(hash(op)) % 1000)
    x = rng.standard_normal((13, 37)).astype(np.float32) * 2
    if op in POSITIVE:
        x = np.abs(x) + 0.1
    got, want = kit.run_both(_unary_graph(kit, op, {}, TILES), {"x": x}, device)
    np.testing.assert_allclose(got["y"], want["y"], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("attrs", [{"approximate": "tanh"}, {"approximate": "none"}])
def test_gelu_variants(attrs, device, kit):
    x = np.random.default_rng(3).standard_normal((5, 19)).astype(np.float32) * 3
    got, want = kit.run_both(_unary_graph(kit, "Gelu", attrs, None, (5, 19)), {"x": x}, device)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)


def test_fused_chain_with_broadcast_operands_in_three_layouts(device, kit):
    """x packed in 16x16 tiles, a per-column bias packed alike, a per-row scale plain, a
    scalar splat: one kernel computes relu((x + bias) * scale - 0.5) and unpacks."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 21, 35)).astype(np.float32)
    bias = rng.standard_normal((35,)).astype(np.float32)
    scale = rng.standard_normal((21, 1)).astype(np.float32)
    enc = PackedEncoding((1, 2), (16, 16))
    g = Graph("chain")
    xv = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, np.float32))], {"encoding": enc}, encoding=enc)
    b = kit.packed_const(g, bias.reshape(1, 1, 35), PackedEncoding((1, 2), (1, 16)), "bias")
    s = g.add_constant(scale, name="scale")
    half = g.add_constant(Splat(0.5, (1,), np.float32), name="half")
    t = kit.add(g, "Add", [xv, b], encoding=enc.with_pad(None))
    t = kit.add(g, "Mul", [t, s], encoding=enc.with_pad(None))
    t = kit.add(g, "Sub", [t, half], encoding=enc.with_pad(None))
    t = kit.add(g, "Relu", [t], encoding=enc.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [t]), "y")
    exe = TritonExecutable(g, device=device)
    got = exe({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum((x + bias) * scale - 0.5, 0), rtol=1e-6, atol=1e-6)
    assert [k for k, src in kernel_sources(g) if "tl.store" in src] == [["pack", "add", "mul", "sub", "relu", "unpack"]]


@pytest.mark.parametrize("enc", [TILES.with_pad(0.0), RAGGED, PackedEncoding((), (), (1, 0))])
def test_pack_writes_the_reference_buffer_and_unpack_inverts_it(enc, device, kit):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((13, 10)).astype(np.float32)
    g = Graph("pack")
    p = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, np.float32))], {"encoding": enc}, encoding=enc)
    g.add_output(p, "packed")  # an output keeps its encoding: the executor returns it unpacked
    g.add_output(kit.add(g, "Unpack", [p]), "y")
    exe = TritonExecutable(g, device=device)
    out = exe({"x": x})
    np.testing.assert_array_equal(out["y"], x)
    np.testing.assert_array_equal(out["packed"], x)
    # the physical buffer, padding included, is what layout.encoding.pack gives
    import torch

    (buffer,) = exe.steps[0].run([torch.from_numpy(x).to(exe.torch_device)])
    np.testing.assert_array_equal(buffer.cpu().numpy(), pack(x, enc))


def test_where_clip_pow_and_cast(device, kit):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 9)).astype(np.float32)
    cond = rng.random((7, 9)) > 0.5
    g = Graph("misc")
    xv = g.add_input("x", TensorType(x.shape, np.float32))
    cv = g.add_input("c", TensorType(cond.shape, np.bool_))
    lo = g.add_constant(Splat(-0.5, (), np.float32), name="lo")
    hi = g.add_constant(np.array(0.75, np.float32), name="hi")
    two = g.add_constant(Splat(2.0, (), np.float32), name="two")
    sq = kit.add(g, "Pow", [xv, two])
    clipped = kit.add(g, "Clip", [xv, lo, hi])
    w = kit.add(g, "Where", [cv, sq, clipped])
    half = kit.add(g, "Cast", [w], {"to": 10})
    g.add_output(kit.add(g, "Cast", [half], {"to": 1}), "y")
    got, want = kit.run_both(g, {"x": x, "c": cond}, device)
    expect = np.where(cond, x * x, np.clip(x, -0.5, 0.75)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got["y"], want["y"])
    np.testing.assert_allclose(got["y"], expect, rtol=1e-3)


def test_float16_chain_computes_in_float32_and_rounds_once(device, kit):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 33)).astype(np.float16)
    y = rng.standard_normal((33,)).astype(np.float16)
    g = Graph("half")
    xv = g.add_input("x", TensorType(x.shape, np.float16))
    yv = g.add_constant(y, name="y")
    g.add_output(kit.add(g, "Sigmoid", [kit.add(g, "Mul", [xv, yv])]), "z")
    got, want = kit.run_both(g, {"x": x}, device)
    assert got["z"].dtype == np.float16
    exact = 1 / (1 + np.exp(-(x.astype(np.float64) * y)))
    np.testing.assert_allclose(got["z"], exact, atol=1e-3)
    np.testing.assert_allclose(got["z"], want["z"], atol=2e-3)


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1)])
def test_transpose_of_packed_operand_fused_with_relu(perm, device, kit):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 17, 20)).astype(np.float32)
    enc = PackedEncoding((1, 2), (16, 16))
    g = Graph("transpose")
    xv = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, np.float32))], {"encoding": enc}, encoding=enc)
    t = kit.add(g, "Transpose", [xv], {"perm": perm})
    g.add_output(kit.add(g, "Relu", [t]), "y")
    got, want = kit.run_both(g, {"x": x}, device)
    np.testing.assert_array_equal(got["y"], np.maximum(x.transpose(perm), 0))
    np.testing.assert_array_equal(got["y"], want["y"])


def test_bool_ops_mask_a_softmax_like_bert(kit, device):
    """IsNaN -> Where and comparisons with And: bool values inside one chain."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 9)).astype(F32)
    x[0, 3] = np.nan
    x[2, 5] = np.inf
    g = Graph("bools")
    xv = g.add_input("x", TensorType(x.shape, F32))
    zero = g.add_constant(Splat(0.0, (), F32), name="zero")
    nan = kit.add(g, "IsNaN", [xv])
    inf = kit.add(g, "IsInf", [xv])
    positive = kit.add(g, "Greater", [xv, zero])
    keep = kit.add(g, "And", [kit.add(g, "Not", [kit.add(g, "Or", [nan, inf])]), positive])
    g.add_output(keep, "keep")
    g.add_output(kit.add(g, "Where", [keep, xv, zero]), "y")
    got, want = kit.run_both(g, {"x": x}, device)
    expect = ~(np.isnan(x) | np.isinf(x)) & (x > 0)
    np.testing.assert_array_equal(got["keep"], expect)
    np.testing.assert_array_equal(got["y"], np.where(expect, x, 0))
    np.testing.assert_array_equal(got["y"], want["y"])


@pytest.mark.parametrize("fill", [-np.inf, np.inf, np.nan])
def test_an_infinite_or_nan_splat_is_a_literal_the_kernel_knows(kit, device, fill):
    """Where(mask, x, -inf), BERT's sdpa attention mask through torch.fx: the splat's repr
    (`-inf`, `nan`) is no name in a kernel; it is spelled float('-inf')."""
    x = np.random.default_rng(7).standard_normal((3, 5)).astype(F32)
    g = Graph("masked_fill")
    xv = g.add_input("x", TensorType(x.shape, F32))
    zero = g.add_constant(Splat(0.0, (), F32), name="zero")
    fill_value = g.add_constant(Splat(fill, (), F32), name="fill")
    g.add_output(kit.add(g, "Where", [kit.add(g, "Greater", [xv, zero]), xv, fill_value]), "y")
    got, want = kit.run_both(g, {"x": x}, device)
    np.testing.assert_array_equal(got["y"], np.where(x > 0, x, F32(fill)))
    np.testing.assert_array_equal(got["y"], want["y"])


def test_reshape_of_a_packed_buffer_is_one_copy_fused_with_what_follows(kit, device):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 17, 20)).astype(F32)
    enc = PackedEncoding((1, 2), (16, 16))
    g = Graph("reshape")
    xv = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": enc}, encoding=enc)
    shape = g.add_constant(np.array([51, 4, 5], np.int64), name="shape")
    r = kit.add(g, "Reshape", [xv, shape])
    g.add_output(kit.add(g, "Tanh", [r]), "y")
    got, want = kit.run_both(g, {"x": x}, device)
    np.testing.assert_allclose(got["y"], np.tanh(x.reshape(51, 4, 5)), rtol=1e-6, atol=1e-6)
    assert [names for names, _ in kernel_sources(g)] == [["pack"], ["reshape", "tanh"]]


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_rows_of_an_embedding_table(kit, device, axis):
    rng = np.random.default_rng(8)
    table = rng.standard_normal((11, 7)).astype(F32)
    ids = rng.integers(-11, 11, (2, 5)) if axis == 0 else rng.integers(-7, 7, (3,))
    g = Graph("gather")
    iv = g.add_input("ids", TensorType(ids.shape, np.int64))
    g.add_output(kit.add(g, "Gather", [g.add_constant(table, name="table"), iv], {"axis": axis}), "y")
    got, want = kit.run_both(g, {"ids": ids}, device)
    np.testing.assert_array_equal(got["y"], np.take(table, ids, axis=axis))


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND by NumPy's advanced indexing, one batch at a time."""
    if batch_dims == 0:
        return data[tuple(np.moveaxis(indices, -1, 0))]
    return np.stack([gather_nd(d, i, batch_dims - 1) for d, i in zip(data, indices)])


@pytest.mark.parametrize("data_shape, indices_shape, batch_dims", [
    ((3, 4, 5), (2, 2), 0),  # whole rows of the last dim
    ((3, 4, 5), (6, 3), 0),  # single elements
    ((2, 6, 4), (2, 3, 1), 1),
    ((2, 3, 4, 5), (2, 3, 2, 1), 2),
    ((4, 5), (2,), 0),  # one element: a rank-0 result
])
def test_gather_nd_reads_data_at_the_looked_up_indices(kit, device, data_shape, indices_shape, batch_dims):
    """Negative indices count from the end; the consumer (a Relu) runs in the same kernel."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal(data_shape).astype(F32)
    sizes = np.array(data_shape[batch_dims:batch_dims + indices_shape[-1]])
    ids = rng.integers(-sizes, sizes, indices_shape)
    g = Graph("gather_nd")
    xv = g.add_input("x", TensorType(x.shape, F32))
    picked = kit.add(g, "GatherND", [xv, g.add_constant(ids, name="ids")], {"batch_dims": batch_dims})
    relu = kit.add(g, "Relu", [picked])
    g.add_output(relu, "y")
    got, _ = kit.run_both(g, {"x": x}, device)
    np.testing.assert_array_equal(got["y"], np.maximum(gather_nd(x, ids, batch_dims), 0))
    assert [names for names, _ in kernel_sources(g)] == [[picked.node, relu.node]]


def test_gather_nd_of_a_bool_mask_and_of_a_packed_buffer(kit, device):
    """The `sdpa` attention's mask selection (bool data, (B, 1, 1, S, 2) indices), and rows of a
    buffer packed in 16-row tiles."""
    rng = np.random.default_rng(12)
    mask = rng.random((2, 16)) > 0.3
    ids = np.stack(np.broadcast_arrays(np.arange(2)[:, None, None, None], np.arange(16)), -1)
    table = rng.standard_normal((20, 6)).astype(F32)
    rows = rng.integers(-20, 20, (7, 1))
    enc = PackedEncoding((0,), (16,))
    g = Graph("gather_nd_mask")
    mv = g.add_input("mask", TensorType(mask.shape, np.bool_))
    g.add_output(kit.add(g, "GatherND", [mv, g.add_constant(ids, name="ids")]), "picked")
    tv = kit.add(g, "Pack", [g.add_input("table", TensorType(table.shape, F32))], {"encoding": enc}, encoding=enc)
    g.add_output(kit.add(g, "GatherND", [tv, g.add_constant(rows, name="rows")]), "rows")
    got, _ = kit.run_both(g, {"mask": mask, "table": table}, device)
    np.testing.assert_array_equal(got["picked"], gather_nd(mask, ids, 0))
    assert got["picked"].shape == (2, 1, 1, 16) and got["picked"].dtype == np.bool_
    np.testing.assert_array_equal(got["rows"], gather_nd(table, rows, 0))


def test_gather_nd_conformance_cases_on_float_data(kit, device):
    kit.check_conformance("GatherND", device, keep=lambda case: kit.first_input(case).dtype == F32)


@pytest.mark.parametrize("dtype, axis", [(F32, 1), (np.int64, 0), (np.bool_, -1)])
def test_gather_elements_reads_along_one_axis(kit, device, dtype, axis):
    rng = np.random.default_rng(16)
    normal = rng.standard_normal((3, 5, 4))
    x = normal > 0 if dtype == np.bool_ else (normal * 2**33).astype(dtype)
    shape = list(x.shape)
    shape[axis] = 6
    ids = rng.integers(-x.shape[axis], x.shape[axis], shape)
    g = Graph("gather_elements")
    xv = g.add_input("x", TensorType(x.shape, dtype))
    g.add_output(kit.add(g, "GatherElements", [xv, g.add_constant(ids, name="ids")], {"axis": axis}), "y")
    got, _ = kit.run_both(g, {"x": x}, device)
    np.testing.assert_array_equal(got["y"], np.take_along_axis(x, ids % x.shape[axis], axis))


def test_gather_elements_conformance_cases(kit, device):
    kit.check_conformance("GatherElements", device)


def test_integer_chains_compute_ids_exactly_in_their_own_type(kit, device):
    """Position ids the way RoBERTa and OPT make them, on int64 values past float32's 2**24
    (which a float32 chain would round): comparisons, selects, arithmetic, an int32 cast and
    an int64 splat constant, in one kernel with the Gather that reads the embedding."""
    rng = np.random.default_rng(13)
    ids = rng.integers(0, 5, (2, 7))
    big = rng.integers(-2**40, 2**40, (2, 7))
    table = rng.standard_normal((50, 3)).astype(F32)
    g = Graph("ids")
    iv = g.add_input("ids", TensorType(ids.shape, np.int64))
    bv = g.add_input("big", TensorType(big.shape, np.int64))
    pad = g.add_constant(Splat(1, (), np.int64), name="pad")
    keep = kit.add(g, "Not", [kit.add(g, "Equal", [iv, pad])])
    step = kit.add(g, "Cast", [keep], {"to": 7})
    shifted = kit.add(g, "Add", [kit.add(g, "Mul", [bv, step]), pad])
    g.add_output(kit.add(g, "Sub", [kit.add(g, "Abs", [shifted]), kit.add(g, "Neg", [bv])]), "arith")
    positions = kit.add(g, "Where", [keep, kit.add(g, "Add", [iv, iv]), pad])
    g.add_output(kit.add(g, "Cast", [positions], {"to": 6}), "int32")
    g.add_output(kit.add(g, "Gather", [g.add_constant(table, name="table"), positions], {"axis": 0}), "rows")
    low, high = g.add_constant(Splat(2, (), np.int64), name="low"), g.add_constant(Splat(6, (), np.int64), name="high")
    g.add_output(kit.add(g, "Clip", [kit.add(g, "Concat", [iv, positions], {"axis": 1}), low, high]), "clipped")
    got, _ = kit.run_both(g, {"ids": ids, "big": big}, device)
    keep_ = ids != 1
    want_positions = np.where(keep_, 2 * ids, 1)
    np.testing.assert_array_equal(got["arith"], np.abs(big * keep_ + 1) + big)
    np.testing.assert_array_equal(got["int32"], want_positions.astype(np.int32))
    assert got["int32"].dtype == np.int32
    np.testing.assert_array_equal(got["rows"], table[want_positions])
    np.testing.assert_array_equal(got["clipped"], np.clip(np.concatenate([ids, want_positions], 1), 2, 6))


SMALL_INTEGERS = [np.int8, np.uint8, np.int16, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", SMALL_INTEGERS)
def test_narrow_and_unsigned_integer_chains_wrap_as_numpy_does(kit, device, dtype):
    """Products and sums that overflow the type, Max/Min, comparisons and selects, bitwise
    not, shifts past the width (0, or the sign for a signed right shift), casts that wrap
    (int64 -> dtype) and widen (dtype -> float32), and a gather of a table of dtype: one
    kernel each, nothing on the host, equal to the NumPy backend bit for bit."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(15)
    a, b = (rng.integers(info.min, info.max, (3, 5), dtype=dtype, endpoint=True) for _ in range(2))
    wide = rng.integers(-2**40, 2**40, (3, 5))
    shifts = rng.integers(0, 8 * np.dtype(dtype).itemsize + 4, (3, 5)).astype(dtype)
    g = Graph("small_ints")
    av, bv = (g.add_input(n, TensorType(v.shape, dtype)) for n, v in (("a", a), ("b", b)))
    sv = g.add_input("s", TensorType(shifts.shape, dtype))
    wv = g.add_input("wide", TensorType(wide.shape, np.int64))
    three = g.add_constant(Splat(3, (), dtype), name="three")
    g.add_output(kit.add(g, "Add", [kit.add(g, "Mul", [av, bv]), three]), "mul_add")
    g.add_output(kit.add(g, "Sub", [kit.add(g, "Max", [av, bv]), kit.add(g, "Min", [av, bv])]), "spread")
    g.add_output(kit.add(g, "Where", [kit.add(g, "Greater", [av, bv]), av, three]), "select")
    g.add_output(kit.add(g, "BitwiseNot", [av]), "not")
    for direction in ("LEFT", "RIGHT"):
        g.add_output(kit.add(g, "BitShift", [av, sv], {"direction": direction}), direction.lower())
    g.add_output(kit.add(g, "Cast", [wv], {"to": np_dtype_to_tensor_dtype(np.dtype(dtype))}), "narrowed")
    g.add_output(kit.add(g, "Cast", [av], {"to": np_dtype_to_tensor_dtype(np.dtype(F32))}), "widened")
    table = g.add_constant(rng.integers(info.min, info.max, (9, 2), dtype=dtype, endpoint=True), name="table")
    picks = g.add_constant(rng.integers(-9, 9, (4,)), name="picks")
    g.add_output(kit.add(g, "Gather", [table, picks], {"axis": 0}), "rows")
    feeds = {"a": a, "b": b, "s": shifts, "wide": wide}
    got, want = kit.run_both(g, feeds, device)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got["mul_add"], a * b + dtype(3))
    np.testing.assert_array_equal(got["narrowed"], wide.astype(dtype))
    np.testing.assert_array_equal(got["not"], ~a)


def test_integer_division_rounds_toward_zero_and_float_activations_stay_on_the_host(kit, device):
    """Div of signed integers as ONNX has it (toward zero, not floor), with NumPy's answers
    where a GPU's are undefined (0 for a zero divisor, the most negative value over -1
    wraps); a float-only activation (Relu) on integers runs on the host."""
    rng = np.random.default_rng(14)
    for dtype in (np.int64, np.int32, np.int8, np.uint16):
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, (4, 6), dtype=dtype, endpoint=True)
        b = rng.integers(-5 if info.min else 0, 6, (4, 6)).astype(dtype)
        a[0, :2], b[0, :2] = info.min, (-1 if info.min else 3)
        g = Graph("int_div")
        av, bv = (g.add_input(n, TensorType(v.shape, dtype)) for n, v in (("a", a), ("b", b)))
        g.add_output(kit.add(g, "Div", [av, bv]), "y")
        got, want = kit.run_both(g, {"a": a, "b": b}, device)
        np.testing.assert_array_equal(got["y"], want["y"], err_msg=str(dtype))
        assert got["y"].dtype == dtype
        nonzero = b != 0
        pairs = [(int(x), int(y)) for x, y in zip(a[nonzero][2:], b[nonzero][2:])]
        truncated = [abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) for x, y in pairs]
        np.testing.assert_array_equal(got["y"][nonzero][2:], np.array(truncated, dtype))
        assert (got["y"][~nonzero] == 0).all()
    g = Graph("int_relu")
    x = g.add_input("x", TensorType((3, 4), np.int64))
    relu = kit.add(g, "Relu", [x])
    g.add_output(relu, "y")
    exe = TritonExecutable(g, device=device)
    ints = rng.integers(-20, 20, (3, 4))
    np.testing.assert_array_equal(exe({"x": ints})["y"], np.maximum(ints, 0))
    assert exe.fallback_nodes == [relu.node]


def test_scalar_results_and_a_gather_of_one_row(kit, device):
    """Rank-0 indices (BERT's [CLS] token select) and a rank-0 chain result."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 5)).astype(F32)
    g = Graph("scalars")
    xv = g.add_input("x", TensorType(x.shape, F32))
    row = kit.add(g, "Gather", [xv, g.add_constant(np.array(-2, np.int64), name="i")], {"axis": 0})
    g.add_output(kit.add(g, "Relu", [row]), "row")
    one = kit.add(g, "Gather", [row, g.add_constant(np.array(3, np.int64), name="j")], {"axis": 0})
    g.add_output(kit.add(g, "Exp", [one]), "one")
    got, _ = kit.run_both(g, {"x": x}, device)
    np.testing.assert_array_equal(got["row"], np.maximum(x[-2], 0))
    np.testing.assert_allclose(got["one"], np.exp(x[-2, 3]), rtol=1e-6)
    assert got["one"].shape == ()


@pytest.mark.parametrize("op", ["Relu", "Max", "Min", "Clip", "HardSigmoid", "HardSwish"])
def test_nan_in_nan_out_like_the_numpy_backend(kit, device, op):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 7)).astype(F32)
    x[1, 2] = np.nan
    g = Graph("nan")
    xv = g.add_input("x", TensorType(x.shape, F32))
    extra = {"Max": [g.add_constant(Splat(0.1, (), F32), name="c")], "Min": [g.add_constant(Splat(0.1, (), F32),
                                                                                         name="c")],
             "Clip": [g.add_constant(Splat(-0.5, (), F32), name="lo"), g.add_constant(Splat(0.5, (), F32), name="hi")]}
    g.add_output(kit.add(g, op, [xv, *extra.get(op, [])]), "y")
    got, want = kit.run_both(g, {"x": x}, device)
    assert np.isnan(got["y"][1, 2])
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-7)


def test_expand_slice_and_concat_heads(kit, device):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 1, 6)).astype(F32)
    y = rng.standard_normal((3, 4, 6)).astype(F32)
    enc = PackedEncoding((2,), (4,))
    g = Graph("moves")
    xv = g.add_input("x", TensorType(x.shape, F32))
    yv = kit.add(g, "Pack", [g.add_input("y", TensorType(y.shape, F32))], {"encoding": enc}, encoding=enc)
    e = kit.add(g, "Expand", [xv, g.add_constant(np.array([2, 3, 4, 6], np.int64), name="shape")])
    g.add_output(kit.add(g, "Neg", [e]), "expanded")
    const = {name: g.add_constant(np.array(v, np.int64), name=name)
             for name, v in (("starts", [-1, 1]), ("ends", [-100, 6]), ("axes", [2, 1]), ("steps", [-2, 2]))}
    g.add_output(kit.add(g, "Slice", [yv, const["starts"], const["ends"], const["axes"], const["steps"]]), "sliced")
    g.add_output(kit.add(g, "Concat", [yv, xv, yv], {"axis": 1}), "joined")
    got, want = kit.run_both(g, {"x": x, "y": y}, device)
    np.testing.assert_array_equal(got["expanded"], -np.broadcast_to(x, (2, 3, 4, 6)))
    np.testing.assert_array_equal(got["sliced"], y[:, 1:6:2, -1::-2])
    np.testing.assert_array_equal(got["joined"], np.concatenate([y, x, y], axis=1))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("to,dtype", [(9, np.bool_), (1, np.float32), (10, np.float16), (16, ml_dtypes.bfloat16)])
def test_cast_from_integers(kit, device, to, dtype):
    ids = np.random.default_rng(12).integers(-3000, 3000, (4, 7))
    ids[0, :3] = 0
    g = Graph("cast")
    g.add_output(kit.add(g, "Cast", [g.add_input("ids", TensorType(ids.shape, np.int64))], {"to": to}), "y")
    if dtype is ml_dtypes.bfloat16:  # the NumPy backend has no bfloat16: ml_dtypes' conversion is the reference
        got = TritonExecutable(g, device=device)({"ids": ids})
        np.testing.assert_array_equal(got["y"].view(np.uint16), ids.astype(dtype).view(np.uint16))
        return
    got, want = kit.run_both(g, {"ids": ids}, device)
    np.testing.assert_array_equal(got["y"], ids.astype(dtype))
    np.testing.assert_array_equal(got["y"], want["y"])


def test_float32_narrows_to_bfloat16_rounding_to_nearest_even(kit, device):
    """As a GPU's cvt.rn, ml_dtypes and torch: ties to even, NaN stays NaN, infinities and
    signed zeros kept (Triton's interpreter truncates; tilefold's interpreted kernels round)."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal(64).astype(F32) * np.float32(1000)
    ties = (np.arange(8, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x3F808000)  # 1.0039..: exactly half an ulp
    x[:8] = ties.view(F32)
    x[8:12] = [np.inf, -np.inf, np.nan, -0.0]
    g = Graph("narrow")
    g.add_output(kit.add(g, "Cast", [g.add_input("x", TensorType(x.shape, F32))], {"to": 16}), "y")
    got = TritonExecutable(g, device=device)({"x": x})["y"]
    nan = np.isnan(x)  # a NaN's payload is the hardware's (cvt.rn gives 0x7fff, ml_dtypes 0x7fc0)
    assert np.isnan(got[nan].astype(F32)).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint16), x[~nan].astype(ml_dtypes.bfloat16).view(np.uint16))


def _bn_params(rng: np.random.Generator, c: int) -> list[np.ndarray]:
    """scale, bias, mean, var of a BatchNormalization over c channels (var > 0)."""
    return [rng.uniform(0.5, 1.5, c).astype(F32), rng.standard_normal(c).astype(F32),
            rng.standard_normal(c).astype(F32), rng.uniform(0.2, 2.0, c).astype(F32)]


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "nchw_c4"])
def test_batch_norm_reads_its_vectors_per_channel_and_fuses_with_relu(kit, device, packed):
    """DenseNet's BatchNormalization after a Concat (nothing to fold it into) runs in the chain,
    its vectors read at the channel index, plain or tiled like the activation."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 6, 5, 3)).astype(F32)
    params = _bn_params(rng, 6)
    enc = PackedEncoding((1,), (4,), (0, 2, 3, 1)) if packed else None
    vec = PackedEncoding((0,), (4,)) if packed else None
    g = Graph("bn")
    xv = g.add_input("x", TensorType(x.shape, F32))
    if packed:
        xv = kit.add(g, "Pack", [xv], {"encoding": enc}, encoding=enc)
    consts = [kit.packed_const(g, p, vec, f"p{k}") if packed else g.add_constant(p, name=f"p{k}")
              for k, p in enumerate(params)]
    y = kit.add(g, "BatchNormalization", [xv, *consts], {"epsilon": 1e-3}, encoding=enc)
    y = kit.add(g, "Relu", [y], encoding=enc)
    if packed:
        y = kit.add(g, "Unpack", [y])
    g.add_output(y, "y")
    got, want = kit.run_both(g, {"x": x}, device)
    scale, bias, mean, var = (p.reshape(6, 1, 1) for p in params)
    exact = np.maximum((x - mean) / np.sqrt(var + 1e-3) * scale + bias, 0)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["y"], exact, rtol=1e-5, atol=1e-5)
    assert len([k for k, src in kernel_sources(g) if "tl.store" in src]) == 1


def test_batch_norm_as_a_convolution_epilogue(kit, device):
    """Conv -> BatchNormalization unfolded (a graph not optimized): the vectors are read at
    the conv kernel's output-channel index."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 3, 6, 6)).astype(F32)
    w = (rng.standard_normal((5, 3, 3, 3)) * 0.3).astype(F32)
    g = Graph("conv_bn")
    c = kit.add(g, "Conv", [g.add_input("x", TensorType(x.shape, F32)), g.add_constant(w, name="w")],
                {"pads": [1, 1, 1, 1]})
    consts = [g.add_constant(p, name=f"p{k}") for k, p in enumerate(_bn_params(rng, 5))]
    g.add_output(kit.add(g, "BatchNormalization", [c, *consts]), "y")
    got, want = kit.run_both(g, {"x": x}, device)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
    assert [k for k, src in kernel_sources(g)] == [["conv", "batchnormalization"]]


@pytest.mark.parametrize("exponent", [2.0, 3.0, -2.0, 0.5, -0.5, 1.5, -0.75, 0.0, 7.0])
@pytest.mark.parametrize("form", ["splat", "array"])
def test_pow_by_a_constant_exponent(kit, device, exponent, form):
    """Llama's RMSNorm squares with a 0-d array exponent (what torch.fx gives), not a splat;
    whole powers keep a negative base's sign, fractional ones give NaN there like powf."""
    x = np.random.default_rng(13).standard_normal((6, 11)).astype(F32) * 2
    x[0, :3] = [0.0, -0.0, np.nan]
    g = Graph("pow")
    e = Splat(exponent, (), F32) if form == "splat" else np.array(exponent, F32)
    y = kit.add(g, "Pow", [g.add_input("x", TensorType(x.shape, F32)), g.add_constant(e, name="e")])
    g.add_output(y, "y")
    got, want = kit.run_both(g, {"x": x}, device)
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.float64), exponent).astype(F32)
    np.testing.assert_allclose(got["y"], want["y"], rtol=2e-6, atol=0)
    np.testing.assert_allclose(got["y"], exact, rtol=2e-6, atol=0)


def test_pow_of_bfloat16_by_a_bfloat16_exponent_runs_in_a_kernel(kit, device):
    """A bfloat16 GPT-2's GELU cubes by a bfloat16 0-d array (NumPy's kind "V", not "f"): a
    kernel computes it, rounded to bfloat16 as the cube of the rounded input; the NumPy
    backend, which has no bfloat16, would refuse it."""
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    x = (np.random.default_rng(15).standard_normal((6, 11)) * 2).astype(bf16)
    g = Graph("pow_bf16")
    y = kit.add(g, "Pow", [g.add_input("x", TensorType(x.shape, bf16)), g.add_constant(np.array(3.0, bf16), name="e")])
    g.add_output(y, "y")
    exe = TritonExecutable(g, device=device)
    got = exe({"x": x})["y"]
    assert exe.fallback_nodes == []
    np.testing.assert_array_equal(got.astype(F32), (x.astype(np.float64) ** 3).astype(F32).astype(bf16).astype(F32))


def test_pow_by_a_large_whole_or_a_computed_exponent_stays_on_numpy(kit, device):
    g = Graph("pow")
    x = g.add_input("x", TensorType((4, 5), F32))
    big = kit.add(g, "Pow", [x, g.add_constant(np.array(11.0, F32), name="eleven")], name="big")
    varying = kit.add(g, "Pow", [x, g.add_input("e", TensorType((4, 5), F32))], name="varying")
    g.add_output(big, "a")
    g.add_output(varying, "b")
    rng = np.random.default_rng(14)
    feeds = {"x": rng.standard_normal((4, 5)).astype(F32), "e": rng.integers(-3, 4, (4, 5)).astype(F32)}
    exe = TritonExecutable(g, device=device)
    got = exe(feeds)
    assert sorted(exe.fallback_nodes) == ["big", "varying"]
    np.testing.assert_allclose(got["a"], feeds["x"] ** 11, rtol=1e-6)
    np.testing.assert_allclose(got["b"], feeds["x"] ** feeds["e"], rtol=1e-6)


@pytest.mark.parametrize("op", ["DepthToSpace", "SpaceToDepth", "Tile", "Trilu"])
def test_index_remapping_heads_pass_the_conformance_cases(kit, device, op):
    """Every case on float32 or int64 data, its other inputs made constants (the block orders
    DCR and CRD, repeats, the triangles above and below k, square and not), but SpaceToDepth's
    CRD mode: opset 28 added it, and tilefold reads opset 21, which has no such mode."""
    kit.check_conformance(op, device, keep=lambda case: kit.first_input(case).dtype in (F32, np.int64)
                          and case.name != "test_spacetodepth_crd_mode_example")


def test_remapping_heads_read_packed_and_integer_operands(kit, device):
    """DepthToSpace then SpaceToDepth of an NCHWc16 buffer gives the operand back; Tile and an
    upper Trilu with k = -1 of int64 values."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 36, 5, 3)).astype(F32)
    ids = rng.integers(-2**40, 2**40, (4, 5))
    enc = PackedEncoding((1,), (16,))
    g = Graph("remap")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": enc}, encoding=enc)
    wide = kit.add(g, "DepthToSpace", [xp], {"blocksize": 3, "mode": "CRD"})
    g.add_output(kit.add(g, "SpaceToDepth", [wide], {"blocksize": 3}), "round_trip")
    g.add_output(wide, "wide")
    iv = g.add_input("ids", TensorType(ids.shape, np.int64))
    tiled = kit.add(g, "Tile", [iv, g.add_constant(np.array([2, 3], np.int64), name="repeats")])
    g.add_output(kit.add(g, "Trilu", [tiled, g.add_constant(np.array(-1, np.int64), name="k")]), "upper")
    got, _ = kit.run_both(g, {"x": x, "ids": ids}, device)
    crd = x.reshape(2, 4, 3, 3, 5, 3).transpose(0, 1, 4, 2, 5, 3).reshape(2, 4, 15, 9)
    np.testing.assert_array_equal(got["wide"], crd)
    dcr_of_crd = crd.reshape(2, 4, 5, 3, 3, 3).transpose(0, 3, 5, 1, 2, 4).reshape(2, 36, 5, 3)
    np.testing.assert_array_equal(got["round_trip"], dcr_of_crd)
    np.testing.assert_array_equal(got["upper"], np.triu(np.tile(ids, (2, 3)), -1))


@pytest.mark.parametrize("op", ["PRelu", "Sign", "Mean"])
def test_prelu_sign_and_mean_pass_the_conformance_cases(kit, device, op):
    kit.check_conformance(op, device, keep=lambda case: kit.first_input(case).dtype == F32, rtol=1e-6, atol=1e-7)


def test_prelu_with_a_per_channel_slope_on_nchwc16_and_sign_of_nan(kit, device):
    rng = np.random.default_rng(18)
    x = rng.standard_normal((2, 20, 3, 3)).astype(F32)
    x[0, 1, 2, 2] = np.nan
    slope = rng.standard_normal((20, 1, 1)).astype(F32)
    enc = PackedEncoding((1,), (16,))
    g = Graph("prelu")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": enc}, encoding=enc)
    y = kit.add(g, "PRelu", [xp, g.add_constant(slope, name="slope")], encoding=enc)
    g.add_output(kit.add(g, "Unpack", [kit.add(g, "Sign", [y], encoding=enc)]), "sign")
    g.add_output(kit.add(g, "Unpack", [y]), "prelu")
    got, _ = kit.run_both(g, {"x": x}, device)
    np.testing.assert_array_equal(got["prelu"], np.where(x < 0, x * slope, x))
    np.testing.assert_array_equal(got["sign"], np.sign(np.where(x < 0, x * slope, x)))


# ---- float math of libm.py, remainders and bits -------------------------------------------------------

LIBM_UNARY = {"Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh,
              "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh}
"""Ops computed in float64 by libm.py helpers (Triton's interpreter has no libdevice)."""

DOMAIN = {"Asin": (-1.25, 1.25), "Acos": (-1.25, 1.25), "Atanh": (-1.25, 1.25), "Acosh": (0.5, 6.0)}
"""Where an op's random inputs are drawn, past its domain too (NaN there); others: normal * 4."""

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-30, -3e-6, 95.0]
"""Values every unary op meets: zeros of both signs, infinities, NaN, its domain's ends, a
tiny argument (where a formula would cancel), one whose sinh and cosh overflow float32."""


@pytest.mark.parametrize("op", sorted(LIBM_UNARY))
def test_inverse_trigonometry_and_hyperbolics_are_the_float64_value_rounded(kit, device, op):
    """On an operand packed in ragged tiles: the float64 function's value rounded to float32,
    to within an ulp (the interpreter gives it bit for bit), NaN exactly where NumPy gives
    NaN, the signs of zeros and infinities kept; NumPy's float32 functions (the NumPy backend)
    agree to 3e-7 (2 ulps), their own error."""
    rng = np.random.default_rng(sorted(LIBM_UNARY).index(op))
    lo, hi = DOMAIN.get(op, (None, None))
    x = (rng.uniform(lo, hi, (13, 37)) if lo is not None else rng.standard_normal((13, 37)) * 4).astype(F32)
    x.reshape(-1)[:len(SPECIAL)] = SPECIAL
    got, want = kit.run_both(_unary_graph(kit, op, {}, RAGGED), {"x": x}, device)
    y = got["y"]
    with np.errstate(all="ignore"):
        exact = LIBM_UNARY[op](x.astype(np.float64)).astype(F32)
    nan = np.isnan(exact)
    np.testing.assert_array_equal(np.isnan(y), nan)
    np.testing.assert_array_equal(np.signbit(y[~nan]), np.signbit(exact[~nan]))
    np.testing.assert_array_max_ulp(y[~nan], exact[~nan], maxulp=1)
    np.testing.assert_allclose(y, want["y"], rtol=3e-7, atol=0)


@pytest.mark.parametrize("op", [*sorted(LIBM_UNARY), "Round"])
def test_libm_ops_pass_the_conformance_cases(kit, device, op):
    """Their float32 cases. NumPy's float32 functions computed the expected answers, so those
    are 2 ulps (3e-7) off at worst, NumPy's own error."""
    kit.check_conformance(op, device, keep=lambda case: kit.first_input(case).dtype == F32, rtol=3e-7)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit (the sign of a zero included), NaN where `want` is NaN."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8))


def test_round_takes_halves_to_even_like_numpy(kit, device):
    """Halves go to the even neighbour (2.5 -> 2, -0.5 -> -0), the float below a half rounds
    down, floats from 2**23 on are whole already, and +-inf, NaN and the sign of zero come
    through: np.rint bit for bit, on an operand packed in ragged tiles."""
    rng = np.random.default_rng(20)
    x = np.concatenate([np.arange(-40, 41) / 2, rng.standard_normal(300) * 1e3, rng.standard_normal(60) * 1e8,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 8388607.5, -8388607.5, 8388609.0, 0.49999997,
                         -0.49999997, 1e-45, -1e-45]])
    x = np.resize(x, (7, 71)).astype(F32)
    got, want = kit.run_both(_unary_graph(kit, "Round", {}, RAGGED, (7, 71)), {"x": x}, device)
    _same_bits(got["y"], np.rint(x))
    _same_bits(got["y"], want["y"])


def _every_magnitude(rng: np.random.Generator, n: int, dtype: type) -> np.ndarray:
    """n floats of both signs spread over every binade of `dtype`, subnormals included."""
    info = np.finfo(dtype)
    exponents = rng.integers(int(np.log2(info.smallest_subnormal)), info.maxexp, n)
    return (rng.uniform(-1, 1, n) * np.exp2(exponents.astype(np.float64))).astype(dtype)


@pytest.mark.parametrize("dtype", [F32, np.float16])
@pytest.mark.parametrize("fmod", [0, 1])
def test_float_mod_is_exact_with_the_sign_numpy_gives(kit, device, dtype, fmod):
    """Mod of floats of every magnitude (quotients up to 2**276, where a - trunc(a/b) * b is
    garbage), of small whole numbers and of every pair of specials, the divisor packed in
    16-tiles: np.mod (fmod=0: the divisor's sign, zeros too) or np.fmod (fmod=1: the dividend's)
    bit for bit; NaN for a zero divisor, an infinite dividend or a NaN, the dividend for an
    infinite divisor (with fmod=0, the divisor where the signs differ)."""
    rng = np.random.default_rng(21 + fmod)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.0, -3.0])
    sa, sb = np.meshgrid(specials, specials)
    a = np.concatenate([_every_magnitude(rng, 200, dtype), rng.integers(-30, 31, 200), sa.ravel()]).astype(dtype)
    b = np.concatenate([_every_magnitude(rng, 200, dtype), rng.integers(-6, 7, 200), sb.ravel()]).astype(dtype)
    enc = PackedEncoding((0,), (16,))
    g = Graph("mod")
    av = g.add_input("a", TensorType(a.shape, dtype))
    bv = kit.add(g, "Pack", [g.add_input("b", TensorType(b.shape, dtype))], {"encoding": enc}, encoding=enc)
    g.add_output(kit.add(g, "Mod", [av, bv], {"fmod": fmod}), "y")
    got, want = kit.run_both(g, {"a": a, "b": b}, device)
    with np.errstate(all="ignore"):
        _same_bits(got["y"], (np.fmod if fmod else np.mod)(a, b))
    _same_bits(got["y"], want["y"])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_mod_has_the_divisors_or_the_dividends_sign(kit, device, dtype, fmod):
    """Values over the whole type (past 2**24, its minimum and maximum) by a broadcast row of
    divisors of both signs, -1 (the minimum's quotient overflows) and 0: np.mod (fmod=0, the
    divisor's sign, as ONNX asks of integers) or np.fmod (fmod=1, the dividend's) exactly, 0
    for a zero divisor as NumPy gives."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(23)
    a = rng.integers(info.min, info.max, (6, 23), dtype=dtype, endpoint=True)
    a[:, :4] = [info.min, info.max, -1, 0]
    b = rng.integers(-2**20, 2**20, 23).astype(dtype)
    b[:6] = [-1, 0, 7, -7, info.min, info.max]
    g = Graph("int_mod")
    av = g.add_input("a", TensorType(a.shape, dtype))
    g.add_output(kit.add(g, "Mod", [av, g.add_input("b", TensorType(b.shape, dtype))], {"fmod": fmod}), "y")
    got, want = kit.run_both(g, {"a": a, "b": b}, device)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got["y"], (np.fmod if fmod else np.mod)(a, b))
    np.testing.assert_array_equal(got["y"], want["y"])
    assert got["y"].dtype == dtype


def test_mod_passes_the_conformance_cases(kit, device):
    """The float32, float16 and integer cases tilefold reads (fmod=1 on floats; both on
    integers), then the float cases with fmod=0 that only opset 28 defines, built by hand."""
    kept = (F32, np.float16, np.int32, np.int64, *SMALL_INTEGERS)
    kit.check_conformance("Mod", device, keep=lambda case: kit.first_input(case).dtype in kept
                          and "fmod_0" not in case.name, least=6)
    kit.check_conformance("Mod", device, keep=lambda case: kit.first_input(case).dtype in kept
                          and "fmod_0" in case.name, least=4, by_hand=True)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_bitwise_ops_keep_every_bit_of_the_integer_type(kit, device, dtype):
    """And, Or and Xor with a broadcast row, and Not, of values over the whole type."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(24)
    a = rng.integers(info.min, info.max, (5, 19), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, 19, dtype=dtype, endpoint=True)
    g = Graph("bits")
    av = g.add_input("a", TensorType(a.shape, dtype))
    bv = g.add_input("b", TensorType(b.shape, dtype))
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        g.add_output(kit.add(g, op, [av, bv]), op)
    g.add_output(kit.add(g, "BitwiseNot", [av]), "BitwiseNot")
    got, _ = kit.run_both(g, {"a": a, "b": b}, device)
    np.testing.assert_array_equal(got["BitwiseAnd"], a & b)
    np.testing.assert_array_equal(got["BitwiseOr"], a | b)
    np.testing.assert_array_equal(got["BitwiseXor"], a ^ b)
    np.testing.assert_array_equal(got["BitwiseNot"], ~a)
    assert {got[name].dtype for name in got} == {np.dtype(dtype)}


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
def test_bitwise_ops_pass_the_conformance_cases(kit, device, op):
    """Every case: signed and unsigned integers of 8 to 64 bits."""
    kit.check_conformance(op, device, keep=lambda case: kit.first_input(case).dtype.kind in "iu", least=2)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_by_any_amount(kit, device, dtype, direction):
    """Values over the whole type shifted by -3 to width + 3: in range, the bits shifted out
    are lost (LEFT) or the sign fills (RIGHT, arithmetic); out of range, 0 or the sign fill,
    as NumPy gives and ONNX opset 28 asks."""
    info = np.iinfo(dtype)
    width = 8 * np.dtype(dtype).itemsize
    rng = np.random.default_rng(25)
    x = rng.integers(info.min, info.max, (5, 19), dtype=dtype, endpoint=True)
    y = rng.integers(-3, width + 4, (5, 19)).astype(dtype)
    y[0, :4] = [0, width - 1, width, -1]
    g = Graph("shift")
    xv = g.add_input("x", TensorType(x.shape, dtype))
    yv = g.add_input("y", TensorType(y.shape, dtype))
    g.add_output(kit.add(g, "BitShift", [xv, yv], {"direction": direction}), "z")
    got, want = kit.run_both(g, {"x": x, "y": y}, device)
    np.testing.assert_array_equal(got["z"], (np.left_shift if direction == "LEFT" else np.right_shift)(x, y))
    np.testing.assert_array_equal(got["z"], want["z"])


def test_bit_shift_passes_the_conformance_cases(kit, device):
    """The unsigned cases tilefold reads; then the signed ones (shifts past the width, negative
    shifts, negative values), which only opset 28 defines: built by hand."""
    kit.check_conformance("BitShift", device, keep=lambda case: kit.first_input(case).dtype.kind == "u", least=8)
    kit.check_conformance("BitShift", device, keep=lambda case: kit.first_input(case).dtype.kind == "i",
                          least=20, by_hand=True)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Max", "Min", "Clip", "Equal", "Less", "LessOrEqual", "Greater",
                                "GreaterOrEqual"])
def test_narrow_and_unsigned_integer_conformance_cases(kit, device, op):
    kit.check_conformance(op, device, keep=lambda case: kit.first_input(case).dtype in SMALL_INTEGERS)


def test_cast_like_takes_only_the_dtype_of_its_second_operand(kit, device):
    """The `like` operand is never loaded: an empty one, one of higher rank than the result,
    an int32 one; the casts are Cast's (float32 to float16 rounded to nearest even, int64 ids
    past 2**24 to float32, float32 to int32 toward zero)."""
    rng = np.random.default_rng(26)
    x = (rng.standard_normal((5, 11)) * 1e3).astype(F32)
    ids = rng.integers(-2**40, 2**40, (5, 11))
    g = Graph("cast_like")
    xv = g.add_input("x", TensorType(x.shape, F32))
    iv = g.add_input("ids", TensorType(ids.shape, np.int64))
    empty = g.add_constant(np.zeros((0,), np.float16), name="empty_like")
    wide = g.add_input("wide_like", TensorType((2, 5, 11), F32))
    int32 = g.add_constant(np.zeros((3,), np.int32), name="int32_like")
    g.add_output(kit.add(g, "CastLike", [xv, empty]), "half")
    g.add_output(kit.add(g, "CastLike", [iv, wide]), "float")
    g.add_output(kit.add(g, "CastLike", [kit.add(g, "Relu", [xv]), int32]), "int")
    feeds = {"x": x, "ids": ids, "wide_like": np.full((2, 5, 11), np.nan, F32)}
    got, _ = kit.run_both(g, feeds, device)
    np.testing.assert_array_equal(got["half"], x.astype(np.float16))
    np.testing.assert_array_equal(got["float"], ids.astype(F32))
    np.testing.assert_array_equal(got["int"], np.maximum(x, 0).astype(np.int32))
    assert [got[k].dtype for k in ("half", "float", "int")] == [np.float16, F32, np.int32]
    sources = "\n".join(src for _, src in kernel_sources(g))
    assert not any(name in sources for name in ("empty_like", "wide_like", "int32_like"))


def test_cast_like_passes_the_conformance_cases_between_float32_and_float16(kit, device):
    """NaN and the infinities included; float64, bfloat16 and the 8-, 4- and 2-bit types are no
    chain dtypes (those cases run on the NumPy backend)."""
    from onnx import TensorProto

    def between_float32_and_float16(case) -> bool:
        types = {value.type.tensor_type.elem_type for value in case.model.graph.input}
        return types <= {TensorProto.FLOAT, TensorProto.FLOAT16}

    kit.check_conformance("CastLike", device, keep=between_float32_and_float16, least=2)
