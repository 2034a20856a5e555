"""F.interpolate through from_torch and torch.compile(backend="tilefold") against eager: the
linear and cubic resampling ops become one Resize (PyTorch's decomposition of them is not
used), nearest ones a Gather per axis, and none falls back to eager."""
from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tilefold
from tilefold.frontends.fx_backend import TilefoldFallbackWarning
from tilefold.graph.errors import UnsupportedOpError

CASES = [
    # (input shape, F.interpolate arguments, from_torch gives one Resize)
    ((2, 3, 5, 4), {"scale_factor": 2, "mode": "nearest"}, False),
    ((2, 3, 5, 4), {"size": (7, 9), "mode": "nearest"}, False),
    ((2, 3, 6, 4), {"scale_factor": (0.5, 1.5), "mode": "nearest"}, False),
    ((2, 3, 5, 4), {"scale_factor": 2, "mode": "nearest-exact"}, False),
    ((2, 3, 5, 4), {"scale_factor": 2, "mode": "bilinear", "align_corners": False}, True),
    ((2, 3, 5, 4), {"size": (9, 3), "mode": "bilinear", "align_corners": False}, True),
    ((2, 3, 5, 4), {"size": (7, 9), "mode": "bilinear", "align_corners": True}, True),
    ((2, 3, 5, 4), {"scale_factor": 2, "mode": "bicubic", "align_corners": False}, True),
    ((2, 3, 5, 4), {"size": (7, 9), "mode": "bicubic", "align_corners": True}, True),
    ((1, 3, 16, 12), {"size": (5, 4), "mode": "bilinear", "antialias": True}, True),
    ((1, 3, 16, 12), {"scale_factor": 0.5, "mode": "bicubic", "antialias": True}, True),
    ((1, 3, 5, 6), {"size": (9, 8), "mode": "bicubic", "antialias": True}, True),
    ((2, 4, 9), {"scale_factor": 2.5, "mode": "linear"}, True),
    ((1, 2, 3, 4, 5), {"scale_factor": 2, "mode": "trilinear"}, True),
    ((1, 2, 3, 4, 5), {"scale_factor": 2, "mode": "nearest"}, False),
    # torch's float32 index arithmetic at non-dyadic scales, and axes whose size stays
    ((1, 2, 17, 10), {"scale_factor": 1.1, "mode": "nearest"}, False),
    ((1, 2, 17, 13), {"scale_factor": 1.7, "mode": "nearest-exact"}, False),
    ((1, 2, 17, 29), {"scale_factor": 0.3, "mode": "nearest"}, False),
    ((1, 2, 3, 29), {"scale_factor": 1.1, "mode": "bilinear"}, True),
    ((1, 2, 3, 29), {"scale_factor": 1.1, "mode": "bicubic"}, True),
    ((1, 2, 3, 29), {"scale_factor": 1.1, "mode": "bicubic", "antialias": True}, True),
]


DECOMPOSITION_DIFFERS = {"bilinear-1x2x3x29-scale_factor=1.1"}
"""torch.compile decomposes upsample_bilinear2d.vec before any backend sees it, and for an
axis that a scale other than 1 leaves at its size (3 * 1.1 -> 3) the decomposition maps
coordinates with the scale where the eager kernel copies the axis: there tilefold's
compiled result is checked against torch's own decomposition (what inductor computes too)."""


class Interpolate(torch.nn.Module):
    def __init__(self, kwargs: dict) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, **self.kwargs)


def _id(case) -> str:
    shape, kwargs, _ = case
    return "-".join([kwargs["mode"], "x".join(map(str, shape)), *(f"{k}={v}" for k, v in kwargs.items() if k != "mode")])


@pytest.mark.parametrize("shape, kwargs, resize", CASES, ids=[_id(c) for c in CASES])
def test_interpolate_runs_like_eager_without_fallback(shape, kwargs, resize):
    rng = np.random.default_rng(zlib.crc32(_id((shape, kwargs, resize)).encode()))
    model = Interpolate(kwargs)
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    want = model(x).numpy()
    graph = tilefold.from_torch(model, (x,))
    assert (graph.op_counts().get("Resize") == 1) == resize
    got = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})["output_0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TilefoldFallbackWarning)
        compiled = torch.compile(model, backend="tilefold")(x)
    if _id((shape, kwargs, resize)) in DECOMPOSITION_DIFFERS:
        want = torch.compile(model, backend="aot_eager_decomp_partition")(x).numpy()
    np.testing.assert_allclose(compiled.numpy(), want, rtol=1e-5, atol=1e-5)


def test_antialiased_align_corners_is_refused_with_a_reason():
    model = Interpolate({"size": (4, 3), "mode": "bilinear", "antialias": True, "align_corners": True})
    with pytest.raises(UnsupportedOpError, match="antialiased resampling with align_corners"):
        tilefold.from_torch(model, (torch.randn(1, 2, 9, 7),))


class UNet(torch.nn.Module):
    """conv -> pool -> conv -> interpolate x2 -> concat with the first conv -> conv."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.down = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.mid = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.up = torch.nn.Conv2d(64, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = F.relu(self.down(x))
        mid = self.mid(F.max_pool2d(skip, 2))
        corners = {} if self.mode == "nearest" else {"align_corners": False}
        return self.up(torch.cat([skip, F.interpolate(mid, scale_factor=2, mode=self.mode, **corners)], 1))


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_a_unets_upsampling_runs_on_the_conv_layouts(mode, target):
    """The one runtime layout op left is the output's (the last conv's layout to NCHW)."""
    torch.manual_seed(zlib.crc32(mode.encode()))
    model = UNet(mode).eval()
    x = torch.randn(2, 3, 16, 16)
    result = tilefold.optimize(tilefold.from_torch(model, (x,)), target=target)
    assert result.report.to_dict()["layout_ops_after"] == 1
    (unpack,) = [n for n in result.graph.nodes() if n.op == "Unpack"]
    assert [result.graph.node(user).op for user, _ in result.graph.users(tilefold.graph.Value(unpack.name))] == [
        "Output"]
    got = tilefold.compile(result.graph)({result.graph.inputs[0]: x.numpy()})["output_0"]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)
