"""PyTorch's OpInfo samples (float32, CPU) of the ops tilefold claims, through
torch.compile(backend="tilefold") against eager PyTorch.

Every sample must give eager's answer (a sample with an op variant tilefold lacks runs
eagerly, with a warning: never a wrong answer), and every op must run on tilefold for at
least one sample. The quick run takes the first SAMPLES samples per op; the slow one all.
Needs `expecttest` (imported by torch.testing._internal)."""
from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

from tilefold.frontends import fx  # noqa: E402
from tilefold.frontends.fx_backend import TilefoldFallbackWarning  # noqa: E402

SAMPLES = 2
CLAIMED = (
    "abs acos acosh add addmm amax amin any all argmax argmin as_strided asin asinh atan atanh bmm cat ceil "
    "clamp clone constant_pad_nd cos cosh cumsum div eq erf exp expand expm1 flip floor fmod gather ge gt "
    "index_add index_copy index_fill index_put index_select le "
    "log log1p logical_and logical_not logical_or linalg.vector_norm logical_xor lt maximum mean minimum "
    "mm mul ne neg nn.functional.adaptive_avg_pool1d nn.functional.adaptive_avg_pool2d "
    "nn.functional.adaptive_avg_pool3d nn.functional.conv2d nn.functional.conv_transpose2d nn.functional.embedding "
    "nn.functional.gelu nn.functional.group_norm nn.functional.hardtanh nn.functional.interpolate.area "
    "nn.functional.layer_norm "
    "nn.functional.leaky_relu nn.functional.linear nn.functional.relu permute pow reciprocal remainder "
    "repeat reshape round rsqrt scatter scatter_add scatter_reduce sigmoid sign sin sinh slice slice_scatter "
    "softmax log_softmax sort argsort split sqrt squeeze sub "
    "sum tan tanh topk tril triu unsqueeze var var_mean view where"
).split()
TOLERANCES = {"nn.functional.conv2d": (1e-4, 1e-4), "nn.functional.conv_transpose2d": (1e-4, 1e-4)}
"""(atol, rtol) beyond the default (1e-5, 1.3e-6): a convolution sums its products in another
order as a GEMM than oneDNN's direct kernel."""
VARIANTS = {"div", "scatter_reduce"}
"""Claimed ops whose OpInfo entries are all variants (div: no, trunc and floor rounding;
scatter_reduce: sum, prod, mean, amax, amin). One variant alone is claimed by its id
(nn.functional.interpolate.area: adaptive average pooling)."""


def _op_id(op) -> str:
    return ".".join(filter(None, (op.name, op.variant_test_name)))


OPS = [op for op in op_db
       if _op_id(op) in CLAIMED or (op.name in CLAIMED and (op.variant_test_name == "" or op.name in VARIANTS))]
IDS = [_op_id(op) for op in OPS]


def _run(op, limit: int | None) -> Counter:
    counts: Counter = Counter()
    for index, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=False)):
        if limit is not None and index >= limit:
            break
        torch._dynamo.reset()
        reports = []

        def f(x, *args, _sample=sample, **kwargs):
            return op(x, *args, **kwargs)

        compiled = torch.compile(f, backend=fx.backend(report=reports.append), dynamic=False)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", TilefoldFallbackWarning)
            want = op(sample.input, *sample.args, **sample.kwargs)
            got = compiled(sample.input, *sample.args, **sample.kwargs)
        atol, rtol = TOLERANCES.get(op.name, (1e-5, 1.3e-6))
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True,
                                   msg=lambda m: f"{op.name} sample {index}: {m}")
        counts["samples"] += 1
        counts["on tilefold"] += int(bool(reports) and all(not r.fallback for r in reports))
    return counts


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_opinfo_samples_match_eager(op):
    counts = _run(op, SAMPLES)
    print(f"{op.name}: {counts['on tilefold']}/{counts['samples']} samples on tilefold")
    assert counts["on tilefold"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_opinfo_all_samples_match_eager(op):
    counts = _run(op, None)
    print(f"{op.name}: {counts['on tilefold']}/{counts['samples']} samples on tilefold")
    assert counts["on tilefold"] >= 1
