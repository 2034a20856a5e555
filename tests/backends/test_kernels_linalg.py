"""MatMul, Gemm and Conv against onnxruntime, with weights both constant (prepared once by
the factory) and computed at run time, on awkward shapes: 3 channels, odd spatial sizes,
strides, dilations, asymmetric pads, auto_pad, groups and depthwise."""
import numpy as np
import pytest

from tilefold.backends.numpy.kernels.common import window_geometry
from tilefold.backends.numpy.kernels.linalg import conv, conv_weight_matrix

from .conftest import node_model

F32 = np.float32


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 5), (5, 7)), ((2, 3, 5, 7), (7, 4)), ((5,), (5, 3)), ((3, 5), (5,)), ((5,), (5,)),
    ((2, 1, 3, 4), (5, 4, 6)), ((1, 9, 6), (6, 2)), ((4, 3, 6), (4, 6, 5)),
])
@pytest.mark.parametrize("const_b", [False, True])
def test_matmul_follows_numpy_semantics(check, rng, a_shape, b_shape, const_b):
    check("MatMul", [normal(rng, *a_shape), normal(rng, *b_shape)], consts={1} if const_b else (), rtol=1e-5, atol=1e-5)


def test_matmul_on_a_transposed_input_and_on_integers(check, rng):
    check("MatMul", [rng.integers(-5, 5, (3, 4, 6)).astype(np.int32), rng.integers(-5, 5, (6, 2)).astype(np.int32)],
          rtol=0, atol=0)
    check("MatMul", [rng.integers(-5, 5, (2, 7)).astype(np.int64), rng.integers(-5, 5, (7, 3)).astype(np.int64)],
          rtol=0, atol=0)


@pytest.mark.parametrize("rows", [7, 64])
def test_a_stack_of_strided_matrices_meeting_one_matrix(rng, rows):
    """Swin's windows: (1, 2, 2, 3, 7, C) read from a (1, 2, 3, 2, 7, C) map. Small
    matrices are copied into one block of rows for one GEMM, larger ones run batched; both
    give numpy's product, and so does the packed kernel writing into a permuted result."""
    from tilefold.backends.numpy.kernels.linalg import matmul, stacked_rows
    from tilefold.backends.numpy.kernels.packed_linalg import permuted_product

    a = rng.standard_normal((1, 2, 3, 2, rows, 24)).astype(np.float32).transpose(0, 1, 3, 2, 4, 5)
    b = rng.standard_normal((24, 5)).astype(np.float32)
    want = np.einsum("...k,kn->...n", a.astype(np.float64), b.astype(np.float64))
    assert (stacked_rows(a, b) is not None) == (a.shape[-2] < 64)
    np.testing.assert_allclose(matmul(a, b), want, rtol=1e-5, atol=1e-5)
    for perm in ((0, 1, 2, 3, 4, 5), (0, 1, 3, 2, 4, 5)):
        physical = tuple(want.shape[p] for p in perm)
        _, view = permuted_product(perm, physical, np.dtype(np.float32))(a, b)
        np.testing.assert_allclose(view, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (7,), (5, 1), (5, 7)])
@pytest.mark.parametrize("consts", [(), (1, 2)])
def test_gemm_transposes_scales_and_broadcasts_c(check, rng, trans_a, trans_b, c_shape, consts):
    a = normal(rng, *((9, 5) if trans_a else (5, 9)))
    b = normal(rng, *((7, 9) if trans_b else (9, 7)))
    c = None if c_shape is None else normal(rng, *c_shape)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.7, "beta": -1.3}
    check("Gemm", [a, b, c], attrs, consts=[i for i in consts if i < 2 or c is not None], rtol=1e-5, atol=1e-5)


def test_gemm_defaults(check, rng):
    check("Gemm", [normal(rng, 4, 6), normal(rng, 6, 3), normal(rng, 3)], consts={1, 2}, rtol=1e-5, atol=1e-5)


CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 11, 9), (5, 3, 3, 3), {}),
    ((2, 3, 11, 9), (4, 3, 3, 3), {"pads": [1, 2, 0, 1], "strides": [2, 1]}),
    ((1, 3, 13, 13), (6, 3, 5, 3), {"strides": [2, 3], "dilations": [1, 2], "pads": [2, 1, 2, 1]}),
    ((1, 6, 9, 10), (4, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((2, 6, 9, 7), (6, 2, 3, 3), {"group": 3, "strides": [2, 2]}),
    ((1, 5, 10, 11), (10, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1]}),  # depthwise, multiplier 2
    ((2, 7, 8, 8), (7, 1, 5, 5), {"group": 7, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),  # depthwise
    ((1, 6, 14, 17), (6, 1, 3, 3), {"group": 6, "strides": [2, 3], "dilations": [2, 3], "pads": [0, 2, 1, 0]}),
    ((2, 4, 19), (8, 1, 5), {"group": 4, "strides": [2], "pads": [2, 2]}),  # 1-D depthwise, multiplier 2
    ((1, 3, 5, 6, 7), (3, 1, 3, 2, 3), {"group": 3, "dilations": [1, 2, 1], "pads": [1, 0, 1, 1, 1, 1]}),  # 3-D
    ((1, 3, 10, 7), (4, 3, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [3, 2]}),
    ((1, 4, 9, 8), (5, 4, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((2, 8, 7, 5), (6, 8, 1, 1), {}),  # pointwise: a GEMM on the NCHW buffer
    ((1, 8, 7, 5), (8, 2, 1, 1), {"group": 4}),  # grouped pointwise
    ((1, 8, 9, 9), (4, 8, 1, 1), {"strides": [2, 2]}),  # strided pointwise
    ((1, 4, 6, 6), (3, 4, 1, 1), {"pads": [1, 0, 0, 1]}),  # padded pointwise
    ((2, 3, 17), (4, 3, 4), {"strides": [3], "pads": [2, 1]}),  # 1-D
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 2]}),  # 3-D
    ((1, 2, 5, 6, 4), (4, 1, 2, 3, 3), {"group": 2, "dilations": [2, 1, 1]}),  # grouped 3-D
    ((2, 8, 9, 7), (3, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # few output channels: tap products
    ((1, 10, 5, 6), (4, 10, 3, 5), {"pads": [4, 1, 2, 5], "dilations": [2, 1]}),  # taps reaching only padding
    ((1, 6, 12), (2, 6, 5), {"auto_pad": "SAME_UPPER"}),  # 1-D tap products
    ((1, 6, 4, 5, 6), (3, 6, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 1]}),  # 3-D tap products
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_with_constant_weights(check, rng, x_shape, w_shape, attrs, bias):
    args = [normal(rng, *x_shape), normal(rng, *w_shape)] + ([normal(rng, w_shape[0])] if bias else [])
    check("Conv", args, attrs, consts={1, 2}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attrs", CONV_CASES[::3])
def test_conv_with_weights_computed_at_run_time(check, rng, x_shape, w_shape, attrs):
    check("Conv", [normal(rng, *x_shape), normal(rng, *w_shape), normal(rng, w_shape[0])], attrs,
          rtol=1e-4, atol=1e-4)


CONV_TRANSPOSE_CASES = [
    ((2, 3, 5, 4), (3, 4, 3, 3), {}),
    ((1, 4, 5, 5), (4, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 4, 6, 5), (4, 3, 2, 3), {"group": 2, "strides": [2, 3], "dilations": [2, 1]}),  # 6 outputs
    ((1, 2, 7), (2, 3, 4), {"strides": [3], "pads": [2, 1]}),  # 1-D
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2]}),  # 3-D
    ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}),  # pads implied
    ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", CONV_TRANSPOSE_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(check, rng, x_shape, w_shape, attrs, bias):
    out_channels = w_shape[1] * attrs.get("group", 1)
    args = [normal(rng, *x_shape), normal(rng, *w_shape)] + ([normal(rng, out_channels)] if bias else [])
    check("ConvTranspose", args, attrs, consts={1, 2}, rtol=1e-4, atol=1e-4)


def test_conv_same_padding_with_dilations(check, rng):
    # onnxruntime refuses dilations with auto_pad SAME_*; onnx.reference implements them
    check("Conv", [normal(rng, 1, 3, 10, 7), normal(rng, 4, 3, 3, 2)], {"auto_pad": "SAME_UPPER", "dilations": [2, 2]},
          consts={1}, rtol=1e-4, atol=1e-4, reference="onnx")


def test_conv_with_explicit_kernel_shape_attribute(check, rng):
    check("Conv", [normal(rng, 1, 3, 8, 8), normal(rng, 2, 3, 3, 3)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
          consts={1}, rtol=1e-4, atol=1e-4)


def test_conv_returns_a_fresh_contiguous_nchw_array(rng):
    x = normal(rng, 1, 3, 9, 9)
    w = normal(rng, 4, 3, 3, 3)
    y = conv(x, conv_weight_matrix(w, 1), (3, 3), {"strides": [2, 2]}, None)
    assert y.shape == (1, 4, 4, 4) and y.flags.c_contiguous and not np.shares_memory(y, x)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 16, 13, 13), (40, 16, 1, 1), {}),  # the light SqueezeNet's last conv, shrunk
    ((2, 6, 9, 7), (6, 2, 3, 3), {"group": 3, "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    ((1, 32, 16, 16), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # where Winograd would run
    ((1, 5, 10, 11), (10, 1, 3, 3), {"group": 5, "dilations": [2, 1]}),
])
@pytest.mark.parametrize("target", [None, "cpu"])
def test_conv_with_a_splat_weight_gives_equal_channels_per_group(rng, x_shape, w_shape, attrs, target):
    """A ConstantOfShape weight stays a splat, on the plain and the channels-last kernel: each
    group's output channels are then the same numbers bit for bit (a uniform softmax over them
    stays uniform), and match onnxruntime."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    import tilefold

    def splat(name: str, value: float) -> onnx.NodeProto:
        fill = helper.make_tensor("fill", onnx.TensorProto.FLOAT, [1], [value])
        return helper.make_node("ConstantOfShape", [f"{name}_shape"], [name], value=fill)

    nodes = [splat("w", 0.37), splat("b", -1.5), helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)]
    graph = helper.make_graph(
        nodes, "splat_conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array(w_shape, np.int64), "w_shape"),
                     numpy_helper.from_array(np.array(w_shape[:1], np.int64), "b_shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = normal(rng, *x_shape) * F32(1e4)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    graph = tilefold.load(model)
    if target is not None:
        graph = tilefold.optimize(graph, target).graph
        assert graph.node(next(n.name for n in graph.nodes() if n.op == "Conv")).outputs[0].encoding is not None
    got = tilefold.compile(graph)({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    groups = attrs.get("group", 1)
    per_group = got.reshape(got.shape[0], groups, w_shape[0] // groups, -1)
    assert (per_group == per_group[:, :, :1]).all()


@pytest.mark.parametrize("size, kernel, attrs, expected", [
    (10, 3, {}, ((0,), (0,), (8,))),
    (10, 3, {"pads": [1, 2]}, ((1,), (2,), (11,))),
    (10, 3, {"auto_pad": "SAME_UPPER", "strides": [3]}, ((1,), (1,), (4,))),
    (10, 2, {"auto_pad": "SAME_UPPER", "strides": [3]}, ((0,), (1,), (4,))),
    (10, 4, {"auto_pad": "SAME_LOWER"}, ((2,), (1,), (10,))),
    (10, 3, {"auto_pad": "VALID", "strides": [2], "dilations": [2]}, ((0,), (0,), (3,))),
])
def test_window_geometry(size, kernel, attrs, expected):
    geo = window_geometry(attrs, (size,), (kernel,))
    assert (geo.pads_begin, geo.pads_end, geo.out_shape) == expected


@pytest.mark.parametrize("n, c, f, h, w, pads", [
    (1, 3, 4, 9, 8, (1, 1, 1, 1)), (2, 5, 7, 11, 6, (2, 1, 0, 3)), (1, 1, 1, 4, 4, (0, 0, 0, 0)),
    (1, 2, 3, 5, 4, (3, 3, 3, 3)), (1, 6, 2, 8, 13, (0, 1, 1, 0)), (3, 4, 4, 7, 7, (1, 1, 1, 1)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [False, True])
def test_winograd_matches_im2col(rng, n, c, f, h, w, pads, dtype, bias):
    from tilefold.backends.numpy.kernels.winograd import weight_transform, winograd_conv

    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    weights = rng.standard_normal((f, c, 3, 3)).astype(dtype)
    b = rng.standard_normal(f).astype(dtype) if bias else None
    expected = conv(x, conv_weight_matrix(weights, 1), (3, 3), {"pads": pads}, b)
    got = winograd_conv(x, weight_transform(weights), pads, b)
    assert got.shape == expected.shape and got.dtype == dtype and got.flags.c_contiguous
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())


@pytest.mark.parametrize("x_shape, attrs, consts", [
    ((1, 16, 14, 13), {"pads": [1, 1, 1, 1]}, {1, 2}),
    ((2, 24, 12, 12), {"auto_pad": "SAME_UPPER"}, {1, 2}),
    ((1, 16, 15, 16), {"pads": [0, 2, 1, 0]}, ()),
])
def test_large_3x3_convolutions_take_the_winograd_path(check, rng, monkeypatch, x_shape, attrs, consts):
    from tilefold.backends.numpy.kernels import linalg

    calls = []
    original = linalg.winograd_conv
    monkeypatch.setattr(linalg, "winograd_conv", lambda *a: calls.append(a[0].shape) or original(*a))
    c = x_shape[1]
    args = [normal(rng, *x_shape), normal(rng, 16, c, 3, 3) * 0.2, normal(rng, 16)]
    check("Conv", args, attrs, consts=consts, rtol=1e-4, atol=1e-4)
    assert calls == [x_shape]


@pytest.mark.parametrize("consts", [{1, 2}, ()])
def test_convs_with_few_output_channels_take_tap_products(check, rng, monkeypatch, consts):
    from tilefold.backends.numpy.kernels import linalg

    calls = []
    original = linalg.conv_taps
    monkeypatch.setattr(linalg, "conv_taps", lambda *a: calls.append(a[0].shape) or original(*a))
    args = [normal(rng, 2, 16, 9, 8), normal(rng, 8, 16, 3, 3) * 0.2, normal(rng, 8)]
    check("Conv", args, {"pads": [1, 0, 2, 1], "strides": [1, 1]}, consts=consts, rtol=1e-4, atol=1e-4)
    assert calls == [(2, 16, 9, 8)]


@pytest.mark.parametrize("x_shape, kernel, strides, pads", [
    ((2, 3, 17, 19), (3, 4), (2, 3), (1, 2, 0, 1)),
    ((1, 2, 9), (5,), (3,), (2, 1)),  # 1-D
    ((1, 2, 7, 8, 9), (2, 3, 2), (2, 2, 3), (0, 1, 1, 1, 0, 2)),  # 3-D
    ((1, 4, 10, 10), (1, 1), (2, 2), (0, 0, 0, 0)),  # fewer taps than phases
    ((1, 3, 11, 11), (7, 7), (2, 2), (3, 3, 3, 3)),
    ((1, 1, 5, 5), (2, 2), (4, 4), (0, 0, 1, 1)),  # stride beyond the kernel
])
def test_strided_columns_from_stride_phases_equal_the_windows_copy(rng, x_shape, kernel, strides, pads):
    from tilefold.backends.numpy.kernels.common import _phase_columns, windows

    x = normal(rng, *x_shape)
    geo = window_geometry({"strides": strides, "pads": pads}, x_shape[2:], kernel)
    nd = len(kernel)
    want = windows(x, geo).transpose(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
    np.testing.assert_array_equal(_phase_columns(x, geo), want)


@pytest.mark.parametrize("target", [None, "cpu"])
def test_a_strided_stem_conv_with_long_rows_reads_stride_phases(rng, monkeypatch, target):
    """ResNet's 7x7/2 stem, shrunk in height: its columns come from the stride phases, on the
    plain and the channels-last kernel, and it matches onnxruntime."""
    import onnxruntime as ort

    import tilefold
    from tilefold.backends.numpy.kernels import common

    calls = []
    original = common._phase_columns
    monkeypatch.setattr(common, "_phase_columns", lambda x, geo: calls.append(x.shape) or original(x, geo))
    args = [normal(rng, 1, 3, 9, 200), normal(rng, 8, 3, 7, 7), normal(rng, 8)]
    model, feeds = node_model("Conv", args, {"strides": [2, 2], "pads": [3, 3, 3, 3]}, 1, consts={1, 2})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    graph = tilefold.load(model)
    if target is not None:
        graph = tilefold.optimize(graph, target).graph
    got = next(iter(tilefold.compile(graph)(feeds).values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert calls == [(1, 3, 9, 200)]


@pytest.mark.parametrize("const", [(), (1, 2)])
def test_float16_linear_algebra_runs_in_float32_and_returns_float16(check, rng, const):
    h = np.float16
    check("MatMul", [normal(rng, 2, 5, 6).astype(h), normal(rng, 6, 3).astype(h)], consts=const[:1],
          rtol=2e-3, atol=2e-3)
    check("Gemm", [normal(rng, 4, 6).astype(h), normal(rng, 3, 6).astype(h), normal(rng, 3).astype(h)],
          {"transB": 1, "alpha": 0.5}, consts=const, rtol=2e-3, atol=2e-3)
    check("Conv", [normal(rng, 1, 3, 7, 6).astype(h), normal(rng, 4, 3, 3, 3).astype(h), normal(rng, 4).astype(h)],
          {"pads": [1, 1, 1, 1]}, consts=const, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("equation, shapes", [
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("bhqd, bhkd -> bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),  # attention scores, spaces included
    ("...ij,...jk->...ik", [(2, 4, 3, 5), (2, 4, 5, 6)]),
    ("...ii->...i", [(3, 4, 4)]),
    ("ij->ji", [(3, 5)]),
    ("ij", [(3, 5)]),
    ("ji", [(3, 5)]),  # implicit output: the labels sorted, so a transpose
    ("i,i", [(7,), (7,)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("b i d, j d", [(2, 3, 4), (5, 4)]),
    ("ii", [(4, 4)]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_einsum(check, rng, equation, shapes, dtype):
    check("Einsum", [rng.standard_normal(s).astype(dtype) for s in shapes], {"equation": equation},
          rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_einsum_on_integers_keeps_their_type(check, rng, dtype):
    a, b = rng.integers(-5, 5, (2, 3, 4)).astype(dtype), rng.integers(-5, 5, (2, 4, 6)).astype(dtype)
    check("Einsum", [a, b], {"equation": "bij,bjk->bik"}, rtol=0, atol=0)
    check("Einsum", [a], {"equation": "bij->j"}, rtol=0, atol=0)


def test_einsum_returns_a_fresh_array_for_a_transpose_or_a_diagonal(run, rng):
    """np.einsum gives views for these; `run` is in debug mode, which fails on an undeclared view."""
    x = rng.standard_normal((4, 4)).astype(F32)
    (t,) = run("Einsum", [x], {"equation": "ij->ji"})
    (d,) = run("Einsum", [x], {"equation": "ii->i"})
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(d, np.diag(x))
