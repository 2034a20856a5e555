"""Packed encodings: tensor.pack semantics, checked as properties over random shapes."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tilefold.graph import VerifyError
from tilefold.layout.encoding import (SLAB, PackedEncoding, contiguous, pack, reshape_encoding, unpack,
                                      whole_tiles_outer)


@st.composite
def packed_case(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    tiled = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    tiles = tuple(draw(st.integers(1, 5)) for _ in tiled)
    perm = tuple(draw(st.permutations(range(rank))))
    pad = draw(st.sampled_from([0.0, -1.5]))
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x, PackedEncoding(tuple(tiled), tiles, perm, pad)


@given(packed_case())
@settings(max_examples=200, deadline=None)
def test_unpack_inverts_pack(case):
    x, enc = case
    np.testing.assert_array_equal(unpack(pack(x, enc), enc, x.shape), x)


@given(packed_case())
@settings(max_examples=200, deadline=None)
def test_buffer_shape_and_bytes_follow_the_formula(case):
    x, enc = case
    p = pack(x, enc)
    tiles = dict(zip(enc.inner_dims_pos, enc.inner_tiles))
    outer = [-(-d // tiles[i]) if i in tiles else d for i, d in enumerate(x.shape)]
    perm = enc.outer_perm(x.ndim)
    assert p.shape == tuple(outer[i] for i in perm) + enc.inner_tiles
    assert enc.nbytes(x.shape, x.dtype) == p.nbytes
    padded = np.prod([-(-d // tiles[i]) * tiles[i] if i in tiles else d for i, d in enumerate(x.shape)])
    assert p.size == padded


@given(packed_case())
@settings(max_examples=200, deadline=None)
def test_padding_holds_the_recorded_value(case):
    x, enc = case
    p = pack(x, enc)
    assert np.count_nonzero(p == enc.pad) >= p.size - x.size  # every padding element
    assert np.isclose(p.sum(), x.sum() + enc.pad * (p.size - x.size), rtol=1e-4, atol=1e-3)


@given(packed_case(), st.data())
@settings(max_examples=200, deadline=None)
def test_a_transpose_of_a_packed_tensor_is_a_relabeling(case, data):
    x, enc = case
    perm = tuple(data.draw(st.permutations(range(x.ndim))))
    np.testing.assert_array_equal(pack(x.transpose(perm), enc.permuted(perm)), pack(x, enc))


def test_known_example_nchw_to_nchw8c():
    x = np.arange(2 * 12 * 3 * 3, dtype=np.float32).reshape(2, 12, 3, 3)
    enc = PackedEncoding((1,), (8,))
    p = pack(x, enc)
    assert p.shape == (2, 2, 3, 3, 8)
    assert p[1, 1, 2, 0, 3] == x[1, 8 + 3, 2, 0]
    assert np.all(p[:, 1, :, :, 4:] == 0)  # channels 12..15 are padding


def test_mmt4d_style_matmul_operand():
    a = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    enc = PackedEncoding((0, 1), (4, 2))
    p = pack(a, enc)
    assert p.shape == (2, 4, 4, 2)
    assert p[1, 2, 0, 1] == a[4, 5]  # p[i, j, r, c] = a[4i + r, 2j + c]
    assert np.all(p[1, :, 1:, :] == 0) and np.all(p[:, 3, :, 1] == 0)  # rows 5..7 and column 7 pad


def test_equality_and_layout_identity():
    a = PackedEncoding((1,), (8,), (0, 1, 2, 3), 0.0)
    b = PackedEncoding((1,), (8,), None, None)
    assert a.outer_dims_perm is None  # an identity permutation is normalized away
    assert a != b and a.same_layout(b)
    assert hash(a) == hash(PackedEncoding((1,), (8,)))


@pytest.mark.parametrize(
    "args, message",
    [(((0,), (4, 4)), "2 tiles"), (((0, 0), (4, 4)), "tiled twice"), (((0,), (0,)), "positive")],
)
def test_malformed_encodings_are_refused(args, message):
    with pytest.raises(VerifyError, match=message):
        PackedEncoding(*args)


def test_an_encoding_must_fit_the_rank():
    with pytest.raises(VerifyError, match="outside rank 2"):
        PackedEncoding((2,), (4,)).physical_shape((3, 3))


@given(packed_case())
@settings(max_examples=300, deadline=None)
def test_a_trivial_encoding_keeps_the_element_order(case):
    x, enc = case
    same_order = pack(x, enc).size == x.size and np.array_equal(pack(x, enc).ravel(), x.ravel())
    assert enc.is_trivial(x.shape) == same_order or (not enc.is_trivial(x.shape) and x.size <= 1)


@st.composite
def unpadded_encoding(draw, shape):
    rank = len(shape)
    tiled = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    tiles = tuple(draw(st.sampled_from([t for t in (1, 2, 3, 4, shape[d]) if shape[d] % t == 0])) for d in tiled)
    return PackedEncoding(tuple(tiled), tiles, tuple(draw(st.permutations(range(rank)))))


@given(st.lists(st.sampled_from([1, 2, 4, 6]), min_size=1, max_size=4).flatmap(
    lambda shape: st.tuples(st.just(tuple(shape)), unpadded_encoding(shape), unpadded_encoding(shape))))
@settings(max_examples=300, deadline=None)
def test_same_layout_on_a_shape_means_the_same_bytes(case):
    """Two unpadded encodings are the same layout on a shape exactly when they pack it to
    the same buffer (NCHWc16 and NHWC of 16 channels)."""
    shape, a, b = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    assert a.same_layout_on(b, shape) == np.array_equal(pack(x, a).ravel(), pack(x, b).ravel())


@given(packed_case())
@settings(max_examples=200, deadline=None)
def test_a_leading_tile_holding_its_whole_dim_reads_as_an_outer_dim(case):
    x, enc = case
    outer = whole_tiles_outer(enc, x.shape)
    np.testing.assert_array_equal(pack(x, outer).ravel(), pack(x, enc).ravel())
    assert len(outer.inner_tiles) <= len(enc.inner_tiles)


def test_a_sequence_in_whole_token_tiles_viewed_as_a_map_is_its_channel_tiles():
    """GLPN: 16 tokens x 48 channels in 16x16 tiles, viewed as a 4x4 map (N, H, W, C): the one
    token tile holds every token, so the buffer is (C/16, tokens, 16), the map channels-last
    with the channels tiled, which a permute to NCHW relabels as NCHWc16."""
    tokens = PackedEncoding((1, 2), (16, 16))
    view = reshape_encoding((1, 16, 48), (1, 4, 4, 48), tokens)
    assert view == PackedEncoding((3,), (16,), (0, 3, 1, 2))
    assert view.permuted((0, 3, 1, 2)) == PackedEncoding((1,), (16,))
    x = np.arange(16 * 48, dtype=np.float32).reshape(1, 16, 48)
    np.testing.assert_array_equal(pack(x.reshape(1, 4, 4, 48), view).ravel(), pack(x, tokens).ravel())
    assert reshape_encoding((1, 32, 48), (1, 4, 8, 48), tokens) is None  # two token tiles: not a view


@st.composite
def long_view(draw):
    """A transposed view whose last axis is long enough for `contiguous` to copy it in slabs."""
    rank = draw(st.integers(2, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    shape[draw(st.integers(0, rank - 1))] = draw(st.integers(8 * SLAB, 8 * SLAB + 37))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int64, np.bool_]))
    x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(shape) * 100
    return x.astype(dtype).transpose(draw(st.permutations(range(rank))))


@given(long_view())
@settings(max_examples=100, deadline=None)
def test_contiguous_is_ascontiguousarray(view):
    out = contiguous(view)
    assert out.flags.c_contiguous and out.dtype == view.dtype
    assert np.shares_memory(out, view) == view.flags.c_contiguous  # a copy unless it already is one
    np.testing.assert_array_equal(out, view)


def test_a_conv_weight_packs_to_rscf_exactly():
    """RSCF (the cpu target's conv weight) moves F, the first axis, last: the slab copy."""
    w = np.random.default_rng(0).standard_normal((256, 96, 3, 3)).astype(np.float32)
    enc = PackedEncoding((), (), (2, 3, 1, 0))
    packed = pack(w, enc)
    assert packed.shape == (3, 3, 96, 256) and packed.flags.c_contiguous
    np.testing.assert_array_equal(packed, w.transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(unpack(packed, enc, w.shape), w)
