"""The `tilefold` command: run, compare with onnxruntime, write outputs, inspect, and one-line
errors with a non-zero exit for bad input."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefold.cli import main

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    w = RNG.standard_normal((6, 4)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Tanh", ["a"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("m") / "tiny.onnx"
    onnx.save(model, path)
    return path, w, b


def test_run_compares_with_onnxruntime_and_writes_outputs(model_path, tmp_path, capsys):
    path, w, b = model_path
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    code = main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--compare", "onnxruntime",
                 "--output-dir", str(out_dir)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "match" in text and "MISMATCH" not in text
    np.testing.assert_allclose(np.load(out_dir / "y.npy"), np.tanh(x @ w + b), rtol=1e-5, atol=1e-6)


def test_compare_exits_1_beyond_the_tolerances(model_path, capsys):
    path, _, _ = model_path
    # A negative tolerance admits no output, so the comparison must fail and say so.
    code = main(["run", str(path), "--dim", "batch=2", "--compare", "onnxruntime", "--rtol", "0", "--atol", "-1"])
    assert code == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_inspect_summarizes_the_graph(model_path, capsys):
    path, _, _ = model_path
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    for expected in ("MatMul 1", "Add 1", "Tanh 1", "28 elements", "x: float32[batchx6]"):
        assert expected in text


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda p, t: ["run", str(t / "missing.onnx")], "missing.onnx"),
        (lambda p, t: ["run", str(p), "--input", f"nope={t / 'x.npy'}"], "unknown input name 'nope'"),
        (lambda p, t: ["run", str(p), "--input", f"x={t / 'absent.npy'}"], "cannot read"),
        (lambda p, t: ["run", str(p), "--input", "x"], "expected NAME=VALUE"),
        (lambda p, t: ["run", str(p), "--input", f"x={t / 'wrong.npy'}"], "dtype float64, expected float32"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(model_path, tmp_path, capsys, make_args, message):
    path, _, _ = model_path
    np.save(tmp_path / "x.npy", np.zeros((2, 6), np.float32))
    np.save(tmp_path / "wrong.npy", RNG.standard_normal((2, 6)))
    assert main(make_args(path, tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tilefold: error: ") and message in err and "\n" not in err


def test_not_an_onnx_file(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_text("this is not a model")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.onnx" in err and "\n" not in err


def test_unwritable_output_dir_fails_cleanly(model_path, tmp_path, capsys):
    path, _, _ = model_path
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", str(path), "--output-dir", str(blocker / "sub")]) == 2
    assert "cannot create output directory" in capsys.readouterr().err


def test_console_script_is_installed(model_path):
    path, _, _ = model_path
    done = subprocess.run([sys.executable, "-m", "tilefold.cli", "inspect", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and "Tanh" in done.stdout


def test_compare_runs_a_quantized_model_as_written_in_onnxruntime(tmp_path, capsys):
    """onnxruntime's fused integer kernels round a QDQ model's arithmetic differently; with its
    graph optimizations off it runs the QuantizeLinear/DequantizeLinear nodes as tilefold does."""
    from tilefold.bench.models import qdq_cnn_model

    path = tmp_path / "qdq.onnx"
    onnx.save(qdq_cnn_model(), path)
    assert main(["run", str(path), "--compare", "onnxruntime", "--atol", "0", "--rtol", "0"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "a quantized (QDQ) model: compared with onnxruntime's graph optimizations off" in text
    assert "match" in text and "MISMATCH" not in text


def test_run_with_the_aten_kernels_matches_onnxruntime(tmp_path, capsys):
    """`--kernels aten`: Softmax and LayerNormalization through PyTorch's kernels."""
    scale = RNG.standard_normal(8).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
         helper.make_node("LayerNormalization", ["s", "scale"], ["y"], axis=-1, epsilon=1e-5)],
        "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [numpy_helper.from_array(scale, "scale")])
    path = tmp_path / "rows.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code = main(["run", str(path), "--kernels", "aten", "--compare", "onnxruntime", "--rtol", "1e-4"])
    text = capsys.readouterr().out
    assert code == 0 and "MISMATCH" not in text, text
