"""The convolution template (implicit GEMM) on NCHWc16 and plain operands, with strides,
padding, dilation, groups and fused epilogues, against torch's conv2d and the NumPy backend."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tilefold.backends.triton import kernel_sources
from tilefold.graph import Graph
from tilefold.graph.types import TensorType
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32
ACT = PackedEncoding((1,), (16,))
WEIGHT = PackedEncoding((0, 1), (16, 16))
BIAS = PackedEncoding((0,), (16,))


def _reference(x, w, b, stride, pad, dilation, group):
    return torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                      None if b is None else torch.from_numpy(b).double(),
                                      stride=stride, padding=pad, dilation=dilation, groups=group).numpy()


@pytest.mark.parametrize("case", [
    dict(c=3, f=20, k=3, stride=1, pad=1, dilation=1, group=1, size=(7, 9)),
    dict(c=18, f=5, k=3, stride=2, pad=0, dilation=1, group=1, size=(9, 8)),
    dict(c=17, f=33, k=1, stride=1, pad=0, dilation=1, group=1, size=(4, 5)),
    dict(c=8, f=12, k=3, stride=1, pad=2, dilation=2, group=4, size=(6, 6)),
    dict(c=6, f=6, k=3, stride=2, pad=1, dilation=1, group=6, size=(7, 7)),
])
@pytest.mark.parametrize("packed", [True, False])
def test_conv_matches_torch(kit, device, case, packed):
    rng = np.random.default_rng(case["c"])
    h, wd = case["size"]
    x = rng.standard_normal((2, case["c"], h, wd)).astype(F32)
    w = rng.standard_normal((case["f"], case["c"] // case["group"], case["k"], case["k"])).astype(F32)
    b = rng.standard_normal(case["f"]).astype(F32)
    g = Graph("conv")
    xv = g.add_input("x", TensorType(x.shape, F32))
    if packed:
        xv = kit.add(g, "Pack", [xv], {"encoding": ACT}, encoding=ACT)
        wv, bv = kit.packed_const(g, w, WEIGHT, "w"), kit.packed_const(g, b, BIAS, "b")
    else:
        wv, bv = g.add_constant(w, name="w"), g.add_constant(b, name="b")
    attrs = {"strides": (case["stride"],) * 2, "pads": (case["pad"],) * 4, "dilations": (case["dilation"],) * 2,
             "group": case["group"]}
    y = kit.add(g, "Conv", [xv, wv, bv], attrs, encoding=ACT if packed else None)
    if packed:
        y = kit.add(g, "Unpack", [y])
    g.add_output(y, "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    want = _reference(x, w, b, case["stride"], case["pad"], case["dilation"], case["group"])
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-4, atol=1e-4)


def test_conv_epilogue_batchnorm_relu_residual_in_one_kernel(kit, device):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 20, 6, 5)).astype(F32)
    w = rng.standard_normal((20, 20, 3, 3)).astype(F32) * 0.2
    scale = rng.uniform(0.5, 1.5, (1, 20, 1, 1)).astype(F32)
    shift = rng.standard_normal((1, 20, 1, 1)).astype(F32)
    g = Graph("block")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": ACT}, encoding=ACT)
    y = kit.add(g, "Conv", [xp, kit.packed_const(g, w, WEIGHT, "w")], {"pads": (1, 1, 1, 1)}, encoding=ACT)
    chan = PackedEncoding((1,), (16,))
    y = kit.add(g, "Mul", [y, kit.packed_const(g, scale, chan, "scale")], encoding=ACT.with_pad(None))
    y = kit.add(g, "Add", [y, kit.packed_const(g, shift, chan, "shift")], encoding=ACT.with_pad(None))
    y = kit.add(g, "Add", [y, xp], encoding=ACT.with_pad(None))
    y = kit.add(g, "Relu", [y], encoding=ACT.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [y]), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    want = np.maximum(_reference(x, w, None, 1, 1, 1, 1) * scale + shift + x, 0)
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    assert len(kernel_sources(g)) == 2  # the input Pack, then conv with its whole epilogue


def test_float16_conv_accumulates_in_float32(kit, device):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 24, 5, 6)).astype(np.float16)
    w = (rng.standard_normal((18, 24, 3, 3)) * 0.2).astype(np.float16)
    g = Graph("half")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, np.float16))], {"encoding": ACT}, encoding=ACT)
    y = kit.add(g, "Conv", [xp, kit.packed_const(g, w, WEIGHT, "w")], {"pads": (1, 1, 1, 1)}, encoding=ACT)
    g.add_output(kit.add(g, "Unpack", [y]), "y")
    got, _ = kit.run_both(g, {"x": x}, device)
    assert got["y"].dtype == np.float16
    exact = _reference(x.astype(F32), w.astype(F32), None, 1, 1, 1, 1)
    np.testing.assert_allclose(got["y"], exact, rtol=2e-3, atol=1e-2)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ("MaxPool", {"kernel_shape": (2, 3), "strides": (1, 2), "dilations": (2, 1), "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ("AveragePool", {"kernel_shape": (3, 2), "strides": (2, 2), "pads": (1, 0, 1, 1), "count_include_pad": 1,
                     "ceil_mode": 1}),
])
def test_pools_on_nchwc16_fused_with_relu(kit, device, op, attrs):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 18, 9, 8)).astype(F32)
    g = Graph("pool")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": ACT}, encoding=ACT)
    y = kit.add(g, op, [xp], attrs, encoding=ACT.with_pad(None))
    y = kit.add(g, "Relu", [y], encoding=ACT.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [y]), "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)
    if op == "MaxPool" and "ceil_mode" not in attrs:
        want = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, 1).relu().numpy()
        np.testing.assert_allclose(got["y"], want, rtol=1e-6)
    assert [names for names, _ in kernel_sources(g)][-1] == [op.lower(), "relu", "unpack"]


@pytest.mark.parametrize("size", [3, 4, 5])
@pytest.mark.parametrize("packed", [True, False], ids=["nchw_c16", "plain"])
def test_lrn_window_crosses_channel_tiles_and_fuses_with_relu(kit, device, size, packed):
    """AlexNet's LRN: a window of channels read across the 16-channel tiles (18 channels: the
    last tile is ragged) and past both ends; torch's local_response_norm agrees for odd sizes
    (it centres even windows one channel lower than ONNX)."""
    rng = np.random.default_rng(size)
    x = (rng.standard_normal((2, 18, 5, 4)) * 3).astype(F32)
    attrs = {"size": size, "alpha": 2e-2, "beta": 0.75, "bias": 1.5}
    enc = ACT if packed else None
    g = Graph("lrn")
    xv = g.add_input("x", TensorType(x.shape, F32))
    if packed:
        xv = kit.add(g, "Pack", [xv], {"encoding": ACT}, encoding=ACT)
    y = kit.add(g, "LRN", [xv], attrs, encoding=None if enc is None else enc.with_pad(None))
    y = kit.add(g, "Relu", [y], encoding=None if enc is None else enc.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [y]) if packed else y, "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)
    if size % 2:
        want = torch.nn.functional.local_response_norm(torch.from_numpy(x), size, 2e-2, 0.75, 1.5).relu().numpy()
        np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)
    assert [names for names, _ in kernel_sources(g)][-1][:2] == ["lrn", "relu"]
