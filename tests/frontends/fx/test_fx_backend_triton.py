"""torch.compile(backend="tilefold", options={"device": ...}) on a Triton device: the Triton
backend runs the compiled graphs on the tensors themselves (CPU tensors under `interp`, CUDA
tensors on `cuda`), outputs come back as new tensors on that device, the gpu target's layouts
by default, ops tilefold lacks eagerly in PyTorch, and devices that are not there are refused
in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tilefold.backends.triton import TritonExecutable
from tilefold.frontends import fx
from tilefold.frontends.fx_backend import TilefoldFallbackWarning
from tilefold.graph.errors import TilefoldError

DEVICES = ["interp"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A Triton device; on a GPU, eager PyTorch with TF32 off (cuDNN's default is on), so that
    it computes float32 as tilefold's kernels do."""
    if request.param == "cuda":
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    return request.param


def _torch_device(device: str) -> torch.device:
    return torch.device("cpu") if device == "interp" else torch.device(device)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    assert got.device == want.device
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name, shape", [("mlp", (5, 32)), ("cnn", (2, 3, 12, 12))])
def test_compiled_model_runs_triton_kernels_and_matches_eager(zoo, device, name, shape):
    where = _torch_device(device)
    model, reports = getattr(zoo, name)(1).to(where), []
    compiled = torch.compile(model, backend="tilefold", options={"device": device, "report": reports.append})
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for _ in range(3):  # recorded, then replayed
            x = zoo.randn(rng, *shape).to(where)
            close(compiled(x), model(x))
    (report,) = reports
    exe = report.executable
    assert isinstance(exe, TritonExecutable) and exe.fallback_nodes == []
    assert exe.graph.meta["target"] == "gpu" and report.fallback == {}
    assert exe._record is not None and "step by step" not in exe.launch_path


def test_outputs_are_tensors_of_their_own(zoo):
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = torch.relu(x)
        return y, y.reshape(-1), x * 2

    compiled = torch.compile(f, backend="tilefold", options={"device": "interp"})
    x = zoo.randn(np.random.default_rng(3), 3, 4)
    with torch.no_grad():
        for _ in range(2):
            a, b, c = compiled(x)
            close(a, torch.relu(x))
            a.add_(1.0)  # changes neither the other outputs nor the next call's
            close(b, torch.relu(x).reshape(-1))
            close(c, x * 2)


def test_an_op_tilefold_lacks_runs_eagerly_between_triton_pieces(zoo):
    rng = np.random.default_rng(4)
    lin = torch.nn.Linear(6, 6).eval()

    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.histc(lin(x), bins=6)
        return torch.tanh(y) * 2 + x

    reports = []
    compiled = torch.compile(f, backend="tilefold", options={"device": "interp", "report": reports.append})
    x = zoo.randn(rng, 3, 6)
    with torch.no_grad(), pytest.warns(TilefoldFallbackWarning, match=r"aten\.histc"):
        close(compiled(x), f(x))
    x = zoo.randn(rng, 3, 6)
    with torch.no_grad():
        close(compiled(x), f(x))
    assert len(reports) == 2 and all(isinstance(r.executable, TritonExecutable) for r in reports)


def test_an_unknown_device_and_a_missing_gpu_are_one_line_errors(zoo):
    with pytest.raises(TilefoldError, match=r"tilefold backend: unknown Triton device 'tpu'.*'cpu' runs the NumPy"):
        fx.backend(device="tpu")
    with pytest.raises(Exception, match="unknown Triton device 'npu'"):
        with torch.no_grad():
            torch.compile(zoo.mlp(5), backend="tilefold", options={"device": "npu"})(torch.randn(2, 32))
    if not torch.cuda.is_available():
        with pytest.raises(TilefoldError, match=r"device 'cuda' is not available here \(no CUDA GPU\)") as info:
            fx.backend(device="cuda")
        assert "\n" not in str(info.value)


def test_a_bfloat16_model_runs_on_triton_and_eagerly_on_the_numpy_backend(zoo):
    """bfloat16 weights freeze as ml_dtypes arrays; the Triton kernels compute in float32 and
    round once per kernel, eager PyTorch's bfloat16 ops once per op: within a few bfloat16
    steps. The NumPy backend has no bfloat16, so device "cpu" runs the model eagerly."""
    model = zoo.mlp(8).to(torch.bfloat16)
    rng = np.random.default_rng(9)
    reports = []
    compiled = torch.compile(model, backend="tilefold", options={"device": "interp", "report": reports.append})
    with torch.no_grad():
        for _ in range(2):
            x = zoo.randn(rng, 4, 32).to(torch.bfloat16)
            got, want = compiled(x), model(x)
            assert got.dtype == torch.bfloat16 and got.shape == want.shape
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    (report,) = reports
    assert isinstance(report.executable, TritonExecutable) and report.fallback == {}
    assert report.executable.fallback_nodes == []

    torch._dynamo.reset()
    on_numpy = torch.compile(model, backend="tilefold")
    x = zoo.randn(rng, 4, 32).to(torch.bfloat16)
    with torch.no_grad(), pytest.warns(TilefoldFallbackWarning, match="element type torch.bfloat16"):
        torch.testing.assert_close(on_numpy(x), model(x))


def test_casts_to_and_from_bfloat16_run_on_triton(zoo):
    """BERT in bfloat16 casts its attention mask to the model's type (Cast to=16)."""

    def f(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.bfloat16) * (1.0 - mask.to(torch.bfloat16))).float() + mask.float()

    reports = []
    compiled = torch.compile(f, backend="tilefold", options={"device": "interp", "report": reports.append})
    rng = np.random.default_rng(10)
    x, mask = zoo.randn(rng, 3, 8), torch.from_numpy(rng.integers(0, 2, (3, 8)))
    with torch.no_grad():  # a fused kernel rounds to bfloat16 once, eager after each op: a step apart at most
        torch.testing.assert_close(compiled(x, mask), f(x, mask), atol=1e-2, rtol=1e-2)
    assert reports[0].fallback == {}
