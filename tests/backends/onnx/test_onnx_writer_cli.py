"""`tilefold optimize MODEL -o OUT`: writes a file onnxruntime runs like the original, prints a
summary, and fails with one line (exit 2) and no partial file on bad paths or bad input."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import tilefold
from tilefold.cli import main


def test_optimize_writes_a_file_onnxruntime_runs(mlp_path, tmp_path, capsys, ort_run):
    out = tmp_path / "mlp.opt.onnx"
    assert main(["optimize", str(mlp_path), "--target", "gpu", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and out.name in text
    for row in ("ops (tilefold graph)", "runtime layout ops", "weight bytes", "time"):
        assert row in text
    x = np.random.default_rng(9).standard_normal((4, 40)).astype(np.float32)
    np.testing.assert_allclose(ort_run(out, {"x": x})["y"], ort_run(mlp_path, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    assert {p.key: p.value for p in onnx.load(out).metadata_props}["tilefold.target"] == "gpu"


def test_json_report_describes_the_written_file(mlp_path, tmp_path, capsys):
    out = tmp_path / "mlp.opt.onnx"
    assert main(["optimize", str(mlp_path), "--target", "gpu", "-o", str(out), "--report", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["output"]["path"] == str(out)
    assert data["output"]["file_bytes"] == out.stat().st_size
    assert data["output"]["weight_bytes"] >= data["weight_bytes_before"]  # padded tiles
    assert data["output"]["onnx_ops"]["MatMul"] == 3


def test_optimizing_an_optimized_file_again_is_a_no_op(mlp_path, tmp_path, capsys):
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert main(["optimize", str(mlp_path), "--target", "gpu", "-o", str(first), "--report", "json"]) == 0
    capsys.readouterr()
    assert main(["optimize", str(first), "--target", "gpu", "-o", str(second), "--report", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pass_seconds"] == {} and data["folded_packs"] == 0
    assert data["layout_ops_before"] == data["layout_ops_after"]
    a, b = onnx.load(first), onnx.load(second)
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    graph_a, graph_b = (json.loads({p.key: p.value for p in m.metadata_props}["tilefold.graph"]) for m in (a, b))
    assert graph_a["nodes"] == graph_b["nodes"]


def test_optimized_for_another_target_is_planned_again(mlp_path, tmp_path, capsys):
    gpu, cpu = tmp_path / "gpu.onnx", tmp_path / "cpu.onnx"
    assert main(["optimize", str(mlp_path), "--target", "gpu", "-o", str(gpu)]) == 0
    assert main(["optimize", str(gpu), "--target", "cpu", "-o", str(cpu), "--check"]) == 0
    capsys.readouterr()
    graph = tilefold.load(cpu)
    assert graph.meta["target"] == "cpu"
    assert all(t.encoding is None or not t.encoding.inner_tiles for n in graph.nodes() for t in n.outputs)


@pytest.mark.parametrize("case", ["missing_dir", "directory", "not_onnx", "unknown_target"])
def test_errors_are_one_line_with_no_partial_file(case, mlp_path, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    model = mlp_path
    args = []
    if case == "missing_dir":
        out = tmp_path / "missing" / "out.onnx"
    elif case == "directory":
        out = tmp_path
    elif case == "not_onnx":
        model = tmp_path / "notes.onnx"
        model.write_text("these are not the weights you are looking for\n" * 20)
    else:
        args = ["--target", "tpu"]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["optimize", str(model), "-o", str(out), *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilefold: error: ")
    assert captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_failed_write_leaves_the_old_output(mlp_path, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous model")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", full_disk)
    assert main(["optimize", str(mlp_path), "-o", str(out)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == b"previous model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "out.onnx"]
