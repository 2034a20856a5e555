"""How build_kernel adapts the plain kernels to packed buffers: elementwise kernels on
physical buffers, the plain kernel on transposed views for permutations, and unpack / run /
pack for tiles and padding. Each result is unpacked and compared with the plain kernel."""
import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.numpy.packed import logical_spec, native_ops
from tilefold.backends.numpy.registry import KernelSpec
from tilefold.graph.graph import Graph, Node
from tilefold.graph.types import Splat, TensorType, Value
from tilefold.layout.encoding import PackedEncoding, pack
from tilefold.layout.targets import NHWC

BLOCKED = PackedEncoding((1,), (4,), None)  # NCHWc4 (channels 5, 6: padded)
BLOCKED_LAST = PackedEncoding((1,), (4,), (0, 2, 3, 1))
PERMUTED = PackedEncoding((), (), (2, 0, 3, 1))


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("enc", [NHWC, BLOCKED, BLOCKED_LAST, PERMUTED])
@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Erf", "Neg"])
def test_unary_runs_on_the_buffer(packed_check, rng, enc, op):
    x = _f32(rng, 2, 5, 7, 3)
    packed_check(op, [x], [enc], [enc], expect_path="physical", rtol=1e-5)


def _tile_one(enc: PackedEncoding, shape) -> PackedEncoding:
    """enc with tile 1 on the dims a broadcast operand of `shape` has as size 1."""
    return PackedEncoding(enc.inner_dims_pos, tuple(1 if shape[d] == 1 else t for d, t in
                                                    zip(enc.inner_dims_pos, enc.inner_tiles)),
                          enc.outer_dims_perm, enc.pad)


@pytest.mark.parametrize("enc", [NHWC, BLOCKED, BLOCKED_LAST])
@pytest.mark.parametrize("op", ["Add", "Mul", "Sub", "Div", "Max", "PRelu"])
def test_binary_with_a_broadcast_operand(packed_check, rng, enc, op):
    """A bias (1, C, 1, 1) packed alike (tile 1 on its broadcast dims), or identity when
    its bytes are in the same order, broadcasts against the result's buffer."""
    x, b = _f32(rng, 2, 6, 5, 3), _f32(rng, 1, 6, 1, 1) + 3.0
    packed_check(op, [x, b], [enc, _tile_one(enc, b.shape)], [enc], expect_path="physical")
    if not enc.inner_tiles:
        packed_check(op, [x, b], [enc, None], [enc], expect_path="physical")
    packed_check(op, [x, x * 2], [enc, enc], [enc], expect_path="physical")


def test_scalar_and_low_rank_operands(packed_check, rng):
    x = _f32(rng, 2, 6, 5, 3)
    packed_check("Mul", [x, np.array(2.5, np.float32)], [NHWC, None], [NHWC], expect_path="physical")
    packed_check("Clip", [x, np.array(-0.5, np.float32), np.array(0.5, np.float32)], [BLOCKED, None, None],
                 [BLOCKED], expect_path="physical")
    packed_check("Where", [x > 0, x, _f32(rng, 1, 1, 1, 3)], [NHWC, NHWC, None], [NHWC], expect_path="physical")
    packed_check("Cast", [x], [BLOCKED], [BLOCKED], {"to": 11}, expect_path="physical")


def test_a_low_rank_operand_is_reshaped_to_broadcast(packed_check, rng):
    """A (W,) operand of an NHWC result broadcasts as (1, 1, W, 1), not against the channels."""
    x = _f32(rng, 2, 6, 5, 3)
    out = packed_check("Add", [x, _f32(rng, 3)], [NHWC, None], [NHWC], expect_path="physical")
    assert out["physical"][0].shape == (2, 5, 3, 6)


def test_operands_laid_out_differently_take_a_generic_path(packed_check, rng):
    x = _f32(rng, 2, 6, 5, 3)
    packed_check("Add", [x, x], [NHWC, PERMUTED], [None], expect_path="permuted")
    packed_check("Add", [x, x], [BLOCKED, NHWC], [BLOCKED_LAST], expect_path="unpacked")
    # a broadcast dim tiled by more than 1 would read padding as data
    packed_check("Add", [x, _f32(rng, 1, 6, 1, 1)], [BLOCKED, PackedEncoding((1, 0), (4, 2))], [BLOCKED],
                 expect_path="unpacked")


@pytest.mark.parametrize("op,attrs", [
    ("Softmax", {"axis": 1}), ("LogSoftmax", {"axis": -1}), ("ArgMax", {"axis": 1, "keepdims": 0}),
    ("LayerNormalization", {"axis": -1}), ("LRN", {"size": 3}), ("HardSigmoid", {}),
])
@pytest.mark.parametrize("enc", [NHWC, PERMUTED, BLOCKED, BLOCKED_LAST])
def test_layout_sensitive_ops(packed_check, rng, op, attrs, enc):
    x = _f32(rng, 2, 5, 7, 3)
    args = [x]
    encs = [enc]
    if op == "LayerNormalization":
        args += [_f32(rng, 3), _f32(rng, 3)]
        encs += [None, None]
    out_enc = None if op == "ArgMax" else enc
    expected = "physical" if op == "HardSigmoid" else ("permuted" if not enc.inner_tiles else "unpacked")
    if op in ("Softmax", "LogSoftmax", "LayerNormalization") and not enc.inner_tiles:
        expected = "native"  # normalized over the buffer axes of the dims, no transposed copy
    packed_check(op, args, encs, [out_enc], attrs, expect_path=expected, rtol=1e-4, atol=1e-5)


def test_multi_output_and_variadic_ops(packed_check, rng):
    x, y = _f32(rng, 2, 5, 7, 3), _f32(rng, 2, 6, 7, 3)
    packed_check("Concat", [x, y], [NHWC, BLOCKED], [BLOCKED_LAST], {"axis": 1}, expect_path="unpacked")
    packed_check("Concat", [x, y], [NHWC, NHWC], [NHWC], {"axis": 1}, expect_path="native")  # runs of whole blocks
    split = np.array([2, 3], np.int64)
    packed_check("Split", [x, split], [NHWC, None], [NHWC, PERMUTED], {"axis": 1}, consts=(1,),
                 expect_path="permuted")
    packed_check("Split", [x, split], [BLOCKED, None], [BLOCKED, None], {"axis": 1}, consts=(1,),
                 expect_path="unpacked")
    packed_check("Sum", [x, x, x], [NHWC, NHWC, NHWC], [NHWC], expect_path="physical")


def test_packed_constants_reach_the_plain_kernel_unpacked(packed_check, rng):
    x, w = _f32(rng, 3, 10), _f32(rng, 10, 7)
    enc = PackedEncoding((0, 1), (4, 3), (1, 0))
    packed_check("MatMul", [x, w], [None, enc], [None], consts=(1,), expect_path="unpacked", rtol=1e-5)
    packed_check("MatMul", [x, w], [BLOCKED.__class__((1,), (4,)), enc], [enc], expect_path="unpacked", rtol=1e-5)


def test_a_packed_splat_stays_a_splat():
    enc = PackedEncoding((1,), (4,), (1, 0))
    t = TensorType((3, 6), np.float32, enc)
    node = Node("n", "Add", {}, [TensorType((3, 6), np.float32)], 2)
    spec = KernelSpec(node, [t, TensorType((3, 6), np.float32)], [Splat(2.0, enc.physical_shape((3, 6))), None])
    plain = logical_spec(spec)
    assert isinstance(plain.consts[0], Splat) and plain.consts[0].shape == (3, 6)
    assert plain.in_types[0].encoding is None and plain.out_types[0].encoding is None


def _graph_add(x_shape, enc) -> Graph:
    """x, y -> Pack both -> Add -> Relu -> Unpack, every intermediate packed with `enc`."""
    g = Graph()
    packed = TensorType(x_shape, np.float32, enc)
    values = []
    for name in ("x", "y"):
        v = g.add_input(name, TensorType(x_shape, np.float32))
        values.append(Value(g.add_node("Pack", [v], [packed], {"encoding": enc}).name))
    e = g.add_node("Exp", values[:1], [packed])
    a = g.add_node("Add", [Value(e.name), values[1]], [packed])
    r = g.add_node("Relu", [Value(a.name)], [packed])
    g.add_output(Value(g.add_node("Unpack", [Value(r.name)], [TensorType(x_shape, np.float32)]).name), "out")
    return g


@pytest.mark.parametrize("enc", [NHWC, BLOCKED, PERMUTED])
def test_in_place_on_physical_buffers(rng, enc):
    """Add and Relu overwrite dying packed buffers (same encoding, so the same physical shape)."""
    x, y = _f32(rng, 2, 6, 5, 3), _f32(rng, 2, 6, 5, 3)
    exe = NumpyExecutable(_graph_add(x.shape, enc), allow_fallback=False, debug=True)
    np.testing.assert_allclose(exe({"x": x, "y": y})["out"], np.maximum(np.exp(x) + y, 0), rtol=1e-6)
    by_op = {step.node.op: step.inplace for step in exe.steps}
    assert by_op["Add"] == 0 and by_op["Relu"] == 0


def test_native_ops_cover_the_cpu_targets_anchors_and_pools():
    assert {"Pack", "Unpack", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean",
            "ReduceSum", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "MatMul", "Gemm"} <= set(native_ops())


def _node(g: Graph, op: str, inputs, shape, enc, attrs=None) -> Value:
    return Value(g.add_node(op, inputs, [TensorType(shape, np.float32, enc)], attrs or {}).name)


def test_a_symbolic_batch_runs_channels_last(rng):
    """Pack -> Conv -> Relu -> MaxPool -> GlobalAveragePool -> Unpack with batch 'N': the
    kernels read the sizes from the buffers."""
    w = rng.standard_normal((8, 5, 3, 3)).astype(np.float32)
    g = Graph()
    x = g.add_input("x", TensorType(("N", 5, 9, 9), np.float32))
    p = _node(g, "Pack", [x], ("N", 5, 9, 9), NHWC, {"encoding": NHWC})
    weight = g.add_constant(pack(w, PackedEncoding((), (), (2, 3, 1, 0))), type=TensorType(
        w.shape, np.float32, PackedEncoding((), (), (2, 3, 1, 0))))
    c = _node(g, "Conv", [p, weight], ("N", 8, 9, 9), NHWC, {"pads": (1, 1, 1, 1), "kernel_shape": (3, 3)})
    r = _node(g, "Relu", [c], ("N", 8, 9, 9), NHWC)
    m = _node(g, "MaxPool", [r], ("N", 8, 5, 5), NHWC, {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1,) * 4})
    a = _node(g, "GlobalAveragePool", [m], ("N", 8, 1, 1), NHWC)
    g.add_output(_node(g, "Unpack", [a], ("N", 8, 1, 1), None), "y")
    exe = NumpyExecutable(g, allow_fallback=False, debug=True)
    assert [s.node.op for s in exe.steps if s.inplace >= 0] == ["Relu"]
    for batch in (1, 3):
        xs = rng.standard_normal((batch, 5, 9, 9)).astype(np.float32)
        plain = Graph()
        px = plain.add_input("x", TensorType(xs.shape, np.float32))
        pc = _node(plain, "Conv", [px, plain.add_constant(w)], (batch, 8, 9, 9), None,
                   {"pads": (1, 1, 1, 1), "kernel_shape": (3, 3)})
        pr = _node(plain, "Relu", [pc], (batch, 8, 9, 9), None)
        pm = _node(plain, "MaxPool", [pr], (batch, 8, 5, 5), None,
                   {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1,) * 4})
        plain.add_output(_node(plain, "GlobalAveragePool", [pm], (batch, 8, 1, 1), None), "y")
        want = NumpyExecutable(plain)({"x": xs})["y"]
        np.testing.assert_allclose(exe({"x": xs})["y"], want, rtol=1e-5, atol=1e-5)


def test_a_symbolic_batch_with_a_bias_in_place(rng):
    bias = rng.standard_normal((1, 6, 1, 1)).astype(np.float32)
    g = Graph()
    x = g.add_input("x", TensorType(("N", 6, 5, 3), np.float32))
    p = _node(g, "Pack", [x], ("N", 6, 5, 3), NHWC, {"encoding": NHWC})
    e = _node(g, "Exp", [p], ("N", 6, 5, 3), NHWC)
    a = _node(g, "Add", [e, g.add_constant(bias)], ("N", 6, 5, 3), NHWC)
    g.add_output(_node(g, "Unpack", [a], ("N", 6, 5, 3), None), "y")
    xs = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)
    got = NumpyExecutable(g, allow_fallback=False, debug=True)({"x": xs})["y"]
    np.testing.assert_allclose(got, np.exp(xs) + bias, rtol=1e-6)
