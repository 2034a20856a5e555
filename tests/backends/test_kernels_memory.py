"""The kernels' memory contract with the executor (see backends/numpy/executor.py):
- an `inplace` kernel given `out` writes its result there and returns it, whichever input
  `out` is;
- a `views` kernel's result may share memory with input 0 only; any other kernel returns
  fresh arrays, even when NumPy would hand back its input;
- unsupported variants fail at build time with a one-line UnsupportedOpError naming the node.
(Kernels never write into their inputs: every onnxruntime comparison in these tests feeds
read-only arrays.)"""
import numpy as np
import pytest
from onnx import helper

from tilefold.backends.numpy import KERNELS, KernelSpec
from tilefold.graph import Graph, TensorType, UnsupportedOpError

F32 = np.dtype(np.float32)


def build(op: str, inputs: list, attrs: dict | None = None, out_dtypes=None, n_outputs: int = 1, consts=None):
    """The kernel `run` for one node whose inputs are the given arrays (none constant)."""
    g = Graph()
    shape = np.shape(inputs[0]) if inputs else ()
    dtypes = out_dtypes or [next(np.asarray(x).dtype for x in inputs if x is not None)] * n_outputs
    node = g.add_node(op, [], [TensorType(shape, d) for d in dtypes], attrs or {}, name=f"my_{op.lower()}")
    in_types = [None if x is None else TensorType(np.shape(x), np.asarray(x).dtype) for x in inputs]
    return KERNELS[op].build(KernelSpec(node, in_types, consts or [None] * len(inputs)))


def inputs_for(op: str, rng) -> tuple[list[np.ndarray], dict]:
    """Inputs of one broadcast shape (so any of them can be `out`) and attributes for `op`."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((3, 4)).astype(np.float32) + 3
    b = rng.random((3, 4)) > 0.5
    i, j = rng.integers(-100, 100, (2, 3, 4)).astype(np.int32)
    special = {
        "Not": ([b], {}), "And": ([b, ~b], {}), "Or": ([b, ~b], {}), "Xor": ([b, b.copy()], {}),
        "Where": ([b, x, y], {}), "Clip": ([x, np.array(-0.5, np.float32), np.array(0.5, np.float32)], {}),
        "Sqrt": ([np.abs(x)], {}), "Log": ([np.abs(x) + 0.1], {}), "Mod": ([x, y], {"fmod": 1}),
        "Pow": ([np.abs(x), y], {}), "Max": ([x, y, x * 2], {}), "Min": ([x, y, x * 2], {}),
        "Sum": ([x, y, x * 2], {}), "Mean": ([x, y, x * 2], {}), "IsInf": ([x], {}), "IsNaN": ([x], {}),
        "Asin": ([np.tanh(x)], {}), "Acos": ([np.tanh(x)], {}), "Atanh": ([np.tanh(x) * 0.9], {}),
        "Acosh": ([np.abs(x) + 1], {}), "BitwiseNot": ([i], {}), "BitwiseAnd": ([i, j], {}),
        "BitwiseOr": ([i, j], {}), "BitwiseXor": ([i, j], {}),
        "BitShift": ([i.astype(np.uint32), (j % 8).astype(np.uint32)], {"direction": "LEFT"}),
    }
    if op in special:
        return special[op]
    unary = op not in {"Add", "Sub", "Mul", "Div", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                       "PRelu"}
    return ([x] if unary else [x, y]), {}


INPLACE = sorted(op for op, k in KERNELS.items() if k.inplace)
VIEWS = sorted(op for op, k in KERNELS.items() if k.views)


def test_inplace_and_views_kernels_are_the_expected_ones():
    assert set(INPLACE) == set("""
        Relu LeakyRelu Sigmoid HardSigmoid HardSwish Tanh Erf Gelu Softplus Elu Sqrt Exp Log Neg Abs Reciprocal
        Floor Ceil Round Sin Cos Sign Not IsNaN IsInf Add Sub Mul Div Pow Mod Max Min Sum Mean Equal Less
        LessOrEqual Greater GreaterOrEqual And Or Xor PRelu Where Clip
        Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Softsign Mish Selu Celu ThresholdedRelu Shrink
        BitwiseAnd BitwiseOr BitwiseXor BitwiseNot BitShift""".split())
    assert set(VIEWS) == {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Slice", "Split",
                          "Cast", "CastLike", "Identity", "Dropout", "Pack", "Unpack", "Transfer",
                          "DepthToSpace", "SpaceToDepth"}


@pytest.mark.parametrize("op", INPLACE)
def test_inplace_kernel_writes_into_out_whichever_input_it_is(rng, op):
    inputs, attrs = inputs_for(op, rng)
    with np.errstate(all="ignore"):
        expected = build(op, inputs, attrs)(*inputs)
        for position, arg in enumerate(inputs):
            if arg.dtype != expected.dtype or arg.shape != expected.shape:
                continue  # the executor hands over only a buffer of the result's shape and dtype
            fresh = [a.copy() for a in inputs]
            out = fresh[position]
            result = build(op, fresh, attrs)(*fresh, out=out)
            assert result is out, f"{op} did not return `out` (input {position})"
            # Sum and Mean may add in another order when `out` is not the first input
            np.testing.assert_allclose(out, expected, rtol=1e-6, err_msg=f"{op} with out = input {position}")


@pytest.mark.parametrize("step", [2, 4, 8])
@pytest.mark.parametrize("op", INPLACE)
def test_inplace_kernel_writes_into_a_strided_out(rng, op, step):
    # the executor hands over views too (a column sliced off a conv result); NumPy 2.4's own
    # np.negative writes wrong values into every 4th float32 of such a buffer
    inputs, attrs = inputs_for(op, rng)
    with np.errstate(all="ignore"):
        expected = build(op, inputs, attrs)(*inputs)
        if inputs[0].dtype != expected.dtype:
            return
        wide = np.zeros(inputs[0].shape[:-1] + (inputs[0].shape[-1] * step,), inputs[0].dtype)
        out = wide[..., ::step]
        out[...] = inputs[0]
        result = build(op, inputs, attrs)(out, *inputs[1:], out=out)
    assert result is out
    np.testing.assert_allclose(out, expected, rtol=1e-6, err_msg=f"{op} into a buffer of stride {step}")


@pytest.mark.parametrize("op", INPLACE)
def test_inplace_kernel_without_out_returns_a_fresh_array_of_the_declared_dtype(rng, op):
    inputs, attrs = inputs_for(op, rng)
    with np.errstate(all="ignore"):
        result = build(op, inputs, attrs)(*inputs)
    assert isinstance(result, np.ndarray) and result.shape == (3, 4)
    assert not any(np.shares_memory(result, a) for a in inputs)


def test_scalar_results_are_arrays():
    result = build("Add", [np.float32(1.0), np.float32(2.0)])(np.array(1.0, np.float32), np.array(2.0, np.float32))
    assert type(result) is np.ndarray and result.shape == () and result == 3.0


VIEW_CASES = [
    ("Reshape", [np.arange(12.0).reshape(3, 4), np.array([4, 3])], {}),
    ("Flatten", [np.arange(24.0).reshape(2, 3, 4)], {"axis": 2}),
    ("Transpose", [np.arange(12.0).reshape(3, 4)], {"perm": (1, 0)}),
    ("Squeeze", [np.arange(4.0).reshape(1, 4, 1), np.array([0])], {}),
    ("Unsqueeze", [np.arange(4.0), np.array([0, 2])], {}),
    ("Expand", [np.arange(4.0), np.array([3, 4])], {}),
    ("Slice", [np.arange(10.0), np.array([1]), np.array([8]), np.array([0]), np.array([2])], {}),
    ("Identity", [np.arange(3.0)], {}),
    ("Cast", [np.arange(3.0)], {"to": 11}),
    ("Dropout", [np.arange(3.0)], {}),
]


@pytest.mark.parametrize("op, inputs, attrs", VIEW_CASES)
def test_views_kernels_return_views_of_input_zero(op, inputs, attrs):
    result = build(op, inputs, attrs)(*inputs)
    assert np.shares_memory(result, inputs[0])
    assert not any(np.shares_memory(result, a) for a in inputs[1:])


@pytest.mark.parametrize("op", ["Reshape", "Squeeze", "Unsqueeze", "Expand", "Slice", "CastLike"])
def test_a_view_is_a_copy_when_input_zero_also_arrives_as_another_input(op):
    v = np.array([0], np.int64)  # Squeeze(v, v) and the like: one array in two slots
    args = [v, v] + ([np.array([1], np.int64)] if op == "Slice" else [])
    result = build(op, args)(*args)
    assert not np.shares_memory(result, v)


def test_split_returns_views_of_its_input():
    x = np.arange(12.0).reshape(2, 6)
    parts = build("Split", [x, np.array([1, 2, 3])], {"axis": 1}, n_outputs=3)(x, np.array([1, 2, 3]))
    assert all(np.shares_memory(p, x) for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), x)


def test_cast_to_another_dtype_copies():
    x = np.arange(3.0)
    result = build("Cast", [x], {"to": 1}, out_dtypes=[F32])(x)
    assert result.dtype == np.float32 and not np.shares_memory(result, x)


@pytest.mark.parametrize("op, inputs, attrs", [
    ("Concat", [np.arange(4.0)], {"axis": 0}),
    ("Pad", [np.arange(4.0), np.array([0, 0])], {}),
    ("Tile", [np.arange(4.0), np.array([1])], {}),
    ("Clip", [np.arange(4.0)], {}),
    ("ReduceSum", [np.arange(4.0), np.array([], np.int64)], {"noop_with_empty_axes": 1}),
    ("Sum", [np.arange(4.0)], {}),
    ("Max", [np.arange(4.0)], {}),
    ("Gather", [np.arange(4.0), np.array([0, 1, 2, 3])], {}),
    ("Trilu", [np.ones((3, 3))], {}),
    ("Einsum", [np.arange(4.0)], {"equation": "i->i"}),
    ("ScatterElements", [np.arange(4.0), np.array([0], np.int64), np.array([0.0])], {}),
    ("ScatterND", [np.arange(4.0), np.array([[1]], np.int64), np.array([1.0])], {}),
])
def test_other_kernels_copy_even_when_numpy_could_alias(op, inputs, attrs):
    result = build(op, inputs, attrs)(*inputs)
    assert not np.shares_memory(result, inputs[0])
    np.testing.assert_array_equal(result, inputs[0] if op not in ("Trilu",) else np.triu(inputs[0]))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "str"])
def test_dtypes_numpy_cannot_compute_are_refused_at_build_time(dtype):
    import ml_dtypes  # noqa: F401 - registers the dtype names with numpy

    g = Graph()
    t = TensorType((2, 3), np.dtype(dtype) if dtype != "str" else np.dtype(object))
    node = g.add_node("Relu", [], [t], {}, name="act")
    with pytest.raises(UnsupportedOpError, match=r"node 'act' \(op Relu\).*dtype") as info:
        KERNELS["Relu"].build(KernelSpec(node, [t], [None]))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("op, attrs, inputs, consts, match", [
    ("Gelu", {"approximate": "erf"}, [np.zeros(2, np.float32)], [None], "approximate"),
    ("Dropout", {}, [np.zeros(2, np.float32), np.float32(0.5), np.True_], [None, np.float32(0.5), np.True_],
     "training mode"),
    ("Pad", {"mode": "mirror"}, [np.zeros(2, np.float32), np.array([1, 1])], [None, None], "mode"),
    ("Slice", {}, [np.zeros(4, np.float32)] + [np.array([v]) for v in (0, 4, 0, 0)],
     [None] + [np.array([v]) for v in (0, 4, 0, 0)], "zero step"),
])
def test_unsupported_variants_are_refused_at_build_time(op, attrs, inputs, consts, match):
    with pytest.raises(UnsupportedOpError, match=match) as info:
        build(op, inputs, attrs, consts=consts)
    assert f"'my_{op.lower()}'" in str(info.value) and "\n" not in str(info.value)


def test_dropout_refuses_training_mode_decided_at_run_time():
    x = np.zeros(3, np.float32)
    run = build("Dropout", [x, np.float32(0.5), np.True_])
    np.testing.assert_array_equal(run(x, np.array(0.5, np.float32), np.array(False)), x)
    np.testing.assert_array_equal(run(x, np.array(0.0, np.float32), np.array(True)), x)
    with pytest.raises(UnsupportedOpError, match="training mode"):
        run(x, np.array(0.5, np.float32), np.array(True))


def test_cast_to_an_onnx_float8_type_is_refused():
    g = Graph()
    f8 = np.dtype(helper.tensor_dtype_to_np_dtype(17))  # FLOAT8E4M3FN
    node = g.add_node("Cast", [], [TensorType((2,), f8)], {"to": 17}, name="c")
    with pytest.raises(UnsupportedOpError, match="float8"):
        KERNELS["Cast"].build(KernelSpec(node, [TensorType((2,), F32)], [None]))


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_splat_weights_are_never_materialized_by_kernel_factories(target):
    """The light ResNet-50 ships ~100 MB of weights as splats: compiling it (weights in GEMM,
    RSCF and Winograd forms) allocates almost nothing, and it still reproduces its outputs."""
    import tracemalloc

    import tilefold
    from tilefold.bench.light import light_path, light_reference

    graph = tilefold.optimize(tilefold.load(str(light_path("resnet50"))), target).graph
    tracemalloc.start()
    try:
        exe = tilefold.compile(graph)
        allocated = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert allocated < 4 * 2**20
    inputs, outputs = light_reference("resnet50")
    for name, got in exe(inputs).items():
        np.testing.assert_allclose(got, outputs[name], rtol=1e-3, atol=1e-7)
