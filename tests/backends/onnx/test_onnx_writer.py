"""`tilefold.save` writes an optimized graph as a standard ONNX model: onnxruntime runs it with
the original's results, the file says what it was optimized for, and tilefold reads back the
exact optimized graph."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import tilefold
from tilefold.backends.onnx import save_onnx
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import Graph, Splat, TensorType, TilefoldError, Value

TARGETS = ("cpu", "gpu", "gpu-padded")
"""gpu tiles none of the MLP fixture's dims (batch 4, widths 40, 72, 24, 10: 16 divides none);
gpu-padded (tests/conftest.py) tiles them all, padding included."""


def _feeds(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(t.shape).astype(t.dtype) for n, t in graph.input_types().items()}


def _props(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}


@pytest.mark.parametrize("target", TARGETS)
def test_optimized_mlp_runs_in_onnxruntime_like_the_original(mlp_path, tmp_path, target, ort_run):
    optimized = tilefold.optimize(mlp_path, target)
    out = tmp_path / f"mlp.{target}.onnx"
    tilefold.save(optimized, out)
    feeds = _feeds(optimized.graph, seed=11)
    want = ort_run(mlp_path, feeds)
    got = ort_run(out, feeds)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    onnx.checker.check_model(str(out), full_check=True)


def test_gpu_tiles_are_stored_packed_and_unpacked_by_standard_ops(mlp_path, tmp_path):
    optimized = tilefold.optimize(mlp_path, "gpu-padded")
    out = tmp_path / "mlp.gpu.onnx"
    tilefold.save(optimized, out)
    model = onnx.load(out)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    packed = [n for n in optimized.graph.constants() if n.outputs[0].encoding is not None
              and isinstance(n.attrs["value"], np.ndarray)]
    assert packed, "the target packs the MLP's weights"
    for node in packed:
        stored = inits[f"{node.name}.packed"]
        assert stored.shape == tuple(node.outputs[0].encoding.physical_shape(node.outputs[0].shape))
        np.testing.assert_array_equal(stored, node.attrs["value"])
    ops = {n.op_type for n in model.graph.node}
    assert {"Transpose", "Reshape", "Slice"} <= ops


@pytest.mark.parametrize("target", TARGETS)
def test_metadata_says_what_the_file_was_optimized_for(mlp_path, tmp_path, target):
    optimized = tilefold.optimize(mlp_path, target)
    out = tmp_path / "opt.onnx"
    tilefold.save(optimized, out)
    props = _props(out)
    assert props["tilefold.target"] == target
    assert props["tilefold.version"] == tilefold.__version__
    tiles = json.loads(props["tilefold.tiles"])
    if target == "gpu-padded":
        assert set(tiles) == {"matmul0", "matmul1", "matmul2"}
        for entry in tiles.values():
            assert entry["op"] == "MatMul"
            assert entry["result"] is None  # written row-major: nothing reads its tiles
            assert entry["operands"][1]["inner_tiles"] == [16, 16]
    else:
        assert tiles == {}  # the cpu target leaves MatMul row-major; gpu finds no dim to tile


@pytest.mark.parametrize("target", TARGETS)
def test_round_trip_gives_back_the_optimized_graph(mlp_path, tmp_path, target, facts):
    optimized = tilefold.optimize(mlp_path, target)
    out = tmp_path / "opt.onnx"
    tilefold.save(optimized, out)
    again = load_onnx(out)
    assert facts(again) == facts(optimized.graph)
    assert again.meta["target"] == target
    assert facts(tilefold.load(out)) == facts(optimized.graph)  # simplify finds nothing to change


@pytest.mark.parametrize("target", TARGETS)
def test_optimizing_a_reloaded_file_is_a_no_op(mlp_path, tmp_path, target, facts):
    optimized = tilefold.optimize(mlp_path, target)
    out = tmp_path / "opt.onnx"
    tilefold.save(optimized, out)
    again = tilefold.optimize(out, target)
    assert facts(again.graph) == facts(optimized.graph)
    assert again.report.pass_seconds == {}
    assert again.report.before.count() == again.report.after.count() == optimized.report.after.count()
    assert again.report.folded_packs == 0


@pytest.mark.parametrize("target", TARGETS)
def test_reloaded_file_runs_on_numpy_backend_with_same_results(mlp_path, tmp_path, target):
    optimized = tilefold.optimize(mlp_path, target)
    out = tmp_path / "opt.onnx"
    tilefold.save(optimized, out)
    feeds = _feeds(optimized.graph, seed=5)
    want = tilefold.compile(tilefold.load(mlp_path))(feeds)
    got_original = tilefold.compile(optimized.graph)(feeds)
    got = tilefold.compile(tilefold.load(out))(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], got_original[name])
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_loading_for_another_target_plans_again(mlp_path, tmp_path, facts):
    gpu = tilefold.optimize(mlp_path, "gpu-padded")
    out = tmp_path / "gpu.onnx"
    tilefold.save(gpu, out)
    plain = load_onnx(out, target="cpu")
    assert plain.meta["optimized_for"] == "gpu-padded"
    assert "target" not in plain.meta
    assert all(t.encoding is None for n in plain.nodes() for t in n.outputs)
    assert facts(load_onnx(out, target="gpu-padded")) == facts(gpu.graph)
    replanned = tilefold.optimize(tilefold.load(out), "cpu")  # stripped, then planned for cpu
    assert replanned.graph.meta["target"] == "cpu"
    assert all(t.encoding is None or not t.encoding.inner_tiles for n in replanned.graph.nodes() for t in n.outputs)
    feeds = _feeds(gpu.graph, seed=8)
    want = tilefold.compile(tilefold.load(mlp_path))(feeds)
    for graph in (plain, replanned.graph):
        got = tilefold.compile(graph)(feeds)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)


def test_strip_layouts_gives_an_equivalent_plain_graph(mlp_path):
    from tilefold.layout.strip import strip_layouts

    gpu = tilefold.optimize(mlp_path, "gpu-padded").graph
    plain = strip_layouts(gpu)
    assert not any(n.op in ("Pack", "Unpack") for n in plain.nodes())
    assert all(t.encoding is None for n in plain.nodes() for t in n.outputs)
    assert "target" not in plain.meta and gpu.meta["target"] == "gpu-padded"
    assert any(t.encoding is not None for n in gpu.nodes() for t in n.outputs)  # the input is unchanged
    feeds = _feeds(gpu, seed=2)
    np.testing.assert_allclose(tilefold.compile(plain)(feeds)["y"], tilefold.compile(gpu)(feeds)["y"],
                               rtol=1e-5, atol=1e-6)


def test_an_edited_file_is_read_as_plain_onnx(mlp_path, tmp_path):
    out = tmp_path / "opt.onnx"
    tilefold.save(tilefold.optimize(mlp_path, "gpu"), out)
    model = onnx.load(out)
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"  # another tool rewrote a node: the annotations no longer describe the file
    onnx.save(model, out)
    graph = load_onnx(out)
    assert "target" not in graph.meta
    assert graph.op_counts().get("Sigmoid") == 1


def test_an_edited_attribute_also_drops_the_annotations(tmp_path):
    from tilefold.bench.models import mlp

    source = mlp(tmp_path / "g.onnx", batch=2, sizes=(8, 6), gemm=True)
    out = tmp_path / "opt.onnx"
    tilefold.save(tilefold.optimize(source, "cpu"), out)
    model = onnx.load(out)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    next(a for a in gemm.attribute if a.name == "alpha").f = 2.0
    onnx.save(model, out)
    graph = load_onnx(out)
    assert "target" not in graph.meta
    assert next(n for n in graph.nodes() if n.op == "Gemm").attrs["alpha"] == 2.0


def test_splats_are_written_as_constant_of_shape(tmp_path, ort_run):
    graph = Graph("splats")
    x = graph.add_input("x", TensorType((3, 5), np.float32))
    half = graph.add_constant(Splat(0.5, (3, 5), np.float32), name="half")
    count = graph.add_constant(Splat(7, (5,), np.int64), name="count")
    mul = graph.add_node("Mul", [x, half], [TensorType((3, 5), np.float32)], name="mul")
    cast = graph.add_node("Cast", [count], [TensorType((5,), np.float32)], {"to": TensorProto.FLOAT, "saturate": 1},
                          name="cast")
    add = graph.add_node("Add", [Value(mul.name), Value(cast.name)],
                         [TensorType((3, 5), np.float32)], name="add")
    graph.add_output(Value(add.name), "y")
    out = tmp_path / "splats.onnx"
    tilefold.save(graph, out)
    model = onnx.load(out)
    assert sum(n.op_type == "ConstantOfShape" for n in model.graph.node) == 2
    assert not any(t.name in ("half", "count") for t in model.graph.initializer)
    xv = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(ort_run(out, {"x": xv})["y"], xv * 0.5 + 7, rtol=1e-6)
    assert isinstance(load_onnx(out).node("half").attrs["value"], Splat)


def test_scalar_constants_keep_rank_zero(tmp_path, ort_run, facts):
    graph = Graph("select")
    x = graph.add_input("x", TensorType((2, 5, 3), np.float32))
    index = graph.add_constant(np.array(3, np.int64), name="index")
    gather = graph.add_node("Gather", [x, index], [TensorType((2, 3), np.float32)], {"axis": 1}, name="gather")
    graph.add_output(Value(gather.name), "y")
    out = tmp_path / "select.onnx"
    tilefold.save(graph, out)
    xv = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(out, {"x": xv})["y"], xv[:, 3])
    assert facts(load_onnx(out)) == facts(graph)


def test_outputs_that_are_inputs_or_shared_get_identities(tmp_path, ort_run):
    graph = Graph("aliases")
    x = graph.add_input("x", TensorType(("N", 4), np.float32))
    relu = graph.add_node("Relu", [x], [TensorType(("N", 4), np.float32)], name="relu")
    graph.add_output(x, "same")
    graph.add_output(Value(relu.name), "r1")
    graph.add_output(Value(relu.name), "r2")
    out = tmp_path / "aliases.onnx"
    tilefold.save(graph, out)
    xv = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    got = ort_run(out, {"x": xv})
    np.testing.assert_array_equal(got["same"], xv)
    np.testing.assert_array_equal(got["r1"], np.maximum(xv, 0))
    np.testing.assert_array_equal(got["r2"], np.maximum(xv, 0))


def test_large_weights_go_to_an_external_data_file(mlp_path, tmp_path, ort_run, facts):
    optimized = tilefold.optimize(mlp_path, "gpu-padded")
    out = tmp_path / "ext.onnx"
    written = save_onnx(optimized.graph, out, external_threshold=1000)
    assert written.data_path is not None and written.data_path.exists()
    assert written.data_path.parent == tmp_path and written.data_path.name.startswith("ext.onnx.")
    assert written.data_path.stat().st_size > out.stat().st_size
    assert not any(t.HasField('raw_data') for t in onnx.load(out, load_external_data=False).graph.initializer
                   if t.dims and np.prod(t.dims) > 1000)
    feeds = _feeds(optimized.graph, seed=4)
    np.testing.assert_allclose(ort_run(out, feeds)["y"], ort_run(mlp_path, feeds)["y"], rtol=1e-5, atol=1e-6)
    assert facts(load_onnx(out)) == facts(optimized.graph)
    rewritten = save_onnx(optimized.graph, out, external_threshold=1000)  # the earlier data file is removed
    assert sorted(p.name for p in tmp_path.glob("ext.onnx*")) == sorted(["ext.onnx", rewritten.data_path.name])
    save_onnx(optimized.graph, out)  # under the threshold: one file
    assert [p.name for p in tmp_path.glob("ext.onnx*")] == ["ext.onnx"]


# ---- bad output paths: one-line errors, no partial file ----------------------------------------
def _graph_of(mlp_path: Path) -> Graph:
    return tilefold.optimize(mlp_path, "gpu").graph


def test_missing_directory_is_a_one_line_error(mlp_path, tmp_path):
    target = tmp_path / "nowhere" / "out.onnx"
    with pytest.raises(TilefoldError, match="no such directory") as info:
        tilefold.save(_graph_of(mlp_path), target)
    assert "\n" not in str(info.value)
    assert not target.parent.exists()


def test_directory_as_output_is_a_one_line_error(mlp_path, tmp_path):
    with pytest.raises(TilefoldError, match="is a directory"):
        tilefold.save(_graph_of(mlp_path), tmp_path)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_directory_is_a_one_line_error(mlp_path, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(TilefoldError, match="cannot write"):
            tilefold.save(_graph_of(mlp_path), folder / "out.onnx")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_unwritable_temporary_file_is_a_one_line_error(mlp_path, tmp_path, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(TilefoldError, match="cannot write .*Permission denied") as info:
        tilefold.save(_graph_of(mlp_path), tmp_path / "out.onnx")
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == [tmp_path / "mlp.onnx"]


def test_a_failing_write_leaves_the_old_output_untouched(mlp_path, tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old contents")
    graph = _graph_of(mlp_path)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", broken)
    with pytest.raises(TilefoldError, match="No space left"):
        tilefold.save(graph, out)
    assert out.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "out.onnx"]


def test_a_model_the_checker_refuses_is_never_renamed_into_place(mlp_path, tmp_path, monkeypatch):
    from tilefold.backends.onnx.lower import lower as real

    def corrupt(graph, **kwargs):
        lowered = real(graph, **kwargs)
        lowered.model.graph.node[0].input[0] = "no_such_tensor"
        return lowered

    monkeypatch.setattr("tilefold.backends.onnx.write.lower", corrupt)
    out = tmp_path / "out.onnx"
    with pytest.raises(TilefoldError, match="fails onnx.checker") as info:
        tilefold.save(_graph_of(mlp_path), out)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


def test_unknown_form_is_refused(mlp_path, tmp_path):
    with pytest.raises(TilefoldError, match="unknown ONNX form"):
        tilefold.save(_graph_of(mlp_path), tmp_path / "o.onnx", form="tiled")


# ---- the packed form ----------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
def test_packed_form_runs_like_the_original(mlp_path, tmp_path, target, ort_run, facts):
    optimized = tilefold.optimize(mlp_path, target)
    out = tmp_path / "packed.onnx"
    tilefold.save(optimized, out, form="packed")
    feeds = _feeds(optimized.graph, seed=13)
    np.testing.assert_allclose(ort_run(out, feeds)["y"], ort_run(mlp_path, feeds)["y"], rtol=1e-5, atol=1e-6)
    assert facts(load_onnx(out)) == facts(optimized.graph)


def test_runtime_layout_ops_are_written_as_standard_ops_in_packed_form(mlp_path, tmp_path, ort_run, facts):
    """Every anchor wrapped in its runtime Pack and Unpack (the graph before propagation, in
    padded 16x16 tiles): in the packed form each is a real Pad/Reshape/Transpose (and Slice
    back), and onnxruntime computes what the original does."""
    wrapped = tilefold.optimize(mlp_path, "gpu-padded").before
    assert any(n.op == "Pack" for n in wrapped.nodes())
    out = tmp_path / "packed.onnx"
    tilefold.save(wrapped, out, form="packed")
    feeds = _feeds(wrapped, seed=13)
    np.testing.assert_allclose(ort_run(out, feeds)["y"], ort_run(mlp_path, feeds)["y"], rtol=1e-5, atol=1e-6)
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert {"Pad", "Reshape", "Transpose", "Slice"} <= set(ops)
    assert "Identity" not in ops[:-1]
    assert facts(load_onnx(out)) == facts(wrapped)


def test_elementwise_ops_run_on_lined_up_buffers():
    from tilefold.backends.onnx.packed import lines_up
    from tilefold.layout.encoding import PackedEncoding

    tiles = PackedEncoding((0, 1), (16, 16))
    out = TensorType((8, 10), np.float32, tiles)
    assert lines_up(TensorType((8, 10), np.float32, tiles), out)
    assert lines_up(TensorType((1, 10), np.float32, PackedEncoding((0, 1), (1, 16))), out)  # a broadcast row
    assert not lines_up(TensorType((1, 10), np.float32, tiles), out)  # a padded tile of one row
    assert not lines_up(TensorType((10,), np.float32), out)  # lower rank: numpy would align it wrongly
    assert not lines_up(TensorType((8, 10), np.float32), out)
    assert lines_up(TensorType((), np.float32), out)


def test_packed_form_refuses_tiles_over_symbolic_dims(tmp_path):
    from tilefold.layout.encoding import PackedEncoding

    graph = Graph("dynamic")
    x = graph.add_input("x", TensorType(("N", 20), np.float32))
    enc = PackedEncoding((1,), (16,))
    pack = graph.add_node("Pack", [x], [TensorType(("N", 20), np.float32, enc)], {"encoding": enc}, name="pack")
    relu = graph.add_node("Relu", [Value(pack.name)], [TensorType(("N", 20), np.float32, enc)], name="relu")
    unpack = graph.add_node("Unpack", [Value(relu.name)], [TensorType(("N", 20), np.float32)], name="unpack")
    graph.add_output(Value(unpack.name), "y")
    with pytest.raises(TilefoldError, match="symbolic dims") as info:
        tilefold.save(graph, tmp_path / "d.onnx", form="packed")
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
    tilefold.save(graph, tmp_path / "d.onnx")  # the logical form has no such limit


def test_written_file_gets_ordinary_permissions(mlp_path, tmp_path):
    out = tmp_path / "perm.onnx"
    tilefold.save(_graph_of(mlp_path), out)
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    out.chmod(0o640)
    tilefold.save(_graph_of(mlp_path), out)  # a rewrite keeps the old file's mode
    assert out.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("form", ["logical", "packed"])
def test_a_placed_graph_keeps_its_devices_and_transfers_in_the_file(tmp_path: Path, form: str) -> None:
    """Where each node runs is kept from the model file: Transfers are written as Identity for
    onnxruntime, and tilefold reads the placement back and runs it."""
    import onnxruntime as ort

    from tilefold.bench.models import mlp_model

    graph = tilefold.load(mlp_model(batch=5, sizes=(20, 33, 7), seed=1))
    placed = tilefold.optimize(graph, device="interp,cpu", affinity={"op:Relu": "cpu"})
    path = tmp_path / f"placed.{form}.onnx"
    tilefold.save(placed, path, form=form)
    back = tilefold.load(path)
    devices = {n.name: (n.op, n.device) for n in back.nodes() if n.op not in ("Input", "Output", "Constant")}
    assert devices == {n.name: (n.op, n.device) for n in placed.graph.nodes()
                       if n.op not in ("Input", "Output", "Constant")}
    assert [op for op, _ in devices.values()].count("Transfer") == 4  # in, to the Relu, back, out
    x = np.random.default_rng(21).standard_normal((5, 20)).astype(np.float32)
    want = tilefold.compile(graph)({"x": x})["y"]
    exe = tilefold.compile(back, device="interp,cpu")
    np.testing.assert_allclose(exe({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert exe.transfers == 4
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
