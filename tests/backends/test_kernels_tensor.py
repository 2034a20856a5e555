"""Shape and data-movement kernels against onnxruntime, with their shape-like inputs both
constant and computed at run time."""
import numpy as np
import pytest

I64 = np.int64


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def ints(*values):
    return np.array(values, I64)


@pytest.mark.parametrize("shape, target, allowzero", [
    ((2, 3, 4), (4, -1), 0), ((2, 3, 4), (0, 0, 2, 2), 0), ((2, 3, 4), (-1,), 0), ((2, 3, 4), (24, 1), 0),
    ((2, 0, 4), (0, 4, 2), 1), ((2, 6), (0, 3, -1), 0),
])
@pytest.mark.parametrize("const", [False, True])
def test_reshape(check, rng, shape, target, allowzero, const):
    check("Reshape", [normal(rng, *shape), ints(*target)], {"allowzero": allowzero}, consts={1} if const else ())


def test_reshape_copying_a_dim_past_the_input_rank_is_a_one_line_input_error(run, rng):
    """A 0 (copy the input dim) where the input has no such dim, in a shape computed at run time."""
    from tilefold.graph import InputError

    with pytest.raises(InputError, match=r"op Reshape.*: shape \[4, 0\] copies a dim past the rank of its input "
                                         r"of shape \(4,\)"):
        run("Reshape", [normal(rng, 4), ints(4, 0)])


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(check, rng, axis):
    check("Flatten", [normal(rng, 2, 3, 4)], {"axis": axis})


@pytest.mark.parametrize("perm", [None, (0, 2, 1, 3), (3, 1, 0, 2)])
def test_transpose(check, rng, perm):
    check("Transpose", [normal(rng, 2, 3, 4, 5)], {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("axes", [None, (1,), (-1, 1)])
def test_squeeze(check, rng, axes):
    args = [normal(rng, 3, 1, 4, 1)] + ([] if axes is None else [ints(*axes)])
    check("Squeeze", args)


@pytest.mark.parametrize("axes", [(0,), (2, 0), (-1,), (1, -1, 3)])
@pytest.mark.parametrize("const", [False, True])
def test_unsqueeze(check, rng, axes, const):
    check("Unsqueeze", [normal(rng, 3, 4), ints(*axes)], consts={1} if const else ())


@pytest.mark.parametrize("shape, target", [((3, 1), (2, 3, 4)), ((4,), (3, 1)), ((2, 1, 5), (1, 6, 1)), ((1,), ())])
def test_expand_broadcasts_both_ways(check, rng, shape, target):
    check("Expand", [normal(rng, *shape), ints(*target)])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(check, rng, axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for k, s in enumerate(shapes):
        s[axis] = k + 1
    check("Concat", [normal(rng, *s) for s in shapes], {"axis": axis})
    check("Concat", [normal(rng, 2, 2)], {"axis": 0})


@pytest.mark.parametrize("args, attrs", [
    ((ints(2, 3, 2),), {"axis": 1}),
    ((), {"axis": 1, "num_outputs": 3}),
    ((), {"axis": -1, "num_outputs": 2}),
    ((ints(7, 0),), {"axis": 1}),
    ((ints(7),), {"axis": 1}),
    ((), {"axis": 0, "num_outputs": 1}),
])
def test_split(check, rng, args, attrs):
    sizes = args[0] if args else None
    n_outputs = len(sizes) if sizes is not None else attrs["num_outputs"]
    check("Split", [normal(rng, 2, 7, 3), *args], attrs, n_outputs=n_outputs)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ((1,), (3,), None, None),
    ((0, 1), (-1, 1000), (1, 0), None),
    ((-1, 10), (-1000, -100), (2, 1), (-1, -2)),
    ((5,), (0,), (-1,), (-2,)),
    ((2, -3), (9223372036854775807, -1), (0, 2), (3, 1)),
    ((0,), (-9223372036854775808,), (1,), (-1,)),
])
@pytest.mark.parametrize("const", [False, True])
def test_slice_clamps_like_onnx(check, rng, starts, ends, axes, steps, const):
    args = [normal(rng, 7, 6, 5), ints(*starts), ints(*ends)]
    if axes is not None:
        args.append(ints(*axes))
    if steps is not None:
        args.append(ints(*steps))
    check("Slice", args, consts=set(range(1, len(args))) if const else ())


@pytest.mark.parametrize("indices, axis", [
    (np.array([[0, 2], [-1, 1]], I64), 0), (np.array([3, -4, 0], I64), 1), (np.array(-2, I64), 2),
    (np.array([1, 0], np.int32), -1),
])
def test_gather_with_negative_indices(check, rng, indices, axis):
    check("Gather", [normal(rng, 4, 5, 3), indices], {"axis": axis})
    check("Gather", [normal(rng, 4, 5, 3), indices], {"axis": axis}, consts={1})


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("narrower", [False, True])
def test_gather_elements(check, rng, axis, narrower):
    """Indices may be shorter than the data along the other axes too (onnxruntime and
    torch.gather read the leading part)."""
    x = normal(rng, 3, 4, 5)
    shape = [d - 1 for d in x.shape] if narrower else list(x.shape)
    shape[axis] = 2
    indices = rng.integers(-x.shape[axis], x.shape[axis], shape).astype(I64)
    check("GatherElements", [x, indices], {"axis": axis})


@pytest.mark.parametrize("data_shape, indices, batch_dims", [
    ((3, 4, 5), np.array([[0, 1], [2, -1]], I64), 0),
    ((3, 4, 5), np.array([[1], [0], [2]], I64), 0),
    ((3, 4, 5), np.array([[0, 1, 2]], I64), 0),
    ((2, 4, 5), np.array([[1], [3]], I64), 1),
    ((2, 3, 4, 5), np.array([[[1, 2], [0, 0]], [[2, 3], [1, 1]]], I64), 1),
    ((2, 3, 4, 5), np.array([[[1], [3]], [[0], [2]], [[3], [3]]], I64).reshape(2, 3, 1)[:, :, :1], 2),
    ((4, 5), np.array([2, -1], I64), 0),  # one element: a rank-0 result
])
def test_gather_nd(check, rng, data_shape, indices, batch_dims):
    check("GatherND", [normal(rng, *data_shape), indices], {"batch_dims": batch_dims})


@pytest.mark.parametrize("repeats", [(1, 1, 1), (2, 1, 3), (1, 4, 1)])
def test_tile(check, rng, repeats):
    check("Tile", [normal(rng, 2, 3, 2), ints(*repeats)])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads, axes", [
    ((1, 0, 2, 2, 1, 0), None), ((0, 2, 1, 1), (1, -1)), ((1, -1, 0, 2, 0, -2), None), ((0, 0, 0, 0, 0, 0), None),
])
def test_pad(check, rng, mode, pads, axes):
    args = [normal(rng, 3, 5, 4), ints(*pads), np.array(1.5, np.float32) if mode == "constant" else None]
    if axes is not None:
        args.append(ints(*axes))
    check("Pad", args, {"mode": mode})


def test_pad_on_integers_without_a_value(check, rng):
    check("Pad", [rng.integers(0, 9, (2, 3)).astype(np.int32), ints(1, 0, 0, 2)])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -5])
def test_trilu(check, rng, upper, k):
    args = [normal(rng, 2, 4, 5)] + ([] if k is None else [np.array(k, I64)])
    check("Trilu", args, {"upper": upper})


@pytest.mark.parametrize("start, end", [(None, None), (1, None), (-2, None), (0, -1), (-10, 10), (2, 1)])
def test_shape_slices_the_dims(check, rng, start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check("Shape", [normal(rng, 2, 3, 4)], attrs)


def test_size(check, rng):
    check("Size", [normal(rng, 2, 3, 4)])
    check("Size", [normal(rng, 0, 3)])


@pytest.mark.parametrize("value", [None, np.array([7], np.int32), np.array([-0.5], np.float64)])
def test_constant_of_shape(check, value):
    from onnx import numpy_helper

    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check("ConstantOfShape", [ints(2, 3)], attrs)


@pytest.mark.parametrize("start, limit, delta, dtype", [
    (0, 10, 3, I64), (10, -3, -4, np.int32), (1.5, 4.0, 0.4, np.float32), (5.0, 2.0, 1.0, np.float64),
])
def test_range(check, start, limit, delta, dtype):
    check("Range", [np.array(start, dtype), np.array(limit, dtype), np.array(delta, dtype)], rtol=1e-6)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape, block", [((2, 12, 3, 5), 2), ((1, 18, 2, 1), 3), ((2, 3, 4, 2), 1)])
def test_depth_to_space(check, rng, mode, shape, block):
    check("DepthToSpace", [normal(rng, *shape)], {"blocksize": block, "mode": mode})


@pytest.mark.parametrize("shape, block", [((2, 3, 6, 4), 2), ((1, 2, 3, 9), 3), ((2, 3, 4, 2), 1)])
def test_space_to_depth_inverts_depth_to_space_in_dcr_mode(check, run, rng, shape, block):
    x = normal(rng, *shape)
    (y,) = check("SpaceToDepth", [x], {"blocksize": block})
    np.testing.assert_array_equal(run("DepthToSpace", [y], {"blocksize": block})[0], x)


@pytest.mark.parametrize("shape", [(2, 8, 3, 5), (1, 4, 2, 2)])
def test_space_to_depth_in_crd_mode_inverts_depth_to_space_in_crd_mode(run, rng, shape):
    """CRD SpaceToDepth is opset 28 (onnxruntime lacks it): built in Python, checked as an inverse."""
    from tilefold.backends.numpy import NumpyExecutable
    from tilefold.graph import Graph
    from tilefold.graph.types import TensorType, Value

    x = normal(rng, *shape)
    (y,) = run("DepthToSpace", [x], {"blocksize": 2, "mode": "CRD"})
    g = Graph("s2d")
    inp = g.add_input("y", TensorType(y.shape, np.float32))
    out = g.add_node("SpaceToDepth", [inp], [TensorType(x.shape, np.float32)], {"blocksize": 2, "mode": "CRD"})
    g.add_output(Value(out.name), "x")
    np.testing.assert_array_equal(NumpyExecutable(g, debug=True)({"y": y})["x"], x)


@pytest.mark.parametrize("axis", [-1, 0, 1, -3])
@pytest.mark.parametrize("const", [False, True])
def test_one_hot_with_negative_and_out_of_range_indices(check, rng, axis, const):
    depth = 6
    indices = rng.integers(-depth - 2, depth + 2, (3, 4)).astype(I64)  # some outside [-depth, depth)
    values = rng.standard_normal(2).astype(np.float32)
    check("OneHot", [indices, np.array(depth, I64), values], {"axis": axis}, consts={1} if const else ())


@pytest.mark.parametrize("index_type, depth_type, value_type", [
    (np.int32, np.float32, np.float32), (np.float32, I64, I64), (I64, np.int32, np.float32),
])
def test_one_hot_types(check, rng, index_type, depth_type, value_type):
    indices = rng.integers(-5, 5, (2, 3, 2)).astype(index_type)
    values = rng.integers(-9, 9, 2).astype(value_type)
    check("OneHot", [indices, np.array([5], depth_type), values], {"axis": 2}, rtol=0, atol=0)


@pytest.mark.parametrize("shape, k, dtype", [((4, 4), 0, None), ((3, 5), 2, 11), ((5, 3), -1, 7), ((3, 5), 9, 6)])
def test_eye_like(check, rng, shape, k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", [rng.integers(-3, 3, shape).astype(np.int32)], attrs, rtol=0, atol=0)


@pytest.mark.parametrize("shape, dtype", [((3, 4, 5), np.float32), ((7,), I64), ((2, 6), np.bool_), ((), np.float32)])
def test_non_zero_coordinates_in_row_major_order(check, rng, shape, dtype):
    x = (rng.integers(0, 3, shape) * rng.standard_normal(shape)).astype(dtype)
    check("NonZero", [x], rtol=0, atol=0)
    check("NonZero", [np.zeros(shape, dtype)], rtol=0, atol=0)


def test_non_zero_sizes_its_consumers_at_run_time(rng):
    """NonZero -> Transpose -> GatherND -> Relu: dims known only at run time flow through."""
    import onnx
    from onnx import TensorProto, helper

    from tilefold import compile as compile_graph, load, optimize

    nodes = [helper.make_node("Greater", ["x", "zero"], ["mask"]), helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["coords"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "coords"], ["picked"]), helper.make_node("Relu", ["picked"], ["y"])]
    graph = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])],
                              initializer=[helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    exe = compile_graph(optimize(load(model.SerializeToString()), "cpu", verify=True).graph, debug=True)
    for rows in (3, 8):
        x = normal(rng, rows, 5)
        np.testing.assert_array_equal(exe({"x": x})["y"], x[x > 0])
