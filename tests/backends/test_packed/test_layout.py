"""Pack and Unpack kernels, and the buffer-order algebra: checked against layout/encoding.py's
reference pack/unpack on fresh random tensors and encodings (permutations, tiles that do not
divide, padding values)."""
import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.numpy.packed import build_kernel, path
from tilefold.backends.numpy.registry import KERNELS, KernelSpec
from tilefold.graph.graph import Graph, Node
from tilefold.graph.types import TensorType, Value
from tilefold.backends.numpy.kernels.packed_layout import (converter, pack_buffer, same_buffer,
                                                          same_reshaped_buffer, unpack_buffer)
from tilefold.layout.encoding import PackedEncoding, pack, unpack


def random_encoding(rng: np.random.Generator, rank: int, max_tile: int = 5) -> PackedEncoding:
    tiled = [int(d) for d in rng.permutation(rank)[: rng.integers(0, rank + 1)]]
    tiles = tuple(int(t) for t in rng.integers(1, max_tile + 1, len(tiled)))
    perm = tuple(int(p) for p in rng.permutation(rank))
    return PackedEncoding(tuple(tiled), tiles, perm, float(rng.choice([0.0, -1.5])))


def random_case(rng: np.random.Generator):
    rank = int(rng.integers(1, 5))
    shape = tuple(int(s) for s in rng.integers(1, 9, rank))
    return rng.standard_normal(shape).astype(np.float32), random_encoding(rng, rank)


def test_pack_buffer_equals_the_reference(rng):
    for _ in range(300):
        x, enc = random_case(rng)
        np.testing.assert_array_equal(pack_buffer(x, enc), pack(x, enc), err_msg=f"{x.shape} {enc}")


def test_unpack_buffer_equals_the_reference_and_is_contiguous(rng):
    for _ in range(300):
        x, enc = random_case(rng)
        got = unpack_buffer(pack(x, enc), enc, x.shape)
        np.testing.assert_array_equal(got, x, err_msg=f"{x.shape} {enc}")
        assert got.flags.c_contiguous


def test_pack_buffer_reads_strided_views(rng):
    x = rng.standard_normal((6, 10, 7)).astype(np.float32)
    view = x.transpose(2, 0, 1)[:, ::2]
    enc = PackedEncoding((1, 2), (2, 4), (2, 0, 1), pad=3.0)
    np.testing.assert_array_equal(pack_buffer(view, enc), pack(np.ascontiguousarray(view), enc))


def _brute_same(x: np.ndarray, a: PackedEncoding, b: PackedEncoding) -> bool:
    """Same bytes: compare the packed buffers of an index tensor (padding marked -1)."""
    index = np.arange(x.size, dtype=np.int64).reshape(x.shape)
    return np.array_equal(pack(index, a.with_pad(-1)).ravel(), pack(index, b.with_pad(-1)).ravel())


def test_same_buffer_agrees_with_brute_force(rng):
    hits = 0
    for _ in range(400):
        x, a = random_case(rng)
        if rng.random() < 0.5:  # an equivalent spelling: tile-1 dims, or a moved size-1 dim
            b = PackedEncoding(a.inner_dims_pos, a.inner_tiles, a.outer_dims_perm, a.pad)
        else:
            b = random_encoding(rng, x.ndim)
        want = _brute_same(x, a, b)
        hits += want
        assert same_buffer(a, b, x.shape) == want, f"{x.shape} {a} {b}"
        assert same_buffer(None, a, x.shape) == _brute_same(x, PackedEncoding((), ()), a)
    assert hits > 50


@pytest.mark.parametrize("shape,a,b,same", [
    ((2, 7, 1, 1), PackedEncoding((), (), (0, 2, 3, 1)), None, True),  # NHWC of 1x1 = NCHW
    ((2, 7, 3, 1), PackedEncoding((), (), (0, 2, 3, 1)), None, False),
    ((4, 6), PackedEncoding((1,), (6,)), None, True),  # one whole tile
    ((4, 6), PackedEncoding((1,), (4,)), None, False),  # padded
    ((4, 6), PackedEncoding((1,), (3,)), PackedEncoding((1,), (2,)), True),  # both row-major
    ((4, 6), PackedEncoding((1,), (3,), (1, 0)), PackedEncoding((1,), (2,), (1, 0)), False),
    ((4, 6), PackedEncoding((0,), (1,)), None, True),
])
def test_same_buffer_cases(shape, a, b, same):
    assert same_buffer(a, b, shape) == same
    assert same_buffer(b, a, shape) == same


def test_same_reshaped_buffer_agrees_with_brute_force(rng):
    cases = [
        # BERT's head split: (B, S, 768) tiled by 64 after the sequence, and (B, S, 12, 64) transposed
        ((2, 5, 12), PackedEncoding((2,), (4,), (0, 2, 1)), (2, 5, 3, 4), PackedEncoding((), (), (0, 2, 1, 3))),
        ((2, 7, 1, 1), PackedEncoding((), (), (0, 2, 3, 1)), (2, 7), None),
        ((3, 4, 5), PackedEncoding((), (), (0, 2, 1)), (12, 5), None),
        ((3, 4, 10), PackedEncoding((2,), (4,)), (12, 10), PackedEncoding((1,), (4,))),  # padded alike
        ((3, 4, 10), PackedEncoding((2,), (4,)), (3, 40), PackedEncoding((1,), (4,))),
    ]
    for shape_a, a, shape_b, b in cases:
        index = np.arange(np.prod(shape_a))
        want = np.array_equal(pack(index.reshape(shape_a), (a or PackedEncoding((), ())).with_pad(-1)).ravel(),
                              pack(index.reshape(shape_b), (b or PackedEncoding((), ())).with_pad(-1)).ravel())
        assert same_reshaped_buffer(a, shape_a, b, shape_b) == want, (shape_a, a, shape_b, b)
    (sa, a, sb, b), (sc, c, sd, d) = cases[0], cases[2]
    assert same_reshaped_buffer(a, sa, b, sb)
    assert not same_reshaped_buffer(c, sc, d, sd)


def test_converter_changes_layouts(rng):
    for _ in range(100):
        x, a = random_case(rng)
        b = random_encoding(rng, x.ndim)
        got = converter(a, b, x.shape)(pack(x, a))
        np.testing.assert_array_equal(unpack(got, b, x.shape), x)


# ---- the kernels ---------------------------------------------------------------------------------
def layout_kernel(op: str, x: np.ndarray, enc: PackedEncoding):
    """The Pack (identity -> enc) or Unpack (enc -> identity) kernel of a tensor like x, and its path."""
    logical, packed = TensorType(x.shape, x.dtype), TensorType(x.shape, x.dtype, enc)
    source, result = (logical, packed) if op == "Pack" else (packed, logical)
    spec = KernelSpec(Node("n", op, {"encoding": enc} if op == "Pack" else {}, [result], 1), [source], [None])
    return build_kernel(KERNELS[op], spec), path(KERNELS[op], spec)


def test_pack_and_unpack_kernels(rng):
    for _ in range(100):
        x, enc = random_case(rng)
        x.flags.writeable = False
        run, way = layout_kernel("Pack", x, enc)
        assert way == "native"
        np.testing.assert_array_equal(run(x), pack(x, enc))
        p = pack(x, enc)
        p.flags.writeable = False
        got = layout_kernel("Unpack", x, enc)[0](p)
        np.testing.assert_array_equal(got, x)
        assert got.flags.c_contiguous


def test_unpack_returns_a_view_only_when_the_order_is_unchanged(rng):
    x = rng.standard_normal((3, 5, 1, 1)).astype(np.float32)
    for enc, view in ((PackedEncoding((), (), (0, 2, 3, 1)), True), (PackedEncoding((), (), (1, 0, 2, 3)), False),
                      (PackedEncoding((1,), (2,)), False), (PackedEncoding((1,), (5,), (0, 2, 3, 1)), True)):
        p = pack(x, enc)
        got = layout_kernel("Unpack", x, enc)[0](p)
        np.testing.assert_array_equal(got, x)
        assert np.shares_memory(got, p) == view, enc


def test_pack_of_an_equivalent_layout_is_a_view(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    got = layout_kernel("Pack", x, PackedEncoding((1,), (6,)))[0](x)
    assert got.shape == (4, 1, 6)
    assert np.shares_memory(got, x)
    np.testing.assert_array_equal(got.reshape(4, 6), x)


def test_pack_and_unpack_in_a_graph(rng):
    """Pack -> Sigmoid -> Relu (on the buffers) -> Unpack through the executor, its aliasing
    checks on; Relu overwrites Sigmoid's dying packed buffer (Pack's result may be a view of
    the graph input, so Sigmoid may not)."""
    x = rng.standard_normal((2, 5, 7, 3)).astype(np.float32)
    enc = PackedEncoding((1,), (4,), (0, 2, 3, 1))
    g = Graph()
    v = g.add_input("x", TensorType(x.shape, x.dtype))
    packed = TensorType(x.shape, x.dtype, enc)
    p = g.add_node("Pack", [v], [packed], {"encoding": enc})
    s = g.add_node("Sigmoid", [Value(p.name)], [packed])
    r = g.add_node("Relu", [Value(s.name)], [packed])
    u = g.add_node("Unpack", [Value(r.name)], [TensorType(x.shape, x.dtype)])
    g.add_output(Value(u.name), "y")
    exe = NumpyExecutable(g, allow_fallback=False, debug=True)
    np.testing.assert_allclose(exe({"x": x})["y"], 1 / (1 + np.exp(-x)), rtol=1e-6)
    assert [step.inplace for step in exe.steps] == [-1, -1, 0, -1]
