"""Launch configuration as node data: defaults from shapes, overrides from Python, and the
verifier's one-line rejections (block vs tile, powers of two, rows longer than a block)."""
from __future__ import annotations

import numpy as np
import pytest

from tilefold.backends.triton import TritonExecutable, set_launch, verify_launch
from tilefold.backends.triton.launch import config, kernel_groups
from tilefold.graph import Graph
from tilefold.graph.errors import VerifyError
from tilefold.graph.types import TensorType
from tilefold.layout.encoding import PackedEncoding

F32 = np.float32


def _mlp_graph(kit, tile: int = 16):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 50)).astype(F32)
    w = rng.standard_normal((50, 70)).astype(F32)
    enc = PackedEncoding((0, 1), (tile, tile))
    g = Graph("launch")
    av = g.add_input("a", TensorType(a.shape, F32))
    y = kit.add(g, "MatMul", [av, kit.packed_const(g, w, enc, "w")], encoding=enc, name="mm")
    y = kit.add(g, "Relu", [y], encoding=enc.with_pad(None), name="relu")
    y = kit.add(g, "Unpack", [y], name="unpack")
    g.add_output(kit.add(g, "Softmax", [y], {"axis": -1}, name="softmax"), "y")
    return g, {"a": a}, a @ w


def test_defaults_come_from_shapes_and_the_target_tile(kit):
    g, _, _ = _mlp_graph(kit)
    groups = {grp.anchor.name: grp for grp in kernel_groups(g)}
    assert set(groups) == {"mm", "softmax"}
    mm = config(g, groups["mm"])  # a 37 x 70 result: tile-sized blocks, 15 programs (a grid that cannot fill a GPU)
    assert mm["BLOCK_M"] == 16 and mm["BLOCK_N"] == 16 and mm["BLOCK_K"] == 32 and mm["input_precision"] == "ieee"
    assert config(g, groups["softmax"])["BLOCK"] == 128  # the whole 70-element row in one block
    verify_launch(g)


@pytest.mark.parametrize("m,n,count,blocks", [
    (4096, 4096, 1, (128, 128)),  # 1,024 programs already
    (128, 768, 1, (16, 32)),      # BERT-base's products at sequence 128: 6 programs at 128 x 128, 192 here
    (128, 128, 12, (32, 32)),     # its 12 heads' scores
    (49, 512, 1, (16, 16)),       # ResNet-50's last stage at batch 1: 4 programs at 64 x 128; the tile is the floor
    (3136, 64, 1, (32, 32)),      # its first stage: 25 programs at 128 x 64
])
def test_blocks_shrink_until_the_grid_fills_the_gpu(m, n, count, blocks):
    """The larger block is halved while the grid has fewer programs than the gpu target's
    multiprocessors, down to the tile."""
    from tilefold.backends.triton.indexing import filling_blocks
    from tilefold.layout.targets import GpuTarget

    target = GpuTarget()
    assert filling_blocks(m, n, count, target) == blocks
    bm, bn = blocks
    programs = count * -(-m // bm) * -(-n // bn)
    assert programs >= target.programs or blocks == (target.block, target.block)


def test_user_configuration_is_node_data_and_changes_the_launch_not_the_result(kit, device):
    g, feeds, want = _mlp_graph(kit)
    base = TritonExecutable(g, device=device)(feeds)["y"]
    assert set_launch(g, "mm", BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, num_warps=2) == ["mm"]
    assert g.node("mm").launch == {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 2}
    assert g.copy().node("mm").launch == g.node("mm").launch
    exe = TritonExecutable(g, device=device)
    plan = next(s.plan for s in exe.steps if s.plan is not None and s.plan.kind == "matmul")
    assert plan.config["BLOCK_M"] == 16 and plan.grid(plan.config) == (9,)
    np.testing.assert_allclose(exe(feeds)["y"], base, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("settings,message", [
    ({"BLOCK_K": 24}, "BLOCK_K=24 is not a positive power of two"),
    ({"BLOCK_M": 8}, "BLOCK_M=8 is below 16"),
    ({"BLOCK_Q": 16}, "unknown launch key 'BLOCK_Q'"),
    ({"num_warps": 3}, "num_warps=3"),
    ({"input_precision": "fast"}, "input_precision='fast'"),
])
def test_bad_matmul_configurations_are_rejected_in_one_line(kit, settings, message):
    g, _, _ = _mlp_graph(kit)
    set_launch(g, "mm", **settings)
    with pytest.raises(VerifyError, match=message) as info:
        verify_launch(g)
    assert "'mm'" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(VerifyError):
        TritonExecutable(g, device="interp")


def test_a_block_must_cover_whole_tiles_of_the_packed_operand(kit):
    """32x32 tiles on the weight: BLOCK_K=16 would split a tile; the error names node, tile, block."""
    g, feeds, want = _mlp_graph(kit, tile=32)
    set_launch(g, "mm", BLOCK_K=16)
    with pytest.raises(VerifyError) as info:
        verify_launch(g)
    text = str(info.value)
    assert "'mm'" in text and "BLOCK_K=16" in text and "tiled by 32" in text and "operand 1 (w)" in text
    set_launch(g, "mm", BLOCK_K=64, BLOCK_M=32, BLOCK_N=32)
    verify_launch(g)
    got = TritonExecutable(g, device="interp")(feeds)["y"]
    e = np.exp(np.maximum(want, 0) - np.maximum(want, 0).max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)


def test_a_reduction_block_must_hold_the_row(kit):
    g, _, _ = _mlp_graph(kit)
    set_launch(g, "softmax", BLOCK=64)
    with pytest.raises(VerifyError, match=r"'softmax'.*BLOCK=64 is shorter than the row \(70"):
        verify_launch(g)


def test_configuration_on_a_fused_node_is_rejected(kit):
    g, _, _ = _mlp_graph(kit)
    set_launch(g, "relu", BLOCK=256)
    with pytest.raises(VerifyError, match="'relu'.*runs no generated kernel"):
        verify_launch(g)


def test_set_launch_by_op_and_pattern(kit):
    g, _, _ = _mlp_graph(kit)
    assert set_launch(g, "MatMul", num_stages=2) == ["mm"]
    assert set_launch(g, "soft*", num_warps=8) == ["softmax"]
    with pytest.raises(VerifyError, match="matches no node"):
        set_launch(g, "conv*", BLOCK=16)


def test_autotune_writes_verified_choices_onto_the_nodes(kit):
    from tilefold.backends.triton import autotune

    g, feeds, _ = _mlp_graph(kit)
    before = TritonExecutable(g, device="interp")(feeds)["y"]
    chosen = autotune(g, feeds, device="interp", limit=3)
    assert set(chosen) == {"mm", "softmax"}
    assert g.node("mm").launch == chosen["mm"] and g.node("softmax").launch == chosen["softmax"]
    verify_launch(g)
    np.testing.assert_allclose(TritonExecutable(g, device="interp")(feeds)["y"], before, rtol=1e-5, atol=1e-6)


def test_autotune_tries_the_current_configuration_and_its_nearest_neighbours_first(kit):
    """A user's configuration outside the candidate grid (2 warps) is still tried, and a small
    limit spends its tries on single changes to it, not on configurations the kernel refuses
    (a 16-row block halved is below tl.dot's 16)."""
    from tilefold.backends.triton import autotune
    from tilefold.backends.triton.autotune import candidates

    base = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 2, "num_stages": 3}
    near = candidates(base, "matmul")
    assert near[0] == base and len(near) == len({tuple(sorted(c.items())) for c in near})
    changed = [sum(c[k] != base[k] for k in base) for c in near]
    assert changed == sorted(changed) and changed[1] == 1

    g, feeds, _ = _mlp_graph(kit)
    set_launch(g, "mm", BLOCK_M=16, BLOCK_N=32, num_warps=2)
    chosen = autotune(g, feeds, device="interp", limit=2)
    assert set(chosen) == {"mm", "softmax"}
    assert chosen["mm"]["BLOCK_M"] >= 16
    verify_launch(g)


def test_configuration_travels_in_the_optimized_onnx_file(tmp_path):
    """Launch data written by `tilefold.save` comes back with `tilefold.load`, and a bad value
    edited into the file is rejected when the graph is compiled."""
    import tilefold
    from tilefold.bench.models import mlp_model

    g = tilefold.optimize(tilefold.load(mlp_model(batch=5, sizes=(20, 33, 7))), "gpu").graph
    set_launch(g, "matmul0", BLOCK_M=16, BLOCK_N=32, num_warps=2)
    tilefold.save(g, tmp_path / "m.onnx")
    loaded = tilefold.load(tmp_path / "m.onnx")
    assert loaded.node("matmul0").launch == {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2}
    x = np.random.default_rng(1).standard_normal((5, 20)).astype(F32)
    np.testing.assert_array_equal(TritonExecutable(loaded, device="interp")({"x": x})["y"],
                                  TritonExecutable(g, device="interp")({"x": x})["y"])
    set_launch(loaded, "matmul0", BLOCK_N=48)
    with pytest.raises(VerifyError, match="'matmul0'.*BLOCK_N=48"):
        TritonExecutable(loaded, device="interp")


def test_defaults_come_from_the_gpu_target_the_graph_was_optimized_for(kit):
    """A user's GpuTarget for a smaller GPU (here: one program fills it, so blocks stay as
    large as the result) gives the defaults of a graph optimized for it; a graph optimized for
    the built-in gpu target gets its 132 programs' blocks."""
    import tilefold
    from tilefold.backends.triton.executor import kernel_plans
    from tilefold.bench.models import mlp_model
    from tilefold.layout.targets import GpuTarget, register_target

    class OneProgram(GpuTarget):
        programs = 1

    register_target(OneProgram("gpu-one-program"))
    model = tilefold.load(mlp_model(batch=64, sizes=(64, 128, 32), seed=4))
    blocks = {name: [(p.config["BLOCK_M"], p.config["BLOCK_N"]) for p in
                     kernel_plans(tilefold.optimize(model, name).graph) if p.kind == "matmul"]
              for name in ("gpu", "gpu-one-program")}
    assert blocks["gpu-one-program"] == [(64, 128), (64, 32)]
    assert blocks["gpu"] == [(16, 16), (16, 16)]
