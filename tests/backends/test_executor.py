"""The NumPy executor: buffers freed at their last use, in-place only where safe, constants and
user inputs never written, one-line errors for bad inputs."""
import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.graph import Graph, InputError, Splat, TensorType, TilefoldError, Value

F32 = np.dtype("float32")
RNG = np.random.default_rng(3)


def t(*shape):
    return TensorType(shape, F32)


def relu_chain(n: int = 4) -> Graph:
    g = Graph()
    v = g.add_input("x", t(8, 5))
    for i, op in enumerate(["Relu", "Neg", "Exp", "Neg"][:n]):
        v = Value(g.add_node(op, [v], [t(8, 5)], name=f"op{i}").name)
    g.add_output(v, "y")
    return g


def test_each_intermediate_is_freed_once_at_its_last_use():
    g = relu_chain()
    exe = NumpyExecutable(g)
    freed = [i for step in exe.steps for i in step.frees]
    assert len(freed) == len(set(freed))
    last_use = {}
    for k, step in enumerate(exe.steps):
        for i in step.ins:
            last_use[i] = k
    for k, step in enumerate(exe.steps):
        for i in step.frees:
            assert last_use.get(i, k) == k


def test_elementwise_chain_runs_in_place_but_not_on_the_user_input():
    g = relu_chain()
    exe = NumpyExecutable(g, debug=True)
    assert exe.steps[0].inplace == -1  # reads the graph input
    assert all(step.inplace == 0 for step in exe.steps[1:])
    x = RNG.standard_normal((8, 5)).astype(np.float32)
    keep = x.copy()
    y = exe({"x": x})["y"]
    np.testing.assert_array_equal(x, keep)
    np.testing.assert_allclose(y, -np.exp(-np.maximum(x, 0)), rtol=1e-6)


def test_no_in_place_into_a_value_read_later():
    g = Graph()
    x = g.add_input("x", t(6))
    a = Value(g.add_node("Exp", [x], [t(6)], name="a").name)
    b = Value(g.add_node("Neg", [a], [t(6)], name="b").name)
    c = Value(g.add_node("Add", [a, b], [t(6)], name="c").name)  # a still read here
    g.add_output(c, "y")
    exe = NumpyExecutable(g, debug=True)
    assert exe.steps[1].inplace == -1 and exe.steps[2].inplace >= 0
    x_val = RNG.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(exe({"x": x_val})["y"], np.zeros(6), atol=1e-6)


def test_no_in_place_into_storage_shared_through_a_view():
    g = Graph()
    x = g.add_input("x", t(2, 3))
    e = Value(g.add_node("Exp", [x], [t(2, 3)], name="e").name)
    shape = g.add_constant(np.array([3, 2], np.int64))
    r = Value(g.add_node("Reshape", [e, shape], [t(3, 2)], name="view").name)
    n = Value(g.add_node("Neg", [r], [t(3, 2)], name="neg").name)  # must not overwrite e ...
    g.add_output(n, "neg")
    g.add_output(e, "exp")  # ... because e is an output
    exe = NumpyExecutable(g, debug=True)
    x_val = RNG.standard_normal((2, 3)).astype(np.float32)
    out = exe({"x": x_val})
    np.testing.assert_allclose(out["exp"], np.exp(x_val), rtol=1e-6)
    np.testing.assert_allclose(out["neg"], -np.exp(x_val).reshape(3, 2), rtol=1e-6)


def test_constants_are_never_written_and_outputs_are_owned():
    g = Graph()
    c = g.add_constant(RNG.standard_normal((4,)).astype(np.float32))
    s = g.add_constant(Splat(2.0, (4,), F32))
    x = g.add_input("x", t(4))
    a = Value(g.add_node("Add", [c, s], [t(4)], name="a").name)
    b = Value(g.add_node("Relu", [a], [t(4)], name="b").name)
    m = Value(g.add_node("Mul", [b, x], [t(4)], name="m").name)
    g.add_output(m, "y")
    g.add_output(c, "c")
    before = g.constant_value(c).copy()
    exe = NumpyExecutable(g, debug=True)
    x_val = RNG.standard_normal(4).astype(np.float32)
    out = exe({"x": x_val})
    np.testing.assert_array_equal(g.constant_value(c), before)
    out["c"][:] = 0  # the caller owns its outputs
    np.testing.assert_array_equal(g.constant_value(c), before)
    np.testing.assert_allclose(exe({"x": x_val})["y"], np.maximum(before + 2, 0) * x_val, rtol=1e-6)


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({"x": np.zeros((8, 5), np.float32), "z": 1}, "unknown input name 'z'"),
        ({}, "missing input 'x'"),
        ({"x": np.zeros((8, 5), np.float64)}, "dtype float64, expected float32"),
        ({"x": np.zeros((8, 6), np.float32)}, r"shape \(8, 6\), expected \(8, 5\)"),
        ({"x": np.zeros((8,), np.float32)}, "expected rank 2"),
    ],
)
def test_bad_inputs_give_one_line_errors(feeds, message):
    exe = NumpyExecutable(relu_chain())
    with pytest.raises(InputError, match=message) as info:
        exe(feeds)
    assert "\n" not in str(info.value)


def test_symbolic_dims_must_agree_across_inputs():
    g = Graph()
    a = g.add_input("a", t("n", 2))
    b = g.add_input("b", t("n", 2))
    g.add_output(Value(g.add_node("Add", [a, b], [t("n", 2)]).name), "y")
    exe = NumpyExecutable(g)
    ok = exe({"a": np.ones((3, 2), np.float32), "b": RNG.standard_normal((3, 2)).astype(np.float32)})
    assert ok["y"].shape == (3, 2)
    with pytest.raises(InputError, match="n = 3 in another input"):
        exe({"a": np.ones((3, 2), np.float32), "b": np.ones((4, 2), np.float32)})


def test_no_in_place_into_a_later_split_part_while_the_split_input_is_read():
    g = Graph()
    x = g.add_input("x", t(2, 6))
    e = Value(g.add_node("Exp", [x], [t(2, 6)], name="e").name)
    sizes = g.add_constant(np.array([3, 3], np.int64))
    split = g.add_node("Split", [e, sizes], [t(2, 3), t(2, 3)], {"axis": 1}, name="split")
    # Neg reads part 1 for the last time, but part 1 is a view of e, which is an output.
    n = Value(g.add_node("Neg", [Value(split.name, 1)], [t(2, 3)], name="neg").name)
    g.add_output(n, "neg")
    g.add_output(e, "exp")
    exe = NumpyExecutable(g, debug=True)
    assert exe.steps[-1].inplace == -1
    x_val = RNG.standard_normal((2, 6)).astype(np.float32)
    out = exe({"x": x_val})
    np.testing.assert_allclose(out["exp"], np.exp(x_val), rtol=1e-6)
    np.testing.assert_allclose(out["neg"], -np.exp(x_val[:, 3:]), rtol=1e-6)


def test_a_node_with_optional_results_its_kernel_does_not_compute():
    """BatchNormalization declared with its running statistics (unread): the first result is
    the whole normalized tensor, not its first row; reading a statistic is a one-line error."""
    c = 3
    x = RNG.standard_normal((2, c, 4)).astype(F32)
    scale, bias, mean = (RNG.standard_normal(c).astype(F32) for _ in range(3))
    var = RNG.uniform(0.5, 2.0, c).astype(F32)

    def graph(read_stat: bool) -> Graph:
        g = Graph()
        vecs = [g.add_constant(a, name=n) for a, n in zip((scale, bias, mean, var), "sbmv")]
        bn = g.add_node("BatchNormalization", [g.add_input("x", t(2, c, 4)), *vecs], [t(2, c, 4), t(c), t(c)],
                        {"epsilon": 1e-5}, name="bn")
        g.add_output(Value(bn.name, 1 if read_stat else 0), "y")
        return g

    want = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * scale[:, None] + bias[:, None]
    np.testing.assert_allclose(NumpyExecutable(graph(False))({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(TilefoldError, match="bn.*computes 1 of the 3 results"):
        NumpyExecutable(graph(True))({"x": x})


def test_outputs_come_back_in_the_order_the_graph_declares_them():
    """Not in the order their nodes run: a pass may give the first output a value computed
    by a node it adds (an Unpack)."""
    g = Graph()
    x = g.add_input("x", t(8, 5))
    first = Value(g.add_node("Relu", [x], [t(8, 5)], name="first").name)
    late = g.add_output(first, "late")
    g.add_output(first, "early")
    g.set_input(late.name, 0, Value(g.add_node("Neg", [first], [t(8, 5)], name="second").name))
    assert [n.attrs["name"] for n in g.nodes() if n.op == "Output"] == ["early", "late"]
    x_in = RNG.standard_normal((8, 5)).astype(F32)
    got = NumpyExecutable(g)({"x": x_in})
    assert list(got) == ["late", "early"]
    np.testing.assert_array_equal(got["late"], -np.maximum(x_in, 0))
