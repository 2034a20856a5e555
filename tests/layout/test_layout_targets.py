"""Issue 4's layout targets on real models (CPU target, and BERT on the gpu target): no standalone runtime layout op on
ResNet-50 or an MLP, and none inside BERT's encoder layers; transposes that remain move no
data (their result keeps their input's buffer)."""
import pytest

import tilefold
from tilefold.bench.models import bert, light_model, mlp, resnet50
from tilefold.graph import Graph
from tilefold.layout import optimize
from tilefold.layout.encoding import PackedEncoding, canonical
from tilefold.layout.targets import GpuTarget


def moving_layout_ops(graph: Graph) -> list[str]:
    """Pack/Unpack of runtime values, and Transposes whose result is not a relabeling."""
    moving = []
    for node in graph.nodes():
        if node.op not in ("Pack", "Unpack", "Transpose"):
            continue
        source = graph.inputs_of(node.name)[0]
        if graph.node(source.node).op == "Constant":
            continue
        if node.op == "Transpose":
            t_in = graph.type_of(source)
            perm = node.attrs.get("perm") or tuple(range(t_in.rank - 1, -1, -1))
            relabeled = (t_in.encoding or PackedEncoding((), ())).permuted(perm)
            if canonical(relabeled, node.outputs[0].shape) == node.outputs[0].encoding:
                continue
        moving.append(f"{node.op} {node.name}")
    return moving


def test_an_mlp_needs_no_layout_op(tmp_path):
    result = optimize(tilefold.load(mlp(tmp_path / "mlp.onnx")), "cpu", verify=True)
    assert moving_layout_ops(result.after) == []


def test_an_audio_stem_of_1d_convs_needs_no_layout_op():
    """Whisper's input: Conv1d -> Gelu -> Conv1d (stride 2) -> Gelu -> transpose to (N, T, C)
    -> LayerNorm. The cpu target runs 1-D convs channels-last too, so the transpose is a
    relabeling of the second conv's buffer; the result matches onnxruntime."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    init = {"w1": rng.standard_normal((24, 8, 3)) * 0.3, "b1": rng.standard_normal(24) * 0.1,
            "w2": rng.standard_normal((24, 24, 3)) * 0.2, "b2": rng.standard_normal(24) * 0.1,
            "scale": rng.standard_normal(24), "shift": rng.standard_normal(24)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]), n("Gelu", ["c1"], ["g1"]),
             n("Conv", ["g1", "w2", "b2"], ["c2"], pads=[1, 1], strides=[2]), n("Gelu", ["c2"], ["g2"]),
             n("Transpose", ["g2"], ["t"], perm=[0, 2, 1]), n("LayerNormalization", ["t", "scale", "shift"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "audio_stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10, 24])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in init.items()]),
        opset_imports=[helper.make_opsetid("", 21)])
    result = optimize(tilefold.load(model), "cpu", verify=True)
    assert len(moving_layout_ops(result.before)) >= 4
    assert moving_layout_ops(result.after) == []
    x = rng.standard_normal((2, 8, 20)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(tilefold.compile(result.after)({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "densenet121", "inception_v1", "inception_v2", "squeezenet"])
def test_light_convnets_need_no_runtime_layout_op(name):
    result = optimize(tilefold.load(light_model(name, random_weights=False)), "cpu", verify=True)
    assert len(moving_layout_ops(result.before)) > 50
    assert moving_layout_ops(result.after) == []


@pytest.mark.slow
def test_transformers_resnet50_needs_no_runtime_layout_op():
    result = optimize(tilefold.load(resnet50()), "cpu", verify=True)
    assert moving_layout_ops(result.after) == []


@pytest.mark.slow
def test_bert_runs_no_transpose_pack_or_unpack():
    g = tilefold.load(bert())
    # the file has 60 (onnxruntime runs 48 of them as copies); each key's transpose pair around
    # its batch-and-heads merge composes into one once the merge sinks (graph/passes/reshapes.py)
    assert g.op_counts()["Transpose"] == 48
    result = optimize(g, "cpu", verify=True)
    assert moving_layout_ops(result.after) == []


@pytest.mark.slow
def test_bert_on_the_gpu_target_moves_no_data_inside_its_encoder_layers():
    """16x16 tiles: the mask is packed once for all layers (each layer's scores run on its
    tiles); every head split and merge is a relabeling, and the residual stream (embeddings,
    LayerNorms, residual Adds) stays row-major: the projections read it and the output
    projections and feed-forward layers write it, so nothing is unpacked for the outputs."""
    import numpy as np

    from tilefold.bench.models import bert_inputs

    g = tilefold.load(bert())
    result = optimize(g, "gpu", verify=True)
    moving = moving_layout_ops(result.after)
    assert [m.split()[0] for m in moving] == ["Pack"], moving
    mask = result.after.type_of(result.after.inputs_of(moving[0].split()[1])[0])
    assert mask.rank == 4 and mask.shape[1] == 1  # broadcast over the heads
    assert all(n.outputs[0].encoding is None for n in result.after.nodes() if n.op == "LayerNormalization")
    feeds = bert_inputs(np.random.default_rng(3))
    want, got = tilefold.compile(g)(feeds), tilefold.compile(result.after)(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * np.abs(want[name]).max())


@pytest.mark.parametrize("batch", [32, 8])
def test_an_mlp_on_the_gpu_target_tiles_the_dims_the_tile_divides_and_computes_the_same(tmp_path, batch):
    """16x16 tiles where 16 divides both matrix dims; elsewhere operands stay as they are (the
    Triton matmul reads any layout masked to the logical extent), so no tile holds padding:
    batch 8 keeps its activations row-major, the 10-wide last layer its weight."""
    import numpy as np

    g = tilefold.load(mlp(tmp_path / "mlp.onnx", batch=batch, sizes=(256, 512, 512, 10)))
    result = optimize(g, "gpu", verify=True)
    assert len(moving_layout_ops(result.before)) == (5 if batch == 32 else 0)
    assert moving_layout_ops(result.after) == []
    matmuls = [n for n in result.after.nodes() if n.op == "MatMul"]
    tiled = [[bool(result.after.type_of(v).encoding) for v in result.after.inputs_of(n.name)] for n in matmuls]
    assert tiled == [[False, True], [batch == 32, True], [batch == 32, False]]
    assert all(not n.outputs[0].encoding.is_padded(n.outputs[0].shape) for n in matmuls if n.outputs[0].encoding)
    x = np.random.default_rng(2).standard_normal((batch, 256)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(result.after)({"x": x})["y"], tilefold.compile(g)({"x": x})["y"],
                               rtol=1e-4, atol=1e-4)


class RowMajorWeights(GpuTarget):
    weight_tiles = False


def test_the_gpu_target_can_keep_weights_row_major(tmp_path):
    """With `weight_tiles` off a Gemm's transposed (N, K) weight is stored turned, (K, N), at
    compile time; the activations between the layers keep their tiles (the first layer reads
    the input as it is) and nothing moves at run time."""
    import numpy as np

    from tilefold.bench.models import mlp_model

    g = tilefold.load(mlp_model(batch=32, sizes=(64, 48, 32), seed=3, gemm=True))
    after = optimize(g, RowMajorWeights("gpu-rows"), verify=True).after
    gemms = [n for n in after.nodes() if n.op == "Gemm"]
    assert len(gemms) == 2 and all(n.attrs.get("transB") == 1 for n in gemms)
    assert [after.type_of(after.inputs_of(n.name)[0]).encoding for n in gemms] == [
        None, PackedEncoding((0, 1), (16, 16))]
    for gemm in gemms:
        w = after.inputs_of(gemm.name)[1]
        assert after.type_of(w).encoding == PackedEncoding((), (), (1, 0))
        stored = np.asarray(after.constant_value(w))
        assert stored.shape == tuple(reversed(after.type_of(w).shape))  # (K, N)
    assert moving_layout_ops(after) == []
    x = np.random.default_rng(4).standard_normal((32, 64)).astype(np.float32)
    np.testing.assert_allclose(tilefold.compile(after)({"x": x})["y"], tilefold.compile(g)({"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
