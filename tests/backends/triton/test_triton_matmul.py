"""The matmul template (MatMul, batched and broadcast, and Gemm) on packed and plain operands
with every epilogue, against numpy and the NumPy backend, on sizes that do not divide the tiles."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilefold.backends.triton import TritonExecutable, kernel_sources
from tilefold.graph import Graph
from tilefold.graph.types import TensorType
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32


def mmt4d(rank: int, pad: float | None = 0.0) -> PackedEncoding:
    return PackedEncoding((rank - 2, rank - 1), (16, 16), pad=pad)


def _matmul_graph(kit, a_shape, b_shape, pack_a: bool, pack_b: bool, pack_out: bool, rng) -> tuple[Graph, dict, np.ndarray]:
    a = rng.standard_normal(a_shape).astype(F32)
    b = rng.standard_normal(b_shape).astype(F32)
    g = Graph("mm")
    av = g.add_input("a", TensorType(a_shape, F32))
    if pack_a:
        av = kit.add(g, "Pack", [av], {"encoding": mmt4d(len(a_shape))}, encoding=mmt4d(len(a_shape)))
    bv = kit.packed_const(g, b, mmt4d(len(b_shape)), "b") if pack_b else g.add_constant(b, name="b")
    out_rank = max(len(a_shape), len(b_shape))
    y = kit.add(g, "MatMul", [av, bv], encoding=mmt4d(out_rank) if pack_out else None)
    if pack_out:
        y = kit.add(g, "Unpack", [y])
    g.add_output(y, "y")
    return g, {"a": a}, np.matmul(a.astype(np.float64), b)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((5, 20), (20, 33)), ((17, 40), (40, 9)), ((1, 3), (3, 50)),
    ((2, 3, 7, 18), (18, 21)), ((3, 1, 7, 18), (2, 18, 5)), ((33, 16), (2, 16, 17)),
])
@pytest.mark.parametrize("packing", [(False, False, False), (True, True, True), (False, True, True)])
def test_matmul_matches_numpy(kit, device, a_shape, b_shape, packing):
    g, feeds, want = _matmul_graph(kit, a_shape, b_shape, *packing, np.random.default_rng(len(a_shape)))
    got, ref = kit.run_both(g, feeds, device)
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epilogue", ["bias_relu", "residual", "batchnorm", "sigmoid_unpack"])
def test_matmul_epilogues_fuse_into_one_kernel(kit, device, epilogue):
    """bias + relu, a residual add of a runtime tensor, a folded BatchNorm's scale and shift,
    and an activation followed by the Unpack: the anchor's kernel does it all."""
    rng = np.random.default_rng(7)
    m, k, n = 19, 24, 35
    a = rng.standard_normal((m, k)).astype(F32)
    w = rng.standard_normal((k, n)).astype(F32)
    bias = rng.standard_normal((1, n)).astype(F32)
    scale = rng.uniform(0.5, 1.5, (1, n)).astype(F32)
    res = rng.standard_normal((m, n)).astype(F32)
    g = Graph("epi")
    av = g.add_input("a", TensorType((m, k), F32))
    rv = g.add_input("r", TensorType((m, n), F32))
    enc = mmt4d(2)
    bias_enc = PackedEncoding((0, 1), (1, 16))
    y = kit.add(g, "MatMul", [av, kit.packed_const(g, w, enc, "w")], encoding=enc)
    t = y
    if epilogue == "bias_relu":
        t = kit.add(g, "Add", [t, kit.packed_const(g, bias, bias_enc, "bias")], encoding=enc.with_pad(None))
        t = kit.add(g, "Relu", [t], encoding=enc.with_pad(None))
        want = np.maximum(a @ w + bias, 0)
    elif epilogue == "residual":
        t = kit.add(g, "Unpack", [t])
        t = kit.add(g, "Add", [t, rv])
        want = a @ w + res
    elif epilogue == "batchnorm":
        t = kit.add(g, "Mul", [t, kit.packed_const(g, scale, bias_enc, "scale")], encoding=enc.with_pad(None))
        t = kit.add(g, "Add", [t, kit.packed_const(g, bias, bias_enc, "shift")], encoding=enc.with_pad(None))
        want = (a @ w) * scale + bias
    else:
        t = kit.add(g, "Sigmoid", [t], encoding=enc.with_pad(None))
        want = 1 / (1 + np.exp(-(a @ w)))
    if g.type_of(t).encoding is not None:
        t = kit.add(g, "Unpack", [t])
    g.add_output(t, "y")
    got, ref = kit.run_both(g, {"a": a, "r": res}, device)
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-5)
    assert len(kernel_sources(g)) == 1


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (23,), (9, 23), (1, 1)])
def test_gemm_transposes_alpha_beta_and_c(kit, device, trans_a, trans_b, c_shape):
    rng = np.random.default_rng(trans_a * 2 + trans_b)
    m, k, n = 9, 30, 23
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(F32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(F32)
    g = Graph("gemm")
    inputs = [g.add_input("a", TensorType(a.shape, F32)), g.add_constant(b, name="b")]
    c = None
    if c_shape is not None:
        c = rng.standard_normal(c_shape).astype(F32)
        inputs.append(g.add_constant(c, name="c"))
    g.add_output(kit.add(g, "Gemm", inputs, {"transA": trans_a, "transB": trans_b, "alpha": 0.7, "beta": 1.3}), "y")
    got, ref = kit.run_both(g, {"a": a}, device)
    want = 0.7 * ((a.T if trans_a else a) @ (b.T if trans_b else b)) + (0 if c is None else 1.3 * c)
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a_enc", [PackedEncoding((1,), (16,), (1, 0)), PackedEncoding((0,), (16,), (1, 0))])
def test_gemm_reads_16_wide_tiles_of_one_matrix_dim(kit, device, a_enc):
    """A channel-tiled map viewed as (pixels, channels) is (C/16, pixels, 16): k in tiles of 16,
    k blocks outermost (ConvNeXt's Linear layers on the gpu target); tiles of m read likewise.
    The result is written in 16x16 tiles, its padding (23 columns) masked."""
    rng = np.random.default_rng(21)
    m, k, n = 40, 32, 23
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    c = rng.standard_normal(n).astype(F32)
    g = Graph("gemm_tiles")
    av = kit.add(g, "Pack", [g.add_input("a", TensorType((m, k), F32))], {"encoding": a_enc}, encoding=a_enc)
    y = kit.add(g, "Gemm", [av, kit.packed_const(g, b, mmt4d(2), "b"), g.add_constant(c, name="c")], encoding=mmt4d(2))
    g.add_output(kit.add(g, "Unpack", [y]), "y")
    got, ref = kit.run_both(g, {"a": a}, device)
    np.testing.assert_allclose(got["y"], a.astype(np.float64) @ b + c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-5)


def test_packed_result_padding_holds_zeros(kit, device):
    """The gpu target's contract: an anchor writes zeros in its result's padding."""
    import torch

    rng = np.random.default_rng(8)
    g, feeds, want = _matmul_graph(kit, (5, 20), (20, 33), False, True, True, rng)
    exe = TritonExecutable(g, device=device, fuse=False)
    (buffer,) = exe.steps[0].run([torch.from_numpy(feeds["a"]).to(exe.torch_device),
                                  exe._device_consts[exe.device, exe.steps[0].ins[1]]])
    full = buffer.cpu().numpy()
    assert full.shape == (1, 3, 16, 16)
    logical = full.transpose(0, 2, 1, 3).reshape(16, 48)
    np.testing.assert_allclose(logical[:5, :33], want, rtol=1e-5, atol=1e-5)
    assert not logical[5:].any() and not logical[:, 33:].any()


HALVES = {"float16": (np.dtype(np.float16), 2e-3, 2e-2), "bfloat16": (np.dtype(ml_dtypes.bfloat16), 1e-2, 1e-1)}
"""16-bit float types: the dtype, and the rtol and atol of one rounding of a float32 sum."""


@pytest.mark.parametrize("half", sorted(HALVES))
def test_16_bit_matmul_accumulates_in_float32(kit, device, half):
    dtype, rtol, atol = HALVES[half]
    rng = np.random.default_rng(9)
    a = rng.standard_normal((20, 64)).astype(dtype)
    b = rng.standard_normal((64, 18)).astype(dtype)
    g = Graph("half")
    y = kit.add(g, "MatMul", [g.add_input("a", TensorType(a.shape, dtype)), g.add_constant(b, name="b")])
    g.add_output(y, "y")
    got = TritonExecutable(g, device=device)({"a": a})["y"]
    assert got.dtype == dtype
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=rtol, atol=atol)
