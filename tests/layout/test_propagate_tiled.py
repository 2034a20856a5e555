"""Tiled encodings (the gpu target's NCHWc16 and 16x16 tiles) through sensitive ops, driven by
the iteration signatures: pooling (channels tiled, windows untiled), channel Concat and Split of
whole tiles, reductions over tiled dims where the padding is neutral, transposes and reshapes
that keep the tiled dims whole. Every optimized graph computes what the plain graph computes,
and every packed value's padding holds what its encoding says (run node by node)."""
import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.backends.numpy.packed import build_kernel
from tilefold.backends.numpy.registry import KERNELS, KernelSpec
from tilefold.graph import Graph, TensorType, Value
from tilefold.graph.types import as_array
from tilefold.layout import optimize
from tilefold.layout.encoding import PackedEncoding, pack, unpack
from tilefold.layout.propagate import propagate, reshape_encoding
from tilefold.layout.targets import GpuTarget, get_target

RNG = np.random.default_rng(11)
F32 = np.dtype("float32")


def runtime_layout_ops(graph: Graph) -> list[str]:
    """Pack/Unpack of values computed at run time, but for the Unpacks of graph outputs."""
    def to_output(n):
        return n.op == "Unpack" and all(graph.node(u).op == "Output" for u, _ in graph.users(Value(n.name)))

    return [f"{n.op} {n.name}" for n in graph.nodes()
            if n.op in ("Pack", "Unpack") and graph.node(graph.inputs_of(n.name)[0].node).op != "Constant"
            and not to_output(n)]


def run_checking_padding(graph: Graph, feeds: dict) -> tuple[dict, list[str]]:
    """Outputs of `graph` run node by node on the NumPy kernels, and the packed values whose
    padding does not hold the value their encoding records."""
    values, wrong = {}, []
    for node in graph.nodes():
        inputs = graph.inputs_of(node.name)
        if node.op == "Input":
            values[(node.name, 0)] = feeds[node.name]
        elif node.op == "Constant":
            values[(node.name, 0)] = as_array(node.attrs["value"])
        elif node.op == "Output":
            values[node.attrs["name"]] = values[tuple(inputs[0])]
        else:
            spec = KernelSpec(node, [graph.type_of(v) if v is not None else None for v in inputs],
                              [graph.constant_value(v) for v in inputs])
            result = build_kernel(KERNELS[node.op], spec)(*[values[tuple(v)] if v is not None else None for v in inputs])
            for k, (r, t) in enumerate(zip(result if isinstance(result, tuple) else (result,), node.outputs)):
                values[(node.name, k)] = r
                enc = t.encoding
                if enc is not None and enc.pad is not None and enc.is_padded(t.shape):
                    if not np.array_equal(pack(unpack(np.asarray(r), enc, t.shape), enc), r, equal_nan=True):
                        wrong.append(f"{node.op} {node.name} {enc}")
    return {name: values[name] for name in graph.output_names()}, wrong


def model(nodes, inputs, outputs, weights) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def conv_weights(f, c, k=3, integers=False):
    if integers:
        return RNG.integers(-2, 3, (f, c, k, k)).astype(np.float32)
    return (RNG.standard_normal((f, c, k, k)) * 0.3).astype(np.float32)


def check(model_proto, target="gpu", integers=False, shape=(2, 3, 8, 8), feeds=None):
    """The optimized graph's outputs equal the plain graph's (exactly on small integers), and
    its padding holds what its encodings record; returns the optimized graph."""
    g = tilefold.load(model_proto)
    after = optimize(g, target, verify=True).after
    if feeds is None:
        (name,) = g.inputs
        feeds = {name: (RNG.integers(-3, 4, shape) if integers else RNG.standard_normal(shape)).astype(np.float32)}
    want = tilefold.compile(g)(feeds)
    got = tilefold.compile(after, debug=True)(feeds)
    stepped, wrong = run_checking_padding(after, feeds)
    assert wrong == []
    for name in want:
        if integers:
            np.testing.assert_array_equal(got[name], want[name])
        else:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * np.abs(want[name]).max())
        np.testing.assert_array_equal(stepped[name], got[name])
    return after


def branches(c1=16, c2=48, integers=False):
    """conv -> maxpool -> two convs concatenated on channels -> avgpool -> split -> add -> conv."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w1"], ["b1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w2"], ["b2"]),
        helper.make_node("Concat", ["b1", "b2"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["q"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Split", ["q"], ["s1", "s2"], axis=1, num_outputs=2),
        helper.make_node("Add", ["s1", "s2"], ["s"]),
        helper.make_node("Conv", ["s", "w3"], ["y"]),
    ]
    half = (c1 + c2) // 2
    weights = {"w0": conv_weights(16, 3, integers=integers), "w1": conv_weights(c1, 16, integers=integers),
               "w2": conv_weights(c2, 16, 1, integers=integers), "w3": conv_weights(4, half, 1, integers=integers)}
    return model(nodes, [("x", [2, 3, 8, 8])], ["y"], weights)


def test_pooling_concat_and_split_of_whole_tiles_run_on_the_tiles():
    after = check(branches())
    assert runtime_layout_ops(after) == []
    for op in ("MaxPool", "Concat", "AveragePool", "Split", "Add"):
        node = next(n for n in after.nodes() if n.op == op)
        assert node.outputs[0].encoding.inner_tiles == (16,)


def test_tiled_layout_changes_alone_are_exact_on_small_integers():
    # the average pool divides by 9 or fewer taps: compare up to that rounding, exactly after it
    after = check(branches(integers=True), integers=False)
    assert runtime_layout_ops(after) == []


def test_lrn_reads_its_channel_window_across_tiles():
    """AlexNet's conv -> relu -> LRN -> maxpool -> conv on 32 channels: LRN's window over
    channels crosses the tile boundary, and its kernels index it logically, so the tiles pass."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("LRN", ["r"], ["n"], size=5, alpha=0.05, beta=0.75, bias=2.0),
        helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w1"], ["y"]),
    ]
    after = check(model(nodes, [("x", [2, 3, 8, 8])], ["y"], {"w0": conv_weights(32, 3), "w1": conv_weights(4, 32, 1)}))
    assert runtime_layout_ops(after) == []
    (lrn,) = [n for n in after.nodes() if n.op == "LRN"]
    assert lrn.outputs[0].encoding.inner_tiles == (16,)


def test_a_concat_of_pieces_that_are_not_whole_tiles_keeps_its_layout_ops():
    after = check(branches(c1=8, c2=24))  # split in two halves of 16  # 8 channels: the second piece starts inside a tile
    concat = next(n for n in after.nodes() if n.op == "Concat")
    assert concat.outputs[0].encoding is None
    assert runtime_layout_ops(after)


def reduction(op, channels, **attrs):
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["a"], ["y"], **attrs)]
    return model(nodes, [("x", [2, 3, 8, 8])], ["y"], {"w0": conv_weights(channels, 3)})


@pytest.mark.parametrize("op, channels, through", [
    ("ReduceSum", 20, True),   # zero padding adds nothing
    ("ReduceMean", 20, True),  # ... and the mean divides by the true count
    ("ReduceMax", 20, False),  # zero padding could be the maximum
    ("ReduceMax", 32, True),   # no padding
])
def test_a_reduction_over_a_tiled_dim_goes_through_only_when_padding_is_neutral(op, channels, through):
    after = check(reduction(op, channels, keepdims=0))  # axes omitted: over every dim
    node = next(n for n in after.nodes() if n.op == op)
    x = after.type_of(after.inputs_of(node.name)[0])
    assert (x.encoding is not None) == through


@pytest.mark.parametrize("channels, through", [(20, False), (32, True)])
def test_softmax_over_a_tiled_dim_needs_whole_tiles(channels, through):
    after = check(reduction("Softmax", channels, axis=1))
    node = next(n for n in after.nodes() if n.op == "Softmax")
    assert (after.type_of(after.inputs_of(node.name)[0]).encoding is not None) == through


@pytest.mark.parametrize("op", ["Sigmoid", "Relu"])
def test_padding_read_by_a_conv_holds_zeros(op):
    # 20 channels in tiles of 16: the second conv reads the padding channels as its k, so an
    # op whose f(0) != 0 must not write into that buffer's padding (sigmoid(0) = 0.5)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["a"], ["s"]),
             helper.make_node("Conv", ["s", "w1"], ["y"])]
    after = check(model(nodes, [("x", [2, 3, 8, 8])], ["y"], {"w0": conv_weights(20, 3), "w1": conv_weights(8, 20, 1)}))
    node = next(n for n in after.nodes() if n.op == op)
    if op == "Relu":
        assert node.outputs[0].encoding.pad == 0.0 and runtime_layout_ops(after) == []
    else:
        assert node.outputs[0].encoding is None or node.outputs[0].encoding.pad is None


def attention(seq=32, hidden=64, heads=4):
    """BERT's self-attention shape play: (1, seq, hidden) -> heads -> softmax(QK^T) V -> merge."""
    d = hidden // heads
    nodes = [
        helper.make_node("MatMul", ["x0", "wi"], ["x"]),
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Reshape", ["q", "split"], ["q4"]),
        helper.make_node("Reshape", ["k", "split"], ["k4"]),
        helper.make_node("Reshape", ["v", "split"], ["v4"]),
        helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kh"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qh", "kh"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vh"], ["o"]),
        helper.make_node("Transpose", ["o"], ["om"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["om", "merge"], ["m"]),
        helper.make_node("MatMul", ["m", "wo"], ["h"]),
        helper.make_node("Add", ["h", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1),
    ]
    w = {n: (RNG.standard_normal((hidden, hidden)) / 8).astype(np.float32) for n in ("wi", "wq", "wk", "wv", "wo")}
    w.update(gamma=RNG.uniform(0.5, 1.5, hidden).astype(np.float32), beta=RNG.standard_normal(hidden).astype(np.float32))
    m = model(nodes, [("x0", [1, seq, hidden])], ["y"], w)
    m.graph.initializer.extend([numpy_helper.from_array(np.array([1, seq, heads, d], np.int64), "split"),
                                numpy_helper.from_array(np.array([1, seq, hidden], np.int64), "merge")])
    return m


def test_attention_heads_split_and_merge_on_tiles():
    after = check(attention(), shape=(1, 32, 64))
    for op in ("Reshape", "Softmax", "LayerNormalization", "Add"):
        assert all(n.outputs[0].encoding is not None and n.outputs[0].encoding.inner_tiles
                   for n in after.nodes() if n.op == op), op
    before = optimize(tilefold.load(attention()), "gpu").before
    assert len(runtime_layout_ops(after)) < len(runtime_layout_ops(before)) // 2


def gqa_attention(seq=32, hidden=64, heads=4, kv_heads=2):
    """Grouped-query attention as Llama exports it: key and value heads repeated to the query
    heads by Unsqueeze -> Expand -> Reshape (transformers' repeat_kv)."""
    d, rep = hidden // heads, heads // kv_heads
    node = helper.make_node
    nodes = [node("MatMul", ["x", "wq"], ["q"]), node("Reshape", ["q", "split_q"], ["q4"]),
             node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3])]
    for name in ("k", "v"):
        nodes += [node("MatMul", ["x", f"w{name}"], [name]), node("Reshape", [name, "split_kv"], [f"{name}4"]),
                  node("Transpose", [f"{name}4"], [f"{name}h"], perm=[0, 2, 1, 3]),
                  node("Unsqueeze", [f"{name}h", "axis2"], [f"{name}u"]),
                  node("Expand", [f"{name}u", "repeat"], [f"{name}e"]),
                  node("Reshape", [f"{name}e", "heads"], [f"{name}r"])]
    nodes += [node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]), node("MatMul", ["qh", "kt"], ["s"]),
              node("Softmax", ["s"], ["p"], axis=-1), node("MatMul", ["p", "vr"], ["o"]),
              node("Transpose", ["o"], ["om"], perm=[0, 2, 1, 3]), node("Reshape", ["om", "merge"], ["m"]),
              node("MatMul", ["m", "wo"], ["y"])]
    w = {"wq": (hidden, hidden), "wk": (hidden, kv_heads * d), "wv": (hidden, kv_heads * d), "wo": (hidden, hidden)}
    weights = {n: (RNG.standard_normal(shape) / 8).astype(np.float32) for n, shape in w.items()}
    ints = {"split_q": [1, seq, heads, d], "split_kv": [1, seq, kv_heads, d], "axis2": [2],
            "repeat": [1, kv_heads, rep, seq, d], "heads": [1, heads, seq, d], "merge": [1, seq, hidden]}
    m = model(nodes, [("x", [1, seq, hidden])], ["y"], weights)
    m.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ints.items())
    return m


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("seq", [16, 32])
def test_grouped_query_attention_repeats_its_key_value_heads_on_their_layout(target, seq):
    """The repeated dim is placed beside the heads it repeats, so the Reshape merging them
    relabels the buffer that Expand writes, and no runtime layout op is left. With 16 tokens
    of 16 per head, a 16x16 tile is the whole matrix: a Pack into it moves nothing and goes."""
    after = check(gqa_attention(seq=seq), target=target, shape=(1, seq, 64))
    assert runtime_layout_ops(after) == []
    if target == "cpu":  # the heads stay inside the sequence rows the projections write
        assert all(n.outputs[0].encoding is not None for n in after.nodes() if n.op == "Expand")


def test_a_2d_matmul_viewed_back_as_tokens_writes_them_plain_for_a_residual_add():
    """PyTorch's Linear on (1, 16, 64) traces as view (16, 64) -> mm -> view (1, 16, 64): the
    residual Add reads the plain stream, so the mm writes its result plain through the view
    instead of the tiles an Unpack after the view would undo."""
    node = helper.make_node
    nodes = [node("Relu", ["x"], ["r"]), node("Reshape", ["r", "rows"], ["r2"]), node("MatMul", ["r2", "w"], ["m"]),
             node("Reshape", ["m", "tokens"], ["m3"]), node("Add", ["m3", "x"], ["y"])]
    weights = {"w": (RNG.standard_normal((64, 64)) / 8).astype(np.float32)}
    m = model(nodes, [("x", [1, 16, 64])], ["y"], weights)
    m.graph.initializer.extend([numpy_helper.from_array(np.array([16, 64], np.int64), "rows"),
                                numpy_helper.from_array(np.array([1, 16, 64], np.int64), "tokens")])
    after = check(m, target="gpu", shape=(1, 16, 64))
    assert not [n for n in after.nodes() if n.op == "Unpack"]
    assert all(n.outputs[0].encoding is None for n in after.nodes() if n.op in ("MatMul", "Reshape"))


@st.composite
def reshape_case(draw):
    rank = draw(st.integers(1, 4))
    src = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=rank, max_size=rank)))
    perm = tuple(draw(st.permutations(range(rank))))
    tiled = [d for d in range(rank) if src[d] % 2 == 0 and draw(st.booleans())]
    tiled = list(draw(st.permutations(tiled))) if tiled else []
    tiles = [draw(st.sampled_from([t for t in (2, 4) if src[d] % t == 0])) for d in tiled]
    dims = list(src)
    for _ in range(draw(st.integers(0, 2))):
        k = draw(st.integers(0, len(dims) - 1))
        if draw(st.booleans()) and k + 1 < len(dims):
            dims[k:k + 2] = [dims[k] * dims[k + 1]]
        elif dims[k] % 2 == 0:
            dims[k:k + 1] = [2, dims[k] // 2]
    return src, tuple(dims), PackedEncoding(tuple(tiled), tuple(tiles), perm)


@given(reshape_case())
@settings(max_examples=400, deadline=None)
def test_a_reshape_of_a_tiled_buffer_is_a_view_when_reshape_encoding_says_so(case):
    src, dst, enc = case
    x = np.arange(int(np.prod(src)), dtype=np.float32).reshape(src)
    new = reshape_encoding(src, dst, enc)
    if new is not None:
        np.testing.assert_array_equal(pack(x.reshape(dst), new).ravel(), pack(x, enc).ravel())


def test_bert_head_split_keeps_the_hidden_tiles_on_the_head_dim():
    enc = PackedEncoding((1, 2), (16, 16))
    assert reshape_encoding((1, 128, 768), (1, 128, 12, 64), enc) == PackedEncoding((1, 3), (16, 16))
    assert reshape_encoding((1, 128, 12, 64), (1, 128, 768), PackedEncoding((1, 3), (16, 16))) == enc
    assert reshape_encoding((1, 100, 768), (1, 100, 12, 64), enc) is None  # 100 rows: padding


def test_an_unpack_with_zero_padding_feeds_an_add_with_unknown_padding():
    # the Add's operands differ in what their padding holds: the result's padding is unknown
    g = Graph()
    zero, unknown = PackedEncoding((1,), (4,)), PackedEncoding((1,), (4,), pad=None)
    x = g.add_input("x", TensorType((3, 6), F32))
    p1 = g.add_node("Pack", [x], [TensorType((3, 6), F32, zero)], {"encoding": zero})
    s = g.add_node("Sigmoid", [Value(p1.name)], [TensorType((3, 6), F32, unknown)])
    r = g.add_node("Relu", [Value(p1.name)], [TensorType((3, 6), F32, zero)])
    u1 = g.add_node("Unpack", [Value(r.name)], [TensorType((3, 6), F32)])
    u2 = g.add_node("Unpack", [Value(s.name)], [TensorType((3, 6), F32)])
    a = g.add_node("Add", [Value(u1.name), Value(u2.name)], [TensorType((3, 6), F32)])
    g.add_output(Value(a.name), "y")
    out = propagate(g, get_target("gpu"), verify=True)
    (add,) = [n for n in out.nodes() if n.op == "Add"]
    assert add.outputs[0].encoding == unknown
    feeds = {"x": RNG.standard_normal((3, 6)).astype(np.float32)}
    got, wrong = run_checking_padding(out, feeds)
    assert wrong == []
    np.testing.assert_allclose(got["y"], np.maximum(feeds["x"], 0) + 1 / (1 + np.exp(-feeds["x"])), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name, most", [("bvlc_alexnet", 0), ("densenet121", 1), ("inception_v1", 0),
                                        ("inception_v2", 0), ("resnet50", 0), ("squeezenet", 1), ("vgg19", 1)])
def test_light_convnets_on_the_gpu_target_compute_the_same(name, most):
    from tilefold.bench.models import light_model

    g = tilefold.load(light_model(name, random_weights=True, seed=3))
    after = optimize(g, "gpu", verify=True).after
    assert len(runtime_layout_ops(after)) <= most
    feeds = {n: np.random.default_rng(4).standard_normal(t.shape).astype(t.dtype) for n, t in g.input_types().items()}
    want = tilefold.compile(g)(feeds)
    got, wrong = run_checking_padding(after, feeds)
    assert wrong == []
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4 * np.abs(want[k]).max())


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("head", ["Gemm", "GemmT", "MatMul"])
def test_a_flattened_packed_activation_is_read_in_buffer_order_by_permuted_weight_rows(target, head):
    # conv (16 channels, 3x3) -> relu -> flatten -> classifier: the classifier's weight rows
    # are permuted at compile time instead of unpacking the activation at run time
    k = 16 * 3 * 3
    w = RNG.integers(-2, 3, (k, 5)).astype(np.float32)
    classifier = {"Gemm": helper.make_node("Gemm", ["f", "wc"], ["y"]),
                  "GemmT": helper.make_node("Gemm", ["f", "wc"], ["y"], transB=1),
                  "MatMul": helper.make_node("MatMul", ["f", "wc"], ["y"])}[head]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             classifier]
    weights = {"w0": conv_weights(16, 3, integers=True), "wc": w.T.copy() if head == "GemmT" else w}
    after = check(model(nodes, [("x", [2, 3, 3, 3])], ["y"], weights), target, integers=True, shape=(2, 3, 3, 3))
    assert runtime_layout_ops(after) == []


def encoder(layers=2, seq=32, hidden=64, heads=4):
    """BERT-like layers: LayerNorm'd input, attention with a runtime additive mask broadcast
    over heads, residual adds and LayerNorms; every LayerNorm feeds a MatMul and a residual."""
    d = hidden // heads
    nodes = [helper.make_node("LayerNormalization", ["x0", "gamma", "beta"], ["h0"], axis=-1)]
    w = {"gamma": RNG.uniform(0.5, 1.5, hidden).astype(np.float32), "beta": RNG.standard_normal(hidden).astype(np.float32)}
    for i in range(layers):
        h, n = f"h{i}", f"l{i}_"
        for name in ("q", "k", "v", "o"):
            w[n + "w" + name] = (RNG.standard_normal((hidden, hidden)) / 8).astype(np.float32)
        nodes += [
            *[helper.make_node("MatMul", [h, n + "w" + name], [n + name]) for name in ("q", "k", "v")],
            *[helper.make_node("Reshape", [n + name, "split"], [n + name + "4"]) for name in ("q", "k", "v")],
            helper.make_node("Transpose", [n + "q4"], [n + "qh"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", [n + "k4"], [n + "kh"], perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", [n + "v4"], [n + "vh"], perm=[0, 2, 1, 3]),
            helper.make_node("MatMul", [n + "qh", n + "kh"], [n + "s"]),
            helper.make_node("Add", [n + "s", "mask"], [n + "sm"]),
            helper.make_node("Softmax", [n + "sm"], [n + "p"], axis=-1),
            helper.make_node("MatMul", [n + "p", n + "vh"], [n + "a"]),
            helper.make_node("Transpose", [n + "a"], [n + "am"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [n + "am", "merge"], [n + "m"]),
            helper.make_node("MatMul", [n + "m", n + "wo"], [n + "out"]),
            helper.make_node("Add", [n + "out", h], [n + "r"]),
            helper.make_node("LayerNormalization", [n + "r", "gamma", "beta"], [f"h{i + 1}"], axis=-1),
        ]
    nodes.append(helper.make_node("Identity", [f"h{layers}"], ["y"]))
    m = model(nodes, [("x0", [1, seq, hidden]), ("mask", [1, 1, seq, seq])], ["y"], w)
    m.graph.initializer.extend([numpy_helper.from_array(np.array([1, seq, heads, d], np.int64), "split"),
                                numpy_helper.from_array(np.array([1, seq, hidden], np.int64), "merge")])
    return m


def test_a_small_broadcast_mask_is_packed_once_and_the_residual_stream_stays_plain():
    """Every layer's scores run on tiles, with the mask packed once for both layers; the
    residual stream (LayerNorms, residual Adds) stays plain: each MatMul reads it plain and
    the output projection writes it plain. Sharing the first LayerNorm's Pack (which the
    MatMuls absorb) with the residual Add would run the stream on tiles from there to an
    Unpack at the output: 3 layout ops, 20 KB, against this 1 op, 4 KB."""
    seq = 32
    mask = np.where(RNG.random((1, 1, seq, seq)) < 0.2, -1e4, 0).astype(np.float32)
    feeds = {"x0": RNG.standard_normal((1, seq, 64)).astype(np.float32), "mask": mask}
    after = check(encoder(seq=seq), feeds=feeds)
    from tilefold.layout.report import GraphLayout

    assert len(GraphLayout.of(after).ops) == 1  # no Unpack at the output either
    (left,) = runtime_layout_ops(after)
    assert left.startswith("Pack") and after.node(after.inputs_of(left.split()[1])[0].node).op == "Input"
    assert all(n.outputs[0].encoding is not None for n in after.nodes() if n.op == "Softmax")
    residual = [n for n in after.nodes() if n.op in ("LayerNormalization", "Add") and n.outputs[0].shape == (1, seq, 64)]
    assert len(residual) == 5 and all(n.outputs[0].encoding is None for n in residual)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("moves_up", [True, False])
def test_a_product_of_broadcast_operands_writes_its_readers_layout(monkeypatch, target, moves_up):
    """FocalNet's modulation: a residual Add of a conv's packed result and the product of a
    (N, C, 1, 1) gate and an (N, 1, H, W) map, read by the next conv. The product takes the
    conv's layout at no cost (both operands are relabelings in it: channels-last, or 16-channel
    tiles of 16 channels), so the conv's Unpack goes; without that look-ahead, packing the
    product would cost the bytes the Unpack moves."""
    from tilefold.layout import propagate

    if not moves_up:
        monkeypatch.setattr(propagate, "_pack_moves_up", lambda *args: False)
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["gate_in"], ["gate"]),
        helper.make_node("Tanh", ["map_in"], ["map"]),
        helper.make_node("Mul", ["gate", "map"], ["product"]),
        helper.make_node("Add", ["a", "product"], ["s"]),
        helper.make_node("Conv", ["s", "w1"], ["y"]),
    ]
    weights = {"w0": conv_weights(16, 3), "w1": conv_weights(4, 16, 1)}
    proto = model(nodes, [("x", [2, 3, 6, 5]), ("gate_in", [2, 16, 1, 1]), ("map_in", [2, 1, 6, 5])], ["y"], weights)
    feeds = {"x": RNG.standard_normal((2, 3, 6, 5)).astype(np.float32),
             "gate_in": RNG.standard_normal((2, 16, 1, 1)).astype(np.float32),
             "map_in": RNG.standard_normal((2, 1, 6, 5)).astype(np.float32)}
    after = check(proto, target=target, feeds=feeds)
    assert len(runtime_layout_ops(after)) == (0 if moves_up else 1)


def test_when_greedy_propagation_overshoots_a_second_try_keeps_unpacks_out_of_growing_ops():
    """Mamba's scan, shrunk: a causal conv's channels-last result feeds a projection (through a
    relabeling Transpose) and a broadcast into (N, C, L, S) that a Gather along L then reads.
    Pushed greedily, the Unpack lands after the broadcast (1920 bytes, more than the wrapped
    anchor's 1152), which used to undo propagation altogether; kept before the broadcast, one
    small Unpack is left (384 bytes) and the Transpose is a relabeling."""
    from tilefold.layout.propagate import propagate
    from tilefold.layout.report import GraphLayout
    from tilefold.layout.targets import get_target

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], group=8, pads=[3, 0]),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t", "w1"], ["y1"]),
        helper.make_node("Unsqueeze", ["a", "axis"], ["u"]),
        helper.make_node("Mul", ["u", "decay"], ["p"]),
        helper.make_node("Exp", ["p"], ["e"]),
        helper.make_node("Gather", ["e", "steps"], ["y2"], axis=2),
    ]
    weights = {"w0": RNG.standard_normal((8, 1, 4)).astype(np.float32),
               "w1": RNG.standard_normal((8, 4)).astype(np.float32), "axis": np.array([3], np.int64),
               "decay": -np.abs(RNG.standard_normal((1, 8, 1, 5))).astype(np.float32),
               "steps": RNG.integers(0, 12, (2, 3)).astype(np.int64)}
    proto = model(nodes, [("x", [1, 8, 12])], ["y1", "y2"], weights)
    after = check(proto, target="cpu", shape=(1, 8, 12))
    result = optimize(tilefold.load(proto), "cpu")
    greedy = propagate(result.before.copy(), get_target("cpu"))
    assert GraphLayout.of(greedy).bytes() > GraphLayout.of(result.before).bytes()
    assert [op.node for op in GraphLayout.of(after).ops] == ["unpack_unsqueeze"]
    assert GraphLayout.of(after).bytes() < GraphLayout.of(result.before).bytes()


@pytest.mark.parametrize("op, pad, through", [("ReduceMax", -np.inf, True), ("ReduceSum", -np.inf, False),
                                              ("ReduceSum", 0.0, True), ("ReduceMax", None, False)])
def test_a_reduction_reads_padding_only_when_it_holds_the_reductions_identity(op, pad, through):
    g = Graph()
    enc = PackedEncoding((1,), (4,), pad=pad)
    x = g.add_input("x", TensorType((3, 6), F32))
    p = g.add_node("Pack", [x], [TensorType((3, 6), F32, enc)], {"encoding": enc})
    kept = g.add_node("Identity", [Value(p.name)], [TensorType((3, 6), F32, enc)])  # so that no Unpack(Pack) cancels
    u = g.add_node("Unpack", [Value(kept.name)], [TensorType((3, 6), F32)])
    axes = g.add_constant(np.array([1], np.int64))
    r = g.add_node(op, [Value(u.name), axes], [TensorType((3,), F32)], {"keepdims": 0})
    g.add_output(Value(r.name), "y")
    out = propagate(g, get_target("gpu"), verify=True)
    (node,) = [n for n in out.nodes() if n.op == op]
    assert (out.type_of(out.inputs_of(node.name)[0]).encoding is not None) == through
    feeds = {"x": RNG.standard_normal((3, 6)).astype(np.float32)}
    got, wrong = run_checking_padding(out, feeds)
    want = feeds["x"].max(axis=1) if op == "ReduceMax" else feeds["x"].sum(axis=1)
    np.testing.assert_allclose(got["y"], want, rtol=1e-6)
    assert wrong == []


def test_merging_the_heads_moves_no_data_when_the_context_matmul_writes_the_merged_tiles():
    """Heads of 64 (four 16-wide tiles each): attention's P.V writes its (1, heads, seq, d)
    result with each head's tiles inside the sequence blocks (outer dims 0, 2, 1, 3), so the
    head merge Transpose -> Reshape is a relabeling that the output projection reads as its
    own tiles, instead of an Unpack per layer."""
    seq, hidden, heads = 32, 128, 2
    feeds = {"x0": RNG.standard_normal((1, seq, hidden)).astype(np.float32),
             "mask": np.where(RNG.random((1, 1, seq, seq)) < 0.2, -1e4, 0).astype(np.float32)}
    after = check(encoder(layers=2, seq=seq, hidden=hidden, heads=heads), feeds=feeds)
    context = [n for n in after.nodes() if n.op == "MatMul" and n.outputs[0].shape == (1, heads, seq, 64)]
    assert len(context) == 2 and all(n.outputs[0].encoding.outer_perm(4) == (0, 2, 1, 3) for n in context)
    merges = [n for n in after.nodes() if n.op == "Reshape" and n.outputs[0].rank == 3]
    assert len(merges) == 2 and all(n.outputs[0].encoding == PackedEncoding((1, 2), (16, 16), pad=0.0)
                                    for n in merges)
    left = runtime_layout_ops(after)
    assert not any(n.startswith("Unpack") for n in left), left  # the mask's and the input's Packs are left


class BlocksInOrderOnly(GpuTarget):
    """The gpu target without its strided block reads and writes: matmul operands only in
    the tiles it asked for."""

    name = "gpu-in-order-test"

    def reads(self, node, slot, t):
        return False

    def writes(self, node, t):
        return False


def test_an_anchor_reads_the_buffer_behind_a_pack_of_an_unpack_when_its_target_says_so():
    g = tilefold.load(encoder(layers=1))
    feeds = {"x0": RNG.standard_normal((1, 32, 64)).astype(np.float32),
             "mask": np.where(RNG.random((1, 1, 32, 32)) < 0.2, -1e4, 0).astype(np.float32)}
    plain = optimize(g, BlocksInOrderOnly(), verify=True).after
    strided = optimize(g, "gpu", verify=True).after
    assert len(runtime_layout_ops(strided)) < len(runtime_layout_ops(plain))
    scores = [n for n in strided.nodes() if n.op == "MatMul"][3]  # q . k^T
    assert all(strided.node(v.node).op not in ("Pack", "Unpack") for v in strided.inputs_of(scores.name))
    want = tilefold.compile(g)(feeds)["y"]
    got, wrong = run_checking_padding(strided, feeds)
    assert wrong == []
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)


def test_propagation_never_moves_more_bytes_than_the_wrapped_anchors():
    # a transpose read by two outputs: relabeled, its unpack pushed through the LeakyRelu and
    # kept for the other output, two unpacks would move twice the transpose's bytes; the
    # result falls back to the wrapped graph (found by tests/test_random_models.py)
    from tilefold.layout.report import GraphLayout

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LeakyRelu", ["t"], ["y"], alpha=0.2)]
    result = optimize(tilefold.load(model(nodes, [("x", [1, 3, 8, 5])], ["y", "t"], {})), "gpu", verify=True)
    assert GraphLayout.of(result.after).bytes() <= GraphLayout.of(result.before).bytes() == 480
    x = RNG.standard_normal((1, 3, 8, 5)).astype(np.float32)
    got = tilefold.compile(result.after)({"x": x})
    np.testing.assert_array_equal(got["t"], x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(got["y"], np.where(got["t"] > 0, got["t"], 0.2 * got["t"]), rtol=1e-6)


def normal(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def convnext_layer(x: str, out: str, channels: int, size: int, p: str = "", batch: int = 1) -> tuple[list, dict]:
    """ConvNeXt's block, shrunk, reading the map `x`: a depthwise conv, permuted channels-last,
    normalized over the channels, through two Linear layers (Gemms on the (pixels, channels)
    view, as torch traces them) and the layer scale, permuted back and added to `x` as `out`."""
    node = helper.make_node
    nodes = [
        node("Conv", [x, p + "wd"], [p + "d"], pads=[1, 1, 1, 1], group=channels),
        node("Transpose", [p + "d"], [p + "t"], perm=[0, 2, 3, 1]),
        node("LayerNormalization", [p + "t", p + "g", p + "beta"], [p + "n"], axis=-1),
        node("Reshape", [p + "n", p + "rows"], [p + "r"]),
        node("Gemm", [p + "r", p + "w1", p + "b1"], [p + "h"]),
        node("Relu", [p + "h"], [p + "hr"]),
        node("Gemm", [p + "hr", p + "w2", p + "b2"], [p + "o"]),
        node("Mul", [p + "o", p + "scale"], [p + "os"]),
        node("Reshape", [p + "os", p + "image"], [p + "o4"]),
        node("Transpose", [p + "o4"], [p + "ot"], perm=[0, 3, 1, 2]),
        node("Add", [x, p + "ot"], [out]),
    ]
    c, hidden = channels, 2 * channels
    weights = {"wd": conv_weights(c, 1), "g": normal(c), "beta": normal(c), "w1": normal(c, hidden, scale=0.3),
               "b1": normal(hidden), "w2": normal(hidden, c, scale=0.3), "b2": normal(c), "scale": normal(c),
               "rows": np.array([batch * size * size, c], np.int64),
               "image": np.array([batch, size, size, c], np.int64)}
    return nodes, {p + k: v for k, v in weights.items()}


def convnext_block() -> onnx.ModelProto:
    """A conv, ConvNeXt's block (`convnext_layer`) on its 32-channel map, then a conv."""
    nodes, weights = convnext_layer("a", "s", 32, 16)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]), *nodes,
             helper.make_node("Conv", ["s", "w3"], ["y"], pads=[1, 1, 1, 1])]
    weights |= {"w0": conv_weights(32, 3), "w3": conv_weights(16, 32)}
    return model(nodes, [("x", [1, 3, 16, 16])], ["y"], weights)


def convnext_stages(channels=(32, 48, 64), size=32, batch=1) -> onnx.ModelProto:
    """ConvNeXt's stages: a stem conv, then per stage one block (`convnext_layer`), each
    stage but the first downsampled first: the map permuted channels-last, normalized over
    the channels, permuted back, and a 2x2 stride-2 conv."""
    node = helper.make_node
    nodes = [node("Conv", ["x", "stem"], ["s0"], pads=[1, 1, 1, 1])]
    weights = {"stem": conv_weights(channels[0], 3)}
    image = [batch, 3, size, size]
    for i, c in enumerate(channels):
        p, x = f"s{i}_", f"s{i}"
        if i:
            nodes += [node("Transpose", [f"y{i - 1}"], [p + "cl"], perm=[0, 2, 3, 1]),
                      node("LayerNormalization", [p + "cl", p + "dg", p + "db"], [p + "dn"], axis=-1),
                      node("Transpose", [p + "dn"], [p + "cf"], perm=[0, 3, 1, 2]),
                      node("Conv", [p + "cf", p + "down"], [x], strides=[2, 2])]
            weights |= {p + "dg": normal(channels[i - 1]), p + "db": normal(channels[i - 1]),
                        p + "down": conv_weights(c, channels[i - 1], 2)}
            size //= 2
        block, block_weights = convnext_layer(x, f"y{i}", c, size, p, batch)
        nodes += block
        weights |= block_weights
    return model(nodes, [("x", image)], [f"y{len(channels) - 1}"], weights)


def test_linear_layers_read_a_channel_tiled_map_as_their_tiles():
    """The block's Linear layers, written as torch traces them (the map's leading dims merged
    into rows for a Gemm), run as MatMuls on the map itself after `load` (graph/'s
    sink_batch_merges). The LayerNorm's NCHWc16 buffer, read as the channels-last map, is
    (N, C/16, H, W, 16): tiles of 16 channels, which the Triton kernel reads by strides as its
    k blocks, so no Unpack is left in front of either layer."""
    after = check(convnext_block(), shape=(1, 3, 16, 16))
    linears = [n for n in after.nodes() if n.op == "MatMul"]
    assert len(linears) == 2 and not any(n.op == "Gemm" for n in after.nodes())
    for linear in linears:
        assert after.node(after.inputs_of(linear.name)[0].node).op != "Unpack"
    first = after.type_of(after.inputs_of(linears[0].name)[0])
    assert first.shape == (1, 16, 16, 32)
    assert first.encoding.inner_tiles == (16,) and first.encoding.outer_perm(4) == (0, 3, 1, 2)


@pytest.mark.parametrize("through_elementwise", [True, False])
def test_a_residual_add_makes_the_linear_layer_write_the_channel_tiles_it_adds(monkeypatch, through_elementwise):
    """The block's residual Add reads the map in NCHWc16 and the second Linear layer's result
    through its bias, the layer scale (Adds and Muls of constants) and the permute back to
    NCHW. That layer writes its channels-last result as (N, C/16, H, W, 16), the bias and
    scale packed to match at compile time, so the Add runs on both tiled buffers and nothing
    but the output is unpacked. Rewriting the writer only through views, the Add's operands
    stay unpacked."""
    from tilefold.layout import propagate as rules
    from tilefold.layout.report import GraphLayout

    if not through_elementwise:
        monkeypatch.setattr(rules, "_elementwise_back", lambda *args: (None, 0))
    after = check(convnext_block(), shape=(1, 3, 16, 16))
    left = [op.node for op in GraphLayout.of(after).ops]
    (add,) = [n for n in after.nodes() if n.op == "Add" and n.outputs[0].shape == (1, 32, 16, 16)]
    if through_elementwise:
        assert runtime_layout_ops(after) == [] and len(left) == 1  # the output's Unpack
        assert add.outputs[0].encoding == PackedEncoding((1,), (16,))
        (last,) = [n for n in after.nodes() if n.op == "MatMul" and n.outputs[0].shape == (1, 16, 16, 32)]
        enc = last.outputs[0].encoding
        assert enc.outer_perm(4) == (0, 3, 1, 2) and enc.inner_tiles == (16,)
    else:
        assert len(left) > 1 and add.outputs[0].encoding is None


@pytest.mark.parametrize("batch", [1, 2])
def test_convnext_stages_run_on_tiles_from_the_stem_to_the_output(batch):
    """Each stage's residual Add runs on channel tiles, and the downsampling LayerNorm reads
    them through its permute, which relabels the tiled buffer; the Add's Linear layer
    writes its tiles through the Unpack its own result still had (`rewrite_writer` steps
    through it). At batch 2 too: the Linear layers run on the map, not on its (N*H*W, C)
    rows, which no tiling of a matrix could read from (N, C/16, H, W, 16)."""
    after = check(convnext_stages(batch=batch), shape=(batch, 3, 32, 32))
    assert runtime_layout_ops(after) == []
    adds = [n for n in after.nodes() if n.op == "Add"
            and not any(after.node(v.node).op == "Constant" for v in after.inputs_of(n.name))]  # not biases
    assert len(adds) == 3 and all(n.outputs[0].encoding == PackedEncoding((1,), (16,)) for n in adds)


def test_a_residual_of_a_linear_layers_own_input_stays_unpacked():
    """A residual Add of a Linear layer's result and that layer's input (BERT's block): the
    Pack in front of the layer is absorbed in the end (the kernel reads the plain operand),
    so it is not a Pack already paid for that the Add could share. The layer writes its
    result plain instead, and nothing is copied; sharing it, the residual stream would run
    on tiles from that Pack to an Unpack at the output."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w"], ["h"]),
             helper.make_node("Add", ["h", "n"], ["y"])]
    weights = {"g": normal(64), "b": normal(64), "w": normal(64, 64, scale=0.2)}
    after = check(model(nodes, [("x", [1, 32, 64])], ["y"], weights), shape=(1, 32, 64))
    assert runtime_layout_ops(after) == []
    assert all(n.outputs[0].encoding is None for n in after.nodes() if n.op in ("MatMul", "Add"))


@pytest.mark.parametrize("enc, readable", [
    (PackedEncoding((0, 1), (16, 16)), True),
    (PackedEncoding((0, 1), (16, 16), (1, 0)), True),
    (PackedEncoding((1,), (16,), (1, 0)), True),  # a channel-tiled map viewed as (pixels, channels)
    (PackedEncoding((1,), (8,)), False),
    (PackedEncoding((0,), (16,), (1, 0)), True),  # tiles of 16 rows, read like a transposed operand
])
def test_the_gpu_matmul_kernels_read_16_wide_tiles_of_either_matrix_dim(enc, readable):
    target = get_target("gpu")
    gemm = Graph().add_node("Gemm", [], [TensorType((64, 16), F32)])
    assert target.reads(gemm, 0, TensorType((64, 32), F32, enc)) == readable
    padded = TensorType((60, 32), F32, PackedEncoding((0, 1), (16, 16)))
    assert not target.reads(gemm, 0, padded)


@pytest.mark.parametrize("channels, copies", [(16, 0), (32, 2)])
def test_channels_last_is_the_channel_tiles_of_a_map_sixteen_channels_deep(channels, copies):
    """A residual Add of a channels-last map (a permuted NHWC input) and a conv's NCHWc16
    result: for 16 channels both store the same bytes, so the Add reads both buffers as they
    are (GLPN's fusion of a transformer stage and an upsampled map); for 32 they differ and
    the Add runs on plain copies of both."""
    node = helper.make_node
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
             node("Relu", ["t"], ["r"]),
             node("Conv", ["image", "w0"], ["a"], pads=[1, 1, 1, 1]),
             node("Add", ["r", "a"], ["s"]),
             node("Conv", ["s", "w1"], ["y"], pads=[1, 1, 1, 1])]
    feeds = {"x": RNG.standard_normal((1, 4, 4, channels)).astype(np.float32),
             "image": RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)}
    proto = model(nodes, [("x", [1, 4, 4, channels]), ("image", [1, 3, 4, 4])], ["y"],
                  {"w0": conv_weights(channels, 3), "w1": conv_weights(16, channels)})
    after = check(proto, feeds=feeds)
    assert len(runtime_layout_ops(after)) == copies


@pytest.mark.parametrize("channels", [16, 32])
def test_focalnet_modulation_runs_on_channel_tiles(channels):
    """FocalNet's modulation: a Linear layer's (pixels, 2C + 3) result, viewed as an NHWC map
    and permuted to NCHW, is split into a query, a context and 3 gates; the context goes
    through a conv, whose result the query multiplies. split_projections (graph/) makes it
    one Linear layer per piece, so each writes the NCHWc16 its reader takes: no copy (three
    per block before, the 3 gates not being whole channel tiles)."""
    node = helper.make_node
    c, side = channels, 8
    nodes = [node("Reshape", ["x", "rows"], ["r"]),
             node("Gemm", ["r", "w", "b"], ["h"]),
             node("Reshape", ["h", "image"], ["hi"]),
             node("Transpose", ["hi"], ["t"], perm=[0, 3, 1, 2]),
             node("Split", ["t", "sizes"], ["q", "ctx", "gates"], axis=1),
             node("Conv", ["ctx", "wc"], ["cc"], pads=[1, 1, 1, 1]),
             node("Mul", ["q", "cc"], ["m"]),
             node("Conv", ["m", "wo"], ["y"], pads=[1, 1, 1, 1])]
    weights = {"rows": np.array([side * side, 16], np.int64), "w": normal(16, 2 * c + 3, scale=0.3),
               "b": normal(2 * c + 3), "image": np.array([1, side, side, 2 * c + 3], np.int64),
               "sizes": np.array([c, c, 3], np.int64), "wc": conv_weights(c, c), "wo": conv_weights(16, c)}
    shape = (1, side, side, 16)
    after = check(model(nodes, [("x", list(shape))], ["y", "gates"], weights), shape=shape)
    assert runtime_layout_ops(after) == []
    assert sum(n.op == "MatMul" for n in after.nodes()) == 3  # the Linear layer, on the map, per piece


def tokens_to_map(tokens=16, side=4, channels=32):
    """GLPN's stage end: a Linear layer and a LayerNorm on (1, tokens, C), the sequence viewed
    as a (side x side) map channels-last, permuted to NCHW, then a conv."""
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["h"]),
             node("Add", ["h", "b"], ["hb"]),
             node("LayerNormalization", ["hb", "g", "beta"], ["n"], axis=-1),
             node("Reshape", ["n", "image"], ["m"]),
             node("Transpose", ["m"], ["t"], perm=[0, 3, 1, 2]),
             node("Conv", ["t", "wc"], ["y"], pads=[1, 1, 1, 1])]
    weights = {"w": normal(channels, channels, scale=0.3), "b": normal(channels), "g": normal(channels),
               "beta": normal(channels), "image": np.array([1, tokens // side, side, channels], np.int64),
               "wc": conv_weights(16, channels)}
    return model(nodes, [("x", [1, tokens, channels])], ["y"], weights)


@pytest.mark.parametrize("tokens, side, viewed", [(16, 4, True), (32, 4, False)])
def test_a_sequence_of_one_token_tile_is_viewed_as_the_maps_channel_tiles(tokens, side, viewed):
    """16 tokens in 16x16 tiles are one tile of tokens: the buffer is (C/16, tokens, 16), which
    viewed as a 4x4 map and permuted to NCHW is the conv's NCHWc16, so nothing is copied.
    With 32 tokens, two token tiles, the map's rows would split a tile: it is copied."""
    after = check(tokens_to_map(tokens, side), shape=(1, tokens, 32))
    assert (runtime_layout_ops(after) == []) == viewed


def scaled_keys():
    """A Llama's scaled keys: the keys permuted (K^T), viewed per head, scaled by a constant,
    and read by the score MatMul."""
    node = helper.make_node
    nodes = [node("Relu", ["k"], ["kr"]),
             node("Transpose", ["kr"], ["kt"], perm=[0, 2, 1]),
             node("Reshape", ["kt", "shape"], ["k4"]),
             node("Mul", ["k4", "scale"], ["ks"]),
             node("MatMul", ["q", "ks"], ["y"])]
    weights = {"shape": np.array([1, 4, 16, 16], np.int64), "scale": np.array(0.25, np.float32)}
    return model(nodes, [("q", [1, 4, 16, 16]), ("k", [4, 16, 16])], ["y"], weights)


def tokens_and_upsampled_map(side=16, c=16):
    """GLPN's decoder fusion: a stage's normalized tokens viewed as a channels-last map and
    permuted to NCHW, concatenated on channels with a conv's upsampled map, then a conv."""
    node = helper.make_node
    nodes = [node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
             node("Reshape", ["n", "image"], ["m"]),
             node("Transpose", ["m"], ["t"], perm=[0, 3, 1, 2]),
             node("Conv", ["z", "w0"], ["a"], pads=[1, 1, 1, 1]),
             node("Resize", ["a", "", "scales"], ["u"], mode="linear"),
             node("Concat", ["t", "u"], ["cat"], axis=1),
             node("Conv", ["cat", "w1"], ["y"], pads=[1, 1, 1, 1])]
    weights = {"g": normal(c), "b": normal(c), "image": np.array([1, side, side, c], np.int64),
               "w0": conv_weights(c, 3), "scales": np.array([1, 1, 2, 2], np.float32),
               "w1": conv_weights(16, 2 * c)}
    return model(nodes, [("x", [1, side * side, c]), ("z", [1, 3, side // 2, side // 2])], ["y"], weights)


@pytest.mark.parametrize("build, feeds, late_wins", [
    (tokens_and_upsampled_map, {"x": (1, 256, 16), "z": (1, 3, 8, 8)}, True),
    (scaled_keys, {"q": (1, 4, 16, 16), "k": (4, 16, 16)}, False),
])
def test_the_order_of_relabeling_transposes_is_tried_both_ways(build, feeds, late_wins):
    """Relabeling a Transpose of a plain value late (once nothing else moves) lets the
    Concat take the upsampled map's channel tiles, which the permuted tokens' 16 channels
    fill in place; early, the permute keeps the tokens' channels-last layout, the Concat
    takes it, and its 32 channels are copied into the conv's tiles. And early, the permute
    of the keys is relabeled before the scale takes the MatMul's tiles, and the permuted
    keys flow into the MatMul. Each order leaves a copy in the other's model; `optimize`
    tries both and keeps the cheaper."""
    from tilefold.layout.materialize import materialize

    proto = build()
    gpu = get_target("gpu")
    before = materialize(tilefold.load(proto), gpu)
    left = {late: runtime_layout_ops(propagate(before.copy(), gpu, late_relabel=late)) for late in (True, False)}
    assert (left[True] == []) == late_wins and (left[False] == []) != late_wins
    after = check(proto, feeds={n: RNG.standard_normal(s).astype(np.float32) for n, s in feeds.items()})
    assert runtime_layout_ops(after) == []
