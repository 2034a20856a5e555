"""tilefold.from_torch: module -> Graph (core ATen, weights frozen), against eager PyTorch."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilefold
from tilefold.graph.errors import UnsupportedOpError
from tilefold.graph.verify import verify_graph



@pytest.mark.parametrize("name, shape", [("mlp", (8, 32)), ("cnn", (2, 3, 16, 16))])
def test_from_torch_graph_runs_like_eager(zoo, name, shape):
    rng = np.random.default_rng(0)
    model = getattr(zoo, name)(0)
    x = zoo.randn(rng, *shape)
    graph = tilefold.from_torch(model, (x,))
    verify_graph(graph)
    assert len(graph.inputs) == 1 and "Constant" in graph.op_counts()
    for _ in range(2):
        x = zoo.randn(rng, *shape)
        for g in (graph, tilefold.optimize(graph, "cpu").graph):
            out = tilefold.compile(g)({graph.inputs[0]: x.numpy()})["output_0"]
            np.testing.assert_allclose(out, model(x).detach().numpy(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name, shape", [("mlp", (8, 32)), ("cnn", (2, 3, 16, 16))])
def test_no_runtime_layout_op_on_the_cpu_target(zoo, name, shape):
    """The graph the backend optimizes: from_torch's (simplified: weights' transposes folded)."""
    graph = tilefold.from_torch(getattr(zoo, name)(0), (torch.randn(*shape),))
    assert tilefold.optimize(graph, "cpu").report.to_dict()["layout_ops_after"] == 0


def test_weights_are_frozen_constants_sharing_memory(zoo):
    model = zoo.mlp(1)
    graph = tilefold.from_torch(model, (torch.randn(2, 32),), simplify_graph=False)
    weight = model[0].weight.detach().numpy()
    constants = [n.attrs["value"] for n in graph.constants() if isinstance(n.attrs["value"], np.ndarray)]
    shared = [c for c in constants if np.shares_memory(c, weight)]
    assert shared and not shared[0].flags.writeable


def test_from_torch_gives_the_graph_the_backend_sees(zoo):
    model = zoo.cnn(2)
    x = torch.randn(2, 3, 16, 16)
    seen = []
    with torch.no_grad():
        torch.compile(model, backend="tilefold", options={"report": seen.append})(x)
    assert seen[0].graph.op_counts() == tilefold.from_torch(model, (x,)).op_counts()


def test_unsupported_op_is_named():
    class Histogram(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.histc(x, bins=5)

    with pytest.raises(UnsupportedOpError, match=r"aten\.histc"):
        tilefold.from_torch(Histogram(), (torch.randn(3, 4),))


def test_from_torch_takes_an_attention_mask_despite_export_s_dtype_asserts():
    """torch.export adds `_assert_tensor_metadata` checks when the mask changes dtype: they
    are checks, not computation, so from_torch drops them."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                                 intermediate_size=64, vocab_size=50)).eval()
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[:, -3:] = 0
    graph = tilefold.from_torch(model, (ids, mask))
    assert graph.meta["source"] == "BertModel (torch.fx)"
    got = tilefold.compile(tilefold.optimize(graph, "cpu").graph)(dict(zip(graph.inputs, (ids.numpy(), mask.numpy()))))
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state.numpy()
    np.testing.assert_allclose(got[graph.output_names()[0]], want, rtol=1e-4, atol=1e-5)


class _KeywordInputs(torch.nn.Module):
    """A transformers model called as `model(input_ids=..., attention_mask=...)`."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def test_from_torch_decomposes_gpt2_sdpa_attention_in_the_kernel_s_layout():
    """GPT-2's sdpa attention transposes the attention output and views it: PyTorch's own
    decomposition of the CPU flash attention lays its output out otherwise than the kernel,
    and torch.export then failed ("Cannot view a tensor"). Both paths match eager."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(1)
    config = GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50, use_cache=False, attn_implementation="sdpa")
    model = _KeywordInputs(GPT2Model(config).eval())
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        want = model(ids, mask).numpy()
        compiled = torch.compile(model, backend="tilefold")(ids, mask).numpy()
    graph = tilefold.from_torch(model, (ids, mask))
    got = tilefold.compile(graph)(dict(zip(graph.inputs, (ids.numpy(), mask.numpy()))))
    np.testing.assert_allclose(got[graph.output_names()[0]], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(compiled, want, rtol=1e-4, atol=1e-5)


class _GroupNormConv(torch.nn.Module):
    """wav2vec2's feature encoder in small: a conv, GroupNorm and a weight-normed conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 16, 5, stride=2)
        self.norm = torch.nn.GroupNorm(4, 16)
        self.pos = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(16, 16, 3, padding=1, groups=4), dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.gelu(self.norm(self.conv(x)))
        return y + self.pos(y)


def test_group_norm_and_weight_norm_are_decomposed_by_pytorch_not_run_eagerly():
    model = _GroupNormConv().eval()
    x = torch.randn(2, 1, 64)
    graph = tilefold.from_torch(model, (x,))  # raises if any op were left unconverted
    for _ in range(2):
        x = torch.randn(2, 1, 64)
        out = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})["output_0"]
        np.testing.assert_allclose(out, model(x).detach().numpy(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("size, stride, offset", [
    ((4, 6), (6, 1), 0),  # the tensor itself: a Reshape
    ((5, 3), (2, 1), 1),  # overlapping windows from an offset: a Gather
    ((3, 4), (1, 3), 0),  # a transposed view
])
def test_as_strided_of_a_contiguous_tensor(size, stride, offset):
    class View(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.as_strided(x * 2, size, stride, offset) + 1

    x = torch.randn(4, 6)
    graph = tilefold.from_torch(View(), (x,))
    assert ("Gather" in graph.op_counts()) == (size != (4, 6))
    x = torch.randn(4, 6)
    out = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})["output_0"]
    np.testing.assert_array_equal(out, View()(x).numpy())


@pytest.mark.parametrize("pool", [
    torch.nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True),
    torch.nn.AvgPool2d(3, stride=2, ceil_mode=True, count_include_pad=False),
    torch.nn.AvgPool2d(320, ceil_mode=True),  # EfficientNet's pooler: the window overhangs the 5x6 map
    torch.nn.MaxPool2d(7, ceil_mode=True),
], ids=["avg-pad", "avg-exclude-pad", "avg-320", "max-7"])
def test_ceil_mode_pools_convert_and_run_like_eager(pool):
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((2, 4, 5, 6)).astype(np.float32))
    graph = tilefold.from_torch(pool, (x,))
    for target in ("cpu", "gpu"):
        out = tilefold.compile(tilefold.optimize(graph, target).graph)({graph.inputs[0]: x.numpy()})["output_0"]
        np.testing.assert_allclose(out, pool(x).numpy(), atol=1e-6, rtol=1e-5)


_I, _J = torch.tensor([0, 2, -1]), torch.tensor([[1], [3]])


@pytest.mark.parametrize("index", [
    lambda x: x[:, _I],
    lambda x: x[:, _I, _J],  # adjacent indexed dims: the broadcast dims stay in their place
    lambda x: x[:, :, _I, _J],
    lambda x: x[_I, :, _J],  # separated: the broadcast dims lead
    lambda x: x[:, _I[:, None], _I[None, :]],  # ConvBERT's and BEiT's pattern
    lambda x: x[_I, _J],
], ids=["one", "adjacent", "adjacent-last", "separated", "outer", "leading"])
def test_advanced_indexing_anywhere_converts_and_runs_like_eager(index):
    class Index(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return index(x * 2)

    x = torch.from_numpy(np.random.default_rng(7).standard_normal((4, 5, 6, 7)).astype(np.float32))
    graph = tilefold.from_torch(Index(), (x,))
    out = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})["output_0"]
    np.testing.assert_array_equal(out, Index()(x).numpy())


def _into_zeros(x: torch.Tensor) -> torch.Tensor:
    y = torch.zeros(6, 7)
    y[1:, 2:] = x[:5, :5]  # BEiT's relative-position table
    return y


def _strided_fill(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[::2, 1:6:3] = 5.0
    return y


def _row(x: torch.Tensor) -> torch.Tensor:
    y = torch.ones(3, 6, 7)
    y[1] = x
    return y


@pytest.mark.parametrize("assign", [_into_zeros, _strided_fill, _row])
def test_slice_assignment_converts_and_runs_like_eager(assign):
    class Assign(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return assign(x) * 2

    x = torch.from_numpy(np.random.default_rng(8).standard_normal((6, 7)).astype(np.float32))
    graph = tilefold.from_torch(Assign(), (x,))
    out = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})["output_0"]
    np.testing.assert_array_equal(out, Assign()(x).numpy())


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim, keepdim", [(1, False), (-1, True)])
def test_max_and_min_along_a_dim_give_values_and_first_indices(largest, dim, keepdim):
    class Extreme(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            values, indices = (torch.max if largest else torch.min)(x.round(), dim=dim, keepdim=keepdim)
            return values * 2, indices

    x = torch.from_numpy(np.random.default_rng(9).standard_normal((4, 5, 6)).astype(np.float32) * 2)  # ties
    graph = tilefold.from_torch(Extreme(), (x,))
    got = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})
    for name, want in zip(("output_0", "output_1"), Extreme()(x)):
        np.testing.assert_array_equal(got[name], want.numpy())


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_integer_division_rounds_as_torch_does_for_negative_operands(mode):
    class Divide(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.div(a * 3, b, rounding_mode=mode)

    rng = np.random.default_rng(10)
    a = torch.from_numpy(rng.integers(-20, 20, 40))
    b = torch.from_numpy(rng.integers(1, 7, 40) * rng.choice([-1, 1], 40))
    graph = tilefold.from_torch(Divide(), (a, b))
    out = tilefold.compile(graph)(dict(zip(graph.inputs, (a.numpy(), b.numpy()))))["output_0"]
    np.testing.assert_array_equal(out, Divide()(a, b).numpy())


def test_integer_powers_stay_integers():
    class Power(torch.nn.Module):
        def forward(self, a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a ** e, 2 ** e + a ** 3

    rng = np.random.default_rng(11)
    a, e = torch.from_numpy(rng.integers(-5, 6, 30)), torch.from_numpy(rng.integers(0, 4, 30))
    graph = tilefold.from_torch(Power(), (a, e))
    got = tilefold.compile(graph)(dict(zip(graph.inputs, (a.numpy(), e.numpy()))))
    for name, want in zip(("output_0", "output_1"), Power()(a, e)):
        assert got[name].dtype == np.int64
        np.testing.assert_array_equal(got[name], want.numpy())


@pytest.mark.parametrize("largest", [True, False])
def test_topk_routing_as_in_a_mixture_of_experts(largest):
    class Route(torch.nn.Module):
        def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            weights, experts = torch.topk(torch.softmax(logits, -1), 2, dim=-1, largest=largest)
            return weights / weights.sum(-1, keepdim=True), experts

    logits = torch.from_numpy(np.random.default_rng(12).standard_normal((2, 9, 8)).astype(np.float32))
    graph = tilefold.from_torch(Route(), (logits,))
    got = tilefold.compile(graph)({graph.inputs[0]: logits.numpy()})
    want = Route()(logits)
    np.testing.assert_allclose(got["output_0"], want[0].numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got["output_1"], want[1].numpy())


def test_transposed_convolution_of_a_decoder_block_runs_like_eager_on_both_targets():
    torch.manual_seed(13)
    up = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                             torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
                             torch.nn.Conv2d(4, 2, 1)).eval()
    x = torch.from_numpy(np.random.default_rng(13).standard_normal((2, 3, 6, 5)).astype(np.float32))
    graph = tilefold.from_torch(up, (x,))
    assert graph.op_counts()["ConvTranspose"] == 1
    with torch.no_grad():
        want = up(x).numpy()
    for target in ("cpu", "gpu"):
        out = tilefold.compile(tilefold.optimize(graph, target).graph)({graph.inputs[0]: x.numpy()})["output_0"]
        np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_bitwise_ops_and_shifts_on_integers_run_like_eager(dtype):
    """Including shifts by a negative amount or the width or more, which torch and BitShift
    both define (0, or the sign fill shifting right)."""
    class Bits(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (a & b, a | 5, a ^ b, ~a, a << b, a >> b, a >> 2, torch.bitwise_left_shift(a, 3),
                    (a > 0) & (b > 0), ~(a > b), a.to(torch.int16) | b)

    rng = np.random.default_rng(13)
    info, bits = np.iinfo(dtype), np.dtype(dtype).itemsize * 8
    a = torch.from_numpy(rng.integers(info.min, info.max, (3, 16), dtype=dtype, endpoint=True))
    b = torch.from_numpy(rng.integers(0 if info.min == 0 else -3, bits + 3, (16,)).astype(dtype))
    graph = tilefold.from_torch(Bits(), (a, b))
    assert {"BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift", "And", "Not"} <= {
        n.op for n in graph.nodes()}
    got = tilefold.compile(graph)(dict(zip(graph.inputs, (a.numpy(), b.numpy()))))
    for k, want in enumerate(Bits()(a, b)):
        assert got[f"output_{k}"].dtype == want.numpy().dtype, k
        np.testing.assert_array_equal(got[f"output_{k}"], want.numpy(), err_msg=f"output {k}")


def test_inverse_trigonometric_and_hyperbolic_functions_run_like_eager():
    class Trig(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.tan(x) + torch.asin(x) + torch.acos(x) + torch.atan(x) * torch.sinh(x)
            return y + torch.cosh(x) - torch.asinh(x) + torch.atanh(x) + torch.acosh(x + 2)

    x = torch.from_numpy(np.random.default_rng(14).uniform(-0.95, 0.95, (4, 33)).astype(np.float32))
    graph = tilefold.from_torch(Trig(), (x,))
    assert {"Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"} <= {n.op for n in graph.nodes()}
    got = tilefold.compile(graph)({graph.inputs[0]: x.numpy()})["output_0"]
    np.testing.assert_allclose(got, Trig()(x).numpy(), rtol=2e-6, atol=1e-6)


class _Scatters(torch.nn.Module):
    """Every scatter form the core ATen graph keeps: scatter (src, value), scatter_add,
    scatter_reduce (with and without self) and index_put (leading, inner and split index dims)."""

    def __init__(self, reduce: str, include_self: bool) -> None:
        super().__init__()
        self.reduce, self.include_self = reduce, include_self

    def forward(self, x, index, src, rows, cols):
        a = x.scatter(1, index, src)
        b = x.scatter(2, index, -1.5)
        c = x.scatter_add(1, index, src)
        d = x.scatter_reduce(2, index, src, self.reduce, include_self=self.include_self)
        e = x.index_put((rows, cols), src[0, :2], accumulate=True)
        f = x.clone()
        f[:, cols] = 7.0
        g = x.clone()
        g[rows, :, cols] = src[0, :2, :5]  # split index dims: their broadcast dim comes first
        return a, b, c, d, e, f, g


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatters_and_index_put_run_like_eager_on_random_indices(reduce, include_self):
    module = _Scatters(reduce, include_self)
    rng = np.random.default_rng(len(reduce) + include_self)

    def inputs():
        return (torch.from_numpy(rng.standard_normal((3, 5, 6)).astype(np.float32)),
                torch.from_numpy(rng.integers(0, 5, (2, 4, 5))),  # repeats along dims 1 and 2
                torch.from_numpy(rng.standard_normal((3, 4, 6)).astype(np.float32)),
                torch.from_numpy(rng.integers(-3, 3, 2)), torch.from_numpy(rng.permutation(5)[:2] - 2))

    graph = tilefold.from_torch(module, inputs())
    assert {"ScatterElements", "ScatterND"} <= set(graph.op_counts())
    run = tilefold.compile(graph)
    for _ in range(2):
        args = inputs()
        got = run({name: a.numpy() for name, a in zip(graph.inputs, args)})
        for k, want in enumerate(module(*args)):
            if k == 0 or k == 1 or (k == 3 and reduce in ("amax", "amin")):
                continue  # repeated positions: which write wins is unspecified in torch
            np.testing.assert_allclose(got[f"output_{k}"], want.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"output {k}")


def test_scatter_with_distinct_positions_writes_like_eager():
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((4, 6)).astype(np.float32))
    index = torch.from_numpy(np.stack([rng.permutation(6)[:3] for _ in range(4)]))
    src = torch.from_numpy(rng.standard_normal((4, 5)).astype(np.float32))  # larger than index: cut

    class Scatter(torch.nn.Module):
        def forward(self, x, index, src):
            return x.scatter(1, index, src), x.scatter(1, index, 2.5)

    graph = tilefold.from_torch(Scatter(), (x, index, src))
    got = tilefold.compile(graph)({n: a.numpy() for n, a in zip(graph.inputs, (x, index, src))})
    for k, want in enumerate(Scatter()(x, index, src)):
        np.testing.assert_array_equal(got[f"output_{k}"], want.numpy())


def test_scatter_modules_compile_without_falling_back():
    from tilefold.frontends.fx_backend import TilefoldFallbackWarning

    module = _Scatters("amax", False)
    compiled = torch.compile(module, backend="tilefold")
    rng = np.random.default_rng(11)
    x = torch.from_numpy(rng.standard_normal((3, 5, 6)).astype(np.float32))
    index = torch.from_numpy(np.stack([np.stack([rng.permutation(5)[:4] for _ in range(5)], -1)] * 2))
    src = torch.from_numpy(rng.standard_normal((3, 4, 6)).astype(np.float32))
    rows, cols = torch.tensor([0, -1]), torch.tensor([4, 1])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TilefoldFallbackWarning)
        got = compiled(x, index[:, :, :5], src, rows, cols)
    for k, (have, want) in enumerate(zip(got, module(x, index[:, :, :5], src, rows, cols))):
        torch.testing.assert_close(have, want, msg=lambda m: f"output {k}: {m}")
