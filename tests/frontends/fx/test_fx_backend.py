"""torch.compile(backend="tilefold") against eager PyTorch: numerics, weight guard, graph
breaks, eager fallback, recompilation, inference modes, training refused, options."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tilefold.frontends import fx
from tilefold.frontends.fx_backend import BackendReport, TilefoldFallbackWarning
from tilefold.graph.errors import TilefoldError

ATOL, RTOL = 1e-5, 1e-4


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def test_backend_is_registered_under_its_name():
    assert "tilefold" in torch._dynamo.list_backends()


@pytest.mark.parametrize("name, shape", [("mlp", (8, 32)), ("cnn", (2, 3, 16, 16))])
def test_compiled_model_matches_eager_and_keeps_no_layout_op(zoo, name, shape):
    rng = np.random.default_rng(0)
    model, reports = getattr(zoo, name)(0), []
    compiled = torch.compile(model, backend="tilefold", options={"report": reports.append})
    with torch.no_grad():
        for _ in range(2):
            x = zoo.randn(rng, *shape)
            close(compiled(x), model(x))
    assert len(reports) == 1 and isinstance(reports[0], BackendReport)
    assert reports[0].fallback == {}
    assert reports[0].optimized.report.to_dict()["layout_ops_after"] == 0


def test_zero_dim_parameters_and_tensor_constants_stay_zero_dim():
    """CLIP's logit_scale (a 0-d parameter) and Bloom's torch.tensor(0.5) constant: frozen as 0-d
    arrays, so the graph runs wholly on tilefold with torch's shapes."""

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(0.7))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            slopes = torch.pow(torch.tensor(0.5), torch.arange(1, 4, dtype=torch.int32))
            return x.sum() * self.scale.exp(), x * slopes

    model, reports = Scaled().eval(), []
    compiled = torch.compile(model, backend="tilefold", options={"report": reports.append})
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32))
    with torch.no_grad():
        got, want = compiled(x), model(x)
    for g, w in zip(got, want):
        close(g, w)
    assert reports[0].fallback == {}


def test_inference_mode_and_integer_inputs():
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    emb, head = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 3)

    def f(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = emb(ids) * mask.unsqueeze(-1).to(torch.float32)
        return head(h).amax(dim=1), (ids > 25).sum(dim=1)

    compiled = torch.compile(f, backend="tilefold")
    ids = torch.from_numpy(rng.integers(0, 50, (2, 7)))
    mask = torch.from_numpy(rng.integers(0, 2, (2, 7)))
    with torch.inference_mode():
        got, want = compiled(ids, mask), f(ids, mask)
    close(got[0], want[0])
    assert torch.equal(got[1], want[1]) and got[1].dtype == torch.int64


def test_second_instance_with_other_weights_gets_its_own_results(zoo):
    """Dynamo reuses one graph for every instance of a class; the folded weights must not leak."""
    rng = np.random.default_rng(2)
    first, second = zoo.cnn(1), zoo.cnn(2)
    x = zoo.randn(rng, 2, 3, 16, 16)
    with torch.no_grad():
        close(torch.compile(first, backend="tilefold")(x), first(x))
        compiled_second = torch.compile(second, backend="tilefold")
        close(compiled_second(x), second(x))
        assert not torch.allclose(first(x), second(x))
        second.fc.weight.mul_(-2.0)  # in place: the guard sees the version change and refolds
        close(compiled_second(x), second(x))


def test_graph_break_runs_both_graphs(zoo):
    rng = np.random.default_rng(3)
    model = zoo.mlp(3)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = model[:3](x)
        torch._dynamo.graph_break()
        return model[3:](y) + 1

    reports = []
    compiled = torch.compile(f, backend=fx.backend(report=reports.append))
    x = zoo.randn(rng, 4, 32)
    with torch.no_grad():
        close(compiled(x), f(x))
    assert len(reports) == 2


def test_unsupported_op_falls_back_to_eager_with_one_warning_naming_it(zoo):
    rng = np.random.default_rng(4)
    torch.manual_seed(4)
    lin = torch.nn.Linear(6, 6)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.histc(lin(x), bins=6)
        return torch.tanh(y) * 2 + x

    compiled = torch.compile(f, backend="tilefold")
    x = zoo.randn(rng, 3, 6)
    with torch.no_grad(), pytest.warns(TilefoldFallbackWarning, match=r"aten\.histc") as caught:
        close(compiled(x), f(x))
    assert len([w for w in caught if issubclass(w.category, TilefoldFallbackWarning)]) == 1
    x = zoo.randn(rng, 3, 6)
    with torch.no_grad():
        close(compiled(x), f(x))


def test_a_split_graph_whose_helper_nodes_share_a_boundary_inputs_name(zoo):
    """Split around an op tilefold lacks, the second piece reads the first's `expand` as an
    input after its own computation, in which index_put adds helper Expands of that name."""

    def f(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        a = x.unsqueeze(0).expand(3, 4)
        s = torch.histc(a, bins=12).reshape(3, 4)
        return torch.index_put(torch.zeros(3, 4), (idx,), s) + a

    x, idx = zoo.randn(np.random.default_rng(8), 4), torch.tensor([2, 0, 1])
    with torch.no_grad(), pytest.warns(TilefoldFallbackWarning, match=r"aten\.histc"):
        close(torch.compile(f, backend="tilefold")(x, idx), f(x, idx))


def test_batch_statistics_of_a_weight_convert_with_no_fallback(zoo):
    """BiT's weight standardization: batch_norm(training=True) of a conv's weight, decomposed
    by PyTorch's table into reductions tilefold has (and folded with the weight)."""

    class StandardizedConv(torch.nn.Conv2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = torch.nn.functional.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                                               training=True, momentum=0.0, eps=1e-8).reshape_as(self.weight)
            return torch.nn.functional.conv2d(x, w, self.bias, padding=1)

    torch.manual_seed(9)
    conv = StandardizedConv(3, 8, 3).eval()
    x = zoo.randn(np.random.default_rng(9), 2, 3, 8, 8)
    reports: list[BackendReport] = []
    with torch.no_grad():
        close(torch.compile(conv, backend=fx.backend(report=reports.append))(x), conv(x))
    assert reports and not any(r.fallback for r in reports)


def test_new_shapes_recompile_and_stay_correct(zoo):
    rng = np.random.default_rng(5)
    model = zoo.cnn(5)
    compiled = torch.compile(model, backend="tilefold")
    with torch.no_grad():
        for shape in [(1, 3, 16, 16), (3, 3, 20, 20), (2, 3, 12, 24), (3, 3, 20, 20)]:
            x = zoo.randn(rng, *shape)
            close(compiled(x), model(x))


def test_training_is_refused_with_a_reason(zoo):
    model = zoo.mlp(6)
    compiled = torch.compile(model, backend="tilefold")
    with pytest.raises(Exception, match="inference only.*no_grad"):
        compiled(torch.randn(2, 32))


def test_options_are_checked(zoo):
    model = zoo.mlp(7)
    with pytest.raises(Exception, match="unknown option"):
        with torch.no_grad():
            torch.compile(model, backend="tilefold", options={"tile": 4})(torch.randn(2, 32))
    with pytest.raises(TilefoldError, match="device 'tpu'"):
        fx.backend(device="tpu")


def test_outputs_never_alias_inputs_or_each_other():
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x.clone()
        return y, y.reshape(-1), x * 2

    compiled = torch.compile(f, backend="tilefold")
    x = torch.randn(3, 4)
    with torch.no_grad():
        a, b, c = compiled(x)
    close(a, x)
    a.add_(1.0)
    close(c, x * 2)
    assert not torch.equal(a, x)
