"""The channels-last Conv kernel: NHWC (or identity NCHW) input, RSCF (or identity) weight,
NHWC (or identity) result, against the plain NCHW kernel and onnxruntime on fresh inputs of
awkward sizes (channels 3 and 100, odd spatial sizes, strides, dilations, groups, depthwise)."""
import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tilefold.backends.numpy.kernels import packed_conv
from tilefold.layout.encoding import PackedEncoding, pack, unpack
from tilefold.layout.targets import NHWC, RSCF

CASES = {
    "3x3 pad 1, C=3": ((2, 3, 11, 9), (5, 3, 3, 3), 1, {"pads": (1, 1, 1, 1)}),
    "1x1 C=100": ((1, 100, 7, 7), (6, 100, 1, 1), 1, {}),
    "1x1 stride 2": ((2, 10, 9, 7), (4, 10, 1, 1), 1, {"strides": (2, 2)}),
    "3x2 stride 2 dilated": ((2, 6, 13, 10), (4, 6, 3, 2), 1,
                             {"strides": (2, 2), "pads": (1, 0, 2, 1), "dilations": (1, 2)}),
    "7x7 stride 2 (stem)": ((1, 3, 23, 21), (8, 3, 7, 7), 1, {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
    "grouped": ((1, 8, 9, 9), (12, 2, 3, 3), 4, {"auto_pad": "SAME_UPPER"}),
    "depthwise": ((2, 8, 9, 7), (8, 1, 3, 3), 8, {"pads": (1, 1, 1, 1)}),
    "depthwise x2 stride 2": ((1, 6, 10, 9), (12, 1, 3, 3), 6, {"strides": (2, 2), "auto_pad": "SAME_LOWER"}),
    "depthwise 7x7 (ConvNeXt)": ((2, 10, 11, 13), (10, 1, 7, 7), 10, {"pads": (3, 3, 3, 3)}),
    "depthwise stride 3 dilated": ((1, 5, 14, 17), (5, 1, 3, 3), 5,
                                   {"strides": (2, 3), "dilations": (2, 3), "pads": (0, 2, 1, 0)}),
    "depthwise unpadded": ((2, 7, 8, 9), (7, 1, 2, 3), 7, {}),
    "grouped 1x1 (ShuffleNet)": ((2, 12, 5, 7), (20, 3, 1, 1), 4, {}),
    "winograd": ((1, 48, 16, 15), (40, 48, 3, 3), 1, {"pads": (1, 1, 1, 1)}),
    "winograd asymmetric pads": ((2, 36, 13, 15), (36, 36, 3, 3), 1, {"pads": (0, 1, 1, 0)}),
    "valid": ((1, 5, 8, 8), (3, 5, 3, 3), 1, {"auto_pad": "VALID"}),
    "tap products": ((2, 12, 9, 11), (4, 12, 3, 3), 1, {"pads": (1, 1, 1, 1)}),
    "tap products, dilated, pads past the input": ((1, 10, 5, 6), (3, 10, 3, 5), 1,
                                                   {"pads": (4, 1, 2, 5), "dilations": (2, 1)}),
}


def _conv_args(rng, x_shape, w_shape, bias=True):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if bias else None
    return x, w, b


@pytest.mark.parametrize("case", list(CASES))
def test_conv_matches_the_plain_kernel(packed_check, rng, case):
    x_shape, w_shape, group, attrs = CASES[case]
    x, w, b = _conv_args(rng, x_shape, w_shape)
    attrs = dict(attrs, group=group, kernel_shape=w_shape[2:])
    for x_enc, w_enc, y_enc in itertools.product((NHWC, None), (RSCF, None), (NHWC, None)):
        if x_enc is w_enc is y_enc is None:
            continue
        for consts in ((1, 2), ()):
            packed_check("Conv", [x, w, b], [x_enc, w_enc, None], [y_enc], attrs, consts=consts,
                         rtol=1e-4, atol=1e-4, expect_path="native")


def test_conv_without_bias_and_without_kernel_shape(packed_check, rng):
    x, w, _ = _conv_args(rng, (2, 4, 8, 6), (5, 4, 2, 3), bias=False)
    packed_check("Conv", [x, w], [NHWC, RSCF], [NHWC], {"pads": (0, 1, 1, 1)}, consts=(1,), expect_path="native",
                 rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rank", [3, 5])
def test_channels_last_conv_of_other_ranks(packed_check, rng, rank):
    spatial = (9,) if rank == 3 else (5, 6, 4)
    kernel = (3,) * (rank - 2)
    x, w, b = _conv_args(rng, (2, 6, *spatial), (4, 3, *kernel))
    last = PackedEncoding((), (), packed_conv.channels_last(rank))
    gemm = PackedEncoding((), (), packed_conv.weight_gemm(rank))
    attrs = {"group": 2, "pads": (1,) * 2 * (rank - 2), "strides": (2,) * (rank - 2)}
    packed_check("Conv", [x, w, b], [last, gemm, None], [last], attrs, consts=(1, 2), expect_path="native",
                 rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rank", [3, 5])
def test_depthwise_conv_of_other_ranks(packed_check, rng, rank):
    spatial = (11,) if rank == 3 else (5, 6, 7)
    x, w, b = _conv_args(rng, (2, 6, *spatial), (6, 1, *(3,) * (rank - 2)))
    last = PackedEncoding((), (), packed_conv.channels_last(rank))
    gemm = PackedEncoding((), (), packed_conv.weight_gemm(rank))
    attrs = {"group": 6, "pads": (1,) * 2 * (rank - 2), "strides": (1,) * (rank - 3) + (2,)}
    for x_enc in (last, None):
        packed_check("Conv", [x, w, b], [x_enc, gemm, None], [last], attrs, consts=(1, 2), expect_path="native",
                     rtol=1e-4, atol=1e-4)


def test_grouped_pointwise_conv_reads_the_buffer_without_a_column_copy(packed_check, rng, monkeypatch):
    """1x1 stride 1 with groups: one batched GEMM reads each group's channels in place."""
    def refuse(*args, **kwargs):
        raise AssertionError("the grouped 1x1 conv copied its input")

    monkeypatch.setattr(packed_conv, "im2col", refuse)
    x, w, b = _conv_args(rng, *CASES["grouped 1x1 (ShuffleNet)"][:2])
    packed_check("Conv", [x, w, b], [NHWC, RSCF, None], [NHWC], {"group": 4}, consts=(1, 2),
                 expect_path="native", rtol=1e-4, atol=1e-4)


def test_a_pointwise_depthwise_conv_is_a_per_channel_scale_not_one_gemm_per_channel(packed_check, rng, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a GEMM per channel ran")

    monkeypatch.setattr(packed_conv, "gemm_conv", refuse)
    x, w, b = _conv_args(rng, (2, 9, 5, 6), (9, 1, 1, 1))
    packed_check("Conv", [x, w, b], [NHWC, RSCF, None], [NHWC], {"group": 9}, consts=(1, 2),
                 expect_path="native", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_keeps_the_dtype(packed_check, rng, dtype):
    x, w, b = (a.astype(dtype) for a in _conv_args(rng, (1, 5, 7, 7), (6, 5, 3, 3)))
    out = packed_check("Conv", [x, w, b], [NHWC, RSCF, None], [NHWC], {"pads": (1, 1, 1, 1)}, consts=(1, 2),
                       rtol=1e-2 if dtype == np.float16 else 1e-10, atol=1e-2 if dtype == np.float16 else 1e-10)
    assert out["physical"][0].dtype == dtype


def _onnxruntime_conv(x, w, b, attrs) -> np.ndarray:
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", 1, list(x.shape))],
        [helper.make_tensor_value_info("y", 1, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("case", ["7x7 stride 2 (stem)", "depthwise x2 stride 2", "winograd", "grouped",
                                  "3x2 stride 2 dilated", "tap products, dilated, pads past the input",
                                  "depthwise stride 3 dilated", "depthwise 7x7 (ConvNeXt)"])
def test_conv_matches_onnxruntime(packed_run, rng, case):
    """The stem case reads identity NCHW input and writes NHWC (the fused layout change)."""
    x_shape, w_shape, group, attrs = CASES[case]
    x, w, b = _conv_args(rng, x_shape, w_shape)
    attrs = dict(attrs, group=group, kernel_shape=w_shape[2:])
    x_enc = None if case.startswith("7x7") else NHWC
    got = packed_run("Conv", [x, w, b], [x_enc, RSCF, None], [NHWC], attrs, consts=(1, 2))["got"][0]
    np.testing.assert_allclose(got, _onnxruntime_conv(x, w, b, attrs), rtol=1e-4, atol=1e-4)


def test_pointwise_conv_is_one_gemm_on_the_buffer(packed_check, rng, monkeypatch):
    """1x1 stride 1: no im2col, no window copy; the GEMM reads the NHWC buffer as (N*H*W, C)."""
    def refuse(*args, **kwargs):
        raise AssertionError("1x1 conv copied its input")

    monkeypatch.setattr(packed_conv, "im2col", refuse)
    monkeypatch.setattr(packed_conv, "nchw_columns", refuse)
    x, w, b = _conv_args(rng, (2, 100, 5, 7), (30, 100, 1, 1))
    packed_check("Conv", [x, w, b], [NHWC, RSCF, None], [NHWC], consts=(1, 2), rtol=1e-4, atol=1e-4)


def test_rscf_weight_is_the_gemm_operand_without_a_copy(rng):
    w = pack(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), RSCF)
    forms = packed_conv.conv_weights(w, packed=True, groups=1)
    assert np.shares_memory(forms.gemm, w) and forms.gemm.shape == (1, 72, 16)


@pytest.mark.parametrize("f, taps", [(6, True), (7, False)])
def test_few_output_channels_take_tap_products_instead_of_im2col(packed_check, rng, monkeypatch, f, taps):
    """At most half as many output channels as input ones (12 -> 6): no column buffer, from an
    NHWC or an NCHW input; 7 output channels take im2col."""
    def refuse(*args, **kwargs):
        raise AssertionError("the other way ran")

    if taps:
        monkeypatch.setattr(packed_conv, "im2col", refuse)
        monkeypatch.setattr(packed_conv, "nchw_columns", refuse)
    else:
        monkeypatch.setattr(packed_conv, "conv_taps", refuse)
    x, w, b = _conv_args(rng, (2, 12, 10, 9), (f, 12, 3, 3))
    for x_enc, y_enc in ((NHWC, NHWC), (None, NHWC), (NHWC, None)):
        packed_check("Conv", [x, w, b], [x_enc, RSCF, None], [y_enc], {"pads": (1, 2, 0, 1)}, consts=(1, 2),
                     rtol=1e-4, atol=1e-4, expect_path="native")


def test_winograd_and_im2col_agree(rng):
    """Both ways of a 3x3 stride-1 conv, on one NHWC input, with a bias."""
    x = rng.standard_normal((2, 14, 11, 40)).astype(np.float32)
    w = rng.standard_normal((3, 3, 40, 33)).astype(np.float32)
    b = rng.standard_normal(33).astype(np.float32)
    geo = packed_conv.window_geometry({"pads": (1, 0, 1, 2)}, (14, 11), (3, 3))
    weights = packed_conv.ConvWeights(w, 1)
    direct = packed_conv.gemm_conv(packed_conv.im2col(x, geo, 1), weights.gemm) + b
    fast = packed_conv.winograd_nhwc(x, weights.winograd, geo, b)
    np.testing.assert_allclose(fast, direct, rtol=1e-4, atol=1e-4)
    assert fast.shape == (2, 14, 11, 33)


def test_a_conv_layout_the_kernel_does_not_know_takes_the_generic_path(packed_check, rng):
    x, w, b = _conv_args(rng, (1, 6, 7, 7), (4, 6, 3, 3))
    blocked = PackedEncoding((1,), (4,))
    out = packed_check("Conv", [x, w, b], [blocked, PackedEncoding((0, 1), (4, 4)), None], [blocked],
                       {"pads": (1, 1, 1, 1)}, consts=(1, 2), rtol=1e-4, atol=1e-4)
    assert out["path"] == "unpacked"
    assert unpack(out["physical"][0], blocked, (1, 4, 7, 7)).shape == (1, 4, 7, 7)


@pytest.mark.parametrize("case", ["3x3 pad 1, C=3", "winograd", "depthwise x2 stride 2", "7x7 stride 2 (stem)",
                                  "depthwise", "depthwise stride 3 dilated", "grouped 1x1 (ShuffleNet)"])
def test_small_integer_convs_are_exact(packed_check, rng, case):
    """Small integers sum exactly in float32 (Winograd's halves and quarters too): the layout
    change must not change a single bit."""
    x_shape, w_shape, group, attrs = CASES[case]
    x = rng.integers(-3, 4, x_shape).astype(np.float32)
    w = rng.integers(-2, 3, w_shape).astype(np.float32)
    b = rng.integers(-5, 6, w_shape[0]).astype(np.float32)
    x_enc = None if case.startswith("7x7") else NHWC
    packed_check("Conv", [x, w, b], [x_enc, RSCF, None], [NHWC], dict(attrs, group=group), consts=(1, 2),
                 rtol=0, atol=0, expect_path="native")
