"""Whole models through `tilefold.load` + `tilefold.compile`, checked against independent references.

- The nine model-zoo architectures shipped with onnx reproduce their shipped outputs
  (the ONNX backend runner's tolerances, rtol=1e-3, atol=1e-7).
- The same architectures with random weights (`light_model(random_weights=True)`) match
  onnxruntime on fresh random inputs: rtol=1e-3 and atol=1e-5 x the output's max |value|.
- A generated MLP (MatMul+Add and Gemm forms, symbolic batch) and U-Net (each upsampling)
  match onnxruntime.
- transformers ResNet-50 and BERT-base exports match onnxruntime (slow: export + 0.5 GB of weights).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tilefold
from tilefold.bench import models
from tilefold.bench.models import LIGHT_MODELS

RTOL = 1e-3
ATOL_SHIPPED = 1e-7  # the ONNX backend runner's default for these models
ATOL_SCALE = 1e-5  # atol relative to the reference output's largest magnitude


def onnxruntime_outputs(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the light models keep a few unused initializers
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def assert_close_to_scale(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(actual) == set(expected)
    for name, ref in expected.items():
        assert actual[name].shape == ref.shape, name
        assert actual[name].dtype == ref.dtype, name
        atol = ATOL_SCALE * float(np.abs(ref).max())
        np.testing.assert_allclose(actual[name], ref, rtol=RTOL, atol=atol, err_msg=name)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_reproduces_its_shipped_reference_outputs(name: str) -> None:
    inputs, expected = models.light_reference(name)
    exe = tilefold.compile(tilefold.load(models.light_path(name)))
    assert exe.fallback_nodes == []
    outputs = exe(inputs)
    assert set(outputs) == set(expected)
    for key, ref in expected.items():
        np.testing.assert_allclose(outputs[key], ref, rtol=RTOL, atol=ATOL_SHIPPED, err_msg=key)


# VGG-19's 140M random weights take ~20 s to draw, serialize and load twice.
SLOW_RANDOM = {"vgg19"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_RANDOM else n for n in LIGHT_MODELS]
)
def test_light_model_with_random_weights_matches_onnxruntime(name: str) -> None:
    model = models.light_model(name, random_weights=True, seed=0)
    assert not [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    feeds = models.random_inputs(model, np.random.default_rng(1))
    expected = onnxruntime_outputs(model, feeds)
    assert_informative(next(iter(expected.values())), softmax=any(n.op_type == "Softmax" for n in model.graph.node))

    exe = tilefold.compile(tilefold.load(model))
    assert exe.fallback_nodes == []
    assert_close_to_scale(exe(feeds), expected)


def assert_informative(out: np.ndarray, *, softmax: bool) -> None:
    """A reference worth comparing against: finite, and not a uniform or one-hot softmax."""
    assert np.isfinite(out).all()
    if softmax:
        assert 3.0 / out.size < out.max() < 0.99
    else:
        assert 0.3 < float(np.sqrt(np.mean(out.astype(np.float64) ** 2))) < 30.0


def test_light_model_random_weights_depend_only_on_the_seed() -> None:
    a = models.light_model("squeezenet", random_weights=True, seed=3)
    b = models.light_model("squeezenet", random_weights=True, seed=3)
    c = models.light_model("squeezenet", random_weights=True, seed=4)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer}
    same = {t.name: onnx.numpy_helper.to_array(t) for t in b.graph.initializer}
    other = {t.name: onnx.numpy_helper.to_array(t) for t in c.graph.initializer}
    w = "conv1_w_0"
    np.testing.assert_array_equal(weights[w], same[w])
    assert not np.array_equal(weights[w], other[w])
    onnx.checker.check_model(a, full_check=True)


@pytest.mark.parametrize("gemm", [False, True], ids=["matmul_add", "gemm"])
def test_mlp_matches_onnxruntime_for_two_batch_sizes(tmp_path: Path, gemm: bool) -> None:
    path = models.mlp(tmp_path / "mlp.onnx", batch="N", sizes=(64, 128, 96, 10), seed=5, gemm=gemm)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert ops == ({"Gemm", "Relu"} if gemm else {"MatMul", "Add", "Relu"})
    exe = tilefold.compile(tilefold.load(path))
    rng = np.random.default_rng(6)
    for batch in (1, 7):
        feeds = {"x": rng.standard_normal((batch, 64)).astype(np.float32)}
        outputs = exe(feeds)
        assert outputs["y"].shape == (batch, 10)
        assert_close_to_scale(outputs, onnxruntime_outputs(path, feeds))


def test_mlp_cli_writes_a_checked_model_and_prints_its_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sub" / "mlp.onnx"
    assert models.main(["mlp", "--out", str(out), "--sizes", "8,4", "--batch", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [3, 8]
    assert list(tmp_path.joinpath("sub").iterdir()) == [out]  # no temporary file left behind


@pytest.mark.parametrize("upsample", models.UPSAMPLINGS)
def test_unet_cli_writes_a_model_that_matches_onnxruntime(tmp_path: Path, upsample: str) -> None:
    out = tmp_path / "unet.onnx"
    assert models.main(["unet", "--out", str(out), "--upsample", upsample, "--channels", "8", "--size", "10"]) == 0
    onnx.checker.check_model(onnx.load(out), full_check=True)
    feeds = {"x": np.random.default_rng(8).standard_normal((2, 3, 10, 10)).astype(np.float32)}
    outputs = tilefold.compile(tilefold.load(out))(feeds)
    assert outputs["y"].shape == (2, 4, 10, 10)
    assert_close_to_scale(outputs, onnxruntime_outputs(out, feeds))


def test_unet_refuses_an_odd_size_and_an_unknown_upsampling() -> None:
    with pytest.raises(ValueError, match="even"):
        models.unet_model(size=9)
    with pytest.raises(ValueError, match="unknown upsampling 'area'"):
        models.unet_model(upsample="area")


@pytest.mark.slow
def test_transformers_resnet50_export_matches_onnxruntime() -> None:
    path = models.resnet50()
    feeds = models.resnet50_inputs(np.random.default_rng(7))
    exe = tilefold.compile(tilefold.load(path))
    assert exe.fallback_nodes == []
    assert_close_to_scale(exe(feeds), onnxruntime_outputs(path, feeds))


@pytest.mark.slow
def test_transformers_bert_export_matches_onnxruntime_with_padding_mask() -> None:
    path = models.bert()
    feeds = models.bert_inputs(np.random.default_rng(8))
    assert 0 < feeds["attention_mask"].sum() < feeds["attention_mask"].size
    exe = tilefold.compile(tilefold.load(path))
    assert exe.fallback_nodes == []
    assert_close_to_scale(exe(feeds), onnxruntime_outputs(path, feeds))


@pytest.mark.slow
def test_exported_models_carry_the_eager_modules_weights() -> None:
    """The eager peers of the CPU benchmark compute what the exports compute."""
    import torch

    rng = np.random.default_rng(9)
    feeds = models.resnet50_inputs(rng)
    (ref,) = onnxruntime_outputs(models.resnet50(), feeds).values()
    with torch.no_grad():
        logits = models.resnet50_torch()(torch.from_numpy(feeds["pixel_values"])).logits.numpy()
    np.testing.assert_allclose(logits, ref, rtol=RTOL, atol=ATOL_SCALE * np.abs(ref).max())

    feeds = models.bert_inputs(rng)
    expected = onnxruntime_outputs(models.bert(), feeds)
    with torch.no_grad():
        out = models.bert_torch()(*(torch.from_numpy(feeds[k]) for k in models.BERT_INPUTS))
    for got, ref in zip((out.last_hidden_state, out.pooler_output), expected.values()):
        np.testing.assert_allclose(got.numpy(), ref, rtol=RTOL, atol=ATOL_SCALE * np.abs(ref).max())


@pytest.mark.slow
def test_a_llama_exported_at_opset_23_runs_its_rms_norms_and_attention_as_older_ops(tmp_path: Path) -> None:
    """torch.onnx writes RMSNormalization and Attention (grouped-query, causal) at opset 23; tilefold
    expands them into their ONNX functions and matches onnxruntime's native kernels, plain and
    optimized; exported at either opset, it keeps no runtime layout op on either target."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=120, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        llama = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llama = llama

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.llama(input_ids=ids, use_cache=False).logits

    ids = np.random.default_rng(10).integers(0, 120, (1, 16)).astype(np.int64)
    paths = {}
    for opset in (20, 23):
        with torch.no_grad():
            program = torch.onnx.export(Logits(), (torch.from_numpy(ids),), dynamo=True, opset_version=opset,
                                        verbose=False)
        paths[opset] = tmp_path / f"llama{opset}.onnx"
        program.save(str(paths[opset]))
    ops23 = {n.op_type for n in onnx.load(paths[23]).graph.node}
    assert {"RMSNormalization", "Attention"} <= ops23
    (name,) = [i.name for i in onnx.load(paths[23]).graph.input]
    feeds = {name: ids}
    expected = onnxruntime_outputs(paths[23], feeds)
    graph = tilefold.load(paths[23])
    for g in (graph, tilefold.optimize(graph, "cpu").graph, tilefold.optimize(graph, "gpu").graph):
        exe = tilefold.compile(g)
        assert exe.fallback_nodes == []
        assert_close_to_scale(exe(feeds), expected)
    for target in ("cpu", "gpu"):  # grouped-query attention's repeated key/value heads included
        counts = [tilefold.optimize(paths[opset], target).report.to_dict()["layout_ops_after"] for opset in (20, 23)]
        assert counts == [0, 0], (target, counts)


@pytest.mark.slow
def test_squeezenet_quantized_by_onnxruntime_runs_on_the_conv_layouts(tmp_path: Path) -> None:
    """SqueezeNet (random weights) quantized to QDQ form by onnxruntime's static quantizer
    (int8 weights per channel, uint8 activations): tilefold runs its QuantizeLinear and
    DequantizeLinear nodes as onnxruntime does with graph optimizations off (its fused integer
    kernels round differently), at most one output quantization step apart where a float sum
    lands on a rounding boundary; optimized for either target, no runtime layout op is left
    but the gpu target's output unpack, as for the float model, and the written file keeps
    the int8 weights."""
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    source = version_converter.convert_version(models.light_model("squeezenet", random_weights=True), 17)
    source.ir_version = 8
    float_path, qdq_path = tmp_path / "squeezenet.onnx", tmp_path / "squeezenet.qdq.onnx"
    onnx.save(source, float_path)
    (info,) = models.data_inputs(source)
    shape = models.static_shape(info)
    rng = np.random.default_rng(12)

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = 3

        def get_next(self) -> dict[str, np.ndarray] | None:
            self.left -= 1
            return {info.name: rng.standard_normal(shape).astype(np.float32)} if self.left >= 0 else None

    quantize_static(str(float_path), str(qdq_path), Calibration(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    feeds = {info.name: rng.standard_normal(shape).astype(np.float32)}
    source_params = sum(int(np.prod(t.dims)) for t in source.graph.initializer)

    def session_of(path: Path) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    (want,) = session_of(qdq_path).run(None, feeds)
    graph = tilefold.load(qdq_path)
    assert sum(n.op == "QuantizeLinear" for n in graph.nodes()) > 20
    last_step = 1 / 255  # the softmax output's quantization step (uint8 over [0, 1])
    for target, left in ((None, 0), ("cpu", 0), ("gpu", 1)):
        g = graph if target is None else tilefold.optimize(graph, target).graph
        exe = tilefold.compile(g)
        assert exe.fallback_nodes == []
        (got,) = exe(feeds).values()
        np.testing.assert_allclose(got, want, rtol=0, atol=1.01 * last_step)
        if target is not None:
            assert tilefold.optimize(graph, target).report.to_dict()["layout_ops_after"] == left
            # written, the weights stay int8 (a quarter of SqueezeNet's 4.9 MB of floats), and
            # both onnxruntime and tilefold read back what was optimized
            from tilefold.backends.onnx import save_onnx

            path = tmp_path / f"squeezenet.{target}.onnx"
            assert save_onnx(g, path).weight_bytes < 0.3 * 4 * source_params
            (again,) = session_of(path).run(None, feeds)
            np.testing.assert_array_equal(again, got)
            (again,) = tilefold.compile(tilefold.load(path))(feeds).values()
            np.testing.assert_array_equal(again, got)
