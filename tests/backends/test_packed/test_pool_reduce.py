"""Pooling on channels-last buffers and reductions on packed buffers, against the plain
kernels (and onnxruntime for the pools) on fresh inputs with odd sizes."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from tilefold.graph.ops.reduce import REDUCE_OPS
from tilefold.layout.encoding import PackedEncoding
from tilefold.layout.targets import NHWC

POOLS = [
    {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)},  # ResNet's stem pool
    {"kernel_shape": (2, 3), "strides": (2, 2), "ceil_mode": 1},
    {"kernel_shape": (3, 2), "strides": (1, 2), "pads": (1, 1, 2, 0)},
    {"kernel_shape": (3, 3), "strides": (2, 2), "auto_pad": "SAME_LOWER"},
    {"kernel_shape": (3, 3), "strides": (3, 2), "pads": (2, 1, 2, 1), "ceil_mode": 1},
]


def _x(rng, shape=(2, 5, 11, 9), dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("attrs", POOLS)
def test_max_pool(packed_check, rng, attrs):
    packed_check("MaxPool", [_x(rng)], [NHWC], [NHWC], attrs, expect_path="native")
    packed_check("MaxPool", [_x(rng)], [NHWC], [NHWC], dict(attrs, dilations=(2, 1)), expect_path="native")
    ints = rng.integers(-100, 100, (1, 3, 8, 7)).astype(np.int8)
    packed_check("MaxPool", [ints], [NHWC], [NHWC], attrs, expect_path="native")


@pytest.mark.parametrize("attrs", POOLS)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(packed_check, rng, attrs, include_pad):
    packed_check("AveragePool", [_x(rng)], [NHWC], [NHWC], dict(attrs, count_include_pad=include_pad),
                 expect_path="native", rtol=1e-5, atol=1e-6)


def _onnxruntime(op, x, attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", 1, list(x.shape))],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pools_match_onnxruntime(packed_run, rng, op):
    x = _x(rng, (1, 7, 13, 12))
    for attrs in POOLS[:3]:
        got = packed_run(op, [x], [NHWC], [NHWC], attrs)["got"][0]
        np.testing.assert_allclose(got, _onnxruntime(op, x, attrs), rtol=1e-5, atol=1e-6)


def test_max_pool_with_indices_takes_the_generic_path(packed_check, rng):
    out = packed_check("MaxPool", [_x(rng)], [NHWC], [NHWC, None], POOLS[0])
    assert out["path"] == "permuted"


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools_give_the_identity_buffer_without_a_copy_of_the_result(packed_check, rng, op):
    """(N, C, 1, 1) in NHWC has the identity's element order: the result is reshaped, not moved."""
    out = packed_check(op, [_x(rng, (2, 100, 7, 5))], [NHWC], [None], expect_path="native")
    assert out["physical"][0].shape == (2, 100, 1, 1)
    packed_check(op, [_x(rng, (2, 3, 7, 5))], [NHWC], [NHWC], expect_path="native")


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keep", [0, 1])
def test_spatial_reductions_of_nhwc(packed_check, rng, op, keep):
    """ResNet's global pooling as ReduceMean over (2, 3): one reduction over the buffer's axes 1, 2."""
    x = _x(rng, (2, 6, 5, 3)) * 0.5
    if op == "ReduceLogSum":
        x = np.abs(x)  # a positive sum
    for axes, out_enc in (([2, 3], None), ([1], None), ([-1, 0], None)):
        packed_check(op, [x, np.array(axes, np.int64)], [NHWC, None], [out_enc], {"keepdims": keep}, consts=(1,),
                     expect_path="native", rtol=1e-5, atol=1e-6)
    if keep:
        packed_check(op, [x, np.array([2], np.int64)], [NHWC, None], [NHWC], {"keepdims": 1}, consts=(1,),
                     expect_path="native", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keep", [0, 1])
def test_reductions_over_tiles(packed_check, rng, keep):
    x = _x(rng, (2, 8, 5, 3))
    blocked = PackedEncoding((1,), (4,), (0, 2, 3, 1))
    axes = np.array([1], np.int64)
    out_enc = None if not keep else PackedEncoding((), (), (0, 2, 3, 1))
    packed_check("ReduceSum", [x, axes], [blocked, None], [out_enc], {"keepdims": keep}, consts=(1,),
                 expect_path="native", rtol=1e-5, atol=1e-5)
    spatial = PackedEncoding((1,), (3,))  # 8 channels in tiles of 3: padded, but only H, W are reduced
    packed_check("ReduceMean", [x, np.array([2, 3], np.int64)], [spatial, None], [spatial if keep else None],
                 {"keepdims": keep}, consts=(1,), expect_path="native", rtol=1e-5, atol=1e-6)
    # reducing a padded tiled dim would read the padding: the generic path unpacks first
    packed_check("ReduceSum", [x, axes], [spatial, None], [None], {"keepdims": keep}, consts=(1,),
                 expect_path="unpacked", rtol=1e-5, atol=1e-5)


def test_reduction_over_every_axis(packed_check, rng):
    x = _x(rng, (2, 6, 5, 3))
    packed_check("ReduceSum", [x], [NHWC], [None], {"keepdims": 0}, expect_path="native", rtol=1e-5, atol=1e-5)


NCHWC = PackedEncoding((1,), (4,))
"""Blocked channels, as the gpu target tiles them (tile 4 here, so that 5 and 8 channels
cover a padded and an exact case)."""


@pytest.mark.parametrize("channels", [5, 8])
@pytest.mark.parametrize("attrs", POOLS)
def test_pools_on_blocked_channels(packed_check, rng, attrs, channels):
    x = _x(rng, (2, channels, 11, 9))
    packed_check("MaxPool", [x], [NCHWC], [NCHWC], attrs, expect_path="native")
    for include_pad in (0, 1):
        packed_check("AveragePool", [x], [NCHWC], [NCHWC], dict(attrs, count_include_pad=include_pad),
                     expect_path="native", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools_on_blocked_channels_keep_the_padding(packed_check, rng, op):
    x = _x(rng, (2, 5, 7, 6))
    out = packed_check(op, [x], [NCHWC], [NCHWC], {}, expect_path="native", rtol=1e-5, atol=1e-6)
    assert np.all(out["physical"][0][:, 1, ..., 1:] == 0)  # channels 5..7: zero padding in, zero out


TILES = PackedEncoding((1, 2), (4, 8), pad=None)
"""16x16-style 2-D tiles (4 x 8 here): rows padded (6 in tiles of 4), columns whole (32)."""


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis, path", [(-1, "native"), (1, "unpacked")])  # axis 1 holds padding
def test_softmax_over_a_tiled_dim(packed_check, rng, op, axis, path):
    x = _x(rng, (2, 6, 32)) * 4
    packed_check(op, [x], [TILES], [TILES], {"axis": axis}, expect_path=path, rtol=1e-5, atol=1e-6)
    outer = PackedEncoding((2,), (8,), (2, 0, 1), pad=None)  # tiles and outer dims permuted
    packed_check(op, [x], [outer], [outer], {"axis": axis}, expect_path="native", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_over_tiled_hidden_dims(packed_check, rng, with_bias):
    x = _x(rng, (2, 6, 32)) * 3 + 1
    scale, bias = rng.uniform(0.5, 1.5, 32).astype(np.float32), _x(rng, (32,))
    params = PackedEncoding((0,), (8,))
    args, encs = ([x, scale, bias], [TILES, params, params]) if with_bias else ([x, scale], [TILES, params])
    packed_check("LayerNormalization", args, encs, [TILES], {"axis": -1}, consts={1, 2},
                 expect_path="native", rtol=1e-5, atol=1e-5)
    plain = [None] * (len(args) - 1)  # a whole-tile vector's buffer is the plain vector
    packed_check("LayerNormalization", args, [TILES, *plain], [TILES], {"axis": -1}, consts={1, 2},
                 expect_path="native", rtol=1e-5, atol=1e-5)
    padded = PackedEncoding((1, 2), (4, 12), pad=None)  # 32 columns in tiles of 12: padding
    packed_check("LayerNormalization", args, [padded, *plain], [padded], {"axis": -1}, consts={1, 2},
                 expect_path="unpacked", rtol=1e-5, atol=1e-5)


def test_instance_normalization_runs_on_channels_last_buffers(packed_check, rng):
    x = _x(rng) * 3 + 1
    scale, bias = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    packed_check("InstanceNormalization", [x, scale, bias], [NHWC, None, None], [NHWC], {"epsilon": 1e-5},
                 consts={1, 2}, expect_path="native", rtol=1e-5, atol=1e-5)
