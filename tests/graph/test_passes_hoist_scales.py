"""hoist_scales: a Mul by a constant scalar after data movement (GQA's repeated keys: Unsqueeze,
Expand, Reshape, Transpose) moves before it, computing what onnxruntime computes for the model
as written, bit for bit; it stops at a value something else reads, and leaves a Mul by a
tensor alone; the gpu target asks for it, the cpu target does not."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.backends.numpy import NumpyExecutable
from tilefold.graph.passes.dce import dce
from tilefold.graph.passes.hoist_scales import hoist_scales
from tilefold.graph.passes.pipeline import run_passes


def _model(scale_shape: tuple[int, ...] = (), also_read: str | None = None):
    """y = Transpose(Reshape(Expand(Unsqueeze(x + 1)))) * s, x of (2, 2, 5, 8) repeated to 6 heads;
    `also_read` names a value that is an output too."""
    node = helper.make_node
    nodes = [node("Add", ["x", "one"], ["k"]), node("Unsqueeze", ["k", "axis"], ["u"]),
             node("Expand", ["u", "repeated"], ["e"]), node("Reshape", ["e", "heads"], ["r"]),
             node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2]), node("Mul", ["t", "s"], ["y"])]
    rng = np.random.default_rng(3)
    scale = rng.uniform(0.1, 1.0, scale_shape).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("one", np.array(1.0, np.float32)), ("axis", np.array([2], np.int64)),
        ("repeated", np.array([2, 2, 3, 5, 8], np.int64)), ("heads", np.array([2, 6, 5, 8], np.int64)),
        ("s", scale))]
    outputs = ["y"] + ([also_read] if also_read else [])
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 2, 5, 8))],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, tilefold.load(model)


def _order(graph) -> list[str]:
    return [n.op for n in graph.nodes() if n.op not in ("Constant", "Input", "Output")]


def _same_as_onnxruntime(model, graph) -> None:
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 2, 5, 8)).astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in model.graph.output], session.run(None, feeds)))
    got = NumpyExecutable(graph)(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("scale_shape", [(), (1,), (1, 1, 1, 1)])
def test_a_scale_moves_before_the_data_movement(scale_shape):
    model, graph = _model(scale_shape)
    hoisted = run_passes(graph.copy(), [hoist_scales, dce], verify=True)
    assert _order(hoisted) == ["Add", "Mul", "Unsqueeze", "Expand", "Reshape", "Transpose"]
    _same_as_onnxruntime(model, hoisted)


def test_it_stops_at_a_value_something_else_reads():
    model, graph = _model(also_read="e")
    hoisted = run_passes(graph.copy(), [hoist_scales, dce], verify=True)
    assert _order(hoisted) == ["Add", "Unsqueeze", "Expand", "Mul", "Reshape", "Transpose"]
    _same_as_onnxruntime(model, hoisted)


@pytest.mark.parametrize("scale_shape", [(8, 5), (1, 1, 1, 1, 1)])
def test_a_tensor_or_a_scale_of_a_higher_rank_than_the_source_stays(scale_shape):
    """A Mul by a tensor does not commute with the movement; a scale of rank 5 would broadcast
    the rank-4 source to rank 5."""
    model, graph = _model(scale_shape)
    assert _order(run_passes(graph.copy(), [hoist_scales, dce], verify=True)) == _order(graph)


def test_the_gpu_target_asks_for_it_and_the_cpu_target_does_not():
    model, graph = _model()
    gpu, cpu = (_order(tilefold.optimize(graph, target).graph) for target in ("gpu", "cpu"))
    assert gpu.index("Mul") < gpu.index("Expand") and cpu.index("Mul") > cpu.index("Transpose")
