"""Layouts pass through resampling (Resize, and Gather along one axis, torch's nearest
upsampling) when the axes it moves are untiled: a U-Net's upsampling then runs on the conv
layouts (NHWC on the cpu target, NCHWc16 on the gpu target) with no runtime layout op. An
axis that Resize resamples stops a tile along it; a Gather, whose kernels read each index
logically, keeps it where data and result hold whole tiles along its axis (rotary's
rotate_half). Every optimized graph computes what the plain graph computes, and its padding
holds what its encodings record."""
import numpy as np
import onnx
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


def _rotary(indices: np.ndarray, width: int = 64) -> onnx.ModelProto:
    """A product's rows rotated as rotary embedding rotates a head: y = h * cos + g(h) * sin,
    g a Gather of h's columns by `indices` (rotate_half's permutation, its sign in `sin`),
    then another product; the gpu target tiles both products' operands 16 x 16."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"]),
        helper.make_node("Gather", ["h", "turn"], ["g"], axis=1),
        helper.make_node("Mul", ["h", "cos"], ["a"]),
        helper.make_node("Mul", ["g", "sin"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["r"]),
        helper.make_node("MatMul", ["r", "w1"], ["y"]),
    ]
    weights = {"w0": RNG.standard_normal((width, width)).astype(np.float32),
               "turn": indices.astype(np.int64),
               "cos": RNG.standard_normal((32, width)).astype(np.float32),
               "sin": RNG.standard_normal((32, width)).astype(np.float32),
               "w1": RNG.standard_normal((width, 16)).astype(np.float32)}
    return model(nodes, [("x", [32, width])], ["y"], weights)


@pytest.mark.parametrize("indices, moves", [
    (np.r_[32:64, 0:32], "whole tiles"),
    (np.arange(63, -1, -1), "elements within tiles"),
    (np.r_[-32:0, 0:32], "whole tiles, counted from the end"),
])
def test_a_gather_along_a_tiled_axis_reads_the_tiles_it_is_given(indices, moves):
    """rotate_half of a 64-wide head, whose columns the gpu target tiles by 16: the Gather
    reads the product's tiles and writes its own (its kernels read each index logically, so
    a permutation within tiles is as good as one of whole tiles), and no runtime layout op is
    left between the two products."""
    after = check(_rotary(indices), target="gpu", shape=(32, 64))
    assert runtime_layout_ops(after) == [], moves
    gather = next(n for n in after.nodes() if n.op == "Gather")
    assert gather.outputs[0].encoding.tiles() == {0: 16, 1: 16}
    assert after.type_of(after.inputs_of(gather.name)[0]).encoding.tiles() == {0: 16, 1: 16}


def test_a_gather_that_changes_its_axis_to_part_of_a_tile_stops_the_tiles():
    """40 columns of 64: the result's axis is not whole tiles, so the tiles stop before it."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"]),
        helper.make_node("Gather", ["h", "some"], ["g"], axis=1),
        helper.make_node("MatMul", ["g", "w1"], ["y"]),
    ]
    weights = {"w0": RNG.standard_normal((64, 64)).astype(np.float32), "some": np.r_[0:20, 40:60].astype(np.int64),
               "w1": RNG.standard_normal((40, 16)).astype(np.float32)}
    after = check(model(nodes, [("x", [32, 64])], ["y"], weights), target="gpu", shape=(32, 64))
    gather = next(n for n in after.nodes() if n.op == "Gather")
    assert after.type_of(after.inputs_of(gather.name)[0]).encoding is None
