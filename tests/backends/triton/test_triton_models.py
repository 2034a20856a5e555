"""Small whole models end to end on the Triton backend (plain and gpu-optimized graphs)
against onnxruntime: an MLP, a small CNN, a tiny transformer layer."""
from __future__ import annotations

import numpy as np
import pytest

import tilefold
from tilefold.backends.triton import TritonExecutable, kernel_sources
from tilefold.backends.triton.executor import kernel_plans
from tilefold.backends.triton.templates import classify
from tilefold.bench.light import LIGHT_MODELS, light_path
from tilefold.bench.models import UPSAMPLINGS, fusion_model, mlp_model, unet_model
from tilefold.graph.graph import CONSTANT, INPUT, OUTPUT


def _models(kit):
    return {
        "mlp": (mlp_model(batch=5, sizes=(20, 33, 7), seed=1), (5, 20)),
        "mlp_gemm": (mlp_model(batch=3, sizes=(18, 40, 6), seed=2, gemm=True), (3, 18)),
        "cnn": (kit.small_cnn(), (2, 3, 9, 9)),
        "transformer": (kit.tiny_transformer(), (2, 5, 24)),
    }


@pytest.mark.parametrize("name", ["mlp", "mlp_gemm", "cnn", "transformer"])
@pytest.mark.parametrize("optimized", [False, True])
def test_model_matches_onnxruntime(kit, device, name, optimized):
    model, shape = _models(kit)[name]
    x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    feed_name = model.graph.input[0].name
    want = kit.ort_outputs(model, {feed_name: x})
    g = tilefold.load(model)
    if optimized:
        g = tilefold.optimize(g, "gpu").graph
    exe = TritonExecutable(g, device=device)
    kit.assert_close(exe({feed_name: x}), want, rtol=1e-4, atol=1e-5)
    assert exe.fallback_nodes == []


def test_a_transformer_layer_computes_query_key_and_value_in_one_kernel(kit, device):
    """On the gpu target the three projections of one activation are one product, whose kernel
    stores the three parts (merge_projections, then the matmul's Split), and the attention is
    one kernel from Q K^T to P V; the post-norm LayerNorm between attention and feed-forward
    is computed by the first feed-forward product, which also writes it for the residual. The
    layer still matches onnxruntime."""
    model, shape = _models(kit)["transformer"]
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    kernels = [[g.node(n).op for n in names] for names, _ in kernel_sources(g)]
    assert kernels.count(["MatMul", "Add", "Split"]) == 1
    assert kernels.count(["MatMul", "Mul", "Softmax", "MatMul"]) == 1
    assert kernels.count(["LayerNormalization", "MatMul", "Add", "Gelu"]) == 1
    assert sum("MatMul" in ops for ops in kernels) == 5  # QKV, attention, out, 2 FFN
    assert len(kernels) == 6  # and the output's LayerNorm
    x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
    name = model.graph.input[0].name
    kit.assert_close(TritonExecutable(g, device=device)({name: x}), kit.ort_outputs(model, {name: x}),
                     rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "mlp_gemm", "transformer"])
def test_weights_kept_row_major_match_onnxruntime(kit, device, name):
    """The gpu target with `weight_tiles` off (bench/gpu.py measures both): the kernels read
    (K, N) weights by rows, a Gemm's (N, K) weight turned at compile time, where the default
    tiles them."""
    from tilefold.layout.targets import GpuTarget

    class RowMajorWeights(GpuTarget):
        weight_tiles = False

    model, shape = {"mlp": (mlp_model(batch=16, sizes=(32, 48, 16), seed=1), (16, 32)),
                    "mlp_gemm": (mlp_model(batch=16, sizes=(32, 48, 16), seed=2, gemm=True), (16, 32)),
                    "transformer": (kit.tiny_transformer(seq=16, dim=32, ff=48), (2, 16, 32))}[name]

    def weight_tiles(g):
        weights = [g.inputs_of(n.name)[1] for n in g.nodes() if n.op in ("MatMul", "Gemm")]
        return [bool(g.type_of(w).encoding and g.type_of(w).encoding.inner_tiles) for w in weights
                if g.node(w.node).op == CONSTANT]

    g = tilefold.optimize(tilefold.load(model), RowMajorWeights("gpu-rows")).graph
    assert weight_tiles(g) == [False] * len(weight_tiles(g)) != weight_tiles(tilefold.optimize(model, "gpu").graph)
    x = np.random.default_rng(13).standard_normal(shape).astype(np.float32)
    feed_name = model.graph.input[0].name
    kit.assert_close(TritonExecutable(g, device=device)({feed_name: x}), kit.ort_outputs(model, {feed_name: x}),
                     rtol=1e-4, atol=1e-5)


def test_optimized_mlp_runs_one_kernel_per_layer(kit):
    g = tilefold.optimize(tilefold.load(mlp_model(batch=5, sizes=(32, 48, 7), seed=1)), "gpu").graph
    sources = kernel_sources(g)
    assert [names[0] for names, _ in sources] == ["matmul0", "matmul1"]
    assert all("tl.dot" in src and src.count("tl.store") == 1 for _, src in sources)
    assert "w0_packed" in sources[0][1] and "// 16" in sources[0][1]  # reads the 32x48 weight's tiles


def test_interp_device_takes_torch_tensors_and_returns_numpy(kit):
    import torch

    model, shape = _models(kit)["mlp"]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    out = TritonExecutable(tilefold.load(model), device="interp")({"x": x})
    want = kit.ort_outputs(model, {"x": x.numpy()})
    assert isinstance(out["y"], np.ndarray)
    kit.assert_close(out, want)


def test_wider_transformer_layer(kit, device):
    model = kit.tiny_transformer(seed=3, batch=2, seq=19, dim=64, heads=4, ff=100)
    x = np.random.default_rng(12).standard_normal((2, 19, 64)).astype(np.float32)
    want = kit.ort_outputs(model, {"x": x})
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    kit.assert_close(TritonExecutable(g, device=device)({"x": x}), want, rtol=1e-4, atol=1e-4)


def test_heads_of_several_tiles_merge_without_moving_data(kit, device):
    """Heads of 32 (two 16-wide tiles): P.V writes the context with the heads inside the
    sequence blocks, so no Unpack is left between attention and the output projection (and
    the residual stream stays row-major: no layout op at all), and the kernels reading and
    writing that order compute onnxruntime's result."""
    model = kit.tiny_transformer(seed=4, batch=1, seq=32, dim=64, heads=2, ff=48)
    x = np.random.default_rng(13).standard_normal((1, 32, 64)).astype(np.float32)
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    (context,) = [n for n in g.nodes() if n.op == "MatMul" and n.outputs[0].shape == (1, 2, 32, 32)
                  and n.outputs[0].encoding.outer_perm(4) == (0, 2, 1, 3)]
    layout_ops = [(n.op, g.node(g.inputs_of(n.name)[0].node).op) for n in g.nodes() if n.op in ("Pack", "Unpack")]
    assert layout_ops == []
    exe = TritonExecutable(g, device=device)
    kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}), rtol=1e-4, atol=1e-4)
    assert exe.fallback_nodes == []


@pytest.mark.slow
def test_resnet50_under_the_interpreter_matches_onnxruntime(kit, monkeypatch):
    """The whole exported ResNet-50, optimized for the gpu target, every conv, pool and
    epilogue in generated kernels. On 64x64 images (the same layers down to 2x2): at 224x224 the
    interpreter took 3 to 5 minutes on two cores. Blocks as large as the results: the
    interpreter runs each program in Python, and blocks that fill a GPU's 132 programs took
    this test from 85 to 259 s (the small-shape tests run those blocks)."""
    from tilefold.bench import models
    from tilefold.layout.targets import GpuTarget

    monkeypatch.setattr(GpuTarget, "programs", 1)

    path = models.resnet50(size=64)
    feeds = models.resnet50_inputs(np.random.default_rng(14), size=64)
    import onnx

    want = kit.ort_outputs(onnx.load(str(path)), feeds)
    exe = TritonExecutable(tilefold.optimize(path, "gpu").graph, device="interp")
    kit.assert_close(exe(feeds), want, rtol=1e-3, atol=1e-4)
    assert exe.fallback_nodes == []


@pytest.mark.parametrize("kind", UPSAMPLINGS)
def test_upsampling_unet_on_the_gpu_target_matches_onnxruntime(kit, kind):
    """The upsampling between convs (a Resize by scales or sizes, or the Gathers of torch's
    nearest upsampling) runs as a Triton kernel on their NCHWc16 buffers: nothing falls back."""
    model = unet_model(upsample=kind, channels=16)
    x = np.random.default_rng(13).standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = kit.ort_outputs(model, {"x": x})
    result = tilefold.optimize(tilefold.load(model), "gpu")
    exe = TritonExecutable(result.graph, device="interp")
    kit.assert_close(exe({"x": x}), want, rtol=1e-4, atol=1e-4)
    resamplers = [n.name for n in result.graph.nodes() if n.op in ("Resize", "Gather")]
    assert resamplers and all(result.graph.node(n).outputs[0].encoding is not None for n in resamplers)
    assert exe.fallback_nodes == []


def test_one_channel_of_a_channel_tiled_attention_map_is_gathered_from_its_tile(kit, device):
    """GLPN's fusion: the Gathers of channel 0 and -1 of a 2-channel attention map read its
    NCHWc16 buffer (one padded tile) by the index's tile and lane, never the padding."""
    model = fusion_model()
    x = np.random.default_rng(17).standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = kit.ort_outputs(model, {"x": x})
    graph = tilefold.optimize(tilefold.load(model), "gpu").graph
    gathers = [n for n in graph.nodes() if n.op == "Gather"]
    assert len(gathers) == 2 and all(graph.type_of(graph.inputs_of(n.name)[0]).encoding.inner_tiles == (16,)
                                     for n in gathers)
    exe = TritonExecutable(graph, device=device)
    kit.assert_close(exe({"x": x}), want, rtol=1e-4, atol=1e-4)
    assert exe.fallback_nodes == []


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_on_the_gpu_target_need_no_host_round_trip(name):
    """Every compute node of the model-zoo models, optimized for the gpu target, runs in a
    generated kernel (AlexNet's LRN and DenseNet's BatchNorms after a Concat included): no
    node falls back to the NumPy backend, which would copy its operands to the host and back."""
    graph = tilefold.optimize(tilefold.load(light_path(name)), "gpu").graph
    compute = [n for n in graph.nodes() if n.op not in (CONSTANT, INPUT, OUTPUT)]
    assert compute and [f"{n.name} ({n.op})" for n in compute if classify(graph, n) == "numpy"] == []


TEXT_MODELS = {
    # name: (config, model, the ops that used to run on the host)
    "bert": ("BertConfig", "BertModel", {"GatherND"}),
    "roberta": ("RobertaConfig", "RobertaModel", {"CumSum", "GatherElements", "Equal", "Cast", "Mul", "Add"}),
    "clip_text": ("CLIPTextConfig", "CLIPTextModel", {"ArgMax", "Equal", "Cast"}),
}


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_text_models_from_torch_run_every_node_in_a_kernel(kit, name):
    """transformers' default `sdpa` attention picks its padding mask with a GatherND of the
    bool mask; RoBERTa counts its position ids with integer arithmetic and a CumSum; CLIP's
    text model pools at the ArgMax of its token ids. All of it runs in generated kernels, so
    nothing crosses to the host, and the outputs match eager PyTorch. The attention, its mask
    and the sdpa guard included (CLIP's causal too), is one kernel, and CLIP's pre-norm layer
    norms run in the kernels of the matmuls after them."""
    import torch
    import transformers

    config_name, model_name, ops = TEXT_MODELS[name]
    config = getattr(transformers, config_name)(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=50,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, attn_implementation="sdpa")
    model = getattr(transformers, model_name)(config).eval()
    ids = torch.from_numpy(np.random.default_rng(15).integers(3, 50, (2, 16)))
    ids[0, 9] = 2  # CLIP pools at the end-of-text token (the largest id in its vocabulary)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    graph = tilefold.optimize(tilefold.from_torch(model, (ids, mask)), "gpu").graph
    assert ops <= {n.op for n in graph.nodes()}
    plans = kernel_plans(graph)
    assert [plan.kind for plan in plans].count("attention") == 1
    if name == "clip_text":  # pre-norm: each layer norm is computed by the matmul that reads it
        assert [graph.node(plan.nodes[0]).op for plan in plans if plan.kind == "matmul"].count(
            "LayerNormalization") == 2
    exe = TritonExecutable(graph, device="interp")
    got = list(exe(dict(zip(graph.input_types(), (ids.numpy(), mask.numpy())))).values())
    with torch.no_grad():
        want = model(ids, mask)
    for have, expected in zip(got, (want.last_hidden_state, want.pooler_output), strict=True):
        np.testing.assert_allclose(have, expected.numpy(), rtol=1e-4, atol=1e-5)
    assert exe.fallback_nodes == []


def test_a_llama_layer_runs_rotary_and_grouped_attention_in_few_kernels(kit):
    """LLaMA (grouped query attention, rotary embeddings) on the gpu target: each rotary
    product is one kernel with its rotate_half (a Gather) and the keys' scale (hoisted before
    repeat_kv's Expand); the attention reads the unrepeated keys and values, so no Slice,
    Concat or Expand runs a kernel of its own; the output matches eager PyTorch."""
    model, ids, mask, graph = _llama_layer()
    plans = kernel_plans(graph)
    alone = {graph.node(plan.nodes[0]).op for plan in plans if len(plan.nodes) == 1}
    assert not alone & {"Slice", "Concat", "Expand", "Mul"}
    assert [plan.kind for plan in plans].count("attention") == 1
    rotary = [plan for plan in plans if any(graph.node(n).op == "Gather" for n in plan.nodes) and plan.kind == "chain"]
    assert len(rotary) == 2 and all(len(plan.nodes) >= 5 for plan in rotary)
    _assert_llama_matches_eager(TritonExecutable(graph, device="interp"), model, ids, mask)


def _llama_layer(hidden: int = 32, heads: int = 4):
    """One LLaMA layer (GQA: half as many key and value heads, rotary, SwiGLU, RMSNorm), its
    inputs (one row padded) and its gpu-optimized graph."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=hidden, num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads // 2,
        intermediate_size=2 * hidden, vocab_size=50, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        attn_implementation="sdpa", use_cache=False)
    model = transformers.LlamaModel(config).eval()
    ids = torch.from_numpy(np.random.default_rng(16).integers(3, 50, (2, 16)))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    return model, ids, mask, tilefold.optimize(tilefold.from_torch(model, (ids, mask)), "gpu").graph


def test_a_llama_layer_with_heads_of_whole_tiles_rotates_them_in_their_tiles():
    """64-wide heads, which the gpu target tiles by 16 as the projection writes them: rotary's
    rotate_half (a Gather of the head dim) reads and writes those tiles, so the layer keeps no
    runtime layout op (it had an Unpack before each Gather and after each rotary product),
    and runs the seven kernels of a layer with untiled heads (norm and projections, two rotary
    products, attention, output projection, norm and SwiGLU, down projection)."""
    model, ids, mask, graph = _llama_layer(hidden=128, heads=4)
    assert [n.name for n in graph.nodes() if n.op in ("Pack", "Unpack") and
            graph.node(graph.inputs_of(n.name)[0].node).op != CONSTANT] == []
    gathers = [n for n in graph.nodes() if n.op == "Gather" and n.outputs[0].rank == 4]
    assert len(gathers) == 2 and all(n.outputs[0].encoding.tiles()[3] == 16 for n in gathers)
    plans = kernel_plans(graph)
    layer = [plan for plan in plans if plan.kind in ("matmul", "attention") or
             (plan.kind == "chain" and any(graph.node(n).op == "Gather" for n in plan.nodes))]
    assert len(layer) == 7
    _assert_llama_matches_eager(TritonExecutable(graph, device="interp"), model, ids, mask)


def _assert_llama_matches_eager(exe, model, ids, mask):
    import torch

    (got,) = exe(dict(zip(exe.graph.input_types(), (ids.numpy(), mask.numpy())))).values()
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    assert exe.fallback_nodes == []


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_a_bfloat16_layer_runs_as_many_kernels_as_a_float32_one(family):
    """Traced on the CPU, a bfloat16 model upcasts to float32 around its attention and its
    RMSNorms, and carries bfloat16 constants (GPT-2's GELU cubes by one): the attention kernel
    casts and scales Q, K and V as it loads them, the norm's kernel upcasts its row, and the
    rotary and scale passes take bfloat16, so no Cast runs a kernel a float32 layer does not.
    The output is eager PyTorch's, to bfloat16's precision."""
    import torch

    from tilefold.bench import models

    config = {"llama": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
                        "num_hidden_layers": 1, "vocab_size": 60},
              "gpt2": {"n_embd": 64, "n_head": 4, "n_layer": 1, "vocab_size": 60},
              "bert": {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "num_hidden_layers": 1,
                       "vocab_size": 60, "attn_implementation": "sdpa"}}[family]
    build = {"llama": models.llama_torch, "gpt2": models.gpt2_torch, "bert": models.bert_torch}[family]
    feeds = models.bert_inputs(np.random.default_rng(17), 16, 60)
    args = tuple(torch.from_numpy(feeds[name]) for name in models.BERT_INPUTS)
    counts = {}
    for dtype in (torch.float32, torch.bfloat16):
        module = build(**config).to(dtype)
        graph = tilefold.optimize(tilefold.from_torch(module, args), "gpu").graph
        counts[dtype] = len(kernel_plans(graph))
    exe = TritonExecutable(graph, device="interp")
    got = np.asarray(next(iter(exe(dict(zip(graph.input_types(), (a.numpy() for a in args)))).values())), np.float32)
    with torch.no_grad():
        want = module(*args)
    want = (want if isinstance(want, torch.Tensor) else want[0]).float().numpy()
    assert counts[torch.bfloat16] == counts[torch.float32] and exe.fallback_nodes == []
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()


@pytest.mark.parametrize("off, kinds_gone", [
    ({"prologues": False}, {"matmul_with_norm", "reduce_with_prologue"}),
    ({"prologues": {"reduce"}}, {"matmul_with_norm"}),
    ({"spans": False}, {"attention"}),
    ({"pairs": False}, {"matmul_with_swiglu"}),
])
def test_each_fusion_that_bench_ablate_measures_can_be_turned_off(off, kinds_gone):
    """`Fusion(prologues=False)`: the RMSNorms run as kernels of their own before the
    products, and their squares before their means; `prologues={"reduce"}`: only the first;
    `spans=False`: the scores, softmax and product with V as three kernels; `pairs=False`:
    the product by up after the merged gate and up projection's kernel (which keeps SiLU(gate)
    as the gate part's epilogue, and writes up). Each costs launches, and the layer still
    matches eager PyTorch."""
    from tilefold.backends.triton import Fusion
    from tilefold.backends.triton.launch import kernel_groups

    model, ids, mask, graph = _llama_layer()

    def kinds(fuse):
        found = set()
        for group in kernel_groups(graph, fuse):
            ops = [n.op for n in group.nodes]
            found.add(group.kind)
            if group.kind == "matmul" and group.head:
                found.add("matmul_with_norm")
            if group.kind == "reduce" and group.head:
                found.add("reduce_with_prologue")
            if group.kind == "matmul" and "Sigmoid" in ops and not group.writes:  # both parts read inside
                found.add("matmul_with_swiglu")
        return found

    fusion = Fusion(**off)
    assert kinds_gone <= kinds(True) and not kinds_gone & kinds(fusion)
    assert len(kernel_plans(graph, fuse=fusion)) > len(kernel_plans(graph))
    _assert_llama_matches_eager(TritonExecutable(graph, device="interp", fuse=fusion), model, ids, mask)


def _linear_block(batch: int):
    """ConvNeXt's block, shrunk: a conv's 16-channel map permuted channels-last, normalized,
    through two Linear layers as torch traces them (rows merged for Gemms), permuted back
    and added to the map, then a conv."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(21)
    c, side = 16, 4

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    node = helper.make_node
    nodes = [node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             node("Transpose", ["a"], ["t"], perm=[0, 2, 3, 1]),
             node("LayerNormalization", ["t", "g", "beta"], ["n"], axis=-1),
             node("Reshape", ["n", "rows"], ["r"]),
             node("Gemm", ["r", "w1", "b1"], ["h"], transB=1),
             node("Relu", ["h"], ["hr"]),
             node("Gemm", ["hr", "w2", "b2"], ["o"]),
             node("Reshape", ["o", "image"], ["o4"]),
             node("Transpose", ["o4"], ["ot"], perm=[0, 3, 1, 2]),
             node("Add", ["a", "ot"], ["s"]),
             node("Conv", ["s", "w3"], ["y"], pads=[1, 1, 1, 1])]
    weights = {"w0": w(c, 3, 3, 3), "g": w(c) + 1, "beta": w(c), "w1": w(2 * c, c), "b1": w(2 * c),
               "w2": w(2 * c, c), "b2": w(c), "w3": w(8, c, 3, 3),
               "rows": np.array([batch * side * side, c], np.int64), "image": np.array([batch, side, side, c], np.int64)}
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, k) for k, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_linear_layers_read_and_write_a_batch_of_channel_tiled_maps(kit, device):
    """At batch 2 the Linear layers run as MatMuls on the (N, H, W, C) map (graph/'s
    sink_batch_merges), reading the LayerNorm's (N, C/16, H, W, 16) buffer and writing the
    residual's channel tiles by strides: no layout op runs, and the result is onnxruntime's."""
    model = _linear_block(batch=2)
    g = tilefold.optimize(tilefold.load(model), "gpu").graph
    assert [n.op for n in g.nodes() if n.op in ("Pack", "Unpack")] == ["Unpack"]  # the output's
    x = np.random.default_rng(22).standard_normal((2, 3, 4, 4)).astype(np.float32)
    exe = TritonExecutable(g, device=device)
    kit.assert_close(exe({"x": x}), kit.ort_outputs(model, {"x": x}), rtol=1e-4, atol=1e-5)
    assert exe.fallback_nodes == []
