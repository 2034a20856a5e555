"""gather_rotations: a Concat of pieces of one tensor along one axis, some negated (rotary's
rotate_half), becomes a Gather by the pieces' indices times a constant sign, computing what
onnxruntime computes for the model as written, bit for bit; the gpu target asks for it, the
cpu target does not; a Concat of anything else is left as it is."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.backends.numpy import NumpyExecutable
from tilefold.graph.passes.dce import dce
from tilefold.graph.passes.pipeline import run_passes
from tilefold.graph.passes.rotations import gather_rotations

SHAPE = (2, 3, 5, 8)
INT_MAX = np.iinfo(np.int64).max


def _model(pieces: list[tuple[str, int, int, int, int, bool]], axis: int = -1, dtype: int = TensorProto.FLOAT) -> tuple:
    """y = Concat(pieces, axis) * 1.5, each piece (input, axis, start, end, step, negated) a
    Slice of input x or z of SHAPE (negated: its Neg), in `dtype`."""
    node = helper.make_node
    scale = helper.make_tensor("c", dtype, [], [1.5])
    nodes, inits, parts = [], [scale], []
    for k, (source, piece_axis, start, end, step, negated) in enumerate(pieces):
        for name, value in (("s", start), ("e", end), ("a", piece_axis), ("t", step)):
            inits.append(numpy_helper.from_array(np.array([value], np.int64), f"{name}{k}"))
        nodes.append(node("Slice", [source, f"s{k}", f"e{k}", f"a{k}", f"t{k}"], [f"p{k}"]))
        if negated:
            nodes.append(node("Neg", [f"p{k}"], [f"n{k}"]))
        parts.append(f"n{k}" if negated else f"p{k}")
    nodes += [node("Concat", parts, ["r"], axis=axis), node("Mul", ["r", "c"], ["y"])]
    graph = helper.make_graph(nodes, "rotation", [helper.make_tensor_value_info(n, dtype, SHAPE) for n in ("x", "z")],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, tilefold.load(model)


def _ops(graph) -> list[str]:
    return sorted(n.op for n in graph.nodes() if n.op not in ("Constant", "Input", "Output"))


def _same_as_onnxruntime(model, graph) -> None:
    rng = np.random.default_rng(7)
    feeds = {n: rng.standard_normal(SHAPE).astype(np.float32) for n in ("x", "z")}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(NumpyExecutable(graph)(feeds)["y"], want)


@pytest.mark.parametrize("pieces, axis, ops", [
    ([("x", 3, 4, 8, 1, True), ("x", 3, 0, 4, 1, False)], -1, ["Gather", "Mul", "Mul"]),  # rotate_half
    ([("x", -1, -4, INT_MAX, 1, True), ("x", -1, 0, -4, 1, False)], 3, ["Gather", "Mul", "Mul"]),  # from the end
    ([("x", 1, 1, 3, 1, False), ("x", 1, 0, 1, 1, False)], 1, ["Gather", "Mul"]),  # a roll of dim 1
    ([("x", 2, -1, -INT_MAX, -2, False), ("x", 2, 0, 2, 1, True), ("x", 2, 1, 4, 2, False)], 2,
     ["Gather", "Mul", "Mul"]),  # a reversed strided piece, three pieces
])
def test_pieces_of_one_tensor_become_one_gather(pieces, axis, ops):
    model, graph = _model(pieces, axis)
    rewritten = run_passes(graph.copy(), [gather_rotations, dce], verify=True)
    assert _ops(rewritten) == ops
    _same_as_onnxruntime(model, rewritten)


@pytest.mark.parametrize("pieces, axis", [
    ([("x", 3, 4, 8, 1, True), ("z", 3, 0, 4, 1, False)], -1),  # two tensors
    ([("x", 2, 0, 5, 1, False), ("x", 3, 0, 4, 1, False)], 3),  # a piece along another axis
    ([("x", 3, 4, 8, 1, True)], -1),  # one piece
])
def test_a_concat_of_anything_else_is_left_as_it_is(pieces, axis):
    model, graph = _model(pieces, axis)
    before = _ops(graph)
    assert _ops(run_passes(graph.copy(), [gather_rotations, dce], verify=True)) == before


def test_a_neg_read_elsewhere_stays():
    model, graph = _model([("x", 3, 4, 8, 1, True), ("x", 3, 0, 4, 1, False)])
    model.graph.output.append(helper.make_tensor_value_info("n0", TensorProto.FLOAT, None))
    graph = tilefold.load(model)
    assert "Concat" in _ops(run_passes(graph.copy(), [gather_rotations, dce], verify=True))


def test_the_gpu_target_asks_for_it_and_the_cpu_target_does_not():
    model, graph = _model([("x", 3, 4, 8, 1, True), ("x", 3, 0, 4, 1, False)])
    assert "Concat" not in _ops(tilefold.optimize(graph, "gpu").graph)
    assert "Concat" in _ops(tilefold.optimize(graph, "cpu").graph)


def test_a_bfloat16_rotation_becomes_a_gather_too():
    """bfloat16 is a float type too (NumPy calls ml_dtypes' kind "V"): a half-precision LLaMA's
    rotate_half is rewritten as a float32 one is, and negates the same elements."""
    import ml_dtypes

    from tilefold.backends.triton import TritonExecutable

    model, graph = _model([("x", 3, 4, 8, 1, True), ("x", 3, 0, 4, 1, False)], dtype=TensorProto.BFLOAT16)
    rewritten = run_passes(graph.copy(), [gather_rotations, dce], verify=True)
    assert _ops(rewritten) == ["Gather", "Mul", "Mul"]
    x = np.random.default_rng(8).standard_normal(SHAPE).astype(ml_dtypes.bfloat16)
    got = TritonExecutable(rewritten, device="interp")({"x": x, "z": x})["y"]  # (the NumPy backend has no bfloat16)
    want = np.concatenate([-x[..., 4:], x[..., :4]], axis=-1).astype(np.float32) * np.float32(1.5)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(ml_dtypes.bfloat16).astype(np.float32))
