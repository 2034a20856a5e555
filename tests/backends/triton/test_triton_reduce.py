"""The row-reduction template (Softmax, LogSoftmax, LayerNormalization, ReduceMean/Sum/Max/Min)
against numpy and the NumPy backend, including rows over a tiled dim whose padding holds
garbage (an elementwise result's padding is unknown): the kernel must mask it."""
from __future__ import annotations

import numpy as np
import pytest

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
