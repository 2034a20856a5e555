"""Layouts pass through the QuantizeLinear/DequantizeLinear pairs of a quantized (QDQ) model:
per-tensor scales like scalars, per-axis scales like BatchNormalization's per-channel
operands (packed with the channels on the gpu target), so a QDQ conv stack runs on the conv
layouts with no runtime layout op, and computes exactly what the plain graph computes
(small integers and power-of-two scales keep every float sum exact)."""
import numpy as np
import pytest

import tilefold
from tilefold.bench.models import qdq_cnn_model

from .test_propagate_tiled import RNG, check, runtime_layout_ops


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_a_qdq_conv_stack_runs_on_the_conv_layouts(target):
    after = check(qdq_cnn_model(), target=target, integers=True)
    assert runtime_layout_ops(after) == []
    quantized = [n for n in after.nodes() if n.op in ("QuantizeLinear", "DequantizeLinear")]
    assert len(quantized) == 4  # the weights' DequantizeLinear folded into the weights at load
    # the input's pair stays plain (the first conv reads NCHW itself); the pair between the
    # convs runs on their layout, its per-channel scale and zero point laid out to match
    assert [n.outputs[0].encoding is not None for n in quantized] == [False, False, True, True]


def test_the_optimized_qdq_graph_is_written_with_its_qdq_nodes(tmp_path):
    """onnxruntime, running the written file's ops as written, computes what tilefold does."""
    import onnxruntime as ort

    opt = tilefold.optimize(tilefold.load(qdq_cnn_model()), "cpu")
    path = tmp_path / "qdq.onnx"
    tilefold.save(opt, path)
    x = RNG.integers(-3, 4, (2, 3, 8, 8)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (want,) = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(tilefold.compile(opt.graph)({"x": x})["y"], want)
    import onnx

    ops = [n.op_type for n in onnx.load(path).graph.node]
    # the weights' DequantizeLinear is written again on their int8 integers
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 4
