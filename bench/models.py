"""Models shared by the tests, the benchmarks, the README demo and the notebooks.

- `mlp(path)`: a small ONNX MLP with random weights, built with onnx.helper.
- `unet_model(...)`: a one-level U-Net (conv, pool, conv, upsample, skip concat, conv) with
  random weights, its upsampling a Resize or torch's nearest form, two Gathers.
- `fusion_model(...)`: GLPN's selective feature fusion (one channel of an attention map
  taken by a Gather of a scalar index), with random weights.
- `resnet50()` / `bert()`: transformers models built from their config with random weights
  (no download), exported with `torch.onnx.export(dynamo=True)` and cached on disk;
  `resnet50_torch()` / `bert_torch()` build the identical eager modules; `gpt2_torch()` and
  `llama_torch()` decoders of the same size (eager only).
- `light_model(name, random_weights=...)`: the model-zoo architectures shipped with onnx.
- `qdq_cnn_model()`: a quantized (QuantizeLinear/DequantizeLinear) conv stack, exact in float32.

    python -m tilefold.bench.models mlp --out build/mlp.onnx
    python -m tilefold.bench.models resnet50 --out build/
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .light import LIGHT_MODELS, data_inputs, light_model, light_path, light_reference, static_shape

TORCH_SEED = 0
RESNET_INPUT = "pixel_values"
BERT_INPUTS = ("input_ids", "attention_mask")

__all__ = [
    "LIGHT_MODELS", "bert", "bert_inputs", "bert_torch", "gpt2_torch", "llama_torch", "model_cache_dir",
    "data_inputs", "light_model", "light_path", "light_reference", "mlp", "random_inputs", "resnet50",
    "resnet50_inputs", "resnet50_torch", "static_shape",
]


# ---- writing files ----------------------------------------------------------------------
@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, moved over it only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Check a model and write it atomically."""
    path = Path(path)
    onnx.checker.check_model(model, full_check=True)
    with atomic_path(path) as tmp:
        onnx.save(model, tmp)
    return path


# ---- a generated MLP --------------------------------------------------------------------
def mlp_model(
    *,
    batch: int | str = 8,
    sizes: Sequence[int] = (256, 512, 512, 10),
    seed: int = 0,
    opset: int = 21,
    gemm: bool = False,
) -> onnx.ModelProto:
    """MLP `x -> [MatMul, Add, Relu]* -> MatMul, Add -> y` (or Gemm with transB=1 layers).

    `batch` may be a name (a symbolic batch dim). Weights are He-normal, biases ~N(0, 0.1).
    """
    if len(sizes) < 2:
        raise ValueError(f"an MLP needs at least two sizes (in, out), got {tuple(sizes)}")
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    x = "x"
    layers = list(zip(sizes[:-1], sizes[1:]))
    for i, (k, n) in enumerate(layers):
        w = (rng.standard_normal((k, n)) * np.sqrt(2.0 / k)).astype(np.float32)
        b = rng.normal(0.0, 0.1, n).astype(np.float32)
        last = i == len(layers) - 1
        y = "y" if last else f"h{i}"
        pre = y if last else f"fc{i}"
        if gemm:
            inits += [numpy_helper.from_array(np.ascontiguousarray(w.T), f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
            nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [pre], name=f"gemm{i}", transB=1))
        else:
            inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"matmul{i}"))
            nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [pre], name=f"add{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [pre], [y], name=f"relu{i}"))
        x = y
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, sizes[-1]])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tilefold.bench")


def mlp(
    path: str | os.PathLike,
    *,
    batch: int | str = 8,
    sizes: Sequence[int] = (256, 512, 512, 10),
    seed: int = 0,
    opset: int = 21,
    gemm: bool = False,
) -> Path:
    """Write `mlp_model(...)` to `path` (checked, atomically); returns the path."""
    return save_model(mlp_model(batch=batch, sizes=sizes, seed=seed, opset=opset, gemm=gemm), path)


def qdq_cnn_model(*, channels: int = 32, size: int = 8, batch: int = 2, seed: int = 0) -> onnx.ModelProto:
    """A quantized ("QDQ") conv stack as quantization tools write it: `x -> Q/DQ (per tensor,
    int8) -> conv 3x3 (int8 weights, per-output-channel DequantizeLinear) -> Relu -> Q/DQ (per
    channel, uint8) -> conv 1x1 -> y`. Weights, inputs' scales and zero points are small
    integers and powers of two, so every float sum is exact (integer inputs give outputs that
    any correct runtime reproduces bit for bit)."""
    rng = np.random.default_rng(seed)
    node = helper.make_node

    def pow2(n: int, low: int, high: int) -> np.ndarray:
        return (2.0 ** rng.integers(low, high + 1, n)).astype(np.float32)

    nodes = [
        node("QuantizeLinear", ["x", "s_in", "z_in"], ["xq"], name="quant_in"),
        node("DequantizeLinear", ["xq", "s_in", "z_in"], ["xd"], name="dequant_in"),
        node("DequantizeLinear", ["w0q", "s_w0", "z_w0"], ["w0"], name="dequant_w0", axis=0),
        node("Conv", ["xd", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        node("Relu", ["c0"], ["r0"], name="relu0"),
        node("QuantizeLinear", ["r0", "s_mid", "z_mid"], ["mq"], name="quant_mid", axis=1),
        node("DequantizeLinear", ["mq", "s_mid", "z_mid"], ["md"], name="dequant_mid", axis=1),
        node("DequantizeLinear", ["w1q", "s_w1"], ["w1"], name="dequant_w1", axis=0),
        node("Conv", ["md", "w1"], ["y"], name="conv1"),
    ]
    weights = {
        "s_in": np.array(0.5, np.float32), "z_in": np.array(0, np.int8),
        "w0q": rng.integers(-3, 4, (channels, 3, 3, 3)).astype(np.int8), "s_w0": pow2(channels, -1, 1),
        "z_w0": np.zeros(channels, np.int8), "b0": rng.integers(-4, 5, channels).astype(np.float32),
        "s_mid": pow2(channels, 0, 2), "z_mid": rng.integers(0, 8, channels).astype(np.uint8),
        "w1q": rng.integers(-3, 4, (8, channels, 1, 1)).astype(np.int8), "s_w1": pow2(8, -2, 0),
    }
    graph = helper.make_graph(
        nodes, "qdq_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, size, size])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="tilefold.bench")


UPSAMPLINGS = ("nearest", "linear", "cubic", "gathers")


def unet_model(*, channels: int = 32, size: int = 8, batch: int = 2, upsample: str = "nearest",
               seed: int = 0) -> onnx.ModelProto:
    """`x (batch, 3, size, size)` -> conv 3x3 -> relu -> maxpool 2 -> conv 3x3 -> upsample x2 ->
    concat with the first relu -> conv 3x3 -> `y (batch, 4, size, size)`.

    `upsample`: a Resize by scales (nearest, linear) or by sizes (cubic), or "gathers": two
    Gathers of repeated indices along H and W, as torch's nearest upsampling reaches ONNX."""
    if upsample not in UPSAMPLINGS:
        raise ValueError(f"unknown upsampling {upsample!r}; choose one of {', '.join(UPSAMPLINGS)}")
    if size % 2:
        raise ValueError(f"the U-Net's size must be even (pooled by 2, upsampled by 2), got {size}")
    rng = np.random.default_rng(seed)

    def conv(name: str, f: int, c: int) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal((f, c, 3, 3)) * np.sqrt(2.0 / (9 * c))).astype(np.float32),
                                       name)

    inits = [conv("w0", channels, 3), conv("w1", channels, channels), conv("w2", 4, 2 * channels)]
    if upsample == "gathers":
        inits.append(numpy_helper.from_array(np.repeat(np.arange(size // 2), 2).astype(np.int64), "twice"))
        up = [helper.make_node("Gather", ["b", "twice"], ["rows"], name="up_rows", axis=2),
              helper.make_node("Gather", ["rows", "twice"], ["up"], name="up_cols", axis=3)]
    elif upsample == "cubic":
        inits.append(numpy_helper.from_array(np.array([batch, channels, size, size], np.int64), "sizes"))
        up = [helper.make_node("Resize", ["b", "", "", "sizes"], ["up"], name="up", mode="cubic")]
    else:
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
        up = [helper.make_node("Resize", ["b", "", "scales"], ["up"], name="up", mode=upsample)]
    same = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], name="conv0", **same),
        helper.make_node("Relu", ["a"], ["r"], name="relu0"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w1"], ["b"], name="conv1", **same),
        *up,
        helper.make_node("Concat", ["r", "up"], ["cat"], name="skip", axis=1),
        helper.make_node("Conv", ["cat", "w2"], ["y"], name="conv2", **same),
    ]
    graph = helper.make_graph(
        nodes, "unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="tilefold.bench")


def fusion_model(*, channels: int = 16, size: int = 8, batch: int = 2, seed: int = 0) -> onnx.ModelProto:
    """GLPN's selective feature fusion, shrunk: `x (batch, 3, size, size)` -> conv 3x3 `a` ->
    conv 3x3 to a 2-channel attention map -> sigmoid; its first and last channels (Gathers of
    the scalar indices 0 and -1, unsqueezed) scale `a`, the two are added -> conv 1x1 ->
    `y (batch, 4, size, size)`."""
    rng = np.random.default_rng(seed)

    def conv(name: str, f: int, c: int, k: int = 3) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal((f, c, k, k)) * np.sqrt(2.0 / (k * k * c))).astype(np.float32),
                                       name)

    inits = [conv("w0", channels, 3), conv("w1", 2, channels), conv("w2", 4, channels, 1),
             numpy_helper.from_array(np.array(0, np.int64), "first"), numpy_helper.from_array(np.array(-1, np.int64), "last"),
             numpy_helper.from_array(np.array([1], np.int64), "channel")]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0"], ["a"], name="conv0", pads=[1, 1, 1, 1]),
        node("Conv", ["a", "w1"], ["logits"], name="conv1", pads=[1, 1, 1, 1]),
        node("Sigmoid", ["logits"], ["attn"], name="attn"),
        node("Gather", ["attn", "first"], ["g0"], name="first", axis=1),
        node("Gather", ["attn", "last"], ["g1"], name="last", axis=1),
        node("Unsqueeze", ["g0", "channel"], ["u0"], name="u0"),
        node("Unsqueeze", ["g1", "channel"], ["u1"], name="u1"),
        node("Mul", ["a", "u0"], ["m0"], name="m0"),
        node("Mul", ["a", "u1"], ["m1"], name="m1"),
        node("Add", ["m0", "m1"], ["s"], name="fuse"),
        node("Conv", ["s", "w2"], ["y"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes, "fusion", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="tilefold.bench")


# ---- transformers models, exported with torch.onnx (dynamo) ----------------------------
def model_cache_dir(explicit: str | os.PathLike | None = None) -> Path:
    """`explicit`, else $TILEFOLD_CACHE, else ~/.cache/tilefold/models."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("TILEFOLD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tilefold" / "models"


def _versions_key() -> str:
    import torch
    import transformers

    return f"torch{torch.__version__}-transformers{transformers.__version__}".replace("+", "_")


@contextlib.contextmanager
def _seeded_torch(seed: int) -> Iterator[None]:
    """Seed torch's RNG for the block without changing the caller's RNG state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def resnet50_torch() -> Any:
    """transformers ResNet-50 (default `ResNetConfig`, 2 labels) with seeded random weights, eval mode."""
    import transformers

    with _seeded_torch(TORCH_SEED):
        model = transformers.ResNetForImageClassification(transformers.ResNetConfig())
    return model.eval()


def mobilenet_v2_torch() -> Any:
    """transformers MobileNetV2 (default `MobileNetV2Config`: width 1.0, 224x224) with seeded
    random weights, eval mode: its 17 depthwise convs are the benchmark's."""
    import transformers

    with _seeded_torch(TORCH_SEED):
        model = transformers.MobileNetV2ForImageClassification(transformers.MobileNetV2Config())
    return model.eval()


def bert_torch(**config: Any) -> Any:
    """transformers BERT-base (`BertConfig(**config)`) with seeded random weights, eval mode."""
    import transformers

    with _seeded_torch(TORCH_SEED):
        model = transformers.BertModel(transformers.BertConfig(**config))
    return model.eval()


def gpt2_torch(**config: Any) -> Any:
    """transformers GPT-2 (`GPT2Config(**config)`; pre-norm LayerNorms, tanh GELU) with seeded
    random weights, called as (input_ids, attention_mask) -> last hidden state, without the
    key and value cache."""
    import transformers

    with _seeded_torch(TORCH_SEED):
        model = transformers.GPT2Model(transformers.GPT2Config(**{"use_cache": False, **config}))
    return _last_hidden_state(model)


LLAMA_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
              "intermediate_size": 2048, "vocab_size": 32000}
"""A LLaMA of BERT-base's size, for `llama_torch` (LlamaConfig's default is 7B)."""


def llama_torch(**config: Any) -> Any:
    """transformers LLaMA (`LlamaConfig(**{**LLAMA_BASE, **config})`: RMSNorm, grouped query
    attention, rotary embeddings, SwiGLU; sdpa attention) with seeded random weights, called
    as (input_ids, attention_mask) -> last hidden state, without the key and value cache."""
    import transformers

    settings = {**LLAMA_BASE, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "use_cache": False,
                "attn_implementation": "sdpa", **config}
    with _seeded_torch(TORCH_SEED):
        model = transformers.LlamaModel(transformers.LlamaConfig(**settings))
    return _last_hidden_state(model)


def _last_hidden_state(model: Any) -> Any:
    """`model` (a transformers decoder) as a module of (input_ids, attention_mask) returning its
    last hidden state alone: what torch.export traces (no cache object in the outputs)."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    return LastHiddenState().eval()


def resnet50_inputs(rng: np.random.Generator, batch: int = 1, size: int = 224) -> dict[str, np.ndarray]:
    """A standard-normal image batch, size x size (224 unless told)."""
    return {RESNET_INPUT: rng.standard_normal((batch, 3, size, size)).astype(np.float32)}


def bert_inputs(rng: np.random.Generator, seq: int = 128, vocab: int = 30522) -> dict[str, np.ndarray]:
    """Random token ids and an attention mask whose last quarter is padding (zeros)."""
    ids = rng.integers(0, vocab, (1, seq), dtype=np.int64)
    mask = np.ones((1, seq), dtype=np.int64)
    mask[:, seq - seq // 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _export(model: Any, args: tuple, path: Path) -> Path:
    import torch

    with torch.no_grad():
        program = torch.onnx.export(model, args, dynamo=True, verbose=False)
    with atomic_path(path) as tmp:
        program.save(str(tmp))
    return path


def resnet50(cache_dir: str | os.PathLike | None = None, size: int = 224) -> Path:
    """The ONNX export of `resnet50_torch()` (batch 1, 3 x size x size), built once and cached.
    A smaller image keeps every layer and cuts the work by (224 / size)**2 (the interpreter's tests)."""
    import torch

    suffix = "" if size == 224 else f"-{size}px"
    path = model_cache_dir(cache_dir) / f"resnet50{suffix}-{_versions_key()}.onnx"
    if not path.exists():
        x = torch.from_numpy(resnet50_inputs(np.random.default_rng(0), size=size)[RESNET_INPUT])
        _export(resnet50_torch(), (x,), path)
    return path


def mobilenet_v2(cache_dir: str | os.PathLike | None = None) -> Path:
    """The ONNX export of `mobilenet_v2_torch()` (batch 1, 3x224x224; input `pixel_values`), cached."""
    import torch

    path = model_cache_dir(cache_dir) / f"mobilenet_v2-{_versions_key()}.onnx"
    if not path.exists():
        x = torch.from_numpy(resnet50_inputs(np.random.default_rng(0))[RESNET_INPUT])
        _export(mobilenet_v2_torch(), (x,), path)
    return path


def bert(cache_dir: str | os.PathLike | None = None, seq: int = 128) -> Path:
    """The ONNX export of `bert_torch()` (input_ids, attention_mask: int64 [1, seq]), cached."""
    import torch

    path = model_cache_dir(cache_dir) / f"bert-seq{seq}-{_versions_key()}.onnx"
    if not path.exists():
        feeds = bert_inputs(np.random.default_rng(0), seq)
        args = tuple(torch.from_numpy(feeds[name]) for name in BERT_INPUTS)
        _export(bert_torch(), args, path)
    return path


# ---- inputs for any model ---------------------------------------------------------------
def random_inputs(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Fresh inputs for a model's float inputs (standard normal; symbolic dims set to 1)."""
    feeds = {}
    for info in data_inputs(model):
        elem = info.type.tensor_type.elem_type
        if elem != TensorProto.FLOAT:
            raise ValueError(f"input {info.name!r}: random_inputs makes float32 inputs only")
        feeds[info.name] = rng.standard_normal(static_shape(info)).astype(np.float32)
    return feeds


# ---- command line -----------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.bench.models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="model", required=True)
    p = sub.add_parser("mlp", help="a random-weight MLP")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.add_argument("--batch", default="8", help="batch size, or a name for a symbolic batch dim")
    p.add_argument("--sizes", default="256,512,512,10", help="layer widths, input first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--opset", type=int, default=21)
    p.add_argument("--gemm", action="store_true", help="Gemm layers instead of MatMul + Add")
    p = sub.add_parser("unet", help="a random-weight one-level U-Net")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.add_argument("--upsample", choices=UPSAMPLINGS, default="nearest")
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--size", type=int, default=8, help="input height and width (even)")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("qdq", help="a quantized (QDQ) conv stack, exact in float32")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--size", type=int, default=8, help="input height and width")
    p.add_argument("--seed", type=int, default=0)
    for name, what in (("resnet50", "transformers ResNet-50"), ("bert", "transformers BERT-base"),
                       ("mobilenet_v2", "transformers MobileNetV2")):
        p = sub.add_parser(name, help=f"{what}, random weights, exported with torch.onnx")
        p.add_argument("--out", default=None, help="folder to write into (default: the model cache)")
        if name == "bert":
            p.add_argument("--seq", type=int, default=128)
    p = sub.add_parser("light", help="an onnx light model-zoo model")
    p.add_argument("name", choices=LIGHT_MODELS)
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.add_argument("--random-weights", action="store_true", help="replace the splat weights by random ones")
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.model == "mlp":
        batch: int | str = int(args.batch) if args.batch.isdigit() else args.batch
        sizes = tuple(int(s) for s in args.sizes.split(","))
        path = mlp(args.out, batch=batch, sizes=sizes, seed=args.seed, opset=args.opset, gemm=args.gemm)
    elif args.model == "unet":
        path = save_model(unet_model(channels=args.channels, size=args.size, upsample=args.upsample,
                                     seed=args.seed), args.out)
    elif args.model == "qdq":
        path = save_model(qdq_cnn_model(channels=args.channels, size=args.size, seed=args.seed), args.out)
    elif args.model == "resnet50":
        path = resnet50(args.out)
    elif args.model == "bert":
        path = bert(args.out, seq=args.seq)
    elif args.model == "mobilenet_v2":
        path = mobilenet_v2(args.out)
    else:
        path = save_model(light_model(args.name, random_weights=args.random_weights, seed=args.seed), args.out)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
