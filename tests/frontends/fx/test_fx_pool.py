"""Adaptive average pooling (1-d, 2-d, 3-d, and F.interpolate(mode="area")) through from_torch
and torch.compile(backend="tilefold") against eager: output sizes that divide the input's
become AveragePool, any other size (smaller, larger, one axis dividing and the other not,
unbatched inputs) a MatMul per axis with constant averaging windows; none falls back."""
from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tilefold
from tilefold.frontends.fx import unsupported_nodes
from tilefold.frontends.fx_backend import TilefoldFallbackWarning
from tilefold.frontends.fx_ops import RULES
from tilefold.frontends.fx_ops_nn import adaptive_windows

CASES = [
    # (F function, input shape, output size or interpolate arguments, the op pooling becomes)
    ("adaptive_avg_pool2d", (2, 8, 13, 13), 6, "MatMul"),  # torchvision AlexNet's pooler
    ("adaptive_avg_pool2d", (2, 3, 7, 7), 3, "MatMul"),
    ("adaptive_avg_pool2d", (2, 3, 5, 5), 7, "MatMul"),  # larger than the input: windows repeat inputs
    ("adaptive_avg_pool2d", (2, 3, 6, 7), (3, 5), "MatMul"),  # H divides, W does not
    ("adaptive_avg_pool2d", (2, 3, 9, 4), (4, 6), "MatMul"),  # one axis shrinks, the other grows
    ("adaptive_avg_pool2d", (2, 3, 9, 5), (None, 3), "MatMul"),  # H kept
    ("adaptive_avg_pool2d", (3, 7, 9), (4, 4), "MatMul"),  # unbatched
    ("adaptive_avg_pool2d", (3, 6, 8), (3, 2), "MatMul"),  # unbatched, dividing
    ("adaptive_avg_pool2d", (2, 3, 8, 12), (4, 3), "AveragePool"),
    ("adaptive_avg_pool1d", (2, 3, 10), 4, "MatMul"),
    ("adaptive_avg_pool1d", (2, 3, 4), 9, "MatMul"),
    ("adaptive_avg_pool3d", (1, 2, 5, 7, 9), (2, 3, 4), "MatMul"),
    ("adaptive_avg_pool3d", (2, 5, 7, 6), (3, 8, 3), "MatMul"),  # unbatched, W dividing
    ("adaptive_avg_pool3d", (1, 2, 4, 6, 8), (2, 3, 4), "AveragePool"),
    ("interpolate", (2, 3, 13, 7), {"size": (5, 9), "mode": "area"}, "MatMul"),
    ("interpolate", (2, 3, 10), {"scale_factor": 0.7, "mode": "area"}, "MatMul"),
]


class Pool(torch.nn.Module):
    def __init__(self, function: str, size) -> None:
        super().__init__()
        self.function, self.size = function, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.size, dict):
            return getattr(F, self.function)(x, **self.size)
        return getattr(F, self.function)(x, self.size)


def _id(case) -> str:
    function, shape, size, _ = case
    size = ",".join(f"{k}={v}" for k, v in size.items()) if isinstance(size, dict) else size
    return f"{function}-{'x'.join(map(str, shape))}-{size}"


def _randn(rng: np.random.Generator, shape, dtype=torch.float32) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


@pytest.mark.parametrize("n_in, n_out", [(13, 6), (7, 3), (5, 7), (6, 3), (1, 4), (9, 9), (10, 1)])
def test_averaging_windows_are_torch_s(n_in, n_out):
    """Row i of the matrix is what torch's adaptive pooling makes of input i (pooling the identity)."""
    pooled = F.adaptive_avg_pool1d(torch.eye(n_in, dtype=torch.float64)[None], n_out)[0]
    np.testing.assert_allclose(adaptive_windows(n_in, n_out), pooled.T.numpy(), rtol=1e-15, atol=0)


@pytest.mark.parametrize("function, shape, size, op", CASES, ids=[_id(c) for c in CASES])
def test_adaptive_pooling_runs_like_eager_without_fallback(function, shape, size, op):
    rng = np.random.default_rng(zlib.crc32(_id((function, shape, size, op)).encode()))
    model = Pool(function, size)
    graph = tilefold.from_torch(model, (_randn(rng, shape),))
    counts = graph.op_counts()
    assert op in counts and ({"MatMul", "AveragePool"} - {op}).isdisjoint(counts)
    run = tilefold.compile(tilefold.optimize(graph, "cpu").graph)
    for _ in range(2):  # fresh inputs, not the traced one
        x = _randn(rng, shape)
        got = run({graph.inputs[0]: x.numpy()})["output_0"]
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)
    x = _randn(rng, shape)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TilefoldFallbackWarning)
        compiled = torch.compile(model, backend="tilefold")(x)
    np.testing.assert_allclose(compiled.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float16, 1e-3)])
@pytest.mark.parametrize("shape, size", [((2, 4, 13, 13), 6), ((2, 4, 5, 5), 7)])
def test_adaptive_pooling_keeps_the_input_dtype(dtype, tolerance, shape, size):
    """float64 averages in float64; float16 in float32, rounded once at the end (as torch)."""
    rng = np.random.default_rng(len(shape) + size)
    model = Pool("adaptive_avg_pool2d", size)
    graph = tilefold.from_torch(model, (_randn(rng, shape, dtype),))
    x = _randn(rng, shape, dtype)
    got = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})["output_0"]
    assert got.dtype == x.numpy().dtype
    np.testing.assert_allclose(got, model(x).numpy(), rtol=tolerance, atol=tolerance)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TilefoldFallbackWarning)
        compiled = torch.compile(model, backend="tilefold")(x)
    assert compiled.dtype == dtype
    np.testing.assert_allclose(compiled.numpy(), model(x).numpy(), rtol=tolerance, atol=tolerance)


def test_symbolic_sizes_are_refused_with_a_reason():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.ops.aten._adaptive_avg_pool2d(x, [3, 5]), tracing_mode="symbolic")(
        torch.randn(2, 3, 7, 9))
    (node, reason), = unsupported_nodes(gm).items()
    assert node.target == torch.ops.aten._adaptive_avg_pool2d.default and "symbolic" in reason
    assert "symbolic size" in RULES[node.target].check(node)


def test_dynamic_compilation_specializes_the_windows_per_shape():
    model = Pool("adaptive_avg_pool2d", (3, 5))
    compiled = torch.compile(model, backend="tilefold", dynamic=True)
    rng = np.random.default_rng(3)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TilefoldFallbackWarning)
        for shape in [(2, 3, 7, 9), (1, 4, 11, 6), (2, 3, 6, 10)]:
            x = _randn(rng, shape)
            np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
