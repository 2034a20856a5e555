"""Op registry entries: declarations against the ONNX schemas, symbolic dims, iteration
signatures, layout kinds and error messages. (Shapes and dtypes on real data are checked
against ONNX's conformance cases in test_ops_conformance.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from tilefold.graph import registry
from tilefold.graph.errors import UnsupportedOpError, VerifyError
from tilefold.graph.ops import ONNX_OPS
from tilefold.graph.ops.shapes import fresh, is_fresh, rename_fresh
from tilefold.graph.signature import Signature
from tilefold.graph.types import Splat, TensorType

onnx = pytest.importorskip("onnx")
from onnx import defs, helper  # noqa: E402


F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)


def T(*shape, dtype=F32) -> TensorType:
    return TensorType(shape, dtype)


def infer(op, types, consts=None, **attrs):
    return registry.infer(op, attrs, types, consts)


def sig(op, types, consts=None, **attrs) -> Signature | None:
    opdef = registry.get(op)
    full = {**opdef.defaults, **attrs}
    outs = registry.infer(op, attrs, types, consts)
    return opdef.signature(full, types, outs, consts)


# ---- declarations ----------------------------------------------------------------------
def test_every_claimed_onnx_op_is_registered():
    assert len(ONNX_OPS) == 128
    assert all(registry.is_registered(op) for op in ONNX_OPS)


@pytest.mark.parametrize("op", sorted(ONNX_OPS))
def test_arity_and_defaults_follow_the_opset_21_schema(op):
    schema = defs.get_schema(op, registry.CANONICAL_OPSET)
    opdef = registry.get(op)
    assert opdef.min_inputs == schema.min_input
    assert opdef.max_inputs == (None if schema.max_input == 2**31 - 1 else schema.max_input)
    expected = {}
    for name, attr in schema.attributes.items():
        if attr.default_value.name:
            value = helper.get_attribute_value(attr.default_value)
            expected[name] = value.decode() if isinstance(value, bytes) else value
    if op == "Identity":
        return  # graph-structure entry in core.py, no attributes
    assert opdef.defaults == expected
    assert opdef.pure


@pytest.mark.parametrize("op, layout, splat", [
    ("Relu", "agnostic", "elementwise"), ("Add", "agnostic", "elementwise"),
    ("Where", "agnostic", "elementwise"), ("Clip", "agnostic", "elementwise"),
    ("Cast", "agnostic", "elementwise"), ("Dropout", "agnostic", "movement"),
    ("MatMul", "anchor", None), ("Gemm", "anchor", None), ("Conv", "anchor", None),
    ("ReduceMean", "sensitive", None), ("Softmax", "sensitive", None),
    ("LayerNormalization", "sensitive", None), ("MaxPool", "sensitive", None),
    ("BatchNormalization", "sensitive", None), ("Concat", "sensitive", None),
    ("Reshape", "sensitive", "movement"), ("Transpose", "sensitive", "movement"),
    ("Expand", "sensitive", "movement"), ("Slice", "sensitive", "movement"),
    ("Tile", "opaque", "movement"), ("Gather", "sensitive", None), ("Resize", "sensitive", None),
    ("Shape", "opaque", None),
])
def test_layout_kind_and_splat_behaviour(op, layout, splat):
    opdef = registry.get(op)
    assert (opdef.layout, opdef.splat) == (layout, splat)


# ---- symbolic dims -----------------------------------------------------------------------
def test_broadcast_keeps_named_batch_dims():
    (out,) = infer("Add", [T("batch", 1, 8), T(4, 1)])
    assert out.shape == ("batch", 4, 8)
    (cmp,) = infer("Less", [T("batch", "seq"), T("seq")])
    assert cmp.shape == ("batch", "seq") and cmp.dtype == np.bool_


def test_matmul_with_symbolic_batch_and_vectors():
    assert infer("MatMul", [T("b", 1, 5, 7), T(3, 7, 2)])[0].shape == ("b", 3, 5, 2)
    assert infer("MatMul", [T(7), T("b", 7, 2)])[0].shape == ("b", 2)
    assert infer("MatMul", [T("b", 5, "k"), T("k")])[0].shape == ("b", 5)


def test_reshape_resolves_minus_one_through_symbols():
    shape = np.array([0, -1, 64], dtype=np.int64)
    assert infer("Reshape", [T("b", "s", 768), T(3, dtype=I64)], [None, shape])[0].shape == ("b", "s*12", 64)
    merge = np.array([-1, 768], dtype=np.int64)
    assert infer("Reshape", [T("b", 12, 64), T(2, dtype=I64)], [None, merge])[0].shape == ("b", 768)
    unknown = infer("Reshape", [T("b", 12, 64), T(2, dtype=I64)])[0].shape
    assert len(unknown) == 2 and all(is_fresh(d) for d in unknown)


def test_data_dependent_shapes_use_constants_or_fresh_dims():
    shape = Splat(7, (2,), I64)  # a splat shape tensor is [7, 7]
    assert infer("ConstantOfShape", [T(2, dtype=I64)], [shape])[0].shape == (7, 7)
    out = infer("Expand", [T("n", 1), T(2, dtype=I64)])[0].shape
    assert out[0] == "n" and is_fresh(out[1])
    assert infer("Concat", [T("n", 3), T("m", 3)], axis=0)[0].shape == ("n+m", 3)
    assert infer("Flatten", [T("n", "c", 4)], axis=1)[0].shape == ("n", "c*4")
    assert infer("Pad", [T("h", 3), T(4, dtype=I64)], [None, np.array([1, 0, 1, -1])])[0].shape == ("h+2", 2)


def test_data_movement_ops_keep_symbols_and_go_fresh_where_a_value_decides():
    assert infer("DepthToSpace", [T("n", 8, "h", 3)], blocksize=2, mode="CRD")[0].shape == ("n", 2, "h*2", 6)
    assert infer("SpaceToDepth", [T("n", 3, 4, 6)], blocksize=2)[0].shape == ("n", 12, 2, 3)
    height = infer("SpaceToDepth", [T(1, 3, "h", 6)], blocksize=2)[0].shape[2]
    assert is_fresh(height)
    hot = [T("n", 3, dtype=I64), T(dtype=I64), T(2, dtype=np.int32)]
    assert infer("OneHot", hot, [None, np.array(5), None], axis=1)[0] == T("n", 5, 3, dtype=np.int32)
    assert is_fresh(infer("OneHot", hot)[0].shape[2])
    (coords,) = infer("NonZero", [T("n", 4)])
    assert coords.shape[0] == 2 and is_fresh(coords.shape[1]) and coords.dtype == I64
    assert infer("NonZero", [T(5)], [np.array([0, 3, 0, 1, 2])])[0].shape == (1, 3)
    assert infer("EyeLike", [T("n", 4)], dtype=7)[0] == T("n", 4, dtype=I64)
    scatter = [T("n", 6), T("n", 2, dtype=I64), T("n", 2)]
    assert infer("ScatterElements", scatter, axis=1, reduction="max")[0] == T("n", 6)
    assert infer("ScatterND", [T(4, 5, 6), T("k", 2, dtype=I64), T("k", 6)])[0] == T(4, 5, 6)


@pytest.mark.parametrize("equation, shapes, result", [
    ("bij,bjk->bik", [(2, 3, 4), ("b", 4, 5)], (2, 3, 5)),
    ("...ij,...jk", [("n", 1, 3, 4), (7, 4, 5)], ("n", 7, 3, 5)),  # implicit: ellipsis, then i, k
    ("...ii->...i", [(2, 3, 3)], (2, 3)),
    ("ji", [(2, 3)], (3, 2)),  # implicit output sorts the labels: a transpose
    ("i,i", [(4,), (1,)], ()),
    ("->", [()], ()),
    ("bhqd, bhkd -> bhqk", [(1, 2, 5, 8), (1, 2, 7, 8)], (1, 2, 5, 7)),
])
def test_einsum_result_shape_follows_the_equation(equation, shapes, result):
    assert infer("Einsum", [T(*shape, dtype=np.int32) for shape in shapes], equation=equation)[0] == \
        T(*result, dtype=np.int32)


def test_fresh_dims_are_renamed_per_node_and_then_equal_themselves():
    (t,) = rename_fresh([T(fresh("Reshape", 0), 3)], "reshape_7")
    assert t.shape == ("reshape_7/Reshape#0", 3) and not is_fresh(t.shape[0])


def test_multi_output_ops_return_every_possible_output():
    assert [t.dtype for t in infer("Dropout", [T(2, 3)])] == [F32, np.bool_]
    pool = infer("MaxPool", [T(1, 3, 8, 8)], kernel_shape=(2, 2), strides=(2, 2))
    assert [(t.shape, t.dtype) for t in pool] == [((1, 3, 4, 4), F32), ((1, 3, 4, 4), I64)]
    norm = infer("LayerNormalization", [T(2, 5, 8), T(8)], axis=-1)
    assert [t.shape for t in norm] == [(2, 5, 8), (2, 5, 1), (2, 5, 1)]
    parts = infer("Split", [T(10, 4)], num_outputs=3)
    assert [t.shape for t in parts] == [(4, 4), (4, 4), (2, 4)]


def test_a_ceil_mode_window_may_overhang_the_input_as_in_pytorch():
    """EfficientNet's pooler (kernel 320, ceil_mode) on a 2x2 map gives one window; without
    ceil_mode the same window is an error (see the inconsistent-inputs cases below)."""
    assert infer("AveragePool", [T(1, 3, 2, 2)], kernel_shape=(320, 320), strides=(320, 320),
                 ceil_mode=1)[0].shape == (1, 3, 1, 1)
    assert infer("MaxPool", [T(1, 3, 5, 6)], kernel_shape=(7, 7), strides=(7, 7), ceil_mode=1)[0].shape == (1, 3, 1, 1)


# ---- signatures ----------------------------------------------------------------------------
def test_matmul_signature_reduces_k_and_broadcasts_batch():
    s = sig("MatMul", [T(1, 5, 7), T(3, 7, 2)])
    assert s.operands == ((None, "m", "k"), ("a", "k", "n")) and s.results == (("a", "m", "n"),)
    assert s.kind("k") == "reduction" and s.kind("m") == s.kind("n") == s.kind("a") == "parallel"


def test_gemm_signature_honours_transposes_and_bias():
    s = sig("Gemm", [T(7, 5), T(2, 7), T(2)], transA=1, transB=1)
    assert str(s) == "km,nk,n->mn reduction=k"


def test_conv_signature_has_window_and_reduction_dims():
    s = sig("Conv", [T(1, 3, 9, 9), T(8, 3, 3, 3), T(8)], pads=(1, 1, 1, 1))
    assert str(s) == "nchw,fcrs,f->nfhw reduction=crs window=hw"


def test_transpose_signature_follows_perm():
    assert str(sig("Transpose", [T(2, 3, 4)], perm=(2, 0, 1))) == "abc->cab"
    assert str(sig("Transpose", [T(2, 3)])) == "ab->ba"


def test_softmax_and_layernorm_reduce_their_normalized_axes():
    assert str(sig("Softmax", [T(2, 3, 4)], axis=1)) == "abc->abc reduction=b"
    s = sig("LayerNormalization", [T(2, 5, 8), T(8), T(8)], axis=-1)
    assert str(s) == "abc,c,c->abc,ab1,ab1 reduction=c"


def test_reduction_signature_marks_kept_dims_as_singletons():
    axes = np.array([1], dtype=np.int64)
    keep = sig("ReduceMean", [T(2, 3, 4), T(1, dtype=I64)], [None, axes], keepdims=1)
    assert str(keep) == "abc,_->a1c reduction=b"
    drop = sig("ReduceSum", [T(2, 3, 4), T(1, dtype=I64)], [None, axes], keepdims=0)
    assert str(drop) == "abc,_->ac reduction=b"


def test_reduction_signature_without_constants_recovers_axes_only_when_unambiguous():
    opdef = registry.get("ReduceMax")
    attrs = {**opdef.defaults, "keepdims": 0}
    types = [T(2, 3, 4), T(1, dtype=I64)]
    assert str(opdef.signature(attrs, types, [T(2, 4)])) == "abc,_->ac reduction=b"
    assert opdef.signature(attrs, [T(3, 3), types[1]], [T(3)]) is None


def test_reshape_family_signatures_only_for_singleton_relabeling():
    axes = np.array([1], dtype=np.int64)
    assert str(sig("Unsqueeze", [T("n", 4), T(1, dtype=I64)], [None, axes])) == "ab,_->a1b"
    assert str(sig("Squeeze", [T("n", 1, 4), T(1, dtype=I64)], [None, axes])) == "a1b,_->ab"
    merge = np.array([6, 4], dtype=np.int64)
    assert sig("Reshape", [T(2, 3, 4), T(2, dtype=I64)], [None, merge]) is None
    assert sig("Flatten", [T(2, 3, 4)], axis=1) is None
    assert str(sig("Flatten", [T(1, 3, 1)], axis=1)) == "1a1->1a"


def test_movement_signatures():
    shape = np.array([5, 3, 4], dtype=np.int64)
    assert str(sig("Expand", [T(3, 1), T(3, dtype=I64)], [None, shape])) == "b1,_->abc"
    assert str(sig("Concat", [T(2, 3), T(2, 5)], axis=1)) == "ab,ab->ab"
    starts, ends, axes = (np.array([v], dtype=np.int64) for v in (0, 2, 1))
    ints = T(1, dtype=I64)
    forward = sig("Slice", [T(4, 6), ints, ints, ints, ints], [None, starts, ends, axes, np.array([1])])
    assert str(forward) == "ab,_,_,_,_->ab"
    backward = [None, ends, starts, axes, np.array([-1])]
    assert sig("Slice", [T(4, 6), ints, ints, ints, ints], backward) is None
    assert registry.get("Tile").signature is None


def test_resampling_signatures_make_the_moved_axes_window_dims():
    """Gather along one axis by a 1-D or scalar index, Resize with a known plan: the other
    axes pass."""
    rows = T(6, dtype=I64)
    assert str(sig("Gather", [T(2, 3, 4), rows], axis=1)) == "abc,_->abc window=b"
    assert str(sig("Gather", [T(2, 3, 4), T(dtype=I64)], axis=1)) == "abc,_->ac window=b"  # a scalar drops it
    assert sig("Gather", [T(2, 3, 4), T(2, 6, dtype=I64)], axis=1) is None
    scales = np.array([1, 1, 2, 0.5], np.float32)
    x, four = T(1, 3, 4, 6), T(4)
    assert str(sig("Resize", [x, None, four], [None, None, scales])) == "abcd,_,_->abcd window=cd"
    assert sig("Resize", [x, None, four]) is None  # scales known only at run time
    sizes = np.array([1, 3, 4, 12], np.int64)
    assert str(sig("Resize", [x, None, None, T(4, dtype=I64)], [None, None, None, sizes])) == \
        "abcd,_,_,_->abcd window=d"
    symbolic = TensorType((1, 3, "h", "w"), np.float32)
    assert str(sig("Resize", [symbolic, None, four], [None, None, scales])) == "abcd,_,_->abcd window=cd"
    assert sig("Resize", [symbolic, None, None, T(4, dtype=I64)], [None, None, None, sizes]) is None
    crop = [None, np.array([0, 0, 0, 0, 1, 1, 1, 0.5], np.float32), np.ones(4, np.float32)]
    assert str(sig("Resize", [x, T(8), four], crop, coordinate_transformation_mode="tf_crop_and_resize")) == \
        "abcd,_,_->abcd window=d"


# ---- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("op, types, attrs, consts, needle", [
    ("MatMul", [T(2, 3), T(4, 5)], {}, None, "float32[2x3]"),
    ("Gemm", [T(2, 3), T(4, 5)], {}, None, "float32[4x5]"),
    ("Add", [T(2, 3), T(4)], {}, None, "float32[2x3]"),
    ("Concat", [T(2, 3), T(4, 5)], {"axis": 0}, None, "dim 1"),
    ("Conv", [T(1, 4, 8, 8), T(2, 3, 3, 3)], {}, None, "4 channels"),
    ("Reshape", [T(2, 3), T(1, dtype=I64)], {}, [None, np.array([5])], "float32[2x3]"),
    ("MaxPool", [T(1, 1, 2, 2)], {"kernel_shape": (3, 3)}, None, "window 3"),
    ("Squeeze", [T(2, 3), T(1, dtype=I64)], {}, [None, np.array([1])], "dim 1"),
    ("Transpose", [T(2, 3)], {"perm": (0, 0)}, None, "perm (0, 0)"),
    ("Add", [T(2), T(2, dtype=I64)], {}, None, "int64[2]"),
    ("BitwiseAnd", [T(2, 3, dtype=I64), T(3)], {}, None, "float32[3]"),
    ("BitwiseNot", [T(4)], {}, None, "float32[4]"),
    ("BitShift", [T(2, dtype=np.dtype(np.uint8)), T(2, dtype=np.dtype(np.uint8))], {"direction": "UP"}, None, "'UP'"),
    ("ScatterElements", [T(3, 4), T(2, 2, dtype=I64), T(2, 3)], {}, None, "float32[2x3]"),
    ("ScatterElements", [T(3, 4), T(2, 2, dtype=I64), T(2, 2)], {"reduction": "mean"}, None, "'mean'"),
    ("ScatterND", [T(3, 4), T(2, 1, dtype=I64), T(2, 3)], {}, None, "[2x4]"),
    ("ScatterND", [T(3, 4), T(2, 3, dtype=I64), T(2)], {}, None, "int64[2x3]"),
    ("DepthToSpace", [T(1, 6, 2, 2)], {"blocksize": 2}, None, "channel dim 6"),
    ("SpaceToDepth", [T(1, 3, 5, 4)], {"blocksize": 2}, None, "height 5"),
    ("OneHot", [T(3, dtype=I64), T(dtype=I64), T(2)], {}, [None, np.array(0), None], "depth 0"),
    ("OneHot", [T(3, dtype=I64), T(dtype=I64), T(3)], {}, None, "float32[3]"),
    ("Einsum", [T(2, 3), T(4, 5)], {"equation": "ij,jk->ik"}, None, "float32[4x5]"),
    ("Einsum", [T(2, 3)], {"equation": "ijk->i"}, None, "'ijk'"),
    ("Einsum", [T(2, 3, 4)], {"equation": "...ij->ij"}, None, "ellipsis"),
    ("EyeLike", [T(2, 3, 4)], {}, None, "float32[2x3x4]"),
])
def test_inconsistent_inputs_raise_one_line_naming_the_shapes(op, types, attrs, consts, needle):
    with pytest.raises(VerifyError) as info:
        infer(op, types, consts, **attrs)
    message = str(info.value)
    assert "\n" not in message and message.startswith(op) and needle in message


def test_unsupported_element_types_are_refused_with_their_name():
    with pytest.raises(UnsupportedOpError, match="float8e4m3fn"):
        infer("Cast", [T(2)], to=17)
    assert infer("Cast", [T(2)], to=10)[0].dtype == np.float16
    assert infer("Cast", [T(2)], to=16)[0].dtype.name == "bfloat16"  # an ml_dtypes type: the Triton backend's


def test_shape_and_size_values_follow_from_static_types():
    shape, size = registry.get("Shape"), registry.get("Size")
    attrs = {**shape.defaults, "start": 1}
    assert shape.static_value(attrs, [T("n", 3, 4)]).tolist() == [3, 4]
    assert shape.static_value(shape.defaults, [T("n", 3, 4)]) is None
    rng = np.random.default_rng(0)
    x = rng.standard_normal(tuple(rng.integers(1, 5, size=3)))
    assert shape.static_value({**shape.defaults, "end": -1}, [T(*x.shape)]).tolist() == list(x.shape[:-1])
    assert size.static_value({}, [T(*x.shape)]).dtype == I64 and size.static_value({}, [T(*x.shape)]) == x.size
    assert size.static_value({}, [T("n", 2)]) is None
    assert registry.get("Dropout").forwards == 0
