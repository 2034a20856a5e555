"""The channels-last ConvTranspose kernel: channels-last (or identity) input, GEMM-form
(C, *k, F/g) (or identity) weight, channels-last (or identity) result, against the plain
kernel on fresh inputs (strides, pads, output_padding, output_shape, auto_pad, dilations,
groups, 1-D and 3-D; a kernel equal to its stride, whose taps tile the result, is one copy)."""
import itertools

import numpy as np
import pytest

from tilefold.layout.encoding import PackedEncoding
from tilefold.layout.targets import channels_last, transposed_weight

CASES = {
    "3x3": ((2, 3, 5, 4), (3, 4, 3, 3), {}),
    "stride 2, pads, output_padding": ((1, 4, 5, 5), (4, 2, 3, 3),
                                       {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    "grouped, dilated": ((1, 4, 6, 5), (4, 3, 2, 3), {"group": 2, "strides": [2, 3], "dilations": [2, 1]}),
    "output_shape": ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}),
    "auto_pad": ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "2x2 stride 2 (U-Net)": ((2, 6, 4, 3), (6, 5, 2, 2), {"strides": [2, 2]}),
    "4x4 stride 4, grouped (DPT)": ((1, 4, 3, 2), (4, 3, 4, 4), {"strides": [4, 4], "group": 2}),
    "kernel = stride, 1-D": ((2, 4, 5), (4, 2, 3), {"strides": [3]}),
    "kernel = stride, output_padding": ((1, 3, 3, 4), (3, 2, 2, 2), {"strides": [2, 2], "output_padding": [1, 0]}),
    "1-D": ((2, 4, 9), (4, 3, 4), {"strides": [3], "pads": [2, 1], "group": 2}),
    "3-D": ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_conv_transpose_matches_the_plain_kernel(packed_check, rng, case):
    x_shape, w_shape, attrs = CASES[case]
    rank = len(x_shape)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[1] * attrs.get("group", 1)).astype(np.float32)
    last, gemm = channels_last(rank), transposed_weight(rank)
    for x_enc, w_enc, y_enc in itertools.product((last, None), (gemm, None), (last, None)):
        if x_enc is w_enc is y_enc is None:
            continue
        for consts in ((1, 2), ()):
            packed_check("ConvTranspose", [x, w, b], [x_enc, w_enc, None], [y_enc], attrs, consts=consts,
                         rtol=1e-4, atol=1e-4, expect_path="native")


def test_float16_conv_transpose_computes_in_float32(packed_check, rng):
    x = rng.standard_normal((1, 4, 5, 6)).astype(np.float16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    out = packed_check("ConvTranspose", [x, w], [channels_last(4), transposed_weight(4)], [channels_last(4)],
                       {"strides": [2, 2]}, consts=(1,), rtol=2e-3, atol=2e-3, expect_path="native")
    assert out["physical"][0].dtype == np.float16


def test_a_weight_packed_otherwise_takes_another_path(packed_run, rng):
    """Only the GEMM form (C, *k, F/g) is read natively: an RSCF-like (k, C, F) buffer is not."""
    x = rng.standard_normal((1, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    other = PackedEncoding((), (), (2, 3, 0, 1))
    out = packed_run("ConvTranspose", [x, w], [channels_last(4), other], [channels_last(4)], consts=(1,))
    assert out["path"] != "native"
    np.testing.assert_allclose(out["got"][0], out["expected"][0], rtol=1e-4, atol=1e-4)
