"""ConvTranspose is an anchor of the cpu target: a decoder's upsampling between channels-last
convs reads and writes channels-last buffers, with its weight packed once as a GEMM operand,
and no runtime layout op is left. The gpu target leaves it as it is. Every optimized graph
computes what the plain graph computes and onnxruntime computes, also from the written file."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import tilefold
from tilefold.backends.numpy.packed import NATIVE, path
from tilefold.backends.numpy.registry import KERNELS, KernelSpec
from tilefold.layout.targets import NHWC, transposed_weight

from .test_propagate_tiled import RNG, check, conv_weights, model, runtime_layout_ops

SHAPE = (2, 3, 7, 6)


def decoder(group: int = 1) -> onnx.ModelProto:
    """conv -> relu -> ConvTranspose (stride 2, pads, output_padding) -> relu -> conv."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["up"], strides=[2, 2], pads=[1, 0, 1, 1],
                         output_padding=[1, 1], group=group),
        helper.make_node("Relu", ["up"], ["u"]),
        helper.make_node("Conv", ["u", "w1"], ["y"], pads=[1, 1, 1, 1]),
    ]
    weights = {"w0": conv_weights(8, 3), "b0": RNG.standard_normal(8).astype(np.float32),
               "wt": (RNG.standard_normal((8, 12 // group, 3, 3)) * 0.3).astype(np.float32),
               "bt": RNG.standard_normal(12).astype(np.float32), "w1": conv_weights(5, 12)}
    return model(nodes, [("x", list(SHAPE))], ["y"], weights)


def _spec(graph, node) -> KernelSpec:
    values = graph.inputs_of(node.name)
    return KernelSpec(node, [graph.type_of(v) if v is not None else None for v in values],
                      [graph.constant_value(v) if v is not None else None for v in values])


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_between_convs_runs_channels_last_on_the_cpu_target(group):
    after = check(decoder(group), target="cpu", shape=SHAPE)
    assert runtime_layout_ops(after) == []
    (node,) = [n for n in after.nodes() if n.op == "ConvTranspose"]
    x, w = (after.type_of(v) for v in after.inputs_of(node.name)[:2])
    assert x.encoding == NHWC and node.outputs[0].encoding == NHWC
    assert w.encoding == transposed_weight(4)
    assert path(KERNELS[node.op], _spec(after, node)) == NATIVE


def test_the_gpu_target_leaves_conv_transpose_as_it_is():
    after = check(decoder(), target="gpu", shape=SHAPE)
    (node,) = [n for n in after.nodes() if n.op == "ConvTranspose"]
    assert node.outputs[0].encoding is None
    assert all(after.type_of(v).encoding is None for v in after.inputs_of(node.name) if v is not None)


def test_a_conv_transpose_at_the_input_reads_it_as_it_is():
    """The graph's NCHW input is read by the kernel itself (no Pack), its 1-D result unpacked
    only where it leaves the graph."""
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["y"], strides=[3], dilations=[2], group=2)]
    weights = {"wt": (RNG.standard_normal((4, 3, 4)) * 0.3).astype(np.float32)}
    after = check(model(nodes, [("x", [2, 4, 9])], ["y"], weights), target="cpu", shape=(2, 4, 9))
    assert runtime_layout_ops(after) == []
    assert not any(n.op == "Pack" for n in after.nodes())


@pytest.mark.parametrize("form", ["logical", "packed"])
def test_the_written_decoder_runs_in_onnxruntime_with_the_same_results(tmp_path, form):
    proto = decoder()
    optimized = tilefold.optimize(tilefold.load(proto), "cpu")
    feeds = {"x": RNG.standard_normal(SHAPE).astype(np.float32)}
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = tilefold.compile(optimized.graph)(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    out = tmp_path / f"decoder.{form}.onnx"
    tilefold.save(optimized, out, form=form)
    written = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(written, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    reread = tilefold.compile(tilefold.load(out))(feeds)["y"]
    np.testing.assert_allclose(reread, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
