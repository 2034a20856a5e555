"""Split as one generated kernel writing every part (split.py): exact against the NumPy backend
(a split copies values) for plain and packed operands and parts, unread and empty parts, bool
values; a Split whose sizes are known only at run time stays on the NumPy backend; and
GPT-2's fused QKV pattern through the gpu target runs with no fallback."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.backends.triton import TritonExecutable, kernel_sources, supports
from tilefold.backends.triton.executor import check_arena
from tilefold.graph import Graph
from tilefold.graph.registry import infer, with_defaults
from tilefold.graph.types import TensorType, Value
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32
COLUMNS = PackedEncoding((1,), (4,))
"""Dim 1 in tiles of 4: a split along dim 1 into multiples of 4 cuts whole tiles."""


def _split(g: Graph, x: Value, attrs: dict, sizes: list[int] | None = None,
           encodings: list | None = None) -> list[Value]:
    """A Split of `x` (sizes from a constant `split` input when given, else `attrs`), its parts
    in `encodings` (plain where None)."""
    inputs = [x] if sizes is None else [x, g.add_constant(np.array(sizes, np.int64), name="sizes")]
    full = with_defaults("Split", attrs)
    t = g.type_of(x)
    outs = infer("Split", full, [TensorType(t.shape, t.dtype), *([g.type_of(inputs[1])] if sizes else [])],
                 [g.constant_value(v) for v in inputs])
    encodings = encodings or [None] * len(outs)
    outs = [TensorType(o.shape, o.dtype, enc) for o, enc in zip(outs, encodings)]
    node = g.add_node("Split", inputs, outs, full, name="split")
    return [Value(node.name, k) for k in range(len(outs))]


def _exact(got: dict, want: dict, ulps: int = 0) -> None:
    """Equal, or for floats within `ulps` units in the last place (a moved element off by one
    would differ by far more)."""
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        if ulps and got[name].dtype.kind == "f":
            np.testing.assert_array_max_ulp(got[name], want[name], maxulp=ulps)
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _run(kit, g: Graph, feeds: dict, device: str) -> TritonExecutable:
    """Run on `device` with the arena poisoned first (NaN bytes: a part a kernel failed to
    write shows), check exactness (within 2 ulps on a GPU, whose exp is an approximate
    instruction) and the arena; the executable."""
    exe = TritonExecutable(g, device=device)
    for arena in exe.arenas.values():
        arena.fill_(0xFF)
    got = exe(feeds)
    assert exe.fallback_nodes == []
    _, want = kit.run_both(g, feeds, device)
    _exact(got, want, ulps=0 if device == "interp" else 2)
    check_arena(exe)
    return exe


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_qkv_split_along_the_last_axis_is_one_kernel(kit, device, dtype):
    """GPT-2's fused QKV: sizes from a constant `split` input, along axis -1."""
    x = np.random.default_rng(0).standard_normal((2, 5, 18)).astype(dtype)
    g = Graph("qkv")
    q, k, v = _split(g, g.add_input("x", TensorType(x.shape, dtype)), {"axis": -1}, [6, 6, 6])
    for name, part in zip("qkv", (q, k, v)):
        g.add_output(part, name)
    exe = _run(kit, g, {"x": x}, device)
    split_steps = [s for s in exe.steps if s.group.kind == "split"]
    assert len(split_steps) == 1 and split_steps[0].outs == [q, k, v]
    (names, source), = kernel_sources(g)
    assert names == ["split"] and source.count("tl.store(") == 3 and "out2" in source


def test_middle_axis_into_num_outputs_with_an_uneven_last_part(kit, device):
    x = np.random.default_rng(1).standard_normal((3, 7, 5)).astype(F32)
    g = Graph("thirds")
    parts = _split(g, g.add_input("x", TensorType(x.shape, F32)), {"axis": 1, "num_outputs": 3})
    assert [g.type_of(p).shape[1] for p in parts] == [3, 3, 1]
    for k, part in enumerate(parts):
        g.add_output(part, f"y{k}")
    _run(kit, g, {"x": x}, device)


@pytest.mark.parametrize("packed_parts", [True, False], ids=["packed-parts", "plain-parts"])
def test_packed_operand_split_along_its_tiled_axis_in_whole_tiles(kit, device, packed_parts):
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(F32)
    g = Graph("tiles")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": COLUMNS}, encoding=COLUMNS)
    parts = _split(g, xp, {"axis": 1}, [4, 8, 4], [COLUMNS] * 3 if packed_parts else None)
    for k, part in enumerate(parts):
        g.add_output(kit.add(g, "Unpack", [part]) if packed_parts else part, f"y{k}")
    _run(kit, g, {"x": x}, device)


@pytest.mark.parametrize("pad", [0.0, None])
def test_split_along_an_untiled_axis_of_a_padded_packed_operand(kit, device, pad):
    """Dim 1 (10) tiled by 4 is padded to 12: each part is padded too, filled before the launch."""
    enc = COLUMNS.with_pad(pad)
    x = np.random.default_rng(3).standard_normal((5, 10)).astype(F32)
    g = Graph("rows")
    xp = kit.add(g, "Pack", [g.add_input("x", TensorType(x.shape, F32))], {"encoding": enc}, encoding=enc)
    top, bottom = _split(g, xp, {"axis": 0}, [2, 3], [enc, enc])
    g.add_output(kit.add(g, "Unpack", [top]), "top")
    g.add_output(kit.add(g, "Unpack", [bottom]), "bottom")
    exe = _run(kit, g, {"x": x}, device)
    if pad is not None:
        buffers: dict = {}
        exe.run({"x": x}, keep=buffers)
        assert (buffers[bottom].cpu().numpy()[:, -1, 2:] == pad).all()  # the last tile's padding columns


def test_an_unread_part_and_an_empty_part(kit, device):
    x = np.random.default_rng(4).standard_normal((2, 7)).astype(F32)
    g = Graph("gaps")
    first, empty, unread, last = _split(g, g.add_input("x", TensorType(x.shape, F32)), {"axis": 1}, [3, 0, 2, 2])
    g.add_output(first, "first")
    g.add_output(empty, "empty")
    g.add_output(last, "last")
    exe = _run(kit, g, {"x": x}, device)
    assert exe(x=x)["empty"].shape == (2, 0)
    (_, source), = kernel_sources(g)
    assert source.count("tl.store(") == 3 and "out3" in source


def test_parts_feed_elementwise_kernels_of_their_own(kit, device):
    """Nothing fuses into a Split: the ops after it read the planned part buffers."""
    x = np.random.default_rng(5).standard_normal((4, 9)).astype(F32)
    g = Graph("after")
    q, k, v = _split(g, g.add_input("x", TensorType(x.shape, F32)), {"axis": 1}, [3, 3, 3])
    g.add_output(kit.add(g, "Relu", [kit.add(g, "Mul", [kit.add(g, "Add", [q, k]), v])]), "y")
    g.add_output(kit.add(g, "Exp", [q]), "e")
    _run(kit, g, {"x": x}, device)
    groups = [names for names, _ in kernel_sources(g)]
    assert groups[0] == ["split"] and len(groups) == 3 and all("split" not in n for n in groups[1:])


def test_a_split_with_one_part_read_by_an_elementwise_op(kit, device):
    x = np.random.default_rng(6).standard_normal((6, 4)).astype(F32)
    g = Graph("one_read")
    head, _ = _split(g, g.add_input("x", TensorType(x.shape, F32)), {"axis": 0, "num_outputs": 2})
    g.add_output(kit.add(g, "Sigmoid", [head]), "y")
    _run(kit, g, {"x": x}, device)
    assert [names for names, _ in kernel_sources(g)] == [["split"], ["sigmoid"]]


def test_bool_parts(kit, device):
    x = np.random.default_rng(7).standard_normal((3, 6)) > 0
    g = Graph("mask")
    a, b = _split(g, g.add_input("x", TensorType(x.shape, np.bool_)), {"axis": 1}, [2, 4])
    g.add_output(a, "a")
    g.add_output(kit.add(g, "Not", [b]), "not_b")
    _run(kit, g, {"x": x}, device)


def test_sizes_known_only_at_run_time_stay_on_the_numpy_backend(device):
    x = np.random.default_rng(8).standard_normal((4, 5)).astype(F32)
    g = Graph("runtime")
    xv = g.add_input("x", TensorType(x.shape, F32))
    sizes = g.add_input("sizes", TensorType((2,), np.int64))
    full = with_defaults("Split", {"axis": 1})
    outs = infer("Split", full, [g.type_of(xv), g.type_of(sizes)], [None, None])
    node = g.add_node("Split", [xv, sizes], outs, full, name="split")
    g.add_output(Value(node.name, 0), "a")
    g.add_output(Value(node.name, 1), "b")
    exe = TritonExecutable(g, device=device)
    got = exe({"x": x, "sizes": np.array([1, 4], np.int64)})
    assert exe.fallback_nodes == ["split"]
    _exact(got, {"a": x[:, :1], "b": x[:, 1:]})


def test_int64_operands_split_exactly_and_others_stay_on_the_numpy_backend(device):
    """int64 ids beyond float32's 2**24 and uint8 pixels are copied exactly; float64 and
    symbolic operands stay on the NumPy backend."""
    rng = np.random.default_rng(11)
    ids = rng.integers(-50, 50, (3, 4)) + 2**40
    g = Graph("ints")
    low, high = _split(g, g.add_input("ids", TensorType(ids.shape, np.int64)), {"axis": 1}, [1, 3])
    g.add_output(low, "low")
    g.add_output(high, "high")
    assert supports(g, g.node("split"))
    exe = TritonExecutable(g, device=device)
    _exact(exe({"ids": ids}), {"low": ids[:, :1], "high": ids[:, 1:]})
    assert exe.fallback_nodes == []
    for dtype, runs in ((np.uint8, True), (np.float64, False)):
        pixels = rng.integers(0, 256, ids.shape).astype(dtype) + (rng.random(ids.shape) if dtype == np.float64 else 0)
        g = Graph("pixels")
        low, high = _split(g, g.add_input("pixels", TensorType(pixels.shape, dtype)), {"axis": 1}, [1, 3])
        g.add_output(low, "low")
        g.add_output(high, "high")
        assert supports(g, g.node("split")) == runs
        exe = TritonExecutable(g, device=device)
        _exact(exe({"pixels": pixels}), {"low": pixels[:, :1], "high": pixels[:, 1:]})
        assert exe.fallback_nodes == ([] if runs else ["split"])
    g = Graph("symbolic")
    _split(g, g.add_input("x", TensorType(("n", 4), F32)), {"axis": 1}, [2, 2])
    assert not supports(g, g.node("split"))


def _qkv_model(seed: int, batch: int = 2, seq: int = 3, dim: int = 16) -> object:
    """GPT-2's attention input: x @ w + b, split into q, k, v along the last axis, each then
    projected or shifted (MatMul, Add)."""
    rng = np.random.default_rng(seed)
    arrays = {"w": (dim, 3 * dim), "b": (3 * dim,), "wq": (dim, dim), "bk": (dim,), "wv": (dim, dim)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(F32), n)
             for n, s in arrays.items()]
    inits.append(numpy_helper.from_array(np.array([dim] * 3, np.int64), "sizes"))
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["h0"]), n("Add", ["h0", "b"], ["h"]),
             n("Split", ["h", "sizes"], ["q", "k", "v"], axis=-1),
             n("MatMul", ["q", "wq"], ["yq"]), n("Add", ["k", "bk"], ["yk"]), n("MatMul", ["v", "wv"], ["yv"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, dim])
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, seq, dim]) for name in ("yq", "yk", "yv")]
    graph = helper.make_graph(nodes, "qkv", [x], outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_gpt2_qkv_split_through_the_gpu_target_runs_no_fallback(kit):
    """The Split runs in the matmul's kernel, which stores q and v itself, and k after its
    Add (the one node that reads k, that part's epilogue)."""
    model = _qkv_model(seed=9)
    optimized = tilefold.optimize(tilefold.load(model), "gpu").graph
    exe = TritonExecutable(optimized, device="interp")
    x = np.random.default_rng(10).standard_normal((2, 3, 16)).astype(F32)
    got = exe({"x": x})
    assert exe.fallback_nodes == []
    (step,) = [s for s in exe.steps if s.group.kind == "matmul" and any(n.op == "Split" for n in s.group.nodes)]
    assert step.group.nodes[-1].op == "Add" and len(step.outs) == 3
    kit.assert_close(got, kit.ort_outputs(model, {"x": x}), rtol=1e-4, atol=1e-5)
    check_arena(exe)
