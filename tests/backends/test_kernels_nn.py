"""Normalizations, softmax, LRN, pooling and dropout against onnxruntime."""
import numpy as np
import pytest

from tilefold.backends.numpy import KERNELS, KernelSpec
from tilefold.graph import Graph, TensorType, UnsupportedOpError

F32 = np.float32


def normal(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (1, 3, 7, 5), (2, 5, 3, 4, 3)])
@pytest.mark.parametrize("consts", [(), (1, 2, 3, 4)])
def test_batch_normalization_inference(check, rng, shape, consts):
    c = shape[1]
    args = [normal(rng, *shape), normal(rng, c), normal(rng, c), normal(rng, c), rng.uniform(0.5, 2, c).astype(F32)]
    check("BatchNormalization", args, {"epsilon": 1e-3}, consts=consts, rtol=1e-5, atol=1e-5)


def test_batch_normalization_in_training_mode_is_refused():
    g = Graph()
    node = g.add_node("BatchNormalization", [], [TensorType((2, 3), np.float32)], {"training_mode": 1}, name="bn")
    with pytest.raises(UnsupportedOpError, match="training_mode") as info:
        KERNELS["BatchNormalization"].build(KernelSpec(node, [TensorType((2, 3), np.float32)] * 5, [None] * 5))
    assert "'bn'" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("shape, axis", [((4, 7), -1), ((2, 5, 6), -1), ((2, 5, 6), 1), ((3, 2, 4, 5), -2)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_normalization(check, rng, shape, axis, bias):
    norm_shape = shape[axis:]
    args = [normal(rng, *shape, scale=3.0) + 2, normal(rng, *norm_shape)] + ([normal(rng, *norm_shape)] if bias else [])
    check("LayerNormalization", args, {"axis": axis, "epsilon": 1e-4}, consts={1, 2}, rtol=1e-4, atol=1e-5)


def test_layer_normalization_mean_and_inverse_std_outputs(check, rng):
    x = normal(rng, 3, 4, 6) * 2 + 1
    check("LayerNormalization", [x, normal(rng, 4, 6), normal(rng, 4, 6)], {"axis": 1}, n_outputs=3,
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (2, 2, 3, 4, 5)])
@pytest.mark.parametrize("epsilon", [1e-5, 0.1])
def test_instance_normalization(check, rng, shape, epsilon):
    c = shape[1]
    check("InstanceNormalization", [normal(rng, *shape) * 3 + 1, normal(rng, c), normal(rng, c)],
          {"epsilon": epsilon}, rtol=1e-4, atol=1e-5)


def test_layer_normalization_of_float16_computes_in_float32(check, rng):
    x = normal(rng, 5, 8).astype(np.float16)
    check("LayerNormalization", [x, normal(rng, 8).astype(np.float16)], {}, rtol=5e-3, atol=5e-3, reference="onnx")


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(check, rng, size):
    check("LRN", [normal(rng, 2, 7, 5, 4, scale=2.0)], {"size": size, "alpha": 0.02, "beta": 0.6, "bias": 1.5},
          rtol=1e-5, atol=1e-6)


def test_lrn_with_an_even_size_follows_the_spec_formula(run, rng):
    # onnxruntime takes odd sizes only and onnx.reference's LRN loops over the wrong axis,
    # so the reference is the spec's formula written out per channel.
    x = normal(rng, 2, 6, 3, 4, scale=2.0)
    size, alpha, beta, bias = 4, 0.02, 0.6, 1.5
    (y,) = run("LRN", [x], {"size": size, "alpha": alpha, "beta": beta, "bias": bias})
    expected = np.empty_like(x)
    for c in range(x.shape[1]):
        low, high = max(0, c - (size - 1) // 2), min(x.shape[1] - 1, c + -(-(size - 1) // 2))
        square_sum = (x[:, low:high + 1] ** 2).sum(axis=1)
        expected[:, c] = x[:, c] / (bias + alpha / size * square_sum) ** beta
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_is_stable_on_large_inputs(check, rng, op, axis):
    x = normal(rng, 3, 4, 5, scale=50.0) + 1000
    check(op, [x], {"axis": axis}, rtol=1e-5, atol=1e-5)


POOLS = [
    # (x shape, attrs)
    ((1, 3, 11, 9), {"kernel_shape": [3, 3]}),
    ((2, 3, 11, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 10, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 9, 11), {"kernel_shape": [2, 3], "strides": [2, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 12, 11), {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [1, 2]}),
    ((1, 3, 10, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 10, 7), {"kernel_shape": [2, 2], "strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 10, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "VALID"}),
    ((2, 3, 13), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
    ((1, 1, 9, 9), {"kernel_shape": [9, 9]}),  # more offsets than the accumulation loop handles
]


@pytest.mark.parametrize("x_shape, attrs", POOLS)
def test_max_pool(check, rng, x_shape, attrs):
    check("MaxPool", [normal(rng, *x_shape)], attrs)


@pytest.mark.parametrize("x_shape, attrs", POOLS)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(check, rng, x_shape, attrs, include_pad):
    check("AveragePool", [normal(rng, *x_shape)], {**attrs, "count_include_pad": include_pad}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("x_shape, attrs", [POOLS[1], POOLS[3], POOLS[4], POOLS[8], POOLS[9]])
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(check, rng, x_shape, attrs, storage_order):
    if storage_order and len(x_shape) != 4:
        pytest.skip("onnxruntime implements column-major indices for 2-D pooling only")
    check("MaxPool", [normal(rng, *x_shape)], {**attrs, "storage_order": storage_order}, n_outputs=2)


@pytest.mark.parametrize("n_outputs", [1, 2])
def test_max_pool_propagates_nan_as_pytorch_does_with_or_without_indices(run, rng, n_outputs):
    torch = pytest.importorskip("torch")
    x = normal(rng, 2, 3, 9, 8)
    x[0, 0, 0, 0] = x[1, 2, 4, 5] = np.nan
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    got = run("MaxPool", [x], attrs, n_outputs=n_outputs)
    want, indices = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(got[0], want.numpy())  # NaN where a window holds one
    assert np.isnan(got[0]).sum() == 3
    if n_outputs == 2:  # PyTorch's indices are flat within each (n, c) plane, ONNX's over the tensor
        np.testing.assert_array_equal(got[1], indices.numpy() + 9 * 8 * np.arange(6).reshape(2, 3, 1, 1))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_on_integers_pads_with_the_lowest_value(check, rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (1, 2, 7, 6)).astype(dtype)
    check("MaxPool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 3, 5, 9), (2, 2, 3, 4, 5)])
def test_global_pools(check, rng, op, shape):
    check(op, [normal(rng, *shape)], rtol=1e-5, atol=1e-6)


def test_dropout_in_inference_passes_data_and_a_true_mask(check, rng):
    x = normal(rng, 3, 4)
    y, mask = check("Dropout", [x, np.array(0.3, F32)], {"seed": 2}, n_outputs=2)
    assert mask.all()
    check("Dropout", [x, np.array(0.0, F32), np.array(True)], n_outputs=2, consts={1, 2})
