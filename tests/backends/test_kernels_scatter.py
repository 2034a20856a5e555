"""ScatterElements and ScatterND against onnxruntime on random data and random indices
(negative ones and repeated positions included), with every reduction, and their one-line
error for an index out of range."""
import numpy as np
import pytest

from tilefold.graph.errors import InputError

I64 = np.int64
REDUCTIONS = ["none", "add", "mul", "max", "min"]


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_elements(check, rng, axis, reduction):
    data = normal(rng, 4, 5, 6)
    shape = [3, 4, 5]
    shape[axis] = 7  # more updates than positions along the axis: repeats are certain
    extent = data.shape[axis]
    indices = rng.integers(-extent, extent, shape).astype(I64)
    check("ScatterElements", [data, indices, normal(rng, *shape)], {"axis": axis, "reduction": reduction})


@pytest.mark.parametrize("dtype, reduction", [(np.int32, "add"), (np.int64, "max"), (np.float64, "mul"),
                                              (np.int32, "none"), (np.bool_, "none")])
def test_scatter_elements_on_other_types_with_int32_indices(check, rng, dtype, reduction):
    data = rng.integers(-9, 9, (6, 3)).astype(dtype)
    indices = rng.integers(-6, 6, (8, 3)).astype(np.int32)
    check("ScatterElements", [data, indices, rng.integers(-9, 9, (8, 3)).astype(dtype)], {"reduction": reduction},
          rtol=0, atol=0)


def test_scatter_elements_with_constant_indices(check, rng):
    indices = rng.integers(-5, 5, (2, 9)).astype(I64)
    check("ScatterElements", [normal(rng, 3, 5), indices, normal(rng, 2, 9)], {"axis": 1}, consts={1})


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd(check, rng, k, reduction):
    data = normal(rng, 4, 3, 5)
    extents = np.array(data.shape[:k])
    indices = (rng.integers(0, 2**20, (6, 2, k)) % (2 * extents) - extents).astype(I64)
    check("ScatterND", [data, indices, normal(rng, 6, 2, *data.shape[k:])], {"reduction": reduction})


def test_scatter_nd_on_integers_with_a_repeated_slice(check, rng):
    data = rng.integers(-9, 9, (5, 4)).astype(np.int64)
    indices = np.array([[3], [-2], [0], [3]], I64)  # 3 and -2 are one row
    check("ScatterND", [data, indices, rng.integers(-9, 9, (4, 4)).astype(np.int64)], rtol=0, atol=0)
    check("ScatterND", [data, indices, rng.integers(-9, 9, (4, 4)).astype(np.int64)], {"reduction": "add"},
          rtol=0, atol=0)


@pytest.mark.parametrize("op, indices, updates, needle", [
    ("ScatterElements", np.array([[0, 5]], I64), np.ones((1, 2), np.float32), "index 5 on axis 1"),
    ("ScatterElements", np.array([[-6, 0]], I64), np.ones((1, 2), np.float32), "index -6 on axis 1"),
    ("ScatterND", np.array([[0, 1], [3, 0]], I64), np.ones(2, np.float32), "index 3 in the first 2 dims"),
])
def test_an_index_out_of_range_is_one_line_naming_the_node(run, rng, op, indices, updates, needle):
    attrs = {"axis": 1} if op == "ScatterElements" else {}
    with pytest.raises(InputError) as info:
        run(op, [normal(rng, 3, 5), indices, updates], attrs)
    message = str(info.value)
    assert "\n" not in message and f"op {op}" in message and needle in message and "(3, 5)" in message
