"""The executor: per-node fallback to the NumPy backend with explicit transfers, host
placement and Transfer nodes, unfused runs, generated sources, and one-line errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tilefold
from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable, kernel_sources
from tilefold.bench.models import mlp_model
from tilefold.graph import Graph
from tilefold.graph.errors import InputError, TilefoldError
from tilefold.graph.types import TensorType
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32


def _graph_with_an_op_no_template_runs(kit):
    """MatMul -> a diagonal Einsum (ii->i, built here, so not lowered: no template, the NumPy
    backend) -> Relu."""
    g = Graph("mixed")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(F32)
    x = g.add_input("x", TensorType((4, 6), F32))
    m = kit.add(g, "MatMul", [x, g.add_constant(w, name="w")], name="mm")
    c = kit.add(g, "Einsum", [m], {"equation": "ii->i"}, name="diagonal")
    g.add_output(kit.add(g, "Relu", [c], name="relu"), "y")
    return g, w


def test_unsupported_node_falls_back_to_numpy_with_counted_transfers(kit, device):
    g, w = _graph_with_an_op_no_template_runs(kit)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(F32)
    exe = TritonExecutable(g, device=device)
    got = exe({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(np.diag(x @ w), 0), rtol=1e-5, atol=1e-5)
    assert exe.fallback_nodes == ["diagonal"]
    # x goes in (4x6), mm's result to the host for the diagonal (4x4), the diagonal back (4),
    # y leaves (4)
    assert exe.transfers == 4 and exe.transfer_bytes == 4 * (4 * 6 + 4 * 4 + 4 + 4)
    assert [names for names, _ in kernel_sources(g)] == [["mm"], ["relu"]]


def _conv_resize_conv(seed: int, scales=(1, 1, 2, 2), size: tuple[int, int] = (5, 6), **attrs):
    """Conv -> Resize (bilinear x2 unless told) -> Conv, as a U-Net decoder step."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(F32), n)
             for n, s in (("w1", (5, 3, 3, 3)), ("w2", (4, 5, 3, 3)))]
    inits.append(numpy_helper.from_array(np.array(scales, F32), "scales"))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["a", "", "scales"], ["b"], name="up", **{"mode": "linear", **attrs}),
             helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1])]
    out = [int(np.floor(np.float32(d) * np.float32(s))) for d, s in zip(size, scales[2:])]
    graph = helper.make_graph(nodes, "unet_step",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, *out])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _resize_operand_and_result(g: Graph) -> list:
    (up,) = [n for n in g.nodes() if n.op == "Resize"]
    return [g.type_of(g.inputs_of(up.name)[0]), up.outputs[0]]


def test_resize_between_convolutions_runs_in_triton_on_their_packed_buffers(kit, device):
    model = _conv_resize_conv(5)
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    assert all(t.encoding is not None for t in _resize_operand_and_result(g))
    x = np.random.default_rng(6).standard_normal((1, 3, 5, 6)).astype(F32)
    exe = TritonExecutable(g, device=device)
    kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}))
    assert exe.fallback_nodes == []


def test_a_node_falling_back_between_convolutions_reads_and_writes_their_packed_buffers(kit, device):
    """A cubic antialiased downscale by 0.4 (10 x 10 taps, more than a Triton kernel sums) runs on
    the NumPy backend, on the NCHWc16 buffers of the convs around it, copied to and from the host."""
    model = _conv_resize_conv(7, scales=(1, 1, 0.4, 0.4), size=(10, 10), mode="cubic", antialias=1)
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    assert all(t.encoding is not None for t in _resize_operand_and_result(g))
    x = np.random.default_rng(8).standard_normal((1, 3, 10, 10)).astype(F32)
    exe = TritonExecutable(g, device=device)
    kit.assert_close(exe({"x": x}), NumpyExecutable(tilefold.load(model))({"x": x}))
    assert [g.node(name).op for name in exe.fallback_nodes] == ["Resize"]
    assert exe.transfers == 4  # x in, the conv's result out and the Resize's back, y out


def test_node_placed_on_the_host_runs_numpy_behind_transfer_nodes(kit, device):
    g = Graph("placed")
    x = g.add_input("x", TensorType((3, 5), F32))
    a = kit.add(g, "Exp", [x], name="exp")
    to_host = kit.add(g, "Transfer", [a], {"source": device, "target": "cpu"}, name="to_host")
    b = kit.add(g, "Neg", [to_host], name="neg")
    g.node("neg").device = "cpu"
    back = kit.add(g, "Transfer", [b], {"source": "cpu", "target": device}, name="to_device")
    g.add_output(kit.add(g, "Sigmoid", [back], name="sig"), "y")
    x_val = np.random.default_rng(2).standard_normal((3, 5)).astype(F32)
    exe = TritonExecutable(g, device=device)
    got = exe({"x": x_val})["y"]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(np.exp(x_val))), rtol=1e-6)
    assert exe.fallback_nodes == ["neg"]


def test_unfused_run_gives_the_same_result_with_more_kernels(kit):
    g = tilefold.optimize(tilefold.load(mlp_model(batch=5, sizes=(20, 33, 7), seed=1)), "gpu").graph
    x = np.random.default_rng(3).standard_normal((5, 20)).astype(F32)
    fused = TritonExecutable(g, device="interp")
    unfused = TritonExecutable(g, device="interp", fuse=False)
    np.testing.assert_allclose(fused({"x": x})["y"], unfused({"x": x})["y"], rtol=1e-5, atol=1e-6)
    assert len(kernel_sources(g, fuse=False)) > len(kernel_sources(g)) == 2


def test_kernel_sources_are_readable_python_naming_their_nodes():
    g = tilefold.load(mlp_model(batch=2, sizes=(8, 12, 3), seed=4))
    sources = kernel_sources(g)
    for names, source in sources:
        compile(source, "<kernel>", "exec")
        assert source.startswith("import triton\nimport triton.language as tl\n")
        assert all(name in source for name in names) and "@triton.jit" in source


def test_input_errors_are_one_line(kit):
    g = tilefold.load(mlp_model(batch=2, sizes=(8, 12, 3), seed=4))
    exe = TritonExecutable(g, device="interp")
    with pytest.raises(InputError, match="missing input 'x'"):
        exe({})
    with pytest.raises(InputError, match="unknown input name 'z'"):
        exe({"x": np.zeros((2, 8), F32), "z": 1})
    with pytest.raises(InputError, match=r"input 'x' has shape \(2, 9\)"):
        exe({"x": np.zeros((2, 9), F32)})


def test_unknown_device_and_missing_gpu_are_one_line_errors():
    g = tilefold.load(mlp_model(batch=2, sizes=(8, 12, 3), seed=4))
    with pytest.raises(TilefoldError, match="unknown Triton device 'tpu'"):
        TritonExecutable(g, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(TilefoldError, match="no CUDA GPU.*interp") as info:
            TritonExecutable(g, device="cuda")
        assert "\n" not in str(info.value)


def test_symbolic_batch_is_specialized_per_input_shape(kit):
    """A dynamic batch: each batch size compiles its own static kernels (cached)."""
    model = mlp_model(batch="N", sizes=(20, 33, 7), seed=5)
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    exe = TritonExecutable(g, device="interp")
    rng = np.random.default_rng(6)
    for batch in (3, 17, 3):
        x = rng.standard_normal((batch, 20)).astype(F32)
        kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}))
        assert exe.fallback_nodes == []
    assert len(exe._variants) == 2
    assert len(kernel_sources(g, shapes={"x": (4, 20)})) == 2 and kernel_sources(g) == []
    with pytest.raises(InputError, match="rank"):
        exe({"x": np.zeros((3,), F32)})


def test_the_interp_device_says_what_it_is_for():
    from tilefold.backends.triton import supported_ops

    g = tilefold.load(mlp_model(batch=2, sizes=(8, 12, 3), seed=4))
    assert "testing" in TritonExecutable(g, device="interp").note
    assert {"MatMul", "Conv", "Softmax", "Pack", "Unpack", "Relu"} <= supported_ops()


def test_shape_of_a_device_tensor_is_known_at_compile_time_and_moves_no_data(kit):
    from tilefold.backends.triton import supports

    g = Graph("shape")
    x = g.add_input("x", TensorType((3, 5), F32))
    e = kit.add(g, "Exp", [x], name="exp")
    g.add_output(e, "e")
    g.add_output(kit.add(g, "Shape", [e], name="shape"), "s")
    exe = TritonExecutable(g, device="interp")
    x_val = np.random.default_rng(7).standard_normal((3, 5)).astype(F32)
    out = exe({"x": x_val})
    np.testing.assert_array_equal(out["s"], [3, 5])
    np.testing.assert_allclose(out["e"], np.exp(x_val), rtol=1e-6)
    assert exe.fallback_nodes == [] and exe.transfers == 2  # x in, e out: the shape reads no buffer
    assert supports(g, g.node("shape")) and supports(g, g.node("exp"))
    nonzero = kit.add(g, "NonZero", [x], name="nonzero")
    assert not supports(g, g.node(nonzero.node))
    top = kit.add(g, "TopK", [x, g.add_constant(np.array([2], np.int64), name="k")], name="top")
    assert supports(g, g.node(top.node))  # a row kernel (reduce.py)


def test_ops_without_a_template_run_on_the_host_as_tilefold_run_does_them(kit):
    """`tilefold run MODEL --device interp,cpu`: float64 math (a row sum between Casts; Triton
    kernels compute floats in float32) runs with the NumPy kernels after the interpreter's
    MatMul kernels; TopK with a constant K runs in its row kernel there."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w1, w2 = rng.standard_normal((6, 16)).astype(F32), rng.standard_normal((16, 4)).astype(F32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("TopK", ["h", "k"], ["m", "order"], name="sort"),
         helper.make_node("MatMul", ["m", "w2"], ["z"], name="mm2"),
         helper.make_node("Cast", ["z"], ["z64"], to=TensorProto.DOUBLE, name="wide"),
         helper.make_node("ReduceSum", ["z64", "one"], ["s64"], keepdims=0, name="rows"),
         helper.make_node("Cast", ["s64"], ["y"], to=TensorProto.FLOAT, name="narrow")],
        "host_ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(np.array([16], np.int64), "k"),
         numpy_helper.from_array(np.array([1], np.int64), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    exe = tilefold.compile(tilefold.load(model), device="interp,cpu")
    x = rng.standard_normal((4, 6)).astype(F32)
    got = exe({"x": x})["y"]
    assert isinstance(exe, TritonExecutable)
    assert {"wide", "rows", "narrow"} <= set(exe.fallback_nodes)
    assert not {"mm1", "sort", "mm2"} & set(exe.fallback_nodes)
    want = kit.ort_outputs(model, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_host_op_falls_back_to_numpy_between_triton_kernels(kit):
    """Exp -> Einsum ii->i (a diagonal built here, so not lowered: no template, the NumPy
    backend) -> Relu."""
    g = Graph("diagonal")
    rng = np.random.default_rng(9)
    x = g.add_input("x", TensorType((5, 5), F32))
    e = kit.add(g, "Exp", [x], name="exp")
    d = kit.add(g, "Einsum", [e], {"equation": "ii->i"}, name="diagonal")
    g.add_output(kit.add(g, "Relu", [d], name="relu"), "y")
    x_val = rng.standard_normal((5, 5)).astype(F32)
    exe = TritonExecutable(g, device="interp")
    np.testing.assert_allclose(exe({"x": x_val})["y"], np.exp(np.diag(x_val)), rtol=1e-6)
    assert exe.fallback_nodes == ["diagonal"]


def _nonzero_model(batch: int | str = 3):
    """x -> Relu -> NonZero (a dim known only at run time) -> Cast -> Mul by itself -> y, and
    x -> NonZero -> Transpose -> t: nodes on values of dynamic shape after kernels and inputs."""
    from onnx import TensorProto, helper

    n = helper.make_node
    graph = helper.make_graph(
        [n("Relu", ["x"], ["r"], name="relu"), n("NonZero", ["r"], ["nz"], name="nz"),
         n("Cast", ["nz"], ["c"], to=TensorProto.FLOAT, name="cast"), n("Mul", ["c", "c"], ["y"], name="mul"),
         n("NonZero", ["x"], ["nx"], name="nx"), n("Transpose", ["nx"], ["t"], perm=[1, 0], name="tr")],
        "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("t", TensorProto.INT64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _nonzero_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    c = np.stack(np.nonzero(np.maximum(x, 0))).astype(F32)
    return {"y": c * c, "t": np.stack(np.nonzero(x)).T}


def test_nodes_of_a_shape_known_only_at_run_time_run_on_the_host(kit, device):
    """NonZero's result has a dim known only at run time: no arena buffer can be planned for
    it, so it and the nodes that read it run on the NumPy backend on the host, behind the
    Relu kernel, as a node without a template does; nothing of theirs is in the arena."""
    from tilefold.backends.devices import canonical
    from tilefold.backends.numpy import NumpyExecutable
    from tilefold.backends.triton.executor import check_arena

    g = tilefold.load(_nonzero_model())
    exe = TritonExecutable(g, device=device)
    rng = np.random.default_rng(11)
    for _ in range(2):  # two draws: a different number of nonzeros each run
        x = rng.standard_normal((3, 4)).astype(F32)
        x[0, 1] = 0.0
        got = exe({"x": x})
        kit.assert_close(got, _nonzero_reference(x), rtol=0, atol=0)
        kit.assert_close(got, NumpyExecutable(g)({"x": x}), rtol=0, atol=0)
    assert exe.fallback_nodes == ["nz", "cast", "mul", "nx", "tr"]
    gpu = canonical(device)  # "cuda" is "cuda:0"
    assert {s.group.anchor.name: s.device for s in exe.steps} == {
        "relu": gpu, "nz": "cpu", "cast": "cpu", "mul": "cpu", "nx": "cpu", "tr": "cpu"}
    assert [b.value.node for b in exe.memory.devices[gpu].buffers] == ["relu"]
    assert exe.transfers == 2 * 2 and exe.transfer_bytes == 2 * 2 * 3 * 4 * 4  # per run: x in, relu's result out
    check_arena(exe)


def test_a_symbolic_batch_then_nonzero_runs_its_dynamic_part_on_the_host(kit):
    """A dynamic batch is made static per run; NonZero's dim stays dynamic after that."""
    g = tilefold.load(_nonzero_model(batch="N"))
    exe = TritonExecutable(g, device="interp")
    rng = np.random.default_rng(12)
    for batch in (2, 5):
        x = rng.standard_normal((batch, 4)).astype(F32)
        kit.assert_close(exe({"x": x}), _nonzero_reference(x), rtol=0, atol=0)
        assert "relu" not in exe.fallback_nodes and {"nz", "cast", "mul"} <= set(exe.fallback_nodes)
    assert len(exe._variants) == 2


def test_topk_with_a_k_known_at_run_time_runs_on_the_host(kit):
    """TopK with K an input: its results' shapes are dynamic, so it and the Neg on its values
    run on the host, after the Exp kernel."""
    from onnx import TensorProto, helper

    n = helper.make_node
    graph = helper.make_graph(
        [n("Exp", ["x"], ["e"], name="exp"), n("TopK", ["e", "k"], ["v", "i"], axis=1, name="topk"),
         n("Neg", ["v"], ["y"], name="neg")],
        "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6]),
                 helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    exe = TritonExecutable(tilefold.load(model), device="interp")
    x = np.random.default_rng(13).standard_normal((3, 6)).astype(F32)
    for k in (2, 4):
        feeds = {"x": x, "k": np.array([k], np.int64)}
        got = exe(feeds)
        want = np.argsort(-x, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(got["i"], want)
        np.testing.assert_allclose(got["y"], -np.take_along_axis(np.exp(x), want, axis=1), rtol=1e-6)
    assert exe.fallback_nodes == ["topk", "neg"]


def test_a_node_of_dynamic_shape_placed_on_a_triton_device_is_a_one_line_error(kit):
    g = tilefold.load(_nonzero_model())
    g.node("cast").device = "interp"
    with pytest.raises(TilefoldError, match=r"node 'cast' \(op Cast\) is placed on 'interp', but its result "
                                            r"float32\[2xunk__\d+\] has a shape known only at run time") as info:
        TritonExecutable(g, device="interp")
    assert "\n" not in str(info.value) and "'cpu'" in str(info.value)
    g.node("cast").device = None
    g.node("tr").device = "interp"
    with pytest.raises(TilefoldError, match=r"node 'tr' \(op Transpose\) is placed on 'interp', but its result"):
        TritonExecutable(g, device="interp")


def test_heads_split_and_transposed_in_whole_tiles_are_views_of_the_projection(kit, device):
    """A transformer layer whose rows and head dims are whole 16x16 tiles, optimized for the
    gpu target: the Reshapes into heads and the Transposes into (B, H, T, D) blocks keep every
    tile in place, so they run as views of the buffers (no kernel, no copy), and the layer
    still computes onnxruntime's result."""
    from tilefold.backends.triton.executor import check_arena
    from tilefold.frontends.onnx import load_onnx

    model = kit.tiny_transformer(batch=1, seq=16, dim=64, heads=2, ff=32)
    exe = TritonExecutable(tilefold.optimize(load_onnx(model), "gpu").graph, device=device)
    views = [step.group.anchor for step in exe.steps if step.group.kind == "view"]
    assert [n.op for n in views].count("Reshape") == 4 and [n.op for n in views].count("Transpose") == 4
    planned = {b.value.node for plan in exe.memory.devices.values() for b in plan.buffers}
    assert not planned & {n.name for n in views}  # the plan keeps the viewed buffers alive instead
    kernels = [step.plan.nodes for step in exe.steps if step.plan is not None]
    assert not any(all(exe.graph.node(n).op in ("Reshape", "Transpose") for n in nodes) for nodes in kernels)
    x = np.random.default_rng(17).standard_normal((1, 16, 64)).astype(F32)
    kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}), rtol=1e-4, atol=1e-5)
    check_arena(exe)  # a view's readers keep the buffer it views alive


def test_a_transpose_that_moves_elements_is_a_kernel_not_a_view(kit, device):
    """The view rule checks where every element lies: a plain transpose, or a reshape that
    cuts across 16x16 tiles, copies."""
    enc = PackedEncoding((0, 1), (16, 16))
    x = np.random.default_rng(18).standard_normal((32, 48)).astype(F32)
    g = Graph("moves")
    xv = g.add_input("x", TensorType(x.shape, F32))
    g.add_output(kit.add(g, "Transpose", [xv], {"perm": (1, 0)}), "t")
    tiled = kit.add(g, "Pack", [xv], {"encoding": enc}, encoding=enc)
    shape = g.add_constant(np.array([16, 96], np.int64), name="shape")
    g.add_output(kit.add(g, "Relu", [kit.add(g, "Reshape", [tiled, shape])]), "r")
    exe = TritonExecutable(g, device=device)
    assert [step.group.kind for step in exe.steps if step.group.kind == "view"] == []
    got = exe({"x": x})
    np.testing.assert_array_equal(got["t"], x.T)
    np.testing.assert_array_equal(got["r"], np.maximum(x.reshape(16, 96), 0))


def test_outputs_come_back_in_the_order_the_graph_declares_them(kit):
    g = Graph("two outputs")
    x = g.add_input("x", TensorType((4, 6), F32))
    first = kit.add(g, "Relu", [x], name="first")
    late = g.add_output(first, "late")
    g.add_output(first, "early")
    g.set_input(late.name, 0, kit.add(g, "Neg", [first], name="second"))
    x_in = np.random.default_rng(4).standard_normal((4, 6)).astype(F32)
    got = TritonExecutable(g, device="interp")({"x": x_in})
    assert list(got) == ["late", "early"]
    np.testing.assert_array_equal(got["early"], np.maximum(x_in, 0))
