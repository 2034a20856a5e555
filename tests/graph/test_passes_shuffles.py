"""compose_shuffles: a chain of Reshapes and Transposes holding two Transposes or more runs as
one Transpose between two Reshapes, with the chain's answers (onnxruntime's, NumPy's)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.graph import Graph, TensorType, Value
from tilefold.graph.passes import compose_shuffles
from tilefold.graph.verify import verify_graph

RNG = np.random.default_rng(23)
B, C, NH, PH, NW, PW = 2, 6, 4, 2, 3, 3  # MobileViT's patches, made unequal: 2x3 pixels, 4x3 of them
H, W = NH * PH, NW * PW


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def mobilevit_patches() -> onnx.ModelProto:
    """transformers' MobileViT unfolding (B, C, H, W) into (B * patch area, patches, C), a token
    op, and its folding back, each as reshape -> transpose -> reshape -> transpose -> reshape."""
    node = helper.make_node
    nodes = [
        node("Reshape", ["x", "rows"], ["r0"]),
        node("Transpose", ["r0"], ["t0"], perm=[0, 2, 1, 3]),
        node("Reshape", ["t0", "grid"], ["r1"]),
        node("Transpose", ["r1"], ["t1"], perm=[0, 3, 2, 1]),
        node("Reshape", ["t1", "tokens"], ["patches"]),
        node("Mul", ["patches", "scale"], ["scaled"]),
        node("Reshape", ["scaled", "areas"], ["f0"]),
        node("Transpose", ["f0"], ["f1"], perm=[0, 3, 2, 1]),
        node("Reshape", ["f1", "columns"], ["f2"]),
        node("Transpose", ["f2"], ["f3"], perm=[0, 2, 1, 3]),
        node("Reshape", ["f3", "image"], ["y"]),
    ]
    inits = {"rows": _ints(B * C * NH, PH, NW, PW), "grid": _ints(B, C, NH * NW, PH * PW),
             "tokens": _ints(B * PH * PW, NH * NW, C), "scale": RNG.standard_normal(C).astype(np.float32),
             "areas": _ints(B, PH * PW, NH * NW, C), "columns": _ints(B * C * NH, NW, PH, PW),
             "image": _ints(B, C, H, W)}
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "patches", [helper.make_tensor_value_info("x", f32, [B, C, H, W])],
                              [helper.make_tensor_value_info(n, f32, None) for n in ("patches", "y")],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _transposes(graph: Graph) -> list[tuple[int, ...]]:
    return [n.outputs[0].shape for n in graph.nodes() if n.op == "Transpose"]


def _check_against_onnxruntime(model: onnx.ModelProto, graph: Graph, shape: tuple[int, ...]) -> None:
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    got = tilefold.compile(graph)(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


def test_mobilevit_unfolding_and_folding_run_as_one_transpose_each():
    model = mobilevit_patches()
    graph = tilefold.load(model)
    assert _transposes(graph) == [(B, PH, PW, NH, NW, C), (B, C, NH, PH, NW, PW)]
    assert [n.op for n in graph.nodes() if n.op in ("Reshape", "Transpose")].count("Reshape") == 4
    _check_against_onnxruntime(model, graph, (B, C, H, W))


def test_a_chain_whose_factors_do_not_line_up_is_left_alone():
    """(6, 4) transposed to (4, 6) and read as (3, 8): no cut of the 4 makes a 3."""
    node = helper.make_node
    nodes = [node("Transpose", ["x"], ["t0"], perm=[1, 0]), node("Reshape", ["t0", "shape"], ["r"]),
             node("Transpose", ["r"], ["y"], perm=[1, 0])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(_ints(3, 8), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    loaded = tilefold.load(model)
    assert _transposes(loaded) == [(4, 6), (8, 3)]
    _check_against_onnxruntime(model, loaded, (6, 4))


def test_a_result_read_elsewhere_ends_the_chain_there():
    """The unfolding's first transpose is also an output, so only its second half, one
    Transpose, is left to compose: nothing changes."""
    model = mobilevit_patches()
    model.graph.output.append(helper.make_tensor_value_info("t0", TensorProto.FLOAT, None))
    graph = tilefold.load(model)
    assert (B * C * NH, NW, PH, PW) in _transposes(graph) and (B, PH * PW, NH * NW, C) in _transposes(graph)
    _check_against_onnxruntime(model, graph, (B, C, H, W))


# ---- any chain whose reshapes cut along its digits: hypothesis against NumPy ----------------
def _regroup(draw, digits: list[int]) -> list[list[int]]:
    """Consecutive runs of `digits` as dims (each a list of its digits), with size-1 dims
    (no digits) sprinkled in."""
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(digits) - 1)), max_size=len(digits) - 1)))
    bounds = [0, *(c for c in cuts if c < len(digits)), len(digits)]
    dims = [digits[a:b] for a, b in zip(bounds, bounds[1:])]
    for _ in range(draw(st.integers(0, 2))):
        dims.insert(draw(st.integers(0, len(dims))), [])
    return dims


def _shape(dims: list[list[int]]) -> tuple[int, ...]:
    return tuple(int(np.prod(d)) for d in dims)


@st.composite
def chains(draw) -> tuple[tuple[int, ...], list[tuple[str, tuple[int, ...]]]]:
    """A shape and a chain of ("T", perm) and ("R", shape) steps. Each dim is a mixed-radix
    number whose digits are factors of the input's; a reshape regroups the digits in their
    current order, so the chain only ever cuts between digits."""
    dims = _regroup(draw, draw(st.lists(st.sampled_from([2, 3, 5]), min_size=1, max_size=6)))
    shape, steps = _shape(dims), []
    for _ in range(draw(st.integers(2, 6))):
        if draw(st.booleans()):
            perm = tuple(draw(st.permutations(range(len(dims)))))
            dims = [dims[p] for p in perm]
            steps.append(("T", perm))
        else:
            dims = _regroup(draw, [digit for d in dims for digit in d])
            steps.append(("R", _shape(dims)))
    return shape, steps


def _graph(shape: tuple[int, ...], steps) -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType(shape, np.dtype("float32")))
    for k, (kind, arg) in enumerate(steps):
        t = g.type_of(x)
        if kind == "T":
            node = g.add_node("Transpose", [x], [TensorType(tuple(t.shape[p] for p in arg), t.dtype)], {"perm": arg},
                              name=f"t{k}")
        else:
            node = g.add_node("Reshape", [x, g.add_constant(np.array(arg, np.int64))], [TensorType(arg, t.dtype)],
                              name=f"r{k}")
        x = Value(node.name)
    g.add_output(x, "y")
    return g


@settings(max_examples=150, deadline=None)
@given(chains())
def test_any_chain_cut_between_its_digits_composes_to_one_transpose_with_numpys_answer(chain):
    shape, steps = chain
    x = RNG.standard_normal(shape).astype(np.float32)
    want = x
    for kind, arg in steps:
        want = want.transpose(arg) if kind == "T" else want.reshape(arg)
    graph = compose_shuffles(_graph(shape, steps)).graph
    verify_graph(graph)
    transposes = sum(n.op == "Transpose" for n in graph.nodes())
    assert transposes <= 1 if sum(kind == "T" for kind, _ in steps) >= 2 else transposes == len(
        [s for s in steps if s[0] == "T"])
    np.testing.assert_array_equal(tilefold.compile(graph)({"x": x})["y"], want)


def test_a_cut_inside_a_digit_that_no_split_makes_leaves_the_chain_alone():
    """(2, 3) merged, transposed and read as (4, ...) would cut the 3: not a transpose of factors."""
    steps = [("T", (1, 0, 2)), ("R", (12,)), ("R", (4, 3)), ("T", (1, 0))]
    graph = compose_shuffles(_graph((2, 3, 2), steps)).graph
    assert sum(n.op == "Transpose" for n in graph.nodes()) == 2
