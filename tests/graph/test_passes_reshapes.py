"""compose_reshapes and sink_batch_merges: chained Reshapes read the first one's input, and
attention written for bmm (batch and heads merged into one dim) runs 4-D after `simplify`,
with onnxruntime's answers."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.graph import Graph

B, T, H, D = 2, 5, 3, 4
RNG = np.random.default_rng(17)


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def bmm_attention() -> onnx.ModelProto:
    """XGLM's attention: heads split, merged with the batch for bmm, a mask added on the
    split scores, softmax on the merged ones, heads merged back into the hidden dim."""
    node = helper.make_node
    nodes = [
        *(node("Reshape", [name, "split"], [f"{name}4"]) for name in ("q", "k", "v")),
        *(node("Transpose", [f"{name}4"], [f"{name}t"], perm=[0, 2, 1, 3]) for name in ("q", "k", "v")),
        *(node("Reshape", [f"{name}t", "merged"], [f"{name}m"]) for name in ("q", "k", "v")),
        node("Mul", ["qm", "scale"], ["qs"]),
        node("Transpose", ["km"], ["kT"], perm=[0, 2, 1]),
        node("MatMul", ["qs", "kT"], ["scores"]),
        node("Reshape", ["scores", "scores4"], ["s4"]),
        node("Add", ["s4", "mask"], ["masked"]),
        node("Reshape", ["masked", "scores3"], ["s3"]),
        node("Softmax", ["s3"], ["p"], axis=-1),
        node("MatMul", ["p", "vm"], ["ctx"]),
        node("Reshape", ["ctx", "heads"], ["ctx4"]),
        node("Transpose", ["ctx4"], ["ctxt"], perm=[0, 2, 1, 3]),
        node("Reshape", ["ctxt", "hidden"], ["y"]),
    ]
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f32, [B, T, H * D]) for n in ("q", "k", "v")]
    inputs.append(helper.make_tensor_value_info("mask", f32, [B, 1, T, T]))
    inits = {"split": _ints(B, T, H, D), "merged": _ints(B * H, T, D), "scale": np.array(0.5, np.float32),
             "scores4": _ints(B, H, T, T), "scores3": _ints(B * H, T, T), "heads": _ints(B, H, T, D),
             "hidden": _ints(B, T, H * D)}
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", f32, [B, T, H * D])], inits)


def _feeds() -> dict[str, np.ndarray]:
    feeds = {n: RNG.standard_normal((B, T, H * D)).astype(np.float32) for n in ("q", "k", "v")}
    feeds["mask"] = np.where(RNG.random((B, 1, T, T)) < 0.2, -1e4, 0.0).astype(np.float32)
    return feeds


def _ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes() if n.op not in ("Input", "Output", "Constant")]


def test_bmm_attention_runs_4d_after_simplify():
    model = bmm_attention()
    graph = tilefold.load(model)
    merged = [n for n in graph.nodes() if n.op == "Reshape" and n.outputs[0].shape[0] == B * H]
    assert merged == []  # no value holds batch and heads merged
    assert all(n.outputs[0].rank == 4 for n in graph.nodes() if n.op in ("MatMul", "Softmax"))
    assert _ops(graph).count("Reshape") == 4  # the three head splits and the final merge
    feeds = _feeds()
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(tilefold.compile(graph)(feeds)["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_bmm_attention_keeps_no_runtime_layout_op(target):
    opt = tilefold.optimize(tilefold.load(bmm_attention()), target)
    assert opt.report.to_dict()["layout_ops_after"] == 0
    feeds = _feeds()
    want = tilefold.compile(tilefold.load(bmm_attention()))(feeds)["y"]
    np.testing.assert_allclose(tilefold.compile(opt.graph)(feeds)["y"], want, rtol=1e-5, atol=1e-6)


def test_chained_reshapes_read_the_first_input_and_a_reshape_to_its_own_shape_goes():
    node = helper.make_node
    model = _model(
        [node("Reshape", ["x", "a"], ["r1"]), node("Relu", ["r1"], ["u"]), node("Reshape", ["r1", "b"], ["r2"]),
         node("Reshape", ["r2", "c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [6, 4])],
        {"a": _ints(6, 4), "b": _ints(24), "c": _ints(2, 3, 4)})
    graph = tilefold.load(model)
    # y is x itself; u reads x as (6, 4), the merge now after the Relu (its only reader)
    assert _ops(graph) == ["Relu", "Reshape"]
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    got = tilefold.compile(graph)({"x": x})
    np.testing.assert_array_equal(got["y"], x)
    np.testing.assert_array_equal(got["u"], np.maximum(x.reshape(6, 4), 0))


def test_merges_that_are_not_batch_stay():
    """A merge read twice, a Transpose that moves the merged dim, and a MatMul of merges of
    different leading dims keep their merges (and still compute the same)."""
    node = helper.make_node
    model = _model(
        [node("Reshape", ["x", "m"], ["xm"]), node("Transpose", ["xm"], ["moved"], perm=[1, 0, 2]),
         node("Relu", ["xm"], ["r"]),
         node("Reshape", ["z", "m2"], ["zm"]), node("Reshape", ["w", "m3"], ["wm"]),
         node("MatMul", ["zm", "wm"], ["p"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3, 4, 5]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2, 5, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("moved", "r", "p")],
        {"m": _ints(6, 4, 5), "m2": _ints(6, 4, 5), "m3": _ints(6, 5, 4)})
    graph = tilefold.load(model)
    assert [n.outputs[0].shape for n in graph.nodes() if n.op == "Reshape"] == [(6, 4, 5)] * 2 + [(6, 5, 4)]
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in
             (("x", (2, 3, 4, 5)), ("z", (2, 3, 4, 5)), ("w", (3, 2, 5, 4)))}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = tilefold.compile(graph)(feeds)
    for name, expected in zip(("moved", "r", "p"), want):
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6)


def test_empty_tensors_keep_their_reshapes():
    """A 0 in a Reshape's shape copies the input's dim unless allowzero: shapes with an empty
    dim are left as they are."""
    node = helper.make_node
    model = _model(
        [node("Reshape", ["x", "a"], ["r"], allowzero=1), node("Reshape", ["r", "b"], ["y"], allowzero=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 0, 4])],
        {"a": _ints(0, 12), "b": _ints(3, 0, 4)})
    graph = tilefold.load(model)
    assert _ops(graph) == ["Reshape", "Reshape"]
    assert tilefold.compile(graph)({"x": np.zeros((0, 3, 4), np.float32)})["y"].shape == (3, 0, 4)



def linear_layers_of_a_map(n=2, side=3, c=8, hidden=12, **gemm_attrs) -> onnx.ModelProto:
    """Two Linear layers on a channels-last map, written as torch traces them: the map's
    leading dims merged into rows, `addmm` (a Gemm; the first with torch's (out, in) weight,
    transB), the rows split back into the map; a Relu between."""
    node = helper.make_node
    rows = n * side * side
    nodes = [node("Reshape", ["x", "rows_c"], ["r"]),
             node("Gemm", ["r", "w1", "b1"], ["h"], transB=1, **gemm_attrs),
             node("Reshape", ["h", "map_h"], ["hm"]),
             node("Relu", ["hm"], ["a"]),
             node("Reshape", ["a", "rows_h"], ["ar"]),
             node("Gemm", ["ar", "w2", "b2"], ["o"]),
             node("Reshape", ["o", "map_c"], ["y"])]
    f32 = TensorProto.FLOAT
    inits = {"rows_c": _ints(rows, c), "map_h": _ints(n, side, side, hidden), "rows_h": _ints(rows, hidden),
             "map_c": _ints(n, side, side, c),
             "w1": RNG.standard_normal((hidden, c)).astype(np.float32),
             "b1": RNG.standard_normal(hidden).astype(np.float32),
             "w2": RNG.standard_normal((hidden, c)).astype(np.float32),
             "b2": RNG.standard_normal((1, c)).astype(np.float32)}
    return _model(nodes, [helper.make_tensor_value_info("x", f32, [n, side, side, c])],
                  [helper.make_tensor_value_info("y", f32, [n, side, side, c])], inits)


def _matches_onnxruntime(model: onnx.ModelProto, graph: Graph) -> None:
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = tilefold.compile(graph)(feeds)
    for out, expected in zip(model.graph.output, want):
        np.testing.assert_allclose(got[out.name], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_linear_layers_of_a_map_run_on_the_map():
    """Each Gemm of merged rows becomes a MatMul of the map and the Add of its bias, as
    torch.onnx writes a Linear layer: no Reshape is left, so a layout of the map (NCHWc16 on
    the gpu target, whose (N*H*W, C) rows no matrix tiling reads) reaches the layers."""
    model = linear_layers_of_a_map()
    graph = tilefold.load(model)
    assert _ops(graph) == ["MatMul", "Add", "Relu", "MatMul", "Add"]
    assert all(n.outputs[0].shape == (2, 3, 3, n.outputs[0].shape[-1]) for n in graph.nodes()
               if n.op in ("MatMul", "Add"))
    _matches_onnxruntime(model, graph)


@pytest.mark.parametrize("attrs", [{"alpha": 0.5}, {"beta": 2.0}])
def test_a_scaled_gemm_of_merged_rows_stays(attrs):
    """alpha or beta other than 1: the Gemm keeps its rows merged (a Linear layer has
    neither)."""
    model = linear_layers_of_a_map(**attrs)
    graph = tilefold.load(model)
    assert _ops(graph).count("Gemm") == 1 and _ops(graph).count("MatMul") == 1
    _matches_onnxruntime(model, graph)


def test_a_bias_that_varies_by_row_keeps_the_rows_merged():
    node = helper.make_node
    model = _model(
        [node("Reshape", ["x", "rows"], ["r"]), node("Gemm", ["r", "w", "c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 5])],
        {"rows": _ints(6, 4), "w": RNG.standard_normal((4, 5)).astype(np.float32),
         "c": RNG.standard_normal((6, 5)).astype(np.float32)})
    graph = tilefold.load(model)
    assert _ops(graph) == ["Reshape", "Gemm"]
    _matches_onnxruntime(model, graph)


def test_a_matmul_of_merged_batch_dims_and_a_matrix_runs_unmerged():
    """(B*H, T, D) against one (D, E) matrix, the matrix known only at run time: the product
    runs on (B, H, T, D), the merge after it."""
    node = helper.make_node
    model = _model(
        [node("Reshape", ["x", "merged"], ["m"]), node("MatMul", ["m", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, H, T, D]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [D, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B * H, T, 6])],
        {"merged": _ints(B * H, T, D)})
    graph = tilefold.load(model)
    assert _ops(graph) == ["MatMul", "Reshape"]
    assert graph.type_of(graph.inputs_of(next(n.name for n in graph.nodes() if n.op == "MatMul"))[0]).shape == (B, H, T, D)
    _matches_onnxruntime(model, graph)


def test_a_transposed_weight_known_only_at_run_time_is_transposed_at_run_time():
    model = linear_layers_of_a_map()
    (w1,) = [i for i in model.graph.initializer if i.name == "w1"]
    model.graph.initializer.remove(w1)
    model.graph.input.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, list(w1.dims)))
    graph = tilefold.load(model)
    assert _ops(graph) == ["Transpose", "MatMul", "Add", "Relu", "MatMul", "Add"]
    _matches_onnxruntime(model, graph)


def test_an_output_projection_of_merged_heads_and_rows_runs_on_the_batch():
    """torch's attention output projection: the context (B, T, H, D) merged into (B*T, H*D)
    rows for `addmm`, split back after. The heads are merged alone, (B, T, H*D), and the
    Linear layer runs on that batch of matrices: no value holds B*T rows."""
    node = helper.make_node
    model = _model(
        [node("Reshape", ["ctx", "rows"], ["r"]),
         node("Gemm", ["r", "w", "b"], ["o"], transB=1),
         node("Reshape", ["o", "tokens"], ["y"])],
        [helper.make_tensor_value_info("ctx", TensorProto.FLOAT, [B, T, H, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, 7])],
        {"rows": _ints(B * T, H * D), "tokens": _ints(B, T, 7),
         "w": RNG.standard_normal((7, H * D)).astype(np.float32), "b": RNG.standard_normal(7).astype(np.float32)})
    graph = tilefold.load(model)
    assert _ops(graph) == ["Reshape", "MatMul", "Add"]
    assert [n.outputs[0].shape for n in graph.nodes() if n.op in ("Reshape", "MatMul")] == [(B, T, H * D), (B, T, 7)]
    _matches_onnxruntime(model, graph)
