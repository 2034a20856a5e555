"""Layout propagation: anchors get their target's layouts, the layout changes between them
cancel or fold into the weights, results never change, and the verifier passes after every
pass (verify=True)."""
import itertools

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.graph import Graph, Splat, TensorType, Value
from tilefold.layout import optimize
from tilefold.layout.encoding import PackedEncoding, pack
from tilefold.layout.propagate import propagate, reshape_perm
from tilefold.layout.targets import NHWC, get_target

RNG = np.random.default_rng(5)
F32 = np.dtype("float32")
LAYOUT_OPS = ("Pack", "Unpack", "Transpose")


def runtime_layout_ops(graph: Graph) -> list[str]:
    """Pack/Unpack/Transpose nodes left on values computed at run time."""
    return [
        n.op for n in graph.nodes()
        if n.op in LAYOUT_OPS and graph.node(graph.inputs_of(n.name)[0].node).op != "Constant"
    ]


def convnet(channels=(3, 8, 8), size=9, groups=1, splat=False) -> onnx.ModelProto:
    """conv -> relu -> conv(+bias) -> add residual -> relu -> global pool -> flatten -> gemm."""
    c0, c1, c2 = channels
    w1 = RNG.standard_normal((c1, c0, 3, 3)).astype(np.float32) * 0.3
    w2 = RNG.standard_normal((c2, c1 // groups, 3, 3)).astype(np.float32) * 0.3
    b2 = RNG.standard_normal(c2).astype(np.float32)
    wg = RNG.standard_normal((c2, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=groups),
        helper.make_node("Add", ["c2", "r1"] if c1 == c2 else ["c2", "c2"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["m"]),
        helper.make_node("Relu", ["m"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wg"], ["y"]),
    ]
    scale = np.full((c2, 1, 1), 0.5, np.float32) if splat else RNG.uniform(0.5, 1.5, (c2, 1, 1)).astype(np.float32)
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c0, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(a, n) for n, a in [("w1", w1), ("w2", w2), ("b2", b2), ("wg", wg), ("scale", scale)]],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_convnet_keeps_no_runtime_layout_op_on_cpu():
    g = tilefold.load(convnet())
    result = optimize(g, "cpu", verify=True)
    assert runtime_layout_ops(result.before).count("Pack") >= 2
    assert runtime_layout_ops(result.after) == []
    convs = [n for n in result.after.nodes() if n.op == "Conv"]
    assert all(n.outputs[0].encoding == NHWC for n in convs)
    first = result.after.inputs_of(convs[0].name)[0]
    assert result.after.type_of(first).encoding is None  # reads the NCHW input itself
    weights = [result.after.node(result.after.inputs_of(n.name)[1].node) for n in convs]
    assert all(w.op == "Constant" and w.outputs[0].encoding is not None for w in weights)


def test_optimize_leaves_its_input_graph_alone():
    g = tilefold.load(convnet())
    before = g.op_counts()
    optimize(g, "cpu")
    assert g.op_counts() == before


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("channels, groups", [((3, 8, 8), 1), ((3, 100, 100), 1), ((5, 12, 12), 4), ((3, 6, 1000), 1)])
def test_optimized_convnets_compute_the_same_results(target, channels, groups):
    model = convnet(channels, size=7, groups=groups)
    g = tilefold.load(model)
    x = RNG.standard_normal((2, channels[0], 7, 7)).astype(np.float32)
    want = tilefold.compile(g)({"x": x})["y"]
    got = tilefold.compile(optimize(g, target, verify=True).after, debug=True)({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_the_gpu_target_tiles_channels_and_pads_what_does_not_divide():
    g = tilefold.load(convnet((3, 100, 100)))
    after = optimize(g, "gpu", verify=True).after
    conv = next(n for n in after.nodes() if n.op == "Conv")
    assert conv.outputs[0].encoding.inner_tiles == (16,)
    assert conv.outputs[0].nbytes() == 2 * 112 * 9 * 9 * 4  # 100 channels padded to 7 tiles of 16


def chain_graph(enc: PackedEncoding, splat: Splat | None = None) -> tuple[Graph, Value]:
    g = Graph()
    x = g.add_input("x", TensorType((4, 6), F32))
    const = g.add_constant(splat if splat is not None else RNG.standard_normal((4, 6)).astype(np.float32))
    p = g.add_node("Pack", [const], [TensorType((4, 6), F32, enc)], {"encoding": enc}, name="pack_const")
    u = g.add_node("Unpack", [Value(p.name)], [TensorType((4, 6), F32)], name="unpack")
    s = g.add_node("Add", [x, Value(u.name)], [TensorType((4, 6), F32)], name="add")
    g.add_output(Value(s.name), "y")
    return g, const


def test_a_pack_of_a_constant_folds_at_compile_time():
    enc = PackedEncoding((1,), (4,))
    g, const = chain_graph(enc)
    array = g.constant_value(const)
    out = propagate(g, get_target("cpu"), verify=True)
    assert "Pack" not in out.op_counts() and "Unpack" not in out.op_counts()
    (add,) = [n for n in out.nodes() if n.op == "Add"]
    np.testing.assert_array_equal(out.constant_value(out.inputs_of(add.name)[1]), array)


@pytest.mark.parametrize("shape, tile, stays_splat", [((4, 8), 4, True), ((4, 6), 4, False)])
def test_a_packed_splat_stays_a_splat_unless_zero_padding_is_needed(shape, tile, stays_splat):
    g = Graph()
    enc = PackedEncoding((1,), (tile,))
    c = g.add_constant(Splat(0.25, shape, F32))
    p = g.add_node("Pack", [c], [TensorType(shape, F32, enc)], {"encoding": enc})
    g.add_output(Value(g.add_node("Unpack", [Value(p.name)], [TensorType(shape, F32)]).name), "y")
    from tilefold.layout.propagate import _packed_constant  # the folding rule itself

    packed = g.constant_value(_packed_constant(g, g.node(c.node), enc))
    assert isinstance(packed, Splat) == stays_splat
    if not stays_splat:
        np.testing.assert_array_equal(packed, pack(np.full(shape, 0.25, np.float32), enc))


def test_pack_of_unpack_with_other_padding_does_not_cancel():
    g = Graph()
    have = PackedEncoding((1,), (4,), pad=None)
    want = PackedEncoding((1,), (4,), pad=0.0)
    zero = PackedEncoding((1,), (4,), pad=0.0)
    x = g.add_input("x", TensorType((3, 6), F32))
    p1 = g.add_node("Pack", [x], [TensorType((3, 6), F32, zero)], {"encoding": zero})
    # sigmoid(0) = 0.5 lands in the padding: what it holds is no longer known to be zero
    s = g.add_node("Sigmoid", [Value(p1.name)], [TensorType((3, 6), F32, have)])
    u = g.add_node("Unpack", [Value(s.name)], [TensorType((3, 6), F32)])
    p2 = g.add_node("Pack", [Value(u.name)], [TensorType((3, 6), F32, want)], {"encoding": want})
    r = g.add_node("Relu", [Value(p2.name)], [TensorType((3, 6), F32, want)])  # reads the padding
    g.add_output(Value(g.add_node("Unpack", [Value(r.name)], [TensorType((3, 6), F32)]).name), "y")
    out = propagate(g, get_target("cpu"), verify=True)
    assert out.op_counts()["Pack"] == 2 and out.op_counts()["Unpack"] == 2


@st.composite
def reshape_case(draw):
    rank = draw(st.integers(1, 4))
    src = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=rank, max_size=rank)))
    perm = tuple(draw(st.permutations(range(rank))))
    # dst: split or merge neighbouring dims of src
    dims = list(src)
    for _ in range(draw(st.integers(0, 2))):
        k = draw(st.integers(0, len(dims) - 1))
        if draw(st.booleans()) and k + 1 < len(dims):
            dims[k:k + 2] = [dims[k] * dims[k + 1]]
        elif dims[k] % 2 == 0:
            dims[k:k + 1] = [2, dims[k] // 2]
    return src, tuple(dims), perm


@given(reshape_case())
@settings(max_examples=300, deadline=None)
def test_a_reshape_of_a_permuted_buffer_is_a_view_when_reshape_perm_says_so(case):
    src, dst, perm = case
    x = np.arange(int(np.prod(src)), dtype=np.float32).reshape(src)
    buffer = pack(x, PackedEncoding((), (), perm))
    new = reshape_perm(src, dst, perm)
    if new is not None:
        np.testing.assert_array_equal(pack(x.reshape(dst), PackedEncoding((), (), new)).ravel(), buffer.ravel())
    else:  # refused only when no permutation of dst holds the buffer's element order
        for candidate in itertools.permutations(range(len(dst))):
            view = pack(x.reshape(dst), PackedEncoding((), (), candidate))
            assert not np.array_equal(view.ravel(), buffer.ravel()), candidate


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_a_scalar_operand_needs_no_packing(target):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "half"], ["m"]),
             helper.make_node("Conv", ["m", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "scalar",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [numpy_helper.from_array(RNG.standard_normal((16, 3, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(RNG.standard_normal((4, 16, 3, 3)).astype(np.float32), "w2"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )
    g = tilefold.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    after = optimize(g, target, verify=True).after
    (mul,) = [n for n in after.nodes() if n.op == "Mul"]
    assert after.type_of(after.inputs_of(mul.name)[0]).encoding is not None  # runs on the packed buffer
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(after)({"x": x})["y"], tilefold.compile(g)({"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_padding_a_computed_result_holds_is_unknown():
    # batch 8 under 16-row tiles: the matmul result is padded, and the bias add puts bias
    # values into the padding rows, so the next matmul must not read that buffer as
    # zero-padded: it reads the unpacked value instead. (The first matmul's result has a
    # second reader, so that it is not simply written unpacked, rule 2b.)
    w1 = RNG.standard_normal((32, 32)).astype(np.float32)
    w2 = RNG.standard_normal((32, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "one"], ["a"]),
         helper.make_node("MatMul", ["a", "w2"], ["y"]), helper.make_node("Relu", ["h"], ["r"])],
        "padded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [8, 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    g = tilefold.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    after = optimize(g, "gpu-padded", verify=True).after  # (tests/conftest.py)
    (add,) = [n for n in after.nodes() if n.op == "Add"]
    assert add.outputs[0].encoding is not None and add.outputs[0].encoding.pad is None
    second = [n for n in after.nodes() if n.op == "MatMul"][1]
    assert after.inputs_of(second.name)[0].node != add.name  # not the buffer with bias in its padding
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    got, want = tilefold.compile(after)({"x": x}), tilefold.compile(g)({"x": x})
    for name in ("y", "r"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-3)


def test_a_matmul_read_through_a_bias_add_and_unpacked_writes_its_result_unpacked():
    """Rule 2b with nothing to cancel, through an elementwise op on a constant: the padded
    tiles the first matmul would write are unpacked after the bias add for the second
    matmul (batch 8 under 16-row tiles), so it writes the plain layout instead."""
    w1 = RNG.standard_normal((32, 32)).astype(np.float32)
    w2 = RNG.standard_normal((32, 16)).astype(np.float32)
    b = RNG.standard_normal(32).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("MatMul", ["a", "w2"], ["y"])],
        "padded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b, "b")],
    )
    g = tilefold.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    after = optimize(g, "gpu-padded", verify=True).after
    assert runtime_layout_ops(after) == []
    assert all(n.outputs[0].encoding is None for n in after.nodes() if n.op in ("MatMul", "Add"))
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(after)({"x": x})["y"], (x @ w1 + b) @ w2, rtol=1e-4, atol=1e-4)


def integer_convnet(channels=(3, 16, 16)) -> onnx.ModelProto:
    """The convnet with small-integer weights on 8x8 inputs: every float32 sum is an exact
    integer, and the global average (a division by 64) is exact too."""
    model = convnet(channels, size=8)
    for init in model.graph.initializer:
        values = numpy_helper.to_array(init)
        small = RNG.integers(-2, 3, values.shape).astype(np.float32)
        init.CopyFrom(numpy_helper.from_array(small, init.name))
    return model


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_layout_changes_alone_are_exact_on_small_integers(target):
    g = tilefold.load(integer_convnet())
    x = RNG.integers(-3, 4, (2, 3, 8, 8)).astype(np.float32)
    plain = tilefold.compile(g)({"x": x})["y"]
    assert np.array_equal(plain * 64, np.round(plain * 64))  # exact values throughout
    np.testing.assert_array_equal(tilefold.compile(optimize(g, target).after)({"x": x})["y"], plain)


def test_channels_last_passes_through_new_activations_into_a_norm_on_cpu():
    """conv -> Mish -> conv -> Softsign -> Celu -> ReduceL2 over H, W: the activations carry the
    convs' channels-last layout, and the norm reduces the channels-last buffer, as for Relu and
    ReduceMean; the values match onnxruntime's."""
    import onnxruntime as ort

    w1 = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("Mish", ["c1"], ["m"]),
         helper.make_node("Conv", ["m", "w2"], ["c2"], pads=[1, 1, 1, 1]),
         helper.make_node("Softsign", ["c2"], ["s"]),
         helper.make_node("Celu", ["s"], ["e"], alpha=0.7),
         helper.make_node("ReduceL2", ["e", "axes"], ["y"], keepdims=0)],
        "activations",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(np.array([2, 3], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    after = optimize(tilefold.load(model), "cpu", verify=True).after
    assert runtime_layout_ops(after) == []
    for op in ("Mish", "Softsign", "Celu"):
        (node,) = [n for n in after.nodes() if n.op == op]
        assert node.outputs[0].encoding == NHWC, op
    (norm,) = [n for n in after.nodes() if n.op == "ReduceL2"]
    assert after.type_of(after.inputs_of(norm.name)[0]).encoding == NHWC
    x = RNG.standard_normal((2, 3, 9, 9)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(tilefold.compile(after, debug=True)({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def patches_between_convs(nh: int, ph: int, nw: int, pw: int, c: int = 8) -> onnx.ModelProto:
    """MobileViT's block, shrunk: a conv, its map unfolded into patches (B * patch area,
    patches, C) as transformers writes it (reshape, transpose, reshape, transpose, reshape), a
    linear layer over the tokens, the folding back, and a conv."""
    b, h, w = 2, nh * ph, nw * pw
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        node("Reshape", ["a", "rows"], ["r0"]), node("Transpose", ["r0"], ["t0"], perm=[0, 2, 1, 3]),
        node("Reshape", ["t0", "grid"], ["r1"]), node("Transpose", ["r1"], ["t1"], perm=[0, 3, 2, 1]),
        node("Reshape", ["t1", "tokens"], ["p"]),
        node("MatMul", ["p", "wt"], ["q"]),
        node("Reshape", ["q", "areas"], ["f0"]), node("Transpose", ["f0"], ["f1"], perm=[0, 3, 2, 1]),
        node("Reshape", ["f1", "columns"], ["f2"]), node("Transpose", ["f2"], ["f3"], perm=[0, 2, 1, 3]),
        node("Reshape", ["f3", "image"], ["b"]),
        node("Conv", ["b", "w1"], ["y"], pads=[1, 1, 1, 1]),
    ]
    shapes = {"rows": (b * c * nh, ph, nw, pw), "grid": (b, c, nh * nw, ph * pw), "tokens": (b * ph * pw, nh * nw, c),
              "areas": (b, ph * pw, nh * nw, c), "columns": (b * c * nh, nw, ph, pw), "image": (b, c, h, w)}
    weights = {"w0": RNG.standard_normal((c, 3, 3, 3)) * 0.3, "w1": RNG.standard_normal((4, c, 3, 3)) * 0.3,
               "wt": RNG.standard_normal((c, c)) * 0.3}
    inits = [numpy_helper.from_array(np.array(s, np.int64), n) for n, s in shapes.items()]
    inits += [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()]
    graph = helper.make_graph(nodes, "patches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, 3, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("grid, copies", [((4, 2, 2, 3), 2), ((1, 2, 1, 3), 0)])
def test_mobilevit_patches_move_each_way_once_on_cpu(monkeypatch, grid, copies):
    """Composed into one transpose each (graph/passes/shuffles.py), the unfolding and the folding
    each copy the channels-last map once; with a 1x1 grid of patches they are views of it. As
    written, an Unpack was left before each reshape that could not view its input (five with
    the 4x2 grid: three unfolding, two folding). The output's Unpack comes on top; the values
    match onnxruntime's."""
    import onnxruntime as ort

    from tilefold.graph.passes import pipeline, shuffles
    from tilefold.layout.report import GraphLayout

    model = patches_between_convs(*grid)
    after = optimize(tilefold.load(model), "cpu", verify=True).after
    assert len(GraphLayout.of(after).ops) == copies + 1
    x = RNG.standard_normal((2, 3, grid[0] * grid[1], grid[2] * grid[3])).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(tilefold.compile(after, debug=True)({"x": x})["y"], want, rtol=1e-5, atol=1e-5)

    monkeypatch.setattr(shuffles, "compose_shuffles", pipeline.Pass("off", lambda g: pipeline.PassResult(g, False)))
    written = optimize(tilefold.load(model), "cpu").after
    assert len(GraphLayout.of(written).ops) > copies + 1
