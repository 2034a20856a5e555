"""Fusion (fusion.py): a row op of its operand's shape (softmax, layer norm) takes the
elementwise ops after it as an epilogue, and a value read by two nodes of a diamond (the safe
softmax's Where(IsNaN(s), 0, s), SiLU's x * sigmoid(x)) stays in registers when both readers
join its group. Each fused kernel matches the NumPy backend on fresh random inputs; a value
something outside the group reads is still written."""
from __future__ import annotations

import numpy as np
import pytest

from tilefold.backends.triton.executor import kernel_plans
from tilefold.graph import Graph
from tilefold.graph.types import TensorType

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
    the softmax's group, where s stays in registers."""
    g = Graph("owed")
    shape = (3, 10)
    s = kit.add(g, "Softmax", [g.add_input("x", TensorType(shape, F32))], {"axis": -1}, name="softmax")
    negated = kit.add(g, "Neg", [s], name="neg")
    t = kit.add(g, "Relu", [g.add_input("u", TensorType(shape, F32))], name="relu")
    g.add_output(kit.add(g, "Sum", [t, negated, s], name="sum"), "y")
    assert sorted(_kernels(g)) == [["relu"], ["softmax", "neg", "sum"]]
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
    """RMSNorm's rsqrt of a mean square: Pow, then ReduceMean with Add, Sqrt and Reciprocal in
    its kernel, computed once per row."""
    g = Graph("rms")
    x = g.add_input("x", TensorType((3, 4, 19), F32))
    square = kit.add(g, "Pow", [x, g.add_constant(np.array(2, F32), name="two")], name="square")
    mean = kit.add(g, "ReduceMean", [square, g.add_constant(np.array([-1], np.int64), name="axes")],
                   {"keepdims": keepdims}, name="mean")
    shifted = kit.add(g, "Add", [mean, g.add_constant(np.array(1e-6, F32), name="eps")], name="eps_add")
    root = kit.add(g, "Sqrt", [shifted], name="root")
    g.add_output(kit.add(g, "Reciprocal", [root], name="rstd"), "y")
    assert _kernels(g) == [["square"], ["mean", "eps_add", "root", "rstd"]]
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
