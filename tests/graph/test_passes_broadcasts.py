"""tile_as_expand: a Tile repeating only size-1 dims becomes an Expand, computing what
onnxruntime computes; a Tile that repeats a longer dim stays a Tile."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold

RNG = np.random.default_rng(29)


def repeat_then_multiply(x_shape, repeats):
    nodes = [helper.make_node("Tile", ["q", "repeats"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])]
    out = [d * r for d, r in zip(x_shape, repeats)]
    graph = helper.make_graph(
        nodes, "repeat", [helper.make_tensor_value_info("q", TensorProto.FLOAT, list(x_shape)),
                          helper.make_tensor_value_info("x", TensorProto.FLOAT, out)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(repeats, np.int64), "repeats")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), out


@pytest.mark.parametrize("q_shape, repeats, becomes", [
    ((1, 1, 32), (1, 64, 1), "Expand"),  # SwiftFormer's query repeated over the tokens
    ((2, 1, 3), (1, 4, 1), "Expand"),
    ((1, 2, 3), (1, 2, 1), "Tile"),  # a dim of 2 repeated: whole blocks, not a broadcast
])
def test_a_tile_of_size_one_dims_is_an_expand(q_shape, repeats, becomes):
    model, out = repeat_then_multiply(q_shape, repeats)
    feeds = {"q": RNG.standard_normal(q_shape).astype(np.float32), "x": RNG.standard_normal(out).astype(np.float32)}
    g = tilefold.load(model)
    assert becomes in g.op_counts() and ({"Tile", "Expand"} - {becomes}).isdisjoint(g.op_counts())
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(tilefold.compile(g)(feeds)["y"], want, rtol=1e-6)
