"""Layouts pass through resampling (Resize, and Gather along one axis, torch's nearest
upsampling) when the axes it moves are untiled: a U-Net's upsampling then runs on the conv
layouts (NHWC on the cpu target, NCHWc16 on the gpu target) with no runtime layout op. An
axis that is resampled stops a tile along it; every optimized graph computes what the plain
graph computes, and its padding holds what its encodings record."""
import numpy as np
import pytest
from onnx import helper

from tilefold.backends.numpy.packed import NATIVE, path
from tilefold.backends.numpy.registry import KERNELS, KernelSpec
from tilefold.bench.models import UPSAMPLINGS, fusion_model, unet_model

from .test_propagate_tiled import RNG, check, conv_weights, model, runtime_layout_ops

SHAPE = (2, 3, 8, 8)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("upsample", UPSAMPLINGS)
def test_upsampling_between_convs_runs_on_their_layout(target, upsample):
    after = check(unet_model(upsample=upsample), target=target, shape=SHAPE)
    assert runtime_layout_ops(after) == []
    for node in after.nodes():
        if node.op in ("Resize", "Gather"):
            assert node.outputs[0].encoding is not None
            spec = KernelSpec(node, [after.type_of(v) if v is not None else None for v in after.inputs_of(node.name)],
                              [after.constant_value(v) if v is not None else None for v in after.inputs_of(node.name)])
            assert path(KERNELS[node.op], spec) == NATIVE


@pytest.mark.parametrize("target, stops", [("gpu", True), ("cpu", False)])
def test_a_resize_along_the_channels_stops_a_channel_tile_but_not_a_permutation(target, stops):
    """Channels 16 -> 32 by a scale of 2: the gpu target's channel tiles cannot pass; the cpu
    target's channels-last order can (the channel axis is one buffer axis)."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["a", "", "scales"], ["up"], mode="linear"),
        helper.make_node("Conv", ["up", "w1"], ["y"]),
    ]
    weights = {"w0": conv_weights(16, 3), "w1": conv_weights(4, 32, 1),
               "scales": np.array([1, 2, 1, 1], np.float32)}
    after = check(model(nodes, [("x", list(SHAPE))], ["y"], weights), target=target, shape=SHAPE)
    assert bool(runtime_layout_ops(after)) == stops


def test_a_gather_with_a_matrix_of_indices_stops_layouts():
    """Only a 1-D index keeps the rank (a dim for a dim); the plain graph's result is kept."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Gather", ["a", "rows"], ["g"], axis=2),
        helper.make_node("Reshape", ["g", "shape"], ["flat"]),
        helper.make_node("Conv", ["flat", "w1"], ["y"]),
    ]
    weights = {"w0": conv_weights(16, 3), "w1": conv_weights(4, 16, 1),
               "rows": RNG.integers(-8, 8, (2, 4)).astype(np.int64), "shape": np.array([2, 16, 8, 8], np.int64)}
    after = check(model(nodes, [("x", list(SHAPE))], ["y"], weights), target="cpu", shape=SHAPE)
    gather = next(n for n in after.nodes() if n.op == "Gather")
    assert gather.outputs[0].encoding is None


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_one_channel_of_an_attention_map_is_read_in_place(target):
    """GLPN's feature fusion: a conv writes a 2-channel attention map, and each channel
    (a Gather of a scalar index, which drops the axis) scales a feature map. A scalar index
    reads one position of the channel axis, so it reads the map in the conv's layout,
    channels-last or channel-tiled (the index addresses its tile like any other; the
    padding of the 2-channel tile is never read, also for the index -1)."""
    after = check(fusion_model(), target=target, shape=SHAPE)
    assert runtime_layout_ops(after) == []
    gathers = [n for n in after.nodes() if n.op == "Gather"]
    assert len(gathers) == 2 and all(after.type_of(after.inputs_of(n.name)[0]).encoding is not None for n in gathers)
