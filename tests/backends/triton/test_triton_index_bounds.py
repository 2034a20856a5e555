"""An index out of range in a gather or a scatter is an error on a Triton device, as it is on
the NumPy backend: the kernel reads or writes nothing outside a buffer, sets its flag, and the
executor raises after the run, naming the node. In-range indices (negative ones included) set
no flag, also when the executable runs again after an error."""
from __future__ import annotations

import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable
from tilefold.backends.triton.executor import kernel_plans, kernel_sources
from tilefold.graph import Graph
from tilefold.graph.errors import InputError
from tilefold.graph.types import TensorType

F32 = np.float32


def _gather(kit, op: str, data_shape: tuple[int, ...], ids_shape: tuple[int, ...], attrs: dict) -> Graph:
    """`op` of a random float table by int64 ids from a graph input, followed by a Relu in the
    same kernel."""
    g = Graph(op.lower())
    table = np.random.default_rng(0).standard_normal(data_shape).astype(F32)
    ids = g.add_input("ids", TensorType(ids_shape, np.int64))
    picked = kit.add(g, op, [g.add_constant(table, name="table"), ids], attrs, name="lookup")
    g.add_output(kit.add(g, "Relu", [picked]), "y")
    return g


GATHERS = [
    ("Gather", (7, 3), (2, 5), {"axis": 0}, 7),
    ("GatherElements", (4, 6), (4, 6), {"axis": 1}, 6),
    ("GatherND", (5, 4, 3), (6, 1), {}, 5),
]


@pytest.mark.parametrize("op, data_shape, ids_shape, attrs, extent", GATHERS)
@pytest.mark.parametrize("bad", ["past the end", "before the start"])
def test_a_gather_index_out_of_range_is_an_error_naming_the_node(kit, device, op, data_shape, ids_shape, attrs,
                                                                  extent, bad):
    rng = np.random.default_rng(1)
    g = _gather(kit, op, data_shape, ids_shape, attrs)
    ids = rng.integers(-extent, extent, ids_shape)
    exe = TritonExecutable(g, device=device)
    np.testing.assert_array_equal(exe({"ids": ids})["y"], NumpyExecutable(g)({"ids": ids})["y"])

    wrong = ids.copy()
    wrong.flat[rng.integers(wrong.size)] = extent + 3 if bad == "past the end" else -extent - 1
    with pytest.raises(InputError, match=rf"node 'lookup' \(op {op}\).*out of range \[-{extent}, {extent - 1}\]"):
        exe({"ids": wrong})
    with pytest.raises(Exception, match="lookup"):
        NumpyExecutable(g)({"ids": wrong})
    np.testing.assert_array_equal(exe({"ids": ids})["y"], NumpyExecutable(g)({"ids": ids})["y"])


@pytest.mark.parametrize("op, reduction", [("ScatterElements", "none"), ("ScatterElements", "add"),
                                           ("ScatterND", "none"), ("ScatterND", "max")])
def test_a_scatter_index_out_of_range_is_an_error_and_writes_nothing_outside(kit, device, op, reduction):
    rng = np.random.default_rng(2)
    data = rng.standard_normal((6, 5)).astype(F32)
    ids_shape, extent = ((3, 5), 6) if op == "ScatterElements" else ((4, 1), 6)
    updates = rng.standard_normal(ids_shape if op == "ScatterElements" else (4, 5)).astype(F32)
    g = Graph("scatter")
    ids = g.add_input("ids", TensorType(ids_shape, np.int64))
    attrs = {"reduction": reduction, **({"axis": 0} if op == "ScatterElements" else {})}
    out = kit.add(g, op, [g.add_constant(data, name="data"), ids, g.add_constant(updates, name="updates")], attrs,
                  name="scatter")
    g.add_output(out, "y")
    good = np.stack([rng.permutation(extent)[:ids_shape[0]] for _ in range(ids_shape[1])], 1) - extent // 2
    exe = TritonExecutable(g, device=device)
    np.testing.assert_allclose(exe({"ids": good})["y"], NumpyExecutable(g)({"ids": good})["y"], rtol=1e-6)

    wrong = good.copy()
    wrong[-1, 0] = extent
    with pytest.raises(InputError, match=rf"node 'scatter' \(op {op}\).*out of range \[-{extent}, {extent - 1}\]"):
        exe({"ids": wrong})
    with pytest.raises(InputError, match="node 'scatter'"):
        NumpyExecutable(g)({"ids": wrong})


def test_lookups_with_constant_in_range_indices_still_run_in_one_kernel(kit, device):
    """The flag is a kernel operand, not a graph value: the Gather and its Relu stay one kernel,
    and nothing falls back to the NumPy backend."""
    from tilefold.backends.triton.executor import kernel_sources

    g = _gather(kit, "Gather", (7, 3), (2, 5), {"axis": 0})
    ids = np.random.default_rng(3).integers(-7, 7, (2, 5))
    got, want = kit.run_both(g, {"ids": ids}, device)
    np.testing.assert_array_equal(got["y"], want["y"])
    (names, source), = kernel_sources(g)
    assert names[0] == "lookup" and "tl.store(in" in source


@pytest.mark.parametrize("bad", ["words", "positions"])
def test_two_lookups_merged_into_one_kernel_each_name_their_own_node(kit, device, bad):
    """BERT's word and position embeddings, added: both Gathers run in the Add's kernel
    (fusion's merge), each with its own flag, so an index out of range names its lookup."""
    rng = np.random.default_rng(4)
    g = Graph("embeddings")
    words = kit.add(g, "Gather", [g.add_constant(rng.standard_normal((9, 4)).astype(F32), name="word_table"),
                                  g.add_input("ids", TensorType((2, 5), np.int64))], {"axis": 0}, name="words")
    positions = kit.add(g, "Gather", [g.add_constant(rng.standard_normal((6, 4)).astype(F32), name="position_table"),
                                      g.add_input("pos", TensorType((2, 5), np.int64))], {"axis": 0}, name="positions")
    g.add_output(kit.add(g, "Add", [words, positions], name="sum"), "y")
    exe = TritonExecutable(g, device=device)
    assert [plan.nodes for plan in kernel_plans(g)] == [["words", "positions", "sum"]]
    feeds = {"ids": rng.integers(0, 9, (2, 5)), "pos": rng.integers(0, 6, (2, 5))}
    np.testing.assert_allclose(exe(feeds)["y"], NumpyExecutable(g)(feeds)["y"], rtol=1e-6)
    wrong = {**feeds, "ids" if bad == "words" else "pos": np.full((2, 5), 11)}
    with pytest.raises(InputError, match=rf"node '{bad}' \(op Gather\)"):
        exe(wrong)


def test_a_head_whose_index_is_computed_from_the_lanes_masks_its_load(kit, device):
    """A rank-1 Slice with a step reads its operand at 2 + i0 * 2: the lanes past the result's
    4 elements would read past the operand's 10, so the load is masked like the store (it was
    not: the mask followed only indices that were the lanes' names themselves)."""
    g = Graph("strided")
    ints = lambda v, n: g.add_constant(np.array([v], np.int64), name=n)  # noqa: E731
    picked = kit.add(g, "Slice", [g.add_input("x", TensorType((10,), F32)), ints(2, "start"), ints(9, "stop"),
                                  ints(0, "axis"), ints(2, "step")], name="picked")
    g.add_output(kit.add(g, "Relu", [picked], name="relu"), "y")
    [(_, source)] = kernel_sources(g)
    [load] = [line for line in source.splitlines() if "tl.load(" in line]
    assert "(2 + i0 * 2), mask=mask)" in load
    x = np.random.default_rng(5).standard_normal(10).astype(F32)
    np.testing.assert_array_equal(TritonExecutable(g, device=device)({"x": x})["y"], np.maximum(x[2:9:2], 0))
