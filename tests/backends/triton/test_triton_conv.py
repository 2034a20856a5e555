"""The convolution template (implicit GEMM) on NCHWc16 and plain operands, with strides,
padding, dilation, groups and fused epilogues, against torch's conv2d and the NumPy backend;
1-D convs (NCWc16 and plain) against torch's conv1d, and a Whisper-like stem end to end."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import tilefold
from tilefold.backends.triton import TritonExecutable, kernel_sources
from tilefold.backends.triton.templates import classify
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


@pytest.mark.parametrize("case", [
    dict(c=5, f=7, k=3, stride=2, pad=1, out_pad=1, dilation=1, group=1, size=(4, 5)),  # a U-Net's upsampling
    dict(c=6, f=4, k=2, stride=2, pad=0, out_pad=0, dilation=1, group=2, size=(3, 3)),
    dict(c=3, f=18, k=4, stride=3, pad=2, out_pad=2, dilation=2, group=1, size=(5, 4)),
    dict(c=17, f=3, k=3, stride=1, pad=1, out_pad=0, dilation=1, group=1, size=(6, 6)),
])
@pytest.mark.parametrize("packed_input", [False, True])
def test_conv_transpose_matches_torch(kit, device, case, packed_input):
    """Strides that skip taps, output padding, dilation and groups; the input plain or NCHWc16,
    a ReLU fused into the store."""
    rng = np.random.default_rng(case["f"])
    h, wd = case["size"]
    x = rng.standard_normal((2, case["c"], h, wd)).astype(F32)
    w = rng.standard_normal((case["c"], case["f"] // case["group"], case["k"], case["k"])).astype(F32)
    b = rng.standard_normal(case["f"]).astype(F32)
    g = Graph("conv_transpose")
    xv = g.add_input("x", TensorType(x.shape, F32))
    if packed_input:
        xv = kit.add(g, "Pack", [xv], {"encoding": ACT}, encoding=ACT)
    attrs = {"strides": (case["stride"],) * 2, "pads": (case["pad"],) * 4, "dilations": (case["dilation"],) * 2,
             "group": case["group"], "output_padding": (case["out_pad"],) * 2}
    y = kit.add(g, "ConvTranspose", [xv, g.add_constant(w, name="w"), g.add_constant(b, name="b")], attrs)
    g.add_output(kit.add(g, "Relu", [y]), "y")
    got, _ = kit.run_both(g, {"x": x}, device)
    want = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(),
        stride=case["stride"], padding=case["pad"], output_padding=case["out_pad"], groups=case["group"],
        dilation=case["dilation"]).clamp_min(0).numpy()
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    assert len(kernel_sources(g)) == 1 + packed_input


def test_conv_transpose_planned_channels_last_by_the_cpu_target(kit, device):
    """The cpu target's ConvTranspose (channels-last input and result, weight in its GEMM form
    (C, *k, F/g)) runs in a Triton kernel as the NumPy backend runs it."""
    from tilefold.layout.targets import channels_last, transposed_weight

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 4, 5)).astype(F32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(F32)
    b = rng.standard_normal(8).astype(F32)
    g = Graph("conv_transpose_nhwc")
    xv = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": channels_last(4)},
                 encoding=channels_last(4))
    wv = kit.packed_const(g, w, transposed_weight(4), "w")
    attrs = {"strides": (2, 2), "pads": (1, 0, 1, 1), "output_padding": (1, 1), "group": 2}
    y = kit.add(g, "ConvTranspose", [xv, wv, g.add_constant(b, name="b")], attrs, encoding=channels_last(4))
    g.add_output(kit.add(g, "Unpack", [y]), "y")
    got, want = kit.run_both(g, {"x": x}, device)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)
    reference = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(), stride=2,
        padding=0, output_padding=1, groups=2).numpy()[:, :, 1:-1, :-1]
    np.testing.assert_allclose(got["y"], reference, rtol=1e-4, atol=1e-4)


def test_conv_transpose_conformance_cases(kit, device):
    """Every 1-D and 2-D case (output_shape, auto_pad, pads, dilations, kernel_shape); 3-D ones
    run on the NumPy backend."""
    kit.check_conformance("ConvTranspose", device, keep=lambda case: kit.first_input(case).ndim in (3, 4),
                          rtol=1e-5, atol=1e-5, least=8)


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


@pytest.mark.parametrize("half, rtol, atol", [("float16", 2e-3, 1e-2), ("bfloat16", 1e-2, 5e-2)])
def test_16_bit_conv_accumulates_in_float32(kit, device, half, rtol, atol):
    dtype = np.dtype(ml_dtypes.bfloat16) if half == "bfloat16" else np.dtype(half)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 24, 5, 6)).astype(dtype)
    w = (rng.standard_normal((18, 24, 3, 3)) * 0.2).astype(dtype)
    g = Graph("half")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, dtype))], {"encoding": ACT}, encoding=ACT)
    y = kit.add(g, "Conv", [xp, kit.packed_const(g, w, WEIGHT, "w")], {"pads": (1, 1, 1, 1)}, encoding=ACT)
    g.add_output(kit.add(g, "Unpack", [y]), "y")
    got = TritonExecutable(g, device=device)({"x": x})["y"]  # the NumPy backend has no bfloat16
    assert got.dtype == dtype
    exact = _reference(x.astype(np.float64), w.astype(np.float64), None, 1, 1, 1, 1)
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=rtol, atol=atol)


def _reference_1d(x, w, b, stride, pads, dilation, group):
    """torch's conv1d in float64, the (begin, end) padding applied first (torch pads both ends alike)."""
    xd = torch.nn.functional.pad(torch.from_numpy(x).double(), tuple(pads))
    return torch.nn.functional.conv1d(xd, torch.from_numpy(w).double(),
                                      None if b is None else torch.from_numpy(b).double(),
                                      stride=stride, dilation=dilation, groups=group).numpy()


def _conv1d_graph(kit, x, w, b, attrs, packed, epilogue=()):
    """x -> [Pack] -> Conv(w, b, attrs) -> `epilogue` -> [Unpack] -> y; the epilogue's items are
    (op, constant second operand or None), all in the conv result's encoding."""
    g = Graph("conv1d")
    xv = g.add_input("x", TensorType(x.shape, x.dtype))
    enc = ACT if packed else None
    if packed:
        xv = kit.add(g, "Pack", [xv], {"encoding": ACT}, encoding=ACT)
        operands = [kit.packed_const(g, w, WEIGHT, "w")] + ([] if b is None else [kit.packed_const(g, b, BIAS, "b")])
    else:
        operands = [g.add_constant(w, name="w")] + ([] if b is None else [g.add_constant(b, name="b")])
    y = kit.add(g, "Conv", [xv, *operands], attrs, encoding=enc)
    for op, const in epilogue:
        extra = [] if const is None else [g.add_constant(const, name=f"{op.lower()}_operand")]
        y = kit.add(g, op, [y, *extra], encoding=None if enc is None else enc.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [y]) if packed else y, "y")
    return g


CONV1D_CASES = {
    "k1_c17_f33": dict(c=17, f=33, k=1, stride=1, pads=(0, 0), dilation=1, group=1, length=11),
    "k3_pad1": dict(c=18, f=20, k=3, stride=1, pads=(1, 1), dilation=1, group=1, length=13),
    "k10_stride5": dict(c=1, f=24, k=10, stride=5, pads=(0, 0), dilation=1, group=1, length=67),
    "k3_stride2_asym": dict(c=20, f=5, k=3, stride=2, pads=(2, 0), dilation=1, group=1, length=12),
    "k5_stride5_asym": dict(c=6, f=18, k=5, stride=5, pads=(0, 4), dilation=1, group=1, length=23),
    "k3_dilation2": dict(c=8, f=12, k=3, stride=1, pads=(1, 3), dilation=2, group=4, length=10),
    "depthwise": dict(c=6, f=6, k=5, stride=2, pads=(2, 2), dilation=1, group=6, length=15),
    "wav2vec2_pos": dict(c=32, f=32, k=16, stride=1, pads=(8, 8), dilation=1, group=4, length=20),
}
"""1-D convs: Wav2Vec2's first conv (k=10, stride 5, one channel) and its grouped positional
conv (k=16, pads (8, 8)), Whisper's k=3 convs, and the awkward sizes (channels not dividing 16,
asymmetric pads, dilation, depthwise)."""


@pytest.mark.parametrize("name", list(CONV1D_CASES))
@pytest.mark.parametrize("packed", [True, False], ids=["ncw_c16", "plain"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv1d_matches_torch(kit, device, name, packed, bias):
    case = CONV1D_CASES[name]
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal((2, case["c"], case["length"])).astype(F32)
    w = rng.standard_normal((case["f"], case["c"] // case["group"], case["k"])).astype(F32)
    b = rng.standard_normal(case["f"]).astype(F32) if bias else None
    attrs = {"strides": (case["stride"],), "pads": case["pads"], "dilations": (case["dilation"],),
             "group": case["group"]}
    g = _conv1d_graph(kit, x, w, b, attrs, packed)
    got, ref = kit.run_both(g, {"x": x}, device)
    want = _reference_1d(x, w, b, case["stride"], case["pads"], case["dilation"], case["group"])
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-4, atol=1e-4)
    assert [names for names, _ in kernel_sources(g)] == ([["pack"], ["conv", "unpack"]] if packed else [["conv"]])


@pytest.mark.parametrize("packed", [True, False], ids=["ncw_c16", "plain"])
def test_conv1d_bias_gelu_and_channel_scale_in_one_kernel(kit, device, packed):
    """Whisper's conv + Gelu, then a per-channel (F, 1) scale broadcast over the length: one
    kernel reads the input (after its Pack, when packed) and writes the result."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 20, 14)).astype(F32)
    w = (rng.standard_normal((18, 20, 3)) * 0.3).astype(F32)
    b = rng.standard_normal(18).astype(F32)
    scale = rng.uniform(0.5, 1.5, (18, 1)).astype(F32)
    g = _conv1d_graph(kit, x, w, b, {"strides": (2,), "pads": (1, 1)}, packed,
                      epilogue=[("Gelu", None), ("Mul", scale)])
    got, ref = kit.run_both(g, {"x": x}, device)
    conv = torch.from_numpy(_reference_1d(x, w, b, 2, (1, 1), 1, 1))
    want = torch.nn.functional.gelu(conv).numpy() * scale
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-4, atol=1e-4)
    names = [names for names, _ in kernel_sources(g)]
    assert names == ([["pack"], ["conv", "gelu", "mul", "unpack"]] if packed else [["conv", "gelu", "mul"]])


def test_float16_conv1d_accumulates_in_float32(kit, device):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 24, 19)).astype(np.float16)
    w = (rng.standard_normal((18, 24, 5)) * 0.2).astype(np.float16)
    b = rng.standard_normal(18).astype(np.float16)
    g = _conv1d_graph(kit, x, w, b, {"strides": (2,), "pads": (2, 1)}, packed=True)
    got, _ = kit.run_both(g, {"x": x}, device)
    assert got["y"].dtype == np.float16
    exact = _reference_1d(x.astype(F32), w.astype(F32), b.astype(F32), 2, (2, 1), 1, 1)
    np.testing.assert_allclose(got["y"], exact, rtol=2e-3, atol=1e-2)


def test_conv3d_stays_on_the_numpy_backend(kit):
    """The template takes 1-D and 2-D convs only; a 3-D one is left to the NumPy backend."""
    g = Graph("conv3d")
    x = g.add_input("x", TensorType((1, 4, 5, 5, 5), F32))
    y = kit.add(g, "Conv", [x, g.add_constant(np.ones((8, 4, 3, 3, 3), F32), name="w")])
    assert classify(g, g.node(y.node)) == "numpy"


def _whisper_stem(seed: int = 0, mels: int = 8, frames: int = 20, width: int = 24):
    """Whisper's encoder input: Conv1d(k=3, pad 1) -> Gelu -> Conv1d(k=3, stride 2, pad 1) ->
    Gelu -> transpose to (N, T, C) -> MatMul (the first projection), as an ONNX model."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    init = {"w1": rng.standard_normal((width, mels, 3)) * 0.3, "b1": rng.standard_normal(width) * 0.1,
            "w2": rng.standard_normal((width, width, 3)) * 0.2, "b2": rng.standard_normal(width) * 0.1,
            "wp": rng.standard_normal((width, 16)) * 0.2}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]), n("Gelu", ["c1"], ["g1"]),
             n("Conv", ["g1", "w2", "b2"], ["c2"], pads=[1, 1], strides=[2]), n("Gelu", ["c2"], ["g2"]),
             n("Transpose", ["g2"], ["t"], perm=[0, 2, 1]), n("MatMul", ["t", "wp"], ["y"])]
    graph = helper.make_graph(
        nodes, "whisper_stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, mels, frames])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, frames // 2, 16])],
        initializer=[numpy_helper.from_array(v.astype(F32), k) for k, v in init.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_whisper_stem_optimized_for_gpu_runs_every_node_in_triton(kit, device):
    """Both 1-D convs run in the conv template with their Gelu fused, none on the host."""
    model = _whisper_stem()
    x = np.random.default_rng(12).standard_normal((2, 8, 20)).astype(F32)
    want = kit.ort_outputs(model, {"x": x})
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    exe = TritonExecutable(g, device=device)
    kit.assert_close(exe({"x": x}), want, rtol=1e-4, atol=1e-4)
    assert exe.fallback_nodes == []
    assert [names for names, _ in kernel_sources(g)][:2] == [["conv", "gelu"], ["conv_1", "gelu_1"]]


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


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1)}),
    ("AveragePool", {"kernel_shape": (2,), "strides": (2,)}),  # SEW's feature pooling
    ("AveragePool", {"kernel_shape": (3,), "strides": (2,), "pads": (1, 0), "count_include_pad": 1, "ceil_mode": 1}),
])
@pytest.mark.parametrize("packed", [True, False], ids=["ncw_c16", "plain"])
def test_1d_pools_run_as_kernels(kit, device, op, attrs, packed):
    """Audio models pool 1-D: the same window head over one spatial dim, fused with a Relu."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 18, 11)).astype(F32)
    enc = ACT if packed else None
    g = Graph("pool1d")
    xv = g.add_input("x", TensorType(x.shape, F32))
    if packed:
        xv = kit.add(g, "Pack", [xv], {"encoding": ACT}, encoding=ACT)
    y = kit.add(g, op, [xv], attrs, encoding=None if enc is None else enc.with_pad(None))
    y = kit.add(g, "Relu", [y], encoding=None if enc is None else enc.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [y]) if packed else y, "y")
    got, ref = kit.run_both(g, {"x": x}, device)
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-6)
    assert [names for names, _ in kernel_sources(g)][-1][:2] == [op.lower(), "relu"]


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
