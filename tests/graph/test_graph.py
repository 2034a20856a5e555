"""The Graph facade: construction, use-def queries and the editing verbs."""
import numpy as np
import pytest

from tilefold.graph import Graph, Splat, TensorType, Value, VerifyError
from tilefold.graph.verify import verify_graph

F32 = np.dtype("float32")


def chain() -> tuple[Graph, Value, Value]:
    g = Graph("chain")
    x = g.add_input("x", TensorType(("batch", 4), F32))
    a = g.add_node("Identity", [x], [TensorType(("batch", 4), F32)], name="a")
    b = g.add_node("Identity", [Value(a.name)], [TensorType(("batch", 4), F32)], name="b")
    g.add_output(Value(b.name), "y")
    return g, Value(a.name), Value(b.name)


def test_every_value_has_one_producer_and_known_users():
    g, a, b = chain()
    assert g.inputs_of("b") == [a]
    assert g.users(a) == [("b", 0)]
    assert g.output_values() == [b]
    assert g.output_names() == ["y"]
    assert [n.op for n in g.nodes()] == ["Input", "Identity", "Identity", "Output"]
    verify_graph(g)


def test_replace_all_uses_and_remove():
    g, a, b = chain()
    assert g.replace_all_uses(b, a) == 1
    g.remove_node("b")
    assert g.output_values() == [a]
    verify_graph(g)


def test_remove_refuses_a_node_still_in_use():
    g, a, _ = chain()
    with pytest.raises(VerifyError, match="still used by"):
        g.remove_node(a.node)


def test_names_are_made_unique():
    g = Graph()
    x = g.add_input("x", TensorType((2,), F32))
    n1 = g.add_node("Identity", [x], [TensorType((2,), F32)], name="n")
    n2 = g.add_node("Identity", [x], [TensorType((2,), F32)], name="n")
    assert n1.name != n2.name


def test_constants_are_read_only_and_splats_stay_scalars():
    g = Graph()
    c = g.add_constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    s = g.add_constant(Splat(0.5, (1000, 1000), F32))
    array = g.constant_value(c)
    with pytest.raises(ValueError):
        array[0, 0] = 1.0
    splat = g.constant_value(s)
    assert splat.nbytes == 4 and g.type_of(s).shape == (1000, 1000)
    view = splat.to_array()
    assert view.shape == (1000, 1000) and view.strides == (0, 0) and not view.flags.writeable


def test_copy_is_independent():
    g, a, b = chain()
    h = g.copy()
    h.replace_all_uses(b, a)
    h.remove_node("b")
    assert "b" in g and "b" not in h
    assert g.node("a") is not h.node("a")


def test_a_cycle_is_reported_with_its_nodes():
    g, a, b = chain()
    g.set_input("a", 0, b)
    with pytest.raises(VerifyError, match="cycle"):
        g.nodes()


def test_tensor_type_bytes_include_encoding_padding():
    class Pad8:
        def physical_shape(self, shape):
            return tuple(-(-d // 8) * 8 for d in shape)

        def validate(self, shape):
            pass

    t = TensorType((3, 10), F32, Pad8())
    assert t.nbytes() == 8 * 16 * 4
    assert TensorType((3, "n"), F32).nbytes() is None
    assert t.logical() == TensorType((3, 10), F32) and t.logical().nbytes() == 3 * 10 * 4
