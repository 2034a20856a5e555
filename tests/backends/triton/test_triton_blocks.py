"""The gpu target lets matmuls read and write 16x16 blocks in any outer order and tiles in
either order (attention heads, K transposed): the Triton matmul addresses them by strides."""
from __future__ import annotations

import numpy as np

import tilefold
from tilefold.backends.triton import TritonExecutable


def test_attention_matmuls_read_permuted_blocks_with_no_copy_and_match_onnxruntime(kit):
    model = kit.tiny_transformer(seed=2, batch=1, seq=16, dim=32, heads=2, ff=32)  # whole 16x16 blocks
    opt = tilefold.optimize(tilefold.load(model), "gpu")
    permuted = [n for n in opt.graph.nodes() if n.op == "MatMul"
                and any((e := opt.graph.type_of(v).encoding) is not None and e.outer_dims_perm is not None
                        for v in opt.graph.inputs_of(n.name))]
    assert permuted, "no matmul reads blocks in a permuted order"
    for n in permuted:
        assert all(opt.graph.node(v.node).op not in ("Pack", "Unpack") for v in opt.graph.inputs_of(n.name))
    feeds = {i.name: np.random.default_rng(3).standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input}
    exe = TritonExecutable(opt.graph, device="interp")
    kit.assert_close(exe(feeds), kit.ort_outputs(model, feeds), rtol=1e-4, atol=1e-4)
    assert not [name for name in exe.fallback_nodes if opt.graph.node(name).op == "MatMul"]
