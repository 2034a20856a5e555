"""`tilefold optimize` and `tilefold.optimize`: the layout report as JSON or a table, `--check`
against the unoptimized graph on the NumPy backend, one-line errors; and the Python API."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefold
from tilefold.bench import models
from tilefold.cli import main
from tilefold.graph import Value
from tilefold.layout import LayoutResult

REQUIRED = ("layout_ops_before", "layout_ops_after", "layout_bytes_before", "layout_bytes_after")


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    return models.mlp(tmp_path_factory.mktemp("mlp") / "mlp.onnx", batch=4, sizes=(24, 40, 10), seed=3)


@pytest.fixture(scope="module")
def convnet_path(tmp_path_factory):
    """Conv -> Relu -> Conv -> residual Add -> Relu -> GlobalAveragePool -> Flatten -> Gemm,
    with channels 3 and 8 and odd spatial sizes."""
    rng = np.random.default_rng(5)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 11, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        [weight("w1", 8, 3, 3, 3), weight("b1", 8), weight("w2", 8, 8, 3, 3), weight("b2", 8),
         weight("fc", 10, 8), weight("fcb", 10)],
    )
    path = tmp_path_factory.mktemp("conv") / "convnet.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _json_report(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)  # stdout holds the JSON and nothing else


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_json_report_has_integer_layout_counts(mlp_path, capsys, target):
    code, report = _json_report(capsys, ["optimize", str(mlp_path), "--target", target, "--report", "json"])
    assert code == 0
    for key in REQUIRED:
        assert type(report[key]) is int and report[key] >= 0
    assert report["target"] == target
    assert report["layout_ops_after"] <= report["layout_ops_before"]
    assert report["layout_bytes_after"] <= report["layout_bytes_before"]


def test_gpu_tiles_on_an_mlp_fold_into_its_weights(tmp_path, capsys):
    path = models.mlp(tmp_path / "mlp16.onnx", batch=16, sizes=(32, 48, 10), seed=3)
    _, report = _json_report(capsys, ["optimize", str(path), "--target", "gpu", "--report", "json"])
    # The first MatMul wrapped (activation Pack, weight Pack, result Unpack), the second's
    # activation packed; 16 does not divide its 48x10 weight and 16x10 result: left untiled.
    assert report["layout_ops_before"] == 3 and report["constant_layout_ops_before"] == 1
    assert report["folded_packs"] == 1 and report["packed_constants_after"] == 1
    assert report["layout_ops_after"] == 0
    assert report["weight_bytes_after"] == report["weight_bytes_before"]  # no tile holds padding


def test_gpu_conv_tiles_count_their_padding_in_the_weight_bytes(convnet_path, capsys):
    _, report = _json_report(capsys, ["optimize", str(convnet_path), "--target", "gpu", "--report", "json"])
    # Both conv weights tiled 16 on F and C (8x3 and 8x8 padded to 16x16 per tap), their
    # biases of 8 tiled 16; the Gemm is not a gpu anchor.
    weights = 2 * 16 * 16 * 9 - 8 * 3 * 9 - 8 * 8 * 9
    biases = 2 * (16 - 8)
    assert report["weight_bytes_after"] - report["weight_bytes_before"] == 4 * (weights + biases)


def test_convnet_runs_without_standalone_layout_ops_on_cpu(convnet_path, capsys):
    code, report = _json_report(capsys, ["optimize", str(convnet_path), "--report", "json"])
    assert code == 0
    # Each conv wrapped: its activation packed to NHWC (2x3x11x9, 2x8x11x9 floats), its result unpacked.
    assert report["layout_ops_before"] == 4
    assert report["layout_bytes_before"] == 4 * (2 * 3 * 11 * 9 + 2 * 8 * 11 * 9 + 2 * 2 * 8 * 11 * 9)
    assert report["layout_ops_after"] == 0 and report["layout_bytes_after"] == 0
    assert report["folded_packs"] == 2  # both conv weights, now in GEMM form
    assert report["fused_layout_changes_after"] == 1  # the first conv reads NCHW x itself
    assert report["fused_layout_bytes_after"] == 4 * 2 * 3 * 11 * 9


@pytest.mark.parametrize("fixture", ["mlp_path", "convnet_path"])
def test_check_passes_on_the_optimized_graph(request, capsys, fixture):
    path = request.getfixturevalue(fixture)
    code, report = _json_report(capsys, ["optimize", str(path), "--check", "--seed", "4", "--report", "json"])
    assert report["check"]["ok"], report["check"]
    assert code == 0
    assert [r["output"] for r in report["check"]["outputs"]] == ["y"]


def test_check_exits_1_when_the_optimized_graph_computes_something_else(mlp_path, capsys, monkeypatch):
    real = tilefold.layout.optimize

    def off_by_a_bit(graph, target="cpu", *, verify=False):
        result = real(graph, target, verify=verify)
        after = result.after
        biggest = max(after.constants(), key=lambda n: n.attrs["value"].size)
        value = np.array(biggest.attrs["value"]) * np.float32(1.01)
        changed = after.add_constant(value, name="scaled", type=biggest.outputs[0])
        after.replace_all_uses(Value(biggest.name), changed)
        after.remove_node(biggest.name)
        return LayoutResult(result.before, after, result.target, result.log)

    monkeypatch.setattr(tilefold.layout, "optimize", off_by_a_bit)
    code = main(["optimize", str(mlp_path), "--check"])
    out = capsys.readouterr().out
    assert code == 1
    assert "MISMATCH" in out and "NO" in out


def test_table_is_the_default_report(mlp_path, capsys):
    assert main(["optimize", str(mlp_path)]) == 0
    out = capsys.readouterr().out
    for expected in ("runtime layout ops", "weight bytes stored", "time per pass", "materialize"):
        assert expected in out


def test_unknown_target_is_one_line_listing_the_registered_ones(mlp_path, capsys):
    code = main(["optimize", str(mlp_path), "--target", "tpu"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "'tpu'" in lines[0] and "cpu" in lines[0] and "gpu" in lines[0]


def test_python_api_returns_graph_report_and_baseline(convnet_path):
    graph = tilefold.load(convnet_path)
    ops_before_call = graph.op_counts()
    opt = tilefold.optimize(graph, target="cpu", verify=True)
    assert graph.op_counts() == ops_before_call  # the input graph is left as it was
    assert opt.report.to_dict()["layout_ops_before"] == opt.report.before.count() == 4
    assert opt.before.op_counts().get("Pack", 0) == 4  # two activations and two weights packed
    assert opt.graph.op_counts().get("Pack", 0) == 0
    assert "<table>" in opt._repr_html_()
    x = np.random.default_rng(8).standard_normal((2, 3, 11, 9)).astype(np.float32)
    want = tilefold.compile(graph)({"x": x})["y"]
    got = tilefold.compile(opt.graph)({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
