"""Fusion (fusion.py): a row op of its operand's shape (softmax, layer norm) takes the
elementwise ops after it as an epilogue; a value read by several nodes (the safe softmax's
Where(IsNaN(s), 0, s), SiLU's x * sigmoid(x), GPT-2's tanh GELU) stays in registers when the
region of its readers closes on one node; a reduction computes the chain that gives its row
as a prologue, and its epilogue goes on over the row where it keeps its dims (RMSNorm); a
group whose result only another group reads runs in that group's kernel where they fit (two
row ops over one row, chains read at one index); a Split ends a matmul's kernel. Each fused
kernel matches the NumPy backend on fresh random inputs; a value something outside the group
reads is still written."""
from __future__ import annotations

import numpy as np
import pytest

from tilefold.backends.triton.executor import kernel_plans, kernel_sources
from tilefold.backends.triton.launch import set_launch, verify_launch
from tilefold.graph import Graph
from tilefold.graph.errors import VerifyError
from tilefold.graph.types import TensorType, Value
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32


def _kernels(g: Graph) -> list[list[str]]:
    return [plan.nodes for plan in kernel_plans(g)]


def _check(kit, g: Graph, feeds: dict[str, np.ndarray], device: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got, want = kit.run_both(g, feeds, device)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def _masked_scores(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Scores with some rows wholly masked (-inf: their softmax is NaN) and some entries masked."""
    x = rng.standard_normal(shape).astype(F32)
    x[rng.random(shape) < 0.3] = -np.inf
    x[..., 1, :] = -np.inf
    return x


@pytest.mark.parametrize("length", [7, 33])
def test_a_softmax_and_its_nan_guard_are_one_kernel(kit, device, length):
    shape = (2, 3, 4, length)
    g = Graph("guard")
    s = kit.add(g, "Softmax", [g.add_input("x", TensorType(shape, F32))], {"axis": -1}, name="softmax")
    nan = kit.add(g, "IsNaN", [s], name="isnan")
    g.add_output(kit.add(g, "Where", [nan, g.add_constant(np.array(0, F32), name="zero"), s], name="guard"), "y")
    assert _kernels(g) == [["softmax", "isnan", "guard"]]
    x = _masked_scores(np.random.default_rng(length), shape)
    _check(kit, g, {"x": x}, device)
    got, _ = kit.run_both(g, {"x": x}, device)
    assert np.all(got["y"][:, :, 1, :] == 0) and np.all(np.isfinite(got["y"]))  # the guard's rows


def test_a_layer_norm_takes_an_elementwise_epilogue(kit, device):
    g = Graph("norm")
    rng = np.random.default_rng(1)
    x = g.add_input("x", TensorType((5, 37), F32))
    gamma, beta = rng.uniform(0.5, 1.5, 37).astype(F32), rng.standard_normal(37).astype(F32)
    y = kit.add(g, "LayerNormalization", [x, g.add_constant(gamma, name="g"), g.add_constant(beta, name="b")],
                {"axis": -1}, name="norm")
    y = kit.add(g, "Mul", [y, g.add_constant(rng.standard_normal((5, 1)).astype(F32), name="s")], name="scale")
    y = kit.add(g, "Relu", [y], name="relu")
    g.add_output(kit.add(g, "Cast", [y], {"to": 10}, name="half"), "y")  # float16
    assert _kernels(g) == [["norm", "scale", "relu", "half"]]
    # one float16 step: a last-bit difference in float32 (a GPU's sqrt) may round either way
    _check(kit, g, {"x": rng.standard_normal((5, 37)).astype(F32)}, device, rtol=1e-3, atol=1e-3)


def test_a_matmul_then_silu_is_one_kernel(kit, device):
    g = Graph("silu")
    rng = np.random.default_rng(2)
    m = kit.add(g, "MatMul", [g.add_input("x", TensorType((6, 20), F32)),
                              g.add_constant(rng.standard_normal((20, 18)).astype(F32), name="w")], name="mm")
    gate = kit.add(g, "Sigmoid", [m], name="gate")
    g.add_output(kit.add(g, "Mul", [m, gate], name="silu"), "y")
    assert _kernels(g) == [["mm", "gate", "silu"]]
    _check(kit, g, {"x": rng.standard_normal((6, 20)).astype(F32)}, device)


def test_the_node_closing_a_diamond_joins_the_group_that_waits_for_it(kit, device):
    """Sum(t, Neg(s), s), with t a chain of its own that Sum could join first: Sum must join
    the softmax's group, where s stays in registers; t's chain, of the row's shape and read by
    Sum alone, then runs in that kernel too."""
    g = Graph("owed")
    shape = (3, 10)
    s = kit.add(g, "Softmax", [g.add_input("x", TensorType(shape, F32))], {"axis": -1}, name="softmax")
    negated = kit.add(g, "Neg", [s], name="neg")
    t = kit.add(g, "Relu", [g.add_input("u", TensorType(shape, F32))], name="relu")
    g.add_output(kit.add(g, "Sum", [t, negated, s], name="sum"), "y")
    assert _kernels(g) == [["softmax", "neg", "relu", "sum"]]
    rng = np.random.default_rng(3)
    _check(kit, g, {"x": rng.standard_normal(shape).astype(F32), "u": rng.standard_normal(shape).astype(F32)}, device)


def test_a_value_read_outside_the_group_is_written(kit, device):
    """The softmax is also a graph output: the guard reads it from its buffer."""
    g = Graph("outside")
    shape = (2, 4, 9)
    s = kit.add(g, "Softmax", [g.add_input("x", TensorType(shape, F32))], {"axis": -1}, name="softmax")
    nan = kit.add(g, "IsNaN", [s], name="isnan")
    g.add_output(kit.add(g, "Where", [nan, g.add_constant(np.array(0, F32), name="zero"), s], name="guard"), "y")
    g.add_output(s, "probs")
    assert _kernels(g) == [["softmax"], ["isnan", "guard"]]
    _check(kit, g, {"x": _masked_scores(np.random.default_rng(4), shape)}, device)


@pytest.mark.parametrize("keepdims", [1, 0])
def test_a_float_reduction_takes_an_epilogue_on_its_one_value_per_row(kit, device, keepdims):
    """RMSNorm's rsqrt of a mean square: ReduceMean with its prologue (Pow, on the row) and
    its epilogue (Add, Sqrt and Reciprocal, once per row) in one kernel."""
    g = Graph("rms")
    x = g.add_input("x", TensorType((3, 4, 19), F32))
    square = kit.add(g, "Pow", [x, g.add_constant(np.array(2, F32), name="two")], name="square")
    mean = kit.add(g, "ReduceMean", [square, g.add_constant(np.array([-1], np.int64), name="axes")],
                   {"keepdims": keepdims}, name="mean")
    shifted = kit.add(g, "Add", [mean, g.add_constant(np.array(1e-6, F32), name="eps")], name="eps_add")
    root = kit.add(g, "Sqrt", [shifted], name="root")
    g.add_output(kit.add(g, "Reciprocal", [root], name="rstd"), "y")
    assert _kernels(g) == [["square", "mean", "eps_add", "root", "rstd"]]
    _check(kit, g, {"x": np.random.default_rng(6).standard_normal((3, 4, 19)).astype(F32)}, device)


def test_an_any_of_a_bool_row_takes_its_not(kit, device):
    """The sdpa guard's Not(ReduceMax(bool row)): one kernel."""
    g = Graph("any")
    b = g.add_input("b", TensorType((2, 3, 9), np.bool_))
    anything = kit.add(g, "ReduceMax", [b, g.add_constant(np.array([-1], np.int64), name="axes")], name="any")
    g.add_output(kit.add(g, "Not", [anything], name="none"), "y")
    assert _kernels(g) == [["any", "none"]]
    rows = np.random.default_rng(7).random((2, 3, 9)) < 0.1
    rows[0, 1] = False
    _check(kit, g, {"b": rows}, device)


def test_an_integer_reduction_takes_no_epilogue(kit, device):
    """Integer rows widen in registers (32-bit sums load as int64): their results are stored
    in their own type before anything reads them."""
    g = Graph("int_sum")
    total = kit.add(g, "ReduceSum", [g.add_input("x", TensorType((4, 11), np.int32)),
                                     g.add_constant(np.array([1], np.int64), name="axes")], name="total")
    g.add_output(kit.add(g, "Mul", [total, g.add_constant(np.array(3, np.int32), name="three")], name="times"), "y")
    assert _kernels(g) == [["total"], ["times"]]
    _check(kit, g, {"x": np.random.default_rng(8).integers(-2**30, 2**30, (4, 11)).astype(np.int32)}, device)


def _rms_norm(kit, g: Graph, x, weight: np.ndarray, name: str = "rms"):
    """LLaMA's RMSNorm as torch traces it: x * rsqrt(mean(x^2) + eps) * weight (in x's type)."""
    dtype = weight.dtype
    square = kit.add(g, "Pow", [x, g.add_constant(np.array(2, dtype), name=f"{name}_two")], name=f"{name}_square")
    mean = kit.add(g, "ReduceMean", [square, g.add_constant(np.array([-1], np.int64), name=f"{name}_axes")],
                   name=f"{name}_mean")
    shifted = kit.add(g, "Add", [mean, g.add_constant(np.array(1e-6, dtype), name=f"{name}_eps")],
                      name=f"{name}_eps_add")
    rstd = kit.add(g, "Reciprocal", [kit.add(g, "Sqrt", [shifted], name=f"{name}_root")], name=f"{name}_rstd")
    normed = kit.add(g, "Mul", [x, rstd], name=f"{name}_normed")
    return kit.add(g, "Mul", [normed, g.add_constant(weight, name=f"{name}_weight")], name=f"{name}_scaled")


@pytest.mark.parametrize("length", [16, 19])
def test_rms_norm_is_one_kernel_that_widens_from_its_row_statistic_to_the_row(kit, device, length):
    """The square is the mean's prologue, the rsqrt its epilogue on one value per row, and the
    two Muls go on over the whole row, reading x where the prologue read it."""
    g = Graph("rms")
    rng = np.random.default_rng(8)
    x = g.add_input("x", TensorType((2, 5, length), F32))
    g.add_output(_rms_norm(kit, g, x, rng.uniform(0.5, 1.5, length).astype(F32)), "y")
    assert _kernels(g) == [["rms_square", "rms_mean", "rms_eps_add", "rms_root", "rms_rstd", "rms_normed",
                            "rms_scaled"]]
    [(_, source)] = kernel_sources(g)
    assert sum("# x: float32" in line for line in source.splitlines()) == 1
    _check(kit, g, {"x": rng.standard_normal((2, 5, length)).astype(F32)}, device)


def _tanh_gelu(kit, g: Graph, x):
    """GPT-2's gelu_new as torch traces it: x is read by three nodes."""
    def const(value: float, name: str):
        return g.add_constant(np.array(value, F32), name=name)
    half = kit.add(g, "Mul", [x, const(0.5, "half")], name="halved")
    cube = kit.add(g, "Pow", [x, const(3.0, "three")], name="cube")
    inner = kit.add(g, "Add", [x, kit.add(g, "Mul", [cube, const(0.044715, "k")], name="scaled_cube")], name="inner")
    t = kit.add(g, "Tanh", [kit.add(g, "Mul", [inner, const(0.7978845608, "c")], name="pre")], name="tanh")
    return kit.add(g, "Mul", [half, kit.add(g, "Add", [t, const(1.0, "one")], name="plus_one")], name="gelu")


def test_a_tanh_gelu_that_reads_x_three_times_is_its_matmuls_epilogue(kit, device):
    g = Graph("gelu")
    rng = np.random.default_rng(9)
    m = kit.add(g, "MatMul", [g.add_input("x", TensorType((6, 20), F32)),
                              g.add_constant(rng.standard_normal((20, 18)).astype(F32), name="w")], name="mm")
    g.add_output(_tanh_gelu(kit, g, m), "y")
    assert _kernels(g) == [["mm", "halved", "cube", "scaled_cube", "inner", "pre", "tanh", "plus_one", "gelu"]]
    _check(kit, g, {"x": rng.standard_normal((6, 20)).astype(F32)}, device)


def test_a_region_that_does_not_close_on_elementwise_nodes_is_not_fused(kit, device):
    """x is read by a Relu and a Neg; the Neg is also a graph output, so no single node closes
    the region of x's readers: x is written, and each reader is a kernel of its own."""
    g = Graph("open")
    rng = np.random.default_rng(10)
    m = kit.add(g, "MatMul", [g.add_input("x", TensorType((5, 12), F32)),
                              g.add_constant(rng.standard_normal((12, 7)).astype(F32), name="w")], name="mm")
    negated = kit.add(g, "Neg", [m], name="neg")
    g.add_output(kit.add(g, "Add", [kit.add(g, "Relu", [m], name="relu"), negated], name="sum"), "y")
    g.add_output(negated, "negated")
    assert _kernels(g) == [["mm"], ["neg"], ["relu", "sum"]]
    _check(kit, g, {"x": rng.standard_normal((5, 12)).astype(F32)}, device)


def test_the_sdpa_guard_is_one_kernel_with_its_comparison_as_a_prologue(kit, device):
    """torch's safe softmax asks whether a row of scores is all -inf: Not(any(Not(x == -inf)))."""
    shape = (2, 3, 5, 9)
    g = Graph("guard")
    x = g.add_input("x", TensorType(shape, F32))
    masked = kit.add(g, "Equal", [x, g.add_constant(np.array(-np.inf, F32), name="ninf")], name="masked")
    kept = kit.add(g, "Not", [masked], name="kept")
    anything = kit.add(g, "ReduceMax", [kept, g.add_constant(np.array([-1], np.int64), name="axes")], name="any")
    g.add_output(kit.add(g, "Not", [anything], name="all_masked"), "y")
    assert _kernels(g) == [["masked", "kept", "any", "all_masked"]]
    scores = _masked_scores(np.random.default_rng(11), shape)
    got, _ = kit.run_both(g, {"x": scores}, device)
    assert got["y"][:, :, 1].all() and not got["y"][:, :, 0].all()  # row 1 is wholly masked
    _check(kit, g, {"x": scores}, device)


@pytest.mark.parametrize("op", ["Softmax", "LayerNormalization"])
def test_a_row_op_computes_the_chain_that_gives_its_row(kit, device, op):
    """A scaled softmax, a layer norm of a residual sum: one kernel each; the row is never stored."""
    g = Graph("prologue")
    rng = np.random.default_rng(12)
    shape = (3, 4, 21)
    total = kit.add(g, "Add", [g.add_input("a", TensorType(shape, F32)), g.add_input("b", TensorType(shape, F32))],
                    name="residual")
    scaled = kit.add(g, "Mul", [total, g.add_constant(np.array(0.125, F32), name="scale")], name="scaled")
    extra = [g.add_constant(rng.uniform(0.5, 1.5, 21).astype(F32), name="gamma")] if op != "Softmax" else []
    g.add_output(kit.add(g, op, [scaled, *extra], {"axis": -1}, name="row"), "y")
    assert _kernels(g) == [["residual", "scaled", "row"]]
    _check(kit, g, {"a": rng.standard_normal(shape).astype(F32), "b": rng.standard_normal(shape).astype(F32)}, device)


def test_a_chain_read_by_more_than_its_reduction_is_no_prologue(kit, device):
    g = Graph("shared")
    rng = np.random.default_rng(13)
    square = kit.add(g, "Mul", [g.add_input("x", TensorType((4, 10), F32)), g.add_input("z", TensorType((4, 10), F32))],
                     name="product")
    g.add_output(kit.add(g, "ReduceSum", [square, g.add_constant(np.array([1], np.int64), name="axes")], name="total"),
                 "y")
    g.add_output(square, "product")
    assert _kernels(g) == [["product"], ["total"]]
    _check(kit, g, {"x": rng.standard_normal((4, 10)).astype(F32), "z": rng.standard_normal((4, 10)).astype(F32)},
           device)


def test_a_reduction_that_drops_its_dims_does_not_widen_to_the_row(kit, device):
    """A column sum of shape (10,) broadcasts into x along rows: it is not x's per-row value, so
    the Mul is a kernel of its own."""
    g = Graph("dropped")
    x = g.add_input("x", TensorType((4, 10), F32))
    total = kit.add(g, "ReduceSum", [x, g.add_constant(np.array([0], np.int64), name="axes")], {"keepdims": 0},
                    name="total")
    g.add_output(kit.add(g, "Mul", [x, total], name="times"), "y")
    assert _kernels(g) == [["total"], ["times"]]
    _check(kit, g, {"x": np.random.default_rng(14).standard_normal((4, 10)).astype(F32)}, device)


def _safe_softmax(kit, g: Graph, x, *, name: str = "p"):
    """torch's safe softmax (sdpa attention with a mask): Where(all(x == -inf), 0, Softmax(x))."""
    probs = kit.add(g, "Softmax", [x], {"axis": -1}, name=f"{name}_softmax")
    masked = kit.add(g, "Equal", [x, g.add_constant(np.array(-np.inf, F32), name=f"{name}_ninf")], name=f"{name}_masked")
    kept = kit.add(g, "Not", [masked], name=f"{name}_kept")
    anything = kit.add(g, "ReduceMax", [kept, g.add_constant(np.array([-1], np.int64), name=f"{name}_axes")],
                       name=f"{name}_any")
    none = kit.add(g, "Not", [anything], name=f"{name}_none")
    return kit.add(g, "Where", [none, g.add_constant(np.array(0, F32), name=f"{name}_zero"), probs], name=f"{name}_safe")


@pytest.mark.parametrize("length", [7, 16])
def test_a_safe_softmax_and_its_guard_are_one_kernel_over_one_load_of_the_row(kit, device, length):
    """The guard's any is a second row op in the softmax's kernel: its result, read by the
    Where alone, never leaves registers."""
    shape = (2, 3, 4, length)
    g = Graph("safe")
    g.add_output(_safe_softmax(kit, g, g.add_input("x", TensorType(shape, F32))), "y")
    assert _kernels(g) == [["p_softmax", "p_masked", "p_kept", "p_any", "p_none", "p_safe"]]
    [(_, source)] = kernel_sources(g)
    assert sum("# x: float32" in line for line in source.splitlines()) == 1
    x = _masked_scores(np.random.default_rng(length), shape)
    got, _ = kit.run_both(g, {"x": x}, device)
    assert np.all(got["y"][:, :, 1] == 0) and np.all(np.isfinite(got["y"]))
    _check(kit, g, {"x": x}, device)


def test_a_row_op_result_read_outside_the_kernel_is_not_merged(kit, device):
    """The guard is also a graph output: it keeps its own kernel and buffer."""
    shape = (2, 5, 9)
    g = Graph("guard_out")
    g.add_output(_safe_softmax(kit, g, g.add_input("x", TensorType(shape, F32))), "y")
    g.add_output(Value("p_none"), "all_masked")
    assert _kernels(g) == [["p_masked", "p_kept", "p_any", "p_none"], ["p_softmax", "p_safe"]]
    _check(kit, g, {"x": _masked_scores(np.random.default_rng(16), shape)}, device)


@pytest.mark.parametrize("axis, keepdims", [(0, 1), (1, 0)])
def test_a_value_that_is_not_the_row_s_own_is_not_merged(kit, device, axis, keepdims):
    """A softmax's epilogue over rows reads a column mean (another row), or a row sum without
    its kept dim, which broadcasts along the other axis: neither is the value of the row in
    registers, so each stays a kernel of its own."""
    g = Graph("rows")
    x = g.add_input("x", TensorType((6, 6), F32))
    mean = kit.add(g, "ReduceMean", [x, g.add_constant(np.array([axis], np.int64), name="axes")],
                   {"keepdims": keepdims}, name="mean")
    probs = kit.add(g, "Softmax", [x], {"axis": 1}, name="softmax")
    g.add_output(kit.add(g, "Sub", [probs, mean], name="centered"), "y")
    assert _kernels(g) == [["mean"], ["softmax", "centered"]]
    _check(kit, g, {"x": np.random.default_rng(17).standard_normal((6, 6)).astype(F32)}, device)


def _slice(kit, g: Graph, x, start: int, stop: int, name: str):
    ints = lambda *v: g.add_constant(np.array(v, np.int64), name=f"{name}_{len(g.nodes())}")  # noqa: E731
    return kit.add(g, "Slice", [x, ints(start), ints(stop), ints(-1)], name=name)


def test_a_rotary_embedding_s_concat_runs_in_the_kernel_of_the_mul_and_add_after_it(kit, device):
    """LLaMA's q * cos + rotate_half(q) * sin: the two groups the Add reads (the Concat's and
    q * cos), read by the Add alone at its own index, are one kernel with it."""
    shape, half = (2, 3, 5, 8), 4
    g = Graph("rotary")
    rng = np.random.default_rng(18)
    q = g.add_input("q", TensorType(shape, F32))
    cos = g.add_constant(rng.standard_normal(shape[2:]).astype(F32), name="cos")
    sin = g.add_constant(rng.standard_normal(shape[2:]).astype(F32), name="sin")
    second = _slice(kit, g, q, half, 2 * half, "second")
    first = kit.add(g, "Neg", [_slice(kit, g, q, 0, half, "first")], name="negated")
    rotated = kit.add(g, "Mul", [kit.add(g, "Concat", [first, second], {"axis": -1}, name="concat"), sin],
                      name="times_sin")
    g.add_output(kit.add(g, "Add", [kit.add(g, "Mul", [q, cos], name="times_cos"), rotated], name="rotary"), "y")
    assert sorted(_kernels(g)) == [["concat", "times_sin", "times_cos", "rotary"], ["first", "negated"], ["second"]]
    _check(kit, g, {"q": rng.standard_normal(shape).astype(F32)}, device)


def test_two_heads_in_one_chain_kernel_keep_their_own_values(kit, device):
    """A Slice of one input plus a Transpose of another: both heads in the Add's kernel."""
    g = Graph("heads")
    rng = np.random.default_rng(19)
    part = _slice(kit, g, g.add_input("u", TensorType((4, 9), F32)), 2, 8, "part")
    turned = kit.add(g, "Transpose", [g.add_input("v", TensorType((6, 4), F32))], {"perm": [1, 0]}, name="turned")
    g.add_output(kit.add(g, "Sub", [part, turned], name="difference"), "y")
    assert _kernels(g) == [["part", "turned", "difference"]]
    _check(kit, g, {"u": rng.standard_normal((4, 9)).astype(F32), "v": rng.standard_normal((6, 4)).astype(F32)},
           device)


@pytest.mark.parametrize("axis, sizes, packed_parts", [(1, [16, 16, 13], False), (1, [20, 5, 20], True),
                                                       (0, [3, 4], True)])
def test_a_split_of_a_matmul_s_result_ends_its_kernel(kit, device, axis, sizes, packed_parts):
    """GPT-2's query, key and value: the matmul's kernel stores each part of the Split, along
    its columns or its rows, at its index in the part and through the part's encoding (16x16
    tiles or plain), from a 16x16-tiled result that is never written (where the first of
    column parts is unpacked for the output, the kernel does that as its epilogue)."""
    rng = np.random.default_rng(20)
    tiles = PackedEncoding((0, 1), (16, 16), pad=0.0)
    m, n = (7, sum(sizes)) if axis == 1 else (sum(sizes), 24)
    g = Graph("qkv")
    y = kit.add(g, "MatMul", [g.add_input("x", TensorType((m, 10), F32)),
                              g.add_constant(rng.standard_normal((10, n)).astype(F32), name="w")],
                encoding=tiles, name="mm")
    y = kit.add(g, "Add", [y, g.add_constant(rng.standard_normal(n).astype(F32), name="bias")], encoding=tiles,
                name="bias_add")
    kit.add(g, "Split", [y, g.add_constant(np.array(sizes, np.int64), name="sizes")], {"axis": axis}, name="parts")
    node = g.node("parts")
    for k in range(len(sizes)):
        part = node.outputs[k]
        node.outputs[k] = TensorType(part.shape, part.dtype, tiles if packed_parts else None)
        out = Value("parts", k)
        g.add_output(kit.add(g, "Unpack", [out], name=f"unpack{k}") if packed_parts else out, f"y{k}")
    assert _kernels(g)[0] == ["mm", "bias_add", "parts"] + (["unpack0"] if packed_parts and axis == 1 else [])
    _check(kit, g, {"x": rng.standard_normal((m, 10)).astype(F32)}, device)


def test_a_split_of_a_batch_dim_or_after_a_split_is_not_in_the_matmul_s_kernel(kit, device):
    """Only rows or columns split in the matmul's kernel; a node reading one column part alone
    (the Relu of the one part that is read) is that part's epilogue, the other part written."""
    rng = np.random.default_rng(21)
    g = Graph("batch_split")
    y = kit.add(g, "MatMul", [g.add_input("x", TensorType((4, 5, 6), F32)),
                              g.add_constant(rng.standard_normal((6, 7)).astype(F32), name="w")], name="mm")
    kit.add(g, "Split", [y, g.add_constant(np.array([1, 3], np.int64), name="sizes")], {"axis": 0}, name="parts")
    g.add_output(Value("parts", 0), "first")
    columns = kit.add(g, "MatMul", [Value("parts", 1), g.add_constant(rng.standard_normal((7, 4)).astype(F32),
                                                                     name="w2")], name="mm2")
    kit.add(g, "Split", [columns, g.add_constant(np.array([1, 3], np.int64), name="half_sizes")], {"axis": -1},
            name="halves")
    g.add_output(kit.add(g, "Relu", [Value("halves", 0)], name="relu"), "relu")  # the other part unread
    assert _kernels(g) == [["mm"], ["parts"], ["mm2", "halves", "relu"]]
    _check(kit, g, {"x": rng.standard_normal((4, 5, 6)).astype(F32)}, device)


def test_fused_rms_norm_and_matmul_split_in_float16_compute_in_float32(kit, device):
    """float16 operands are widened when loaded and the results narrowed when stored: RMSNorm,
    computed by the matmul that reads it, whose kernel stores its Split's parts, matches the
    NumPy backend within a few steps of float16 (which rounds after every node; the NumPy
    backend has no bfloat16 to compare with)."""
    dtype = np.float16
    rng = np.random.default_rng(22)
    g = Graph("half")
    x = g.add_input("x", TensorType((3, 16), dtype))
    normed = _rms_norm(kit, g, x, rng.uniform(0.5, 1.5, 16).astype(dtype))
    y = kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((16, 12)).astype(dtype), name="w")], name="mm")
    kit.add(g, "Split", [y, g.add_constant(np.array([4, 8], np.int64), name="sizes")], {"axis": -1}, name="parts")
    g.add_output(Value("parts", 0), "a")
    g.add_output(Value("parts", 1), "b")
    assert [k[-1] for k in _kernels(g)] == ["parts"]
    got, want = kit.run_both(g, {"x": rng.standard_normal((3, 16)).astype(dtype)}, device)
    for name in want:
        assert got[name].dtype == want[name].dtype == dtype
        np.testing.assert_allclose(got[name].astype(F32), want[name].astype(F32), rtol=3e-2, atol=3e-2, err_msg=name)


def _normed_product(kit, g: Graph, x: Value, rng: np.random.Generator, k: int, n: int, bias: bool = True,
                    dtype: type = F32) -> Value:
    """LayerNormalization of x's last dim (k), then a MatMul by a (k, n) weight, a bias Add and
    a Gelu (a pre-norm transformer's first Linear layer)."""
    ins = [x, g.add_constant(rng.uniform(0.5, 1.5, k).astype(dtype), name="gamma")]
    if bias:
        ins.append(g.add_constant(rng.standard_normal(k).astype(dtype), name="beta"))
    normed = kit.add(g, "LayerNormalization", ins, {"axis": -1, "epsilon": 1e-5}, name="norm")
    y = kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((k, n)).astype(dtype), name="w")], name="mm")
    y = kit.add(g, "Add", [y, g.add_constant(rng.standard_normal(n).astype(dtype), name="b")], name="bias")
    return kit.add(g, "Gelu", [y], name="gelu")


@pytest.mark.parametrize("k, bias", [(37, True), (100, False), (16, True)])
def test_a_layer_norm_read_only_by_a_matmul_is_that_matmul_s_prologue(kit, device, k, bias):
    """The norm's statistics come from two passes over k in the matmul's kernel (a k that no
    block divides, several blocks of k); each row is normalized as it is loaded. A row of one
    value (no deviation) and rows far from 0 match too."""
    rng = np.random.default_rng(k)
    g = Graph("normed")
    x = g.add_input("x", TensorType((2, 19, k), F32))
    g.add_output(_normed_product(kit, g, x, rng, k, 33, bias), "y")
    assert _kernels(g) == [["norm", "mm", "bias", "gelu"]]
    feed = rng.standard_normal((2, 19, k)).astype(F32)
    feed[0, 3] = 2.5
    feed[1, 5:9] += 1000.0
    _check(kit, g, {"x": feed}, device, rtol=1e-4, atol=1e-4)


def test_a_layer_norm_read_elsewhere_or_over_more_dims_stays_a_kernel(kit):
    rng = np.random.default_rng(3)
    g = Graph("norm_read_twice")
    x = g.add_input("x", TensorType((4, 24), F32))
    g.add_output(_normed_product(kit, g, x, rng, 24, 8), "y")
    g.add_output(Value("norm"), "normed")
    assert _kernels(g) == [["norm"], ["mm", "bias", "gelu"]]
    g = Graph("norm_of_two_dims")
    x = g.add_input("x", TensorType((4, 3, 8), F32))
    normed = kit.add(g, "LayerNormalization", [x, g.add_constant(np.ones((3, 8), F32), name="gamma")], {"axis": 1},
                     name="norm")
    g.add_output(kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((8, 5)).astype(F32), name="w")],
                         name="mm"), "y")
    assert _kernels(g) == [["norm"], ["mm"]]


def _post_norm(kit, g: Graph, x: Value, rng: np.random.Generator, k: int, rms: bool, dtype: type = F32
               ) -> tuple[Value, list[str]]:
    """A post-norm layer's feed-forward half (BERT): h = norm(x); h + W2 gelu(W1 h + b1), the
    norm's result read by the first product and, two products later, by the residual Add.
    Returns the output and the norm's nodes."""
    if rms:
        normed = _rms_norm(kit, g, x, rng.uniform(0.5, 1.5, k).astype(dtype))
        norm = ["rms_square", "rms_mean", "rms_eps_add", "rms_root", "rms_rstd", "rms_normed", "rms_scaled"]
        y = kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((k, 24)).astype(dtype), name="w")],
                    name="mm")
        y = kit.add(g, "Add", [y, g.add_constant(rng.standard_normal(24).astype(dtype), name="b")], name="bias")
        y = kit.add(g, "Gelu", [y], name="gelu")
    else:
        y, norm, normed = _normed_product(kit, g, x, rng, k, 24, dtype=dtype), ["norm"], Value("norm")
    y = kit.add(g, "MatMul", [y, g.add_constant((rng.standard_normal((24, k)) * 0.2).astype(dtype), name="w2")],
                name="mm2")
    return kit.add(g, "Add", [y, normed], name="residual"), norm


@pytest.mark.parametrize("k, rms", [(37, False), (64, False), (19, True)])
def test_a_post_norm_is_the_next_matmul_s_prologue_and_that_kernel_also_writes_it(kit, device, k, rms):
    """BERT's post-norm: the norm's result feeds the next Linear layer and is the residual two
    products later. The first product computes the norm (the norm's kernel goes), and the
    programs of its first block column write each block of rows they normalize, which the
    residual Add reads (a k no block divides, several blocks of k; RMSNorm's row group too)."""
    rng = np.random.default_rng(k)
    g = Graph("post_norm")
    x = g.add_input("x", TensorType((2, 19, k), F32))
    y, norm = _post_norm(kit, g, x, rng, k, rms)
    g.add_output(y, "y")
    plans = kernel_plans(g)
    assert [p.nodes for p in plans] == [[*norm, "mm", "bias", "gelu"], ["mm2", "residual"]]
    assert plans[0].outputs == [Value("gelu"), Value(norm[-1])]
    feed = rng.standard_normal((2, 19, k)).astype(F32)
    feed[1, 5:9] += 1000.0
    _check(kit, g, {"x": feed}, device, rtol=1e-4, atol=1e-4)


def test_a_post_norm_prologue_in_float16_writes_the_rows_in_float16(kit, device):
    rng = np.random.default_rng(9)
    g = Graph("half_post_norm")
    x = g.add_input("x", TensorType((6, 40), np.float16))
    y, _ = _post_norm(kit, g, x, rng, 40, rms=False, dtype=np.float16)
    g.add_output(y, "y")
    assert len(kernel_plans(g)) == 2
    got, want = kit.run_both(g, {"x": rng.standard_normal((6, 40)).astype(np.float16)}, device)
    assert got["y"].dtype == np.float16
    np.testing.assert_allclose(got["y"].astype(F32), want["y"].astype(F32), rtol=2e-2, atol=2e-2)


def test_a_post_norm_in_tiles_is_written_in_its_tiles_by_blocks_that_cover_them(kit, device):
    """The written norm is a result of the product's kernel: a block of k (the norm's columns)
    must cover whole tiles of it, as a block of n must of the product's own result."""
    rng = np.random.default_rng(4)
    g = Graph("tiled_post_norm")
    x = g.add_input("x", TensorType((40, 64), F32))
    tiles = PackedEncoding((0, 1), (16, 32), pad=0.0)
    norm = kit.add(g, "LayerNormalization", [x, g.add_constant(rng.uniform(0.5, 1.5, 64).astype(F32), name="gamma")],
                   {"axis": -1, "epsilon": 1e-5}, encoding=tiles, name="norm")
    y = kit.add(g, "MatMul", [norm, g.add_constant(rng.standard_normal((64, 24)).astype(F32), name="w")], name="mm")
    y = kit.add(g, "MatMul", [y, g.add_constant((rng.standard_normal((24, 64)) * 0.2).astype(F32), name="w2")],
                name="mm2")
    g.add_output(kit.add(g, "Add", [y, norm], name="residual"), "y")
    assert _kernels(g) == [["norm", "mm"], ["mm2", "residual"]]
    _check(kit, g, {"x": rng.standard_normal((40, 64)).astype(F32)}, device, rtol=1e-4, atol=1e-4)
    set_launch(g, "mm", BLOCK_K=16)
    with pytest.raises(VerifyError, match=r"node 'mm'.*BLOCK_K=16 does not cover whole tiles of result \(norm\)"):
        verify_launch(g)


def test_a_norm_is_not_shared_with_a_reader_beside_its_matmul_or_in_that_matmul_s_epilogue(kit, device):
    """A reader that need not come after the product (a second projection of the same norm)
    could run before the kernel that writes the norm: the norm stays a kernel. A reader that
    joins the product's epilogue would read rows other programs are still writing: it runs
    after the kernel instead."""
    rng = np.random.default_rng(6)
    g = Graph("two_projections")
    x = g.add_input("x", TensorType((4, 24), F32))
    normed = kit.add(g, "LayerNormalization", [x, g.add_constant(rng.uniform(0.5, 1.5, 24).astype(F32), name="gamma")],
                     {"axis": -1, "epsilon": 1e-5}, name="norm")
    q = kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((24, 8)).astype(F32), name="wq")], name="q")
    k = kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((24, 8)).astype(F32), name="wk")], name="k")
    g.add_output(kit.add(g, "Mul", [q, k], name="product"), "y")
    assert _kernels(g)[0] == ["norm"] and len(_kernels(g)) == 3
    _check(kit, g, {"x": rng.standard_normal((4, 24)).astype(F32)}, device, rtol=1e-4, atol=1e-4)
    g = Graph("own_residual")
    x = g.add_input("x", TensorType((4, 24), F32))
    normed = kit.add(g, "LayerNormalization", [x, g.add_constant(rng.uniform(0.5, 1.5, 24).astype(F32), name="gamma")],
                     {"axis": -1, "epsilon": 1e-5}, name="norm")
    y = kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((24, 24)).astype(F32), name="w")], name="mm")
    g.add_output(kit.add(g, "Add", [y, normed], name="residual"), "y")
    assert _kernels(g) == [["norm", "mm"], ["residual"]]
    _check(kit, g, {"x": rng.standard_normal((4, 24)).astype(F32)}, device, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("off", [{"shared": False}, {"prologues": False}])
def test_a_post_norm_prologue_is_a_fusion_that_can_be_turned_off(kit, off):
    from tilefold.backends.triton import Fusion

    rng = np.random.default_rng(2)
    g = Graph("post_norm")
    g.add_output(_post_norm(kit, g, g.add_input("x", TensorType((2, 5, 24), F32)), rng, 24, rms=False)[0], "y")
    assert [p.nodes for p in kernel_plans(g, fuse=Fusion(**off))] == \
        [["norm"], ["mm", "bias", "gelu"], ["mm2", "residual"]]


def test_a_layer_norm_prologue_in_float16_rounds_the_normalized_rows_as_the_norm_would(kit, device):
    rng = np.random.default_rng(5)
    g = Graph("half_normed")
    x = g.add_input("x", TensorType((6, 40), np.float16))
    g.add_output(_normed_product(kit, g, x, rng, 40, 24, dtype=np.float16), "y")
    assert _kernels(g) == [["norm", "mm", "bias", "gelu"]]
    got, want = kit.run_both(g, {"x": rng.standard_normal((6, 40)).astype(np.float16)}, device)
    assert got["y"].dtype == np.float16
    np.testing.assert_allclose(got["y"].astype(F32), want["y"].astype(F32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("k", [19, 64, 100])
def test_an_rms_norm_read_only_by_a_matmul_is_that_matmul_s_prologue(kit, device, k):
    """RMSNorm's group (the square before its mean, the rsqrt on one value per row, the Muls
    over the row) in the kernel of the matmul that reads it: the mean in one pass over k, the
    row computed as it is loaded (a k that no block divides, several blocks of k)."""
    rng = np.random.default_rng(k)
    g = Graph("rms_normed")
    x = g.add_input("x", TensorType((2, 9, k), F32))
    normed = _rms_norm(kit, g, x, rng.uniform(0.5, 1.5, k).astype(F32))
    y = kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((k, 24)).astype(F32), name="w")], name="mm")
    g.add_output(kit.add(g, "Relu", [y], name="relu"), "y")
    assert _kernels(g) == [["rms_square", "rms_mean", "rms_eps_add", "rms_root", "rms_rstd", "rms_normed",
                            "rms_scaled", "mm", "relu"]]
    feed = rng.standard_normal((2, 9, k)).astype(F32) * 3.0
    feed[1, 4] = 0.0  # a row of zeros: rsqrt(eps)
    _check(kit, g, {"x": feed}, device, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("product", [False, True])
def test_a_half_precision_rms_norm_upcasts_its_row_in_its_kernel(kit, device, product):
    """LLaMA's RMSNorm in float16: the row is cast to float32 first, and both the square and
    the scaling read the cast. The cast joins the norm's kernel (or the kernel of the matmul
    that computes the norm as its prologue) instead of writing a float32 copy of the row."""
    rng = np.random.default_rng(12)
    g = Graph("half_rms")
    x = g.add_input("x", TensorType((2, 9, 40), np.float16))
    upcast = kit.add(g, "Cast", [x], {"to": 1}, name="upcast")
    y = _rms_norm(kit, g, upcast, rng.uniform(0.5, 1.5, 40).astype(F32))
    if product:
        y = kit.add(g, "MatMul", [y, g.add_constant(rng.standard_normal((40, 24)).astype(F32), name="w")], name="mm")
    g.add_output(y, "y")
    rms = ["rms_square", "rms_mean", "rms_eps_add", "rms_root", "rms_rstd", "rms_normed", "rms_scaled"]
    assert _kernels(g) == [["upcast", *rms, *(["mm"] if product else [])]]
    _check(kit, g, {"x": (rng.standard_normal((2, 9, 40)) * 3).astype(np.float16)}, device, rtol=1e-4, atol=1e-4)


def test_a_reduction_over_another_dim_or_read_elsewhere_is_not_a_matmul_prologue(kit):
    rng = np.random.default_rng(8)
    g = Graph("rms_read_twice")
    x = g.add_input("x", TensorType((4, 16), F32))
    normed = _rms_norm(kit, g, x, rng.uniform(0.5, 1.5, 16).astype(F32))
    g.add_output(kit.add(g, "MatMul", [normed, g.add_constant(rng.standard_normal((16, 8)).astype(F32), name="w")],
                         name="mm"), "y")
    g.add_output(normed, "normed")
    assert [k[-1] for k in _kernels(g)] == ["rms_scaled", "mm"]
    g = Graph("column_mean")
    x = g.add_input("x", TensorType((4, 16), F32))
    mean = kit.add(g, "ReduceMean", [x, g.add_constant(np.array([0], np.int64), name="axes")], name="mean")
    centered = kit.add(g, "Sub", [x, mean], name="centered")
    g.add_output(kit.add(g, "MatMul", [centered, g.add_constant(rng.standard_normal((16, 8)).astype(F32), name="w")],
                         name="mm"), "y")
    assert [k[-1] for k in _kernels(g)] == ["centered", "mm"]


def _merged_projection(kit, g: Graph, rng: np.random.Generator, widths: tuple[int, ...]) -> None:
    """A product and its bias cut into column parts of `widths` by the Split "parts" (a parallel
    block's attention and MLP projections, merged)."""
    w = g.add_constant(rng.standard_normal((24, sum(widths))).astype(F32), name="w")
    y = kit.add(g, "MatMul", [g.add_input("x", TensorType((2, 9, 24), F32)), w], name="mm")
    y = kit.add(g, "Add", [y, g.add_constant(rng.standard_normal(sum(widths)).astype(F32), name="b")], name="bias")
    kit.add(g, "Split", [y, g.add_constant(np.array(widths, np.int64), name="sizes")], {"axis": -1}, name="parts")


@pytest.mark.parametrize("widths, tiles, others_read", [
    ((20, 36), False, True), ((32, 48), True, True), ((20, 36, 12), False, True), ((24, 24), False, False)])
def test_an_activation_of_one_column_part_is_that_part_s_epilogue(kit, device, widths, tiles, others_read):
    """Phi's, GPT-NeoX's and Falcon's parallel blocks: the MLP's first projection merged with
    the attention's, its GELU reading that part alone. The kernel stores the other parts as
    they are (read or not) and the GELU of its part's columns (its constants read at the
    part's own columns), not the part: one kernel, one write of the widest activation (in
    tiles, for the next product, too). Equal parts, which SwiGLU would read side by side, are
    no different when one is read."""
    rng = np.random.default_rng(len(widths) + tiles)
    g = Graph("parallel_block")
    _merged_projection(kit, g, rng, widths)
    last = len(widths) - 1 if len(widths) == 2 else 1
    y = kit.add(g, "Mul", [Value("parts", last), g.add_constant(rng.uniform(0.5, 1.5, widths[last]).astype(F32),
                                                                name="scale")], name="scaled")
    y = kit.add(g, "Gelu", [y], {"approximate": "tanh"}, name="gelu",
                encoding=PackedEncoding((1, 2), (16, 16)) if tiles else None)
    if tiles:  # read in its tiles by the next product
        y = kit.add(g, "MatMul", [y, g.add_constant(rng.standard_normal((widths[last], 8)).astype(F32), name="w2")],
                    name="mm2")
    g.add_output(y, "mlp")
    for k in range(len(widths)):
        if k != last and others_read:
            g.add_output(Value("parts", k), f"part{k}")
    plans = kernel_plans(g)
    assert [p.nodes for p in plans] == [["mm", "bias", "parts", "scaled", "gelu"]] + ([["mm2"]] if tiles else [])
    assert plans[0].outputs == [Value("gelu")] + [Value("parts", k) for k in range(len(widths)) if k != last]
    _check(kit, g, {"x": rng.standard_normal((2, 9, 24)).astype(F32)}, device, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("widths", [(19, 1), (20, 20, 16)])
def test_nodes_reading_parts_that_do_not_pair_are_no_part_s_epilogue(kit, device, widths):
    """A Mul of two column parts, one of width 1 that broadcasts, or two of three unequal ones:
    neither one part's epilogue (it reads more than its part) nor a pair (the parts differ),
    so it runs after the kernel that stores the parts."""
    rng = np.random.default_rng(len(widths))
    g = Graph("unpaired")
    _merged_projection(kit, g, rng, widths)
    g.add_output(kit.add(g, "Mul", [Value("parts", 0), Value("parts", 1)], name="gated"), "y")
    assert [p.nodes for p in kernel_plans(g)] == [["mm", "bias", "parts"], ["gated"]]
    _check(kit, g, {"x": rng.standard_normal((2, 9, 24)).astype(F32)}, device, rtol=1e-4, atol=1e-5)


def test_a_part_s_epilogue_runs_where_the_parts_are_ready(kit, device):
    """The kernel that computes a part's epilogue writes the other parts too, so it runs at the
    Split's place: a product reading another part, before the epilogue's nodes in the order,
    reads it written. Nodes reading another operand than the part and constants (a graph
    input) are no such epilogue: their operand might not be ready there."""
    rng = np.random.default_rng(3)
    g = Graph("read_first")
    _merged_projection(kit, g, rng, (20, 36))
    attn = kit.add(g, "MatMul", [Value("parts", 0), g.add_constant(rng.standard_normal((20, 8)).astype(F32), name="wa")],
                   name="attention")
    g.add_output(attn, "attention")
    g.add_output(kit.add(g, "Gelu", [Value("parts", 1)], name="gelu"), "mlp")
    assert [p.nodes for p in kernel_plans(g)] == [["mm", "bias", "parts", "gelu"], ["attention"]]
    _check(kit, g, {"x": rng.standard_normal((2, 9, 24)).astype(F32)}, device, rtol=1e-4, atol=1e-5)
    g = Graph("reads_more")
    _merged_projection(kit, g, rng, (20, 36))
    other = g.add_input("z", TensorType((2, 9, 36), F32))
    g.add_output(kit.add(g, "Mul", [Value("parts", 1), other], name="gated"), "mlp")
    g.add_output(kit.add(g, "Relu", [Value("parts", 0)], name="relu"), "attention")
    assert [p.nodes for p in kernel_plans(g)] == [["mm", "bias", "parts", "relu"], ["gated"]]
    _check(kit, g, {"x": rng.standard_normal((2, 9, 24)).astype(F32), "z": rng.standard_normal((2, 9, 36)).astype(F32)},
           device, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("parts, packed", [(2, False), (2, True), (3, False)])
def test_elementwise_nodes_reading_equal_column_parts_of_a_matmul_are_its_epilogue(kit, device, parts, packed):
    """LLaMA's SiLU(gate) * up of its merged gate and up projections (and a sum of three
    parts): the kernel holds each part's columns of a block in an accumulator of its own, adds
    each part's bias at its columns, and writes only the result (the parts never reach
    memory); a weight and a result in 16x16 tiles too (columns per part that no block
    divides)."""
    rng = np.random.default_rng(parts)
    width = 20
    g = Graph("paired")
    enc = PackedEncoding((0, 1), (16, 16)) if packed else None
    w = rng.standard_normal((24, parts * width)).astype(F32)
    weight = kit.packed_const(g, w, enc, "w") if packed else g.add_constant(w, name="w")
    y = kit.add(g, "MatMul", [g.add_input("x", TensorType((2, 9, 24), F32)), weight], name="mm")
    y = kit.add(g, "Add", [y, g.add_constant(rng.standard_normal(parts * width).astype(F32), name="b")], name="bias")
    sizes = g.add_constant(np.full(parts, width, np.int64), name="sizes")
    kit.add(g, "Split", [y, sizes], {"axis": -1}, name="parts")
    if parts == 2:
        gate = Value("parts", 0)
        y = kit.add(g, "Mul", [kit.add(g, "Mul", [gate, kit.add(g, "Sigmoid", [gate], name="sig")], name="silu"),
                               Value("parts", 1)], name="swiglu", encoding=PackedEncoding((1, 2), (16, 16)) if packed else None)
    else:
        y = kit.add(g, "Sum", [Value("parts", k) for k in range(parts)], name="total")
    if packed:
        y = kit.add(g, "Unpack", [y], name="unpack")
    g.add_output(y, "y")
    assert len(_kernels(g)) == 1 and _kernels(g)[0][:3] == ["mm", "bias", "parts"]
    (plan,) = kernel_plans(g)
    assert plan.source.count("tl.store") == 1 and plan.source.count("tl.dot") == parts
    _check(kit, g, {"x": rng.standard_normal((2, 9, 24)).astype(F32)}, device, rtol=1e-4, atol=1e-5)
