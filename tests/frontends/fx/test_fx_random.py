"""Random PyTorch modules through `torch.compile(backend="tilefold")` (cpu and gpu targets)
and `tilefold.from_torch` + optimize, against eager PyTorch on fresh random inputs.

Hypothesis stacks layers (convolutions of any stride, dilation and grouping, pools,
BatchNorm, activations, residual adds, channel concat and chunk, permute, reshape, flatten,
flip, repeat, indexing, linear, batched matmul, softmax, layer norm, reductions) on an image
or a sequence input.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import tilefold
from tilefold.frontends import fx_backend

F = torch.nn.functional
RTOL = 1e-4  # of the output's largest magnitude


class Random(torch.nn.Module):
    """Layers, each a function of the values so far (and its own parameters), the last value out."""

    def __init__(self, steps: list, params: torch.nn.ParameterList) -> None:
        super().__init__()
        self.steps = steps
        self.params = params

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = [x]
        for step in self.steps:
            values.append(step(values, self.params))
        return values[-1]


@st.composite
def random_module(draw):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    params = torch.nn.ParameterList()
    steps: list = []
    notes: list[str] = []

    def weight(*shape: int, fan_in: int = 1) -> int:
        params.append(torch.nn.Parameter(torch.randn(*shape, generator=gen) / math.sqrt(fan_in), requires_grad=False))
        return len(params) - 1

    image = draw(st.booleans())
    shape = ((draw(st.sampled_from([1, 2])), draw(st.sampled_from([3, 8, 16, 20])), draw(st.sampled_from([5, 8])),
              draw(st.sampled_from([4, 8]))) if image else
             (draw(st.sampled_from([1, 2])), draw(st.sampled_from([3, 8])), draw(st.sampled_from([8, 16, 20]))))
    shapes = [shape]
    for _ in range(draw(st.integers(1, 6))):
        src = len(shapes) - 1 if draw(st.integers(0, 3)) else draw(st.integers(0, len(shapes) - 1))
        s = shapes[src]
        ops = ["unary", "binary", "affine", "permute", "row", "reorder"]
        if len(s) == 4 and min(s[2:]) >= 3:
            ops += ["conv", "conv", "pool", "concat", "flatten"]
        if len(s) >= 2:
            ops += ["linear", "linear", "bmm"]
        op = draw(st.sampled_from(ops))
        if op == "conv":
            n, c, h, w = s
            k, stride = draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 2]))
            dilation = draw(st.sampled_from([1, 2])) if k == 3 and min(h, w) >= 5 else 1
            pad = draw(st.integers(0, 1)) if k == 3 else 0
            groups = draw(st.sampled_from([1, c]))
            f = c if groups == c else draw(st.sampled_from([4, 16, 17]))
            wi, bi = weight(f, c // groups, k, k, fan_in=c // groups * k * k), weight(f)
            steps.append(lambda v, p, src=src, wi=wi, bi=bi, a=(stride, pad, dilation, groups):
                         F.conv2d(v[src], p[wi], p[bi], *a))
            span = dilation * (k - 1) + 1
            out = (n, f, (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1)
        elif op == "pool":
            kind = draw(st.sampled_from(["max", "avg"]))
            k = draw(st.sampled_from([2, 3]))
            options = {"kernel_size": k, "stride": draw(st.sampled_from([1, 2])), "padding": draw(st.integers(0, k // 2)),
                       "ceil_mode": draw(st.booleans())}
            if kind == "avg":
                options["count_include_pad"] = draw(st.booleans())
            fn = functools.partial(F.max_pool2d if kind == "max" else F.avg_pool2d, **options)
            steps.append(lambda v, p, src=src, fn=fn: fn(v[src]))
            out = tuple(fn(torch.empty(s, device="meta")).shape)
        elif op == "concat":
            steps.append(lambda v, p, src=src: torch.cat([v[src], torch.relu(v[src])], 1))
            out = (s[0], 2 * s[1], *s[2:])
        elif op == "flatten":
            steps.append(lambda v, p, src=src: torch.flatten(F.adaptive_avg_pool2d(v[src], 1), 1))
            out = (s[0], s[1])
        elif op == "unary":
            fn = draw(st.sampled_from([torch.relu, torch.sigmoid, torch.tanh, F.gelu, F.silu, torch.neg, F.hardtanh]))
            steps.append(lambda v, p, src=src, fn=fn: fn(v[src]))
            out = s
        elif op == "binary":
            other = draw(st.sampled_from([i for i, t in enumerate(shapes) if t == s]))
            fn = draw(st.sampled_from([torch.add, torch.mul, torch.sub, torch.maximum]))
            steps.append(lambda v, p, src=src, other=other, fn=fn: fn(v[src], v[other]))
            out = s
        elif op == "affine":
            if len(s) == 4 and draw(st.booleans()):
                mean, var, scale, shift = weight(s[1]), weight(s[1]), weight(s[1]), weight(s[1])
                steps.append(lambda v, p, src=src, i=(mean, var, scale, shift):
                             F.batch_norm(v[src], p[i[0]], p[i[1]].abs() + 0.5, p[i[2]], p[i[3]]))
            else:
                wi = weight(s[-1])
                steps.append(lambda v, p, src=src, wi=wi: v[src] * p[wi] + 1.0)
            out = s
        elif op == "permute":
            perm = tuple(draw(st.permutations(range(len(s)))))
            steps.append(lambda v, p, src=src, perm=perm: v[src].permute(perm).contiguous())
            out = tuple(s[d] for d in perm)
        elif op == "row":
            kind = draw(st.sampled_from(["softmax", "layer_norm", "mean", "sum", "amax"]))
            if kind == "layer_norm":
                wi, bi = weight(s[-1]), weight(s[-1])
                steps.append(lambda v, p, src=src, wi=wi, bi=bi: F.layer_norm(v[src], v[src].shape[-1:], p[wi], p[bi]))
                out = s
            elif kind == "softmax":
                dim = draw(st.sampled_from([-1, 1]))
                steps.append(lambda v, p, src=src, dim=dim: torch.softmax(v[src], dim))
                out = s
            else:
                dim = draw(st.sampled_from([-1, 1]))
                fn = {"mean": torch.mean, "sum": torch.sum, "amax": torch.amax}[kind]
                steps.append(lambda v, p, src=src, dim=dim, fn=fn: fn(v[src], dim, keepdim=True))
                out = tuple(1 if d == dim % len(s) else n for d, n in enumerate(s))
        elif op == "reorder":
            kind, dim = draw(st.sampled_from(["flip", "repeat", "index"])), draw(st.integers(0, len(s) - 1))
            if kind == "flip":
                steps.append(lambda v, p, src=src, dim=dim: torch.flip(v[src], (dim,)))
                out = s
            elif kind == "repeat":
                times = tuple(2 if d == dim else 1 for d in range(len(s)))
                steps.append(lambda v, p, src=src, times=times: v[src].repeat(*times))
                out = tuple(n * t for n, t in zip(s, times))
            else:
                index = torch.tensor(draw(st.lists(st.integers(-s[dim], s[dim] - 1), min_size=1, max_size=5)))
                steps.append(lambda v, p, src=src, at=(slice(None),) * dim + (index,): v[src][at])
                out = (*s[:dim], len(index), *s[dim + 1:])
        elif op == "linear":
            e = draw(st.sampled_from([8, 16, 20]))
            wi, bi = weight(e, s[-1], fan_in=s[-1]), weight(e)
            steps.append(lambda v, p, src=src, wi=wi, bi=bi: F.linear(v[src], p[wi], p[bi]))
            out = (*s[:-1], e)
        else:  # bmm: x @ x^T over the last two dims, scaled
            steps.append(lambda v, p, src=src, k=s[-1]: v[src] @ v[src].transpose(-1, -2) / math.sqrt(k))
            out = (*s[:-1], s[-2])
        notes.append(f"{op} of value {src} {s} -> {out}")
        shapes.append(out)
    note("\n".join(notes))
    x = torch.randn(*shape, generator=gen)
    return Random(steps, params).eval(), x


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max()) / max(1.0, float(want.abs().max()))


@pytest.mark.filterwarnings("ignore::UserWarning")
@given(random_module())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_modules_compiled_with_tilefold_match_eager(case):
    model, x = case
    with torch.no_grad():
        want = model(x)
        bigger = torch.randn(x.shape[0] + 1, *x.shape[1:])  # a new batch size: a recompilation
        try:
            want_bigger = model(bigger)
        except RuntimeError:  # the batch dim was permuted into a weight's dim
            want_bigger = None
        for target in ("cpu", "gpu"):
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=fx_backend.backend(target=target))
            got = compiled(x)
            assert got.shape == want.shape and _error(got, want) < RTOL, target
            if want_bigger is not None:
                got = compiled(bigger)
                assert got.shape == want_bigger.shape and _error(got, want_bigger) < RTOL, f"{target}, new shape"
        graph = tilefold.from_torch(model, (x,))
        for target in ("cpu", "gpu"):
            out = tilefold.compile(tilefold.optimize(graph, target, verify=True).graph)(
                {graph.inputs[0]: x.numpy()})
            got = torch.from_numpy(next(iter(out.values())))
            assert got.shape == want.shape and _error(got, want) < RTOL, f"from_torch, {target}"
