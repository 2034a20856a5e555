"""View ops that keep the buffer (no copy: checked with np.shares_memory), and MatMul / Gemm
writing permuted and head-split results, against the plain kernels on fresh inputs."""
import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.graph.graph import Graph
from tilefold.graph.types import TensorType, Value
from tilefold.layout.encoding import PackedEncoding
from tilefold.layout.targets import NHWC

HEADS = PackedEncoding((2,), (4,), (0, 2, 1))  # (B, S, 12) stored as (B, 3, S, 4): heads split
SPLIT = PackedEncoding((), (), (0, 2, 1, 3))  # (B, S, 3, 4) stored as (B, 3, S, 4)


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _is_view(out) -> bool:
    return np.shares_memory(out["physical"][0], out["buffers"][0])


def test_transpose_of_a_packed_tensor_is_a_relabeling(packed_check, rng):
    x = _f32(rng, 2, 5, 7, 3)
    for perm in ((0, 2, 3, 1), (3, 1, 0, 2)):
        for enc in (NHWC, PackedEncoding((1,), (2,), (0, 2, 3, 1))):
            out = packed_check("Transpose", [x], [enc], [enc.permuted(perm)], {"perm": perm}, expect_path="native")
            assert _is_view(out)
    # the attention merge: identity (B, H, S, D) transposed to (B, S, H, D) keeps its buffer
    out = packed_check("Transpose", [x], [None], [PackedEncoding((), (), (0, 2, 1, 3))], {"perm": (0, 2, 1, 3)},
                       expect_path="native")
    assert _is_view(out)


def test_transpose_that_moves_data_is_generic(packed_check, rng):
    x = _f32(rng, 2, 5, 7, 3)
    out = packed_check("Transpose", [x], [NHWC], [NHWC], {"perm": (0, 1, 3, 2)})
    assert out["path"] == "permuted" and not _is_view(out)


@pytest.mark.parametrize("op,shape,args,attrs,in_enc,out_enc", [
    ("Flatten", (2, 7, 1, 1), [], {"axis": 1}, NHWC, None),  # ResNet's head, NHWC pooled
    ("Squeeze", (2, 7, 1, 1), [np.array([2, 3])], {}, NHWC, None),
    ("Unsqueeze", (2, 7), [np.array([2, 3])], {}, None, NHWC),
    ("Reshape", (2, 6, 12), [np.array([2, 6, 3, 4])], {}, HEADS, SPLIT),  # BERT's head split
    ("Reshape", (2, 6, 3, 4), [np.array([2, 6, 12])], {}, SPLIT, HEADS),  # and its merge
    ("Reshape", (3, 4, 10), [np.array([12, 10])], {}, PackedEncoding((2,), (4,)), PackedEncoding((1,), (4,))),
])
def test_reshapes_that_keep_the_buffer_are_views(packed_check, rng, op, shape, args, attrs, in_enc, out_enc):
    x = _f32(rng, *shape)
    out = packed_check(op, [x, *args], [in_enc] + [None] * len(args), [out_enc], attrs,
                       consts=range(1, 1 + len(args)), expect_path="native")
    assert _is_view(out)


def test_reshapes_that_move_data_are_generic(packed_check, rng):
    x = _f32(rng, 2, 6, 12)
    out = packed_check("Reshape", [x, np.array([12, 12])], [HEADS, None], [None], consts=(1,))
    assert out["path"] == "unpacked"
    out = packed_check("Flatten", [_f32(rng, 2, 7, 3, 1)], [NHWC], [None], {"axis": 1})
    assert out["path"] == "permuted"
    # the padding the result's encoding records (0) is not what the input's holds (-1)
    x = _f32(rng, 3, 4, 10)
    out = packed_check("Reshape", [x, np.array([12, 10])], [PackedEncoding((2,), (4,), pad=-1.0), None],
                       [PackedEncoding((1,), (4,))], consts=(1,))
    assert out["path"] == "unpacked"


def test_view_kernels_are_declared_views_in_the_executor(rng):
    """Flatten of an NHWC (N, C, 1, 1) returns the input's buffer; the executor's debug check passes
    and the graph output is an owned copy."""
    x = _f32(rng, 2, 7, 1, 1)
    g = Graph()
    v = g.add_input("x", TensorType(x.shape, x.dtype))
    p = g.add_node("Pack", [v], [TensorType(x.shape, x.dtype, NHWC)], {"encoding": NHWC})
    r = g.add_node("Relu", [Value(p.name)], [TensorType(x.shape, x.dtype, NHWC)])
    f = g.add_node("Flatten", [Value(r.name)], [TensorType((2, 7), x.dtype)], {"axis": 1})
    g.add_output(Value(f.name), "y")
    got = NumpyExecutable(g, allow_fallback=False, debug=True)({"x": x})["y"]
    np.testing.assert_array_equal(got, np.maximum(x, 0).reshape(2, 7))


# ---- MatMul / Gemm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("out_enc", [
    PackedEncoding((), (), (0, 2, 1)),  # (B, N, M): column-major result matrices, computed transposed
    PackedEncoding((), (), (1, 0, 2)),  # (M, B, N)
    PackedEncoding((), (), (2, 0, 1)),  # (N, B, M)
])
@pytest.mark.parametrize("const_weight", [True, False])
def test_matmul_writes_its_result_in_place_of_a_transpose(packed_check, rng, out_enc, const_weight):
    a, w = _f32(rng, 2, 6, 10), _f32(rng, 10, 12)
    packed_check("MatMul", [a, w], [None, None], [out_enc], consts=(1,) if const_weight else (),
                 expect_path="native", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out_enc", [HEADS, PackedEncoding((2,), (5,), (0, 2, 1))])
def test_matmul_with_a_head_split_result_is_one_gemm_and_one_packing_copy(packed_check, rng, out_enc):
    a, w = _f32(rng, 2, 6, 10), _f32(rng, 10, 12)
    out = packed_check("MatMul", [a, w], [None, None], [out_enc], consts=(1,), expect_path="unpacked",
                       rtol=1e-5, atol=1e-5)
    tile = out_enc.inner_tiles[0]
    if 12 % tile:
        assert not out["physical"][0][:, -1, :, 12 % tile:].any()  # the encoding records zero padding


def test_batched_matmul_on_permuted_operands(packed_check, rng):
    """Attention: Q (B, H, S, D) read from a (B, S, H, D) buffer, K^T from the same layout, the
    context written back as (B, S, H, D), with no copy in or out."""
    q, k, v = _f32(rng, 2, 3, 6, 4), _f32(rng, 2, 3, 4, 6), _f32(rng, 2, 3, 6, 4)
    bshd = PackedEncoding((), (), (0, 2, 1, 3))
    kt = PackedEncoding((), (), (0, 3, 1, 2))
    packed_check("MatMul", [q, k], [bshd, kt], [None], expect_path="native", rtol=1e-5, atol=1e-5)
    scores = _f32(rng, 2, 3, 6, 6)
    packed_check("MatMul", [scores, v], [None, bshd], [bshd], expect_path="native", rtol=1e-5, atol=1e-5)


def test_matmul_with_tiled_operands_is_generic(packed_check, rng):
    a, w = _f32(rng, 6, 10), _f32(rng, 10, 12)
    tiles = PackedEncoding((0, 1), (4, 4))
    out = packed_check("MatMul", [a, w], [tiles, tiles], [tiles], consts=(1,), rtol=1e-5, atol=1e-5)
    assert out["path"] == "unpacked"


@pytest.mark.parametrize("consts", [(1, 2), ()])
@pytest.mark.parametrize("bias_shape", [(12,), (6, 12), (6, 1)])
@pytest.mark.parametrize("a_enc", [None, PackedEncoding((), (), (1, 0))])
def test_gemm_writes_a_transposed_result(packed_check, rng, consts, bias_shape, a_enc):
    a, b, c = _f32(rng, 10, 6), _f32(rng, 12, 10), _f32(rng, *bias_shape)
    attrs = {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}
    packed_check("Gemm", [a, b, c], [a_enc, None, None], [PackedEncoding((), (), (1, 0))], attrs, consts=consts,
                 expect_path="native", rtol=1e-5, atol=1e-5)


def test_shape_and_size_of_a_packed_tensor(packed_check, rng):
    x = _f32(rng, 2, 5, 7, 3)
    blocked = PackedEncoding((1,), (4,))
    out = packed_check("Shape", [x], [blocked], [None], {"start": 1}, expect_path="native")
    assert out["physical"][0].tolist() == [5, 7, 3]
    assert packed_check("Size", [x], [blocked], [None], expect_path="native")["physical"][0] == x.size


BLOCKED = PackedEncoding((1,), (4,))
"""Channels tiled by 4 (the gpu target's NCHWc with a small tile)."""


@pytest.mark.parametrize("sizes, native", [((8, 4, 12), True), ((4, 6, 2), False)])
@pytest.mark.parametrize("enc", [BLOCKED, PackedEncoding((1,), (4,), (0, 2, 3, 1))])
def test_concat_and_split_of_whole_blocks_run_on_the_buffers(packed_check, rng, sizes, native, enc):
    # 6 and 2 channels end inside a tile: those pieces take the generic path
    parts = [rng.standard_normal((2, c, 5, 3)).astype(np.float32) for c in sizes]
    path = "native" if native else "unpacked"
    packed_check("Concat", parts, [enc] * 3, [enc], {"axis": 1}, expect_path=path)
    whole = np.concatenate(parts, axis=1)
    split = np.array(sizes, np.int64)
    out = packed_check("Split", [whole, split], [enc, None], [enc] * 3, {"axis": 1}, consts={1}, expect_path=path)
    assert len(out["got"]) == 3


def test_concat_along_an_untiled_dim_of_padded_pieces(packed_check, rng):
    parts = [rng.standard_normal((2, 5, h, 3)).astype(np.float32) for h in (2, 3)]
    packed_check("Concat", parts, [BLOCKED] * 2, [BLOCKED], {"axis": 2}, expect_path="native")
