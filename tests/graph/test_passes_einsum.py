"""lower_einsum: an Einsum becomes ReduceSums, Transposes, Reshapes and batched MatMuls that
compute np.einsum's result (diagonals as strided Slices first, broadcast dims squeezed);
integer Einsums stay as they are; the ONNX conformance cases still pass, and the lowered
MatMuls run in Triton kernels."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.backend.test.case.node import collect_testcases

import tilefold
from tilefold.backends.numpy import evaluate_node
from tilefold.graph import Graph, TensorType
from tilefold.graph.errors import ModelError
from tilefold.graph.passes import lower_einsum, run_passes, simplify
from tilefold.graph.registry import infer
from tilefold.graph.types import Value

from .test_passes import make_model

LOWERED = [
    ("ij,jk->ik", [(5, 7), (7, 3)]),
    ("bij,bjk->bik", [(2, 5, 7), (2, 7, 3)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 6, 4), (2, 3, 5, 4)]),  # attention scores: k read transposed
    ("bhqk,bkhd->bqhd", [(2, 3, 6, 5), (2, 5, 3, 4)]),  # values, heads merged in the output order
    ("i,j->ij", [(4,), (6,)]),  # an outer product: k is empty
    ("i,i->", [(9,), (9,)]),  # a dot product: m and n are empty
    ("ij->ji", [(3, 5)]),
    ("ijk->ki", [(3, 4, 5)]),  # j summed out
    ("ij,k->i", [(3, 4), (5,)]),  # a label one operand alone has, summed before the product
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),  # a bilinear form: three operands
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    ("ij,jk", [(3, 4), (4, 2)]),  # implicit output: ik
    ("abc,cd->abd", [(2, 1, 3), (3, 4)]),  # a size-1 label is no broadcast
    ("ij,ij->ij", [(1, 3), (2, 3)]),  # a label of one element against two: broadcast
    ("bij,bjk->bik", [(1, 4, 5), (3, 5, 6)]),  # a broadcast batch
    ("...ij,...jk->...ik", [(3, 4, 5), (2, 1, 5, 6)]),  # ellipses of different lengths, right-aligned
]

DIAGONALS = [
    ("ii->i", [(4, 4)]),
    ("ii", [(5, 5)]),  # a trace: implicit output, nothing left
    ("bii->bi", [(3, 4, 4)]),
    ("iji->j", [(3, 5, 3)]),  # the repeated axes apart: moved last first
    ("iii->i", [(3, 3, 3)]),  # a label three times: two diagonals in turn
    ("ij,jj->ij", [(4, 3), (3, 3)]),  # a diagonal, then a broadcast product
    ("bij,bjj->bi", [(2, 4, 3), (2, 3, 3)]),
]


@pytest.fixture
def rng():
    return np.random.default_rng()


def _einsum_graph(equation: str, shapes, dtype=np.float32) -> Graph:
    g = Graph("einsum")
    operands = [g.add_input(f"x{k}", TensorType(s, np.dtype(dtype))) for k, s in enumerate(shapes)]
    types = infer("Einsum", {"equation": equation}, [g.type_of(v) for v in operands])
    node = g.add_node("Einsum", operands, types, {"equation": equation}, name="einsum")
    g.add_output(Value(node.name), "y")
    return g


def _feeds(shapes, rng, dtype=np.float32):
    return {f"x{k}": rng.standard_normal(s).astype(dtype) for k, s in enumerate(shapes)}


@pytest.mark.parametrize("equation, shapes", LOWERED, ids=[e for e, _ in LOWERED])
def test_an_einsum_becomes_matmuls_that_give_np_einsum_s_result(equation, shapes, rng):
    g = run_passes(_einsum_graph(equation, shapes), [lower_einsum], verify=True)
    ops = {n.op for n in g.nodes()}
    assert "Einsum" not in ops and ops <= {"Input", "Constant", "Output", "MatMul", "Transpose", "Reshape",
                                           "ReduceSum"}
    assert sum(n.op == "MatMul" for n in g.nodes()) == max(0, len(shapes) - 1)
    feeds = _feeds(shapes, rng)
    want = np.einsum(equation, *(feeds[f"x{k}"].astype(np.float64) for k in range(len(shapes))))
    got = tilefold.compile(g)(feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation, shapes", DIAGONALS, ids=[e for e, _ in DIAGONALS])
def test_a_repeated_label_is_read_as_a_strided_slice_of_the_merged_axes(equation, shapes, rng):
    g = run_passes(_einsum_graph(equation, shapes), [lower_einsum], verify=True)
    ops = {n.op for n in g.nodes()}
    assert "Einsum" not in ops and "Slice" in ops
    feeds = _feeds(shapes, rng)
    want = np.einsum(equation, *(feeds[f"x{k}"].astype(np.float64) for k in range(len(shapes))))
    got = tilefold.compile(g)(feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation, shapes, dtype", [
    ("ij,jk->ik", [(3, 4), (4, 2)], np.int64),
    ("ij,jk->ik", [(3, 4), (4, 2)], np.int32),
])
def test_what_matmuls_cannot_say_stays_an_einsum_and_still_runs(equation, shapes, dtype, rng):
    g = _einsum_graph(equation, shapes, dtype)
    result = lower_einsum(g)
    assert not result.modified and [n.op for n in g.nodes() if n.op == "Einsum"] == ["Einsum"]
    feeds = {k: (v * 3).astype(dtype) for k, v in _feeds(shapes, rng).items()}
    np.testing.assert_allclose(tilefold.compile(g)(feeds)["y"], np.einsum(equation, *feeds.values()), rtol=1e-6)


def _einsum_cases():
    return [case for case in collect_testcases()
            if case.kind == "node" and {n.op_type for n in case.model.graph.node} == {"Einsum"}]


def test_the_onnx_conformance_cases_pass_through_the_lowering():
    """tilefold.load simplifies, which lowers; every float case becomes MatMuls (a bfloat16
    case exists only in opset 28, which tilefold cannot convert to 21)."""
    lowered = 0
    cases = _einsum_cases()
    assert len(cases) >= 5
    for case in cases:
        try:
            graph = tilefold.load(case.model)
        except ModelError as exc:
            assert "opset 28" in str(exc), case.name
            continue
        lowered += not any(n.op == "Einsum" for n in graph.nodes())
        run = tilefold.compile(graph)
        for inputs, outputs in case.data_sets:
            feeds = {i.name: np.asarray(x) for i, x in zip(case.model.graph.input, inputs)}
            (got,) = run(feeds).values()
            np.testing.assert_allclose(got, outputs[0], rtol=1e-5, atol=1e-6, err_msg=case.name)
    print(f"Einsum: {lowered} of {len(cases)} conformance cases lowered to MatMuls")
    assert lowered >= 6


def test_attention_written_as_einsums_gets_packed_layouts_and_triton_kernels(rng):
    """Scores and context as Einsums (as TensorFlow converters and older exports write them):
    lowered, they are MatMul anchors for the gpu target, and the interpreter runs every node."""
    from tilefold.backends.triton import TritonExecutable

    b, h, s, d = 1, 2, 32, 16
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, h, s, d]) for n in ("q", "k", "v")]
    model = make_model([
        helper.make_node("Einsum", ["q", "k"], ["scores"], equation="bhqd,bhkd->bhqk"),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhqk,bhkd->bhqd"),
    ], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, s, d])])
    optimized = tilefold.optimize(tilefold.load(model), "gpu").graph
    anchors = [n for n in optimized.nodes() if n.op == "MatMul"]
    assert len(anchors) == 2 and not any(n.op == "Einsum" for n in optimized.nodes())
    assert any(t.encoding is not None for n in anchors for t in n.outputs)
    feeds = {n: rng.standard_normal((b, h, s, d)).astype(np.float32) for n in ("q", "k", "v")}
    scores = np.einsum("bhqd,bhkd->bhqk", feeds["q"], feeds["k"])
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), feeds["v"])
    exe = TritonExecutable(optimized, device="interp")
    np.testing.assert_allclose(exe(feeds)["y"], want, rtol=1e-4, atol=1e-5)
    assert exe.fallback_nodes == []


def test_simplify_lowers_einsums():
    g = simplify(_einsum_graph("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), evaluate_node, verify=True)
    assert [n.op for n in g.nodes() if n.op not in ("Input", "Output", "Constant")] == ["MatMul"]


def test_a_diagonal_runs_in_triton_kernels(rng):
    """The strided Slice is a Triton chain head: nothing of a lowered diagonal runs on the host."""
    from tilefold.backends.triton import TritonExecutable

    equation, shapes = "bij,bjj->bi", [(2, 4, 3), (2, 3, 3)]
    g = run_passes(_einsum_graph(equation, shapes), [lower_einsum], verify=True)
    exe = TritonExecutable(g, device="interp")
    feeds = _feeds(shapes, rng)
    got = exe(feeds)["y"]
    assert exe.fallback_nodes == []
    np.testing.assert_allclose(got, np.einsum(equation, feeds["x0"], feeds["x1"]), rtol=1e-5, atol=1e-6)
