"""merge_projections: Linear layers that read one activation become one Linear layer and a
Split of its features, computing what onnxruntime computes for the model as written; the gpu
target asks for it, the cpu target does not."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.backends.numpy import NumpyExecutable
from tilefold.graph.passes.dce import dce
from tilefold.graph.passes.merge_projections import merge_projections
from tilefold.graph.passes.pipeline import run_passes

RNG = np.random.default_rng(31)
T, D = 6, 8


def attention_inputs(bias: tuple[bool, ...] = (True, True, True)):
    """BERT's query, key and value of one activation x (T, D) (their widths 8, 8 and 5; a
    MatMul without its bias Add where `bias` says so), and a fourth Linear layer of another
    input that is not merged."""
    node = helper.make_node
    nodes, weights, outputs = [], {}, []
    for k, (name, width) in enumerate((("q", D), ("k", D), ("v", 5))):
        weights[f"w{name}"] = (RNG.standard_normal((D, width)) * 0.3).astype(np.float32)
        if bias[k]:
            weights[f"b{name}"] = RNG.standard_normal(width).astype(np.float32)
            nodes += [node("MatMul", ["x", f"w{name}"], [f"{name}_raw"]), node("Add", [f"{name}_raw", f"b{name}"], [name])]
        else:
            nodes.append(node("MatMul", ["x", f"w{name}"], [name]))
        outputs.append(name)
    weights["wo"] = (RNG.standard_normal((D, D)) * 0.3).astype(np.float32)
    nodes.append(node("MatMul", ["z", "wo"], ["o"]))
    outputs.append("o")
    graph = helper.make_graph(
        nodes, "qkv", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [T, D]) for n in ("x", "z")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _ops(graph) -> list[str]:
    return sorted(n.op for n in graph.nodes() if n.op in ("MatMul", "Add", "Split"))


@pytest.mark.parametrize("bias, ops", [
    ((True, True, True), ["Add", "MatMul", "MatMul", "Split"]),
    ((False, False, False), ["MatMul", "MatMul", "Split"]),
    ((True, True, False), ["Add", "MatMul", "MatMul", "MatMul", "Split"]),  # the two with a bias
])
def test_linear_layers_of_one_activation_become_one_and_a_split(bias, ops):
    model = attention_inputs(bias)
    graph = tilefold.load(model)
    merged = run_passes(graph.copy(), [merge_projections, dce], verify=True)
    assert _ops(merged) == ops
    feeds = {"x": RNG.standard_normal((T, D)).astype(np.float32), "z": RNG.standard_normal((T, D)).astype(np.float32)}
    want = dict(zip([o.name for o in model.graph.output], ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)))
    got = NumpyExecutable(merged)(feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_product_read_by_more_than_its_bias_add_is_merged_without_it():
    """q's raw product is also an output: q joins as a product alone, and its Add stays."""
    model = attention_inputs((True, False, False))
    model.graph.output.append(helper.make_tensor_value_info("q_raw", TensorProto.FLOAT, None))
    merged = run_passes(tilefold.load(model), [merge_projections, dce], verify=True)
    assert _ops(merged) == ["Add", "MatMul", "MatMul", "Split"]
    feeds = {"x": RNG.standard_normal((T, D)).astype(np.float32), "z": RNG.standard_normal((T, D)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = NumpyExecutable(merged)(feeds)
    for name, value in zip([o.name for o in model.graph.output], want):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_gpu_target_merges_and_the_cpu_target_does_not():
    graph = tilefold.load(attention_inputs())
    assert sum(n.op == "Split" for n in tilefold.optimize(graph, "gpu").graph.nodes()) == 1
    assert sum(n.op == "Split" for n in tilefold.optimize(graph, "cpu").graph.nodes()) == 0


@pytest.mark.parametrize("shape, perm, merged", [
    ((T, 2, 4), (1, 0, 2), True),  # heads split: the features leave the last dim in pieces
    ((1, 2, 3, D), (0, 3, 1, 2), False),  # FocalNet's NCHW: whole features move to dim 1
])
def test_layers_whose_whole_features_a_transpose_moves_off_the_last_dim_stay_apart(shape, perm, merged):
    """The layers split_projections splits are never merged back."""
    node = helper.make_node
    nodes, weights, outputs = [], {"shape": np.array(shape, np.int64)}, []
    for name in ("a", "b"):
        weights[f"w{name}"] = (RNG.standard_normal((D, D)) * 0.3).astype(np.float32)
        nodes += [node("MatMul", ["x", f"w{name}"], [f"{name}_mm"]), node("Reshape", [f"{name}_mm", "shape"], [f"{name}_r"]),
                  node("Transpose", [f"{name}_r"], [name], perm=list(perm))]
        outputs.append(name)
    model = helper.make_model(helper.make_graph(
        nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, D])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in weights.items()]), opset_imports=[helper.make_opsetid("", 21)])
    graph = run_passes(tilefold.load(model), [merge_projections, dce], verify=True)
    assert (_ops(graph) == ["MatMul", "Split"]) is merged
    feeds = {"x": RNG.standard_normal((T, D)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = NumpyExecutable(graph)(feeds)
    for name, value in zip(outputs, want):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_weight_that_stands_for_a_dequantized_one_stays_whole():
    """A written model keeps its integers: the MatMul of a weight folded from DequantizeLinear
    is not merged (the other two are)."""
    from tilefold.graph import Graph
    from tilefold.graph.graph import DEQUANTIZED
    from tilefold.graph.ops.quantize import dequantized_value
    from tilefold.graph.types import Dequantized, TensorType, Value

    origin = Dequantized(RNG.integers(-128, 128, (D, D)).astype(np.int8), np.array(0.05, np.float32), None, 1, 0)
    g = Graph("quantized")
    x = g.add_input("x", TensorType((T, D), np.float32))
    weights = [g.add_constant(dequantized_value(origin), name="wq", dequantized=origin)]
    weights += [g.add_constant((RNG.standard_normal((D, D)) * 0.3).astype(np.float32), name=n) for n in ("wk", "wv")]
    for k, w in enumerate(weights):
        g.add_output(Value(g.add_node("MatMul", [x, w], [TensorType((T, D), np.float32)], {}, name=f"mm{k}").name),
                     f"y{k}")
    reference = g.copy()
    merged = run_passes(g, [merge_projections, dce], verify=True)
    assert _ops(merged) == ["MatMul", "MatMul", "Split"]
    assert any(DEQUANTIZED in n.attrs for n in merged.nodes())
    feeds = {"x": RNG.standard_normal((T, D)).astype(np.float32)}
    want, got = NumpyExecutable(reference)(feeds), NumpyExecutable(merged)(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
