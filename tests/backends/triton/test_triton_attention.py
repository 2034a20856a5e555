"""The attention template (attention.py): softmax(Q K^T ...) V, the scores' epilogue, the
softmax with or without its NaN guard and the product's epilogue are one kernel, that matches
the NumPy backend running the nodes one by one and NumPy references (on fresh random inputs,
sizes that divide no block, several key blocks, rows masked off entirely, a NaN score,
packed and transposed operands, float16 and bfloat16, grouped keys and values read through
their Expand); a run it cannot hold stays three kernels; its launch configuration is checked
and tuned."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tilefold.backends.triton import TritonExecutable
from tilefold.backends.triton.executor import kernel_plans
from tilefold.backends.triton.launch import set_launch, verify_launch
from tilefold.graph import Graph
from tilefold.graph.errors import VerifyError
from tilefold.graph.types import TensorType, Value
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32


def _attention(kit, g: Graph, q: Value, kt: Value, v: Value, *, scores: str = "scale_mask", guard: str | None = None,
               epilogue: bool = False, mask: Value | None = None, encoding: PackedEncoding | None = None) -> Value:
    """softmax(chain(Q K^T)) V as ONNX nodes, named: `scores` the chain on the scores (a scale
    and an added `mask`, a causal Where, or none), `guard` the NaN guard after the softmax
    ("nan": the ONNX exporter's, "masked": torch's sdpa decomposition's), `epilogue` a
    residual add and a Relu after the product, whose result is in `encoding`."""
    s = kit.add(g, "MatMul", [q, kt], name="scores")
    dtype = g.type_of(s).dtype
    m, n = g.type_of(s).shape[-2:]
    if scores == "scale_mask":
        s = kit.add(g, "Mul", [s, g.add_constant(np.array(0.3, dtype), name="scale")], name="scaled")
        s = kit.add(g, "Add", [s, mask], name="masked")
    elif scores == "causal":
        causal = g.add_constant(np.tril(np.ones((m, n), bool), n - m), name="causal")
        s = kit.add(g, "Where", [causal, s, g.add_constant(np.array(-np.inf, dtype), name="minus_inf")], name="masked")
    p = kit.add(g, "Softmax", [s], {"axis": -1}, name="softmax")
    zero = g.add_constant(np.array(0, dtype), name="zero")
    if guard == "nan":
        p = kit.add(g, "Where", [kit.add(g, "IsNaN", [p], name="isnan"), zero, p], name="guard")
    elif guard == "masked":
        eq = kit.add(g, "Equal", [s, g.add_constant(np.array(-np.inf, dtype), name="inf")], name="eq")
        seen = kit.add(g, "ReduceMax", [kit.add(g, "Not", [eq], name="not_eq"),
                                        g.add_constant(np.array([-1]), name="last")], {"keepdims": 1}, name="any")
        p = kit.add(g, "Where", [kit.add(g, "Not", [seen], name="none"), zero, p], name="guard")
    y = kit.add(g, "MatMul", [p, v], name="product", encoding=encoding)
    if epilogue:
        y = kit.add(g, "Add", [y, q if g.type_of(q).shape == g.type_of(y).shape else v], name="residual")
        y = kit.add(g, "Relu", [y], name="relu")
    return y


def _mask(rng: np.random.Generator, batch: int, n: int) -> np.ndarray:
    """A padding mask added to the scores: 0, a large negative number or -inf, with the first
    image's keys all -inf (its rows' softmax is NaN)."""
    mask = np.where(rng.random((batch, 1, 1, n)) < 0.3, np.float32(-1e9), np.float32(0))
    mask[rng.random(mask.shape) < 0.1] = -np.inf
    mask[0] = -np.inf
    return mask.astype(F32)


def _inputs_graph(kit, shape: tuple[int, int, int, int, int, int], dtype: type = F32, **options) -> tuple[Graph, dict]:
    """Q, K^T, V (and the mask, for the default scores) as inputs of (batch, heads, m, n, d, e)."""
    b, h, m, n, d, e = shape
    rng = np.random.default_rng(m * n + d)
    g = Graph("attention")
    feeds = {"q": rng.standard_normal((b, h, m, d)), "kt": rng.standard_normal((b, h, d, n)),
             "v": rng.standard_normal((b, h, n, e))}
    if options.get("scores", "scale_mask") == "scale_mask":
        feeds["mask"] = _mask(rng, b, n)
    feeds = {name: x.astype(dtype) for name, x in feeds.items()}
    values = {name: g.add_input(name, TensorType(x.shape, dtype)) for name, x in feeds.items()}
    g.add_output(_attention(kit, g, values["q"], values["kt"], values["v"], mask=values.get("mask"), **options), "y")
    return g, feeds


def _kinds(g: Graph) -> list[str]:
    return [plan.kind for plan in kernel_plans(g)]


def _check(kit, g: Graph, feeds: dict, device: str, rtol: float = 1e-5, atol: float = 1e-5) -> dict:
    got, want = kit.run_both(g, feeds, device)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)
    return got


@pytest.mark.parametrize("shape", [(2, 3, 20, 37, 24, 40), (1, 2, 70, 100, 16, 8), (2, 1, 1, 5, 3, 17)])
@pytest.mark.parametrize("guard", [None, "nan", "masked"])
def test_attention_is_one_kernel_that_matches_the_nodes(kit, device, shape, guard):
    """Rows of the first image see only -inf: NaN without a guard (as ONNX's Softmax), 0 with."""
    g, feeds = _inputs_graph(kit, shape, guard=guard)
    assert _kinds(g) == ["attention"]
    got = _check(kit, g, feeds, device)
    assert np.isnan(got["y"][0]).all() if guard is None else (got["y"][0] == 0).all()
    assert np.isfinite(got["y"][1:]).all()


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the interpreter's tl.max of the NaN row
@pytest.mark.parametrize("guard", [None, "nan", "masked"])
def test_a_nan_among_the_scores_is_zero_under_the_nan_guard_alone(kit, device, guard):
    """A NaN in a query row makes that row's softmax NaN: the ONNX exporter's guard gives 0 there,
    torch's guard (of rows of -inf) and none keep NaN."""
    g, feeds = _inputs_graph(kit, (1, 2, 20, 70, 8, 8), guard=guard)
    feeds["mask"][:] = 0
    feeds["q"][0, 1, 3, 2] = np.nan
    got = _check(kit, g, feeds, device)
    row = got["y"][0, 1, 3]
    assert (row == 0).all() if guard == "nan" else np.isnan(row).all()
    assert np.isfinite(np.delete(got["y"][0, 1], 3, axis=0)).all()


@pytest.mark.parametrize("scores", ["causal", "none"])
def test_the_scores_chain_and_the_products_epilogue_are_in_the_kernel(kit, device, scores):
    g, feeds = _inputs_graph(kit, (2, 2, 19, 19, 19, 19), scores=scores, guard="masked", epilogue=True)
    assert [g.node(n).op for plan in kernel_plans(g) for n in plan.nodes][-3:] == ["MatMul", "Add", "Relu"]
    assert _kinds(g) == ["attention"]
    _check(kit, g, feeds, device)


def test_packed_and_transposed_operands_broadcast_over_heads(kit, device):
    """Q in 16x16 tiles, K^T a transposed tiled buffer (BERT's key heads), V shared by every
    head (a batch dim of 1), the result written in tiles and unpacked."""
    rng = np.random.default_rng(3)
    b, h, m, n, d = 2, 3, 21, 35, 20
    q, k, v = (rng.standard_normal(s).astype(F32) for s in ((b, h, m, d), (b, h, n, d), (b, 1, n, d)))
    tiles = PackedEncoding((2, 3), (16, 16))
    transposed = PackedEncoding((3, 2), (16, 16), (0, 1, 3, 2))
    g = Graph("packed")
    qv = kit.add(g, "Pack", [g.add_input("q", TensorType(q.shape, F32))], {"encoding": tiles}, encoding=tiles)
    kt = kit.packed_const(g, np.ascontiguousarray(k.transpose(0, 1, 3, 2)), transposed, "kt")
    vv = kit.packed_const(g, v, tiles, "v")
    mask = g.add_constant(_mask(rng, b, n), name="mask")
    y = _attention(kit, g, qv, kt, vv, mask=mask, guard="nan", encoding=tiles)
    g.add_output(kit.add(g, "Unpack", [y]), "y")
    assert _kinds(g) == ["chain", "attention"]  # the Pack of an input; the Unpack ends the product's epilogue
    _check(kit, g, {"q": q}, device)
    scores = np.einsum("bhmd,bhnd->bhmn", q, k) * F32(0.3) + g.constant_value(mask)
    with np.errstate(invalid="ignore"):  # the first image's rows: NaN, which the guard makes 0
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        want = np.nan_to_num((probs / probs.sum(-1, keepdims=True)) @ v, nan=0.0)
    got, _ = kit.run_both(g, {"q": q}, device)
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rep", [1, 3])
def test_grouped_keys_and_values_are_read_through_their_expand(kit, device, rep):
    """GQA: K^T and V of 2 heads, each repeated for `rep` query heads (Unsqueeze, Expand,
    Reshape) as transformers' repeat_kv does: the kernel reads the unrepeated tensors at the
    query head's key head, and the Expands run no kernel of their own."""
    rng = np.random.default_rng(rep)
    b, kv, m, n, d, e = 2, 2, 9, 21, 16, 12
    h = kv * rep
    g = Graph("gqa")
    feeds = {"q": rng.standard_normal((b, h, m, d)).astype(F32), "kt": rng.standard_normal((b, kv, d, n)).astype(F32),
             "v": rng.standard_normal((b, kv, n, e)).astype(F32)}
    q, kt, v = (g.add_input(name, TensorType(x.shape, F32)) for name, x in feeds.items())

    def repeated(x: Value, name: str) -> Value:
        rows, cols = g.type_of(x).shape[-2:]
        x = kit.add(g, "Unsqueeze", [x, g.add_constant(np.array([2]), name=f"{name}_axis")], name=f"{name}_unsqueeze")
        x = kit.add(g, "Expand", [x, g.add_constant(np.array([b, kv, rep, rows, cols]), name=f"{name}_shape")],
                    name=f"{name}_expand")
        return kit.add(g, "Reshape", [x, g.add_constant(np.array([b, h, rows, cols]), name=f"{name}_heads")],
                       name=f"{name}_heads")

    g.add_output(_attention(kit, g, q, repeated(kt, "k"), repeated(v, "v"), scores="causal", guard="masked"), "y")
    assert _kinds(g) == ["attention"]
    (plan,) = kernel_plans(g)
    assert {"k_expand", "v_expand"} <= set(plan.nodes) and "read from k_unsqueeze" in plan.source
    got = _check(kit, g, feeds, device)
    scores = np.where(np.tril(np.ones((m, n), bool), n - m), feeds["q"] @ np.repeat(feeds["kt"], rep, axis=1), -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = (probs / probs.sum(-1, keepdims=True)) @ np.repeat(feeds["v"], rep, axis=1)
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


def test_an_expand_read_elsewhere_keeps_its_kernel(kit):
    g = Graph("shared_expand")
    q, kt, v = (g.add_input(name, TensorType(shape, F32)) for name, shape in
                (("q", (1, 4, 8, 16)), ("kt", (1, 2, 16, 8)), ("v", (1, 4, 8, 16))))
    x = kit.add(g, "Unsqueeze", [kt, g.add_constant(np.array([2]), name="axis")])
    x = kit.add(g, "Expand", [x, g.add_constant(np.array([1, 2, 2, 16, 8]), name="shape")], name="expand")
    k = kit.add(g, "Reshape", [x, g.add_constant(np.array([1, 4, 16, 8]), name="heads")])
    g.add_output(_attention(kit, g, q, k, v, scores="none"), "y")
    g.add_output(x, "repeated")
    assert sorted(_kinds(g)) == ["attention", "movement"]


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_half_precision_operands_accumulate_in_float32(kit, device, dtype):
    """Q, K and V in float16 or bfloat16, against float64 on the same (rounded) values: the
    probabilities are narrowed for the second product, as flash attention does."""
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    g, feeds = _inputs_graph(kit, (1, 2, 24, 40, 32, 16), dtype=dtype, scores="causal", guard="masked")
    assert _kinds(g) == ["attention"]
    exe = TritonExecutable(g, device=device)
    got = exe(feeds)["y"].astype(np.float64)
    q, kt, v = (feeds[name].astype(np.float64) for name in ("q", "kt", "v"))
    scores = np.where(np.tril(np.ones((24, 40), bool), 16), q @ kt, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = (probs / probs.sum(-1, keepdims=True)) @ v
    tolerance = 1e-2 if dtype == np.float16 else 4e-2
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def _upcast(kit, g: Graph, x: Value, name: str, scale: float | None = None, axes: list[int] | None = None) -> Value:
    """x cast to float32 (then transposed by `axes`, then scaled), as torch's decomposition of
    a half-precision sdpa on the CPU computes its operands."""
    x = kit.add(g, "Cast", [x], {"to": 1}, name=f"{name}_f32")
    if axes is not None:
        x = kit.add(g, "Transpose", [x], {"perm": axes}, name=f"{name}_t")
    if scale is not None:
        x = kit.add(g, "Mul", [x, g.add_constant(np.array(scale, F32), name=f"{name}_scale")], name=f"{name}_scaled")
    return x


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_upcast_and_scaled_operands_are_computed_by_the_attention_kernel(kit, device, dtype):
    """A half-precision sdpa traced on the CPU: Q, K and V cast to float32 (K then transposed),
    Q and K each scaled, the attention in float32. The kernel loads the half tiles and casts
    and scales them itself: one kernel, no float32 copies of Q, K and V, and the float32
    result of the nodes."""
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    rng = np.random.default_rng(8)
    b, h, m, n, d = 2, 3, 19, 37, 24
    feeds = {"q": rng.standard_normal((b, h, m, d)).astype(dtype), "k": rng.standard_normal((b, h, n, d)).astype(dtype),
             "v": rng.standard_normal((b, h, n, d)).astype(dtype)}
    g = Graph("half_sdpa")
    q, k, v = (g.add_input(name, TensorType(x.shape, dtype)) for name, x in feeds.items())
    root = float(np.sqrt(1 / np.sqrt(d)))
    y = _attention(kit, g, _upcast(kit, g, q, "q", root), _upcast(kit, g, k, "k", root, [0, 1, 3, 2]),
                   _upcast(kit, g, v, "v"), scores="causal", guard="masked")
    g.add_output(kit.add(g, "Cast", [y], {"to": 10 if dtype == np.float16 else 16}, name="narrowed"), "y")
    assert _kinds(g) == ["attention"]
    (plan,) = kernel_plans(g)
    assert {"q_scaled", "k_f32", "k_t", "v_f32"} <= set(plan.nodes)
    got = TritonExecutable(g, device=device)(feeds)  # (the NumPy backend has no bfloat16)
    q32, k32, v32 = (feeds[name].astype(np.float64) for name in ("q", "k", "v"))
    scores = np.where(np.tril(np.ones((m, n), bool), n - m), (q32 * root) @ (k32 * root).transpose(0, 1, 3, 2), -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    exact = ((probs / probs.sum(-1, keepdims=True)) @ v32).astype(dtype).astype(np.float64)
    ulp = 2.0 ** (-10 if dtype == np.float16 else -7)  # one unit in the last place at magnitude 1 to 2
    assert np.abs(got["y"].astype(np.float64) - exact).max() <= ulp * max(1.0, np.abs(exact).max())


def test_a_divided_query_and_a_key_scaled_from_the_left_are_computed_too(kit, device):
    """Div(Q, c) and Mul(c, K^T), and a scale on V: each pointwise form the kernel takes, against
    the nodes run one by one."""
    rng = np.random.default_rng(10)
    feeds = {name: rng.standard_normal(shape).astype(F32)
             for name, shape in (("q", (2, 2, 13, 16)), ("kt", (2, 2, 16, 21)), ("v", (2, 2, 21, 8)))}
    g = Graph("scaled_forms")
    q, kt, v = (g.add_input(name, TensorType(x.shape, F32)) for name, x in feeds.items())
    q = kit.add(g, "Div", [q, g.add_constant(np.array(4.0, F32), name="four")], name="q_divided")
    kt = kit.add(g, "Mul", [g.add_constant(np.array(0.7, F32), name="seven_tenths"), kt], name="k_scaled")
    v = kit.add(g, "Mul", [v, g.add_constant(np.array([-2.0], F32), name="minus_two")], name="v_scaled")
    g.add_output(_attention(kit, g, q, kt, v, scores="causal", guard="masked"), "y")
    assert _kinds(g) == ["attention"]
    _check(kit, g, feeds, device)


def test_a_cast_whose_kernel_computes_more_keeps_it(kit):
    """The upcast of Q is also added to a bias in the same chain kernel (read once): that kernel
    stays, and the attention reads its float32 result; K's and V's casts still go."""
    rng = np.random.default_rng(9)
    g = Graph("shared_cast")
    half = np.float16
    feeds = {name: rng.standard_normal(shape).astype(half)
             for name, shape in (("q", (1, 2, 8, 16)), ("kt", (1, 2, 16, 8)), ("v", (1, 2, 8, 16)))}
    q, kt, v = (g.add_input(name, TensorType(x.shape, half)) for name, x in feeds.items())
    bias = g.add_constant(rng.standard_normal(16).astype(F32), name="bias")
    shifted = kit.add(g, "Add", [_upcast(kit, g, q, "q"), bias], name="shifted")
    g.add_output(_attention(kit, g, shifted, _upcast(kit, g, kt, "k"), _upcast(kit, g, v, "v"), scores="none"), "y")
    assert sorted(_kinds(g)) == ["attention", "chain"]
    (chain,) = [plan for plan in kernel_plans(g) if plan.kind == "chain"]
    assert chain.nodes == ["q_f32", "shifted"]
    _check(kit, g, feeds, "interp")


def test_a_run_it_cannot_hold_stays_three_kernels(kit):
    """The probabilities read outside (an output of their own, or by the product's epilogue), a
    softmax over another dim, a head dim past HEAD_LIMIT, and a chain between the softmax and
    the product."""
    g, _ = _inputs_graph(kit, (1, 2, 8, 8, 8, 8))
    g.add_output(Value("softmax"), "probs")
    assert _kinds(g) == ["matmul", "reduce", "matmul"]
    g, _ = _inputs_graph(kit, (1, 2, 8, 8, 8, 8))
    g.node("softmax").attrs["axis"] = 2
    assert "attention" not in _kinds(g)
    g, _ = _inputs_graph(kit, (1, 1, 8, 8, 300, 8))
    assert _kinds(g) == ["matmul", "reduce", "matmul"]
    g = Graph("probs_after")
    q, kt, v = (g.add_input(name, TensorType(shape, F32)) for name, shape in
                (("q", (1, 8, 4)), ("kt", (1, 4, 8)), ("v", (1, 8, 8))))
    p = kit.add(g, "Softmax", [kit.add(g, "MatMul", [q, kt])], {"axis": -1})
    g.add_output(kit.add(g, "Add", [kit.add(g, "MatMul", [p, v]), p]), "y")  # P read after the product
    assert "attention" not in _kinds(g)
    g = Graph("scaled_probs")
    q, kt, v = (g.add_input(name, TensorType(shape, F32)) for name, shape in
                (("q", (1, 8, 4)), ("kt", (1, 4, 8)), ("v", (1, 8, 4))))
    p = kit.add(g, "Softmax", [kit.add(g, "MatMul", [q, kt])], {"axis": -1})
    p = kit.add(g, "Mul", [p, g.add_constant(np.array(0.5, F32), name="half")])
    g.add_output(kit.add(g, "MatMul", [p, v]), "y")
    assert "attention" not in _kinds(g)


def test_launch_configuration_is_checked_and_overridden(kit, device):
    """Its blocks are data on the scores' MatMul: a smaller key block gives the same answer
    (more steps of the online softmax); a head dim block shorter than the head dim, or a block
    below tl.dot's 16, is refused with the node named."""
    g, feeds = _inputs_graph(kit, (1, 2, 33, 70, 24, 20), guard="nan")
    want = _check(kit, g, feeds, device)
    set_launch(g, "scores", BLOCK_M=16, BLOCK_N=16, num_warps=2)
    verify_launch(g)
    got = TritonExecutable(g, device=device)(feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
    for bad, message in (({"BLOCK_D": 16}, "BLOCK_D=16 is shorter than the head dim of Q and K (24"),
                         ({"BLOCK_K": 16}, "unknown launch key 'BLOCK_K' for the attention kernel"),
                         ({"BLOCK_N": 8}, "BLOCK_N=8 is below 16")):
        set_launch(g, "scores", **bad)
        with pytest.raises(VerifyError, match=f"scores.*{re.escape(message)}"):
            verify_launch(g)
        g.node("scores").launch = {}


def test_autotune_tunes_the_query_and_key_blocks_alone(kit):
    """Autotuning writes a verified choice onto the scores' MatMul, varying the row and key
    blocks (not the head dims, which one block holds whole), and the answer stays the same."""
    from tilefold.backends.triton import autotune

    g, feeds = _inputs_graph(kit, (1, 2, 40, 40, 24, 20), guard="nan")
    before = TritonExecutable(g, device="interp")(feeds)["y"]
    chosen = autotune(g, feeds, device="interp", limit=4)
    assert set(chosen) == {"scores"} and g.node("scores").launch == chosen["scores"]
    assert chosen["scores"]["BLOCK_D"] == 32 and chosen["scores"]["BLOCK_E"] == 32
    verify_launch(g)
    np.testing.assert_allclose(TritonExecutable(g, device="interp")(feeds)["y"], before, rtol=1e-5, atol=1e-6)
