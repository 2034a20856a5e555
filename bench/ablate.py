"""Which of the gpu target's bets pay, end to end on a GPU: each model run with one of them
off against the default, in one process (ratio = the variant's time / the default's; above 1,
the bet pays).

The bets, each trading work inside a kernel for launches and trips through memory, or one
way of reading a weight for another:
- `GpuTarget.weight_tiles`: weights in 16x16 tiles (default), or row-major (K, N), which
  measured 3-5% faster per product in bench/gpu.py's matmul rows;
- `Fusion.prologues` of matmuls: a matmul computes the LayerNorm or RMSNorm of its operand
  (pre-norm layers: GPT-2, LLaMA), each program reading its rows two or three times, instead
  of a launch plus a write and a read of the normalized rows (the row ops' prologues stay);
- `Fusion.shared`: the same for a post-norm layer's LayerNorm (BERT), which is also the next
  residual: the first column of the matmul's programs writes the normalized rows too, and the
  norm's launch goes (two a layer);
- `Fusion.spans`: attention's scores, softmax and product with V as one flash-attention kernel;
- `Fusion.pairs`: LLaMA's SiLU(gate) * up in its merged gate and up projection's kernel.

Models, batch 1, sequence 128, float32 (or `--dtype`), random weights, traced with
`tilefold.from_torch`, also timed in eager PyTorch on the device:
BERT-base (post-norm), GPT-2 base (pre-norm LayerNorm) and a LLaMA of the same size (RMSNorm,
grouped query attention, rotary, SwiGLU: bench/models.py's LLAMA_BASE). A variant whose kernels
and weights are the default's is not run. Each row also gives the kernel launches, the first
run (kernel compiles) and the largest difference from the default's output.

    python -m tilefold.bench.ablate [--models llama,gpt2,bert] [--dtype float32|float16|bfloat16]
                                    [--repeat 20] [--device cuda|interp]

Runs only where CUDA is present; elsewhere it prints one line and exits with status 0
(`--device interp` runs two-layer models of width 32 at sequence 16 under the interpreter, to
check the script).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import numpy as np

from ..backends.triton.fusion import Fusion
from ..backends.triton.templates import TEMPLATES
from ..layout.targets import GpuTarget
from .gpu import _guarded, _time

MODELS = ("llama", "gpt2", "bert")
"""In the order they run: LLaMA first, which has every bet (a run stopped early keeps it)."""
SMALL = {"bert": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                  "vocab_size": 100},
         "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 100},
         "llama": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 64, "vocab_size": 100}}
"""The models' configurations for `--device interp` (the full ones are each family's base size)."""
VOCAB = {"bert": 30522, "gpt2": 50257, "llama": 32000}


class RowMajorWeights(GpuTarget):
    """The gpu target with its matmul weights row-major (K, N)."""

    weight_tiles = False


VARIANTS: tuple[tuple[str, bool, Fusion], ...] = (
    ("default", True, Fusion()),
    ("row-major weights", False, Fusion()),
    ("no norm prologues in matmuls", True, Fusion(prologues=frozenset(TEMPLATES) - {"matmul"})),
    ("no shared norm prologues (post-norm)", True, Fusion(shared=False)),
    ("attention unfused (no spans)", True, Fusion(spans=False)),
    ("no paired parts", True, Fusion(pairs=False)),
)
"""(label, GpuTarget.weight_tiles, fusions): the default first, then one bet off in each."""


def _builder(name: str) -> Callable[..., Any]:
    from . import models

    return {"bert": models.bert_torch, "gpt2": models.gpt2_torch, "llama": models.llama_torch}[name]


def _same_plan(graph: Any, fuse: Fusion, other: Any, other_fuse: Fusion) -> bool:
    """Whether two graphs run the same kernels on the same weight layouts."""
    from ..backends.triton.launch import kernel_groups
    from ..graph.graph import CONSTANT

    def plan(g: Any, f: Fusion) -> tuple:
        return ([(group.kind, tuple(group.names)) for group in kernel_groups(g, f)],
                [(n.name, n.outputs[0].encoding) for n in g.nodes() if n.op == CONSTANT])

    return plan(graph, fuse) == plan(other, other_fuse)


def ablate(name: str, repeat: int, device: str, failures: list[str], dtype: str = "float32") -> None:
    """Eager PyTorch, then every variant of one model that differs from the default, timed
    against the default; the model in `dtype`."""
    import torch

    import tilefold
    from tilefold.backends.triton import TritonExecutable

    from .models import BERT_INPUTS, bert_inputs

    small = device == "interp"
    seq = 16 if small else 128
    module = _builder(name)(**(SMALL[name] if small else {})).to(getattr(torch, dtype))
    feeds = bert_inputs(np.random.default_rng(5), seq, SMALL[name]["vocab_size"] if small else VOCAB[name])
    args = tuple(torch.from_numpy(feeds[k]) for k in BERT_INPUTS)
    start = time.perf_counter()
    traced = tilefold.from_torch(module, args)
    graphs = {True: tilefold.optimize(traced, "gpu").graph,
              False: tilefold.optimize(traced, RowMajorWeights("gpu-row-major-weights")).graph}
    print(f"  {name}: traced and optimized both ways in {time.perf_counter() - start:.1f} s", flush=True)
    where = "cpu" if small else device
    inputs = dict(zip(graphs[True].input_types(), (a.to(where) for a in args)))

    def forward(model: Any, operands: tuple) -> Any:
        with torch.no_grad():
            out = model(*operands)
        return (out if isinstance(out, torch.Tensor) else out[0]).float().cpu().numpy()  # BERT: last hidden state

    eager = forward(module, args)
    base: dict[str, Any] = {}

    def run(label: str, weight_tiles: bool, fuse: Fusion) -> None:
        graph = graphs[weight_tiles]
        if base and _same_plan(graph, fuse, graphs[True], Fusion()):
            print(f"  {name}, {label}: the default's kernels and weights; not run", flush=True)
            return
        exe = TritonExecutable(graph, device=device, fuse=fuse)
        began = time.perf_counter()
        out = next(iter(exe(inputs).values()))
        compiled = time.perf_counter() - began
        took = _time(lambda: exe(inputs), repeat)
        launches = sum(step.plan is not None for step in exe.steps)
        out = np.asarray(out, np.float32)
        if not base:
            base.update(time=took, out=out)
            error = float(np.abs(out - eager).max() / np.abs(eager).max())
            print(f"  {name}: largest error against eager, relative to its largest output: {error:.2e}", flush=True)
            on_device = module.to(where)
            operands = tuple(a.to(where) for a in args)
            eager_time = _time(lambda: forward(on_device, operands), repeat)
            print(f"{name + ', eager PyTorch':<44} {eager_time * 1e3:9.3f} ms  eager / default "
                  f"{eager_time / took:5.2f}x (above 1: the default is faster)", flush=True)
        difference = float(np.abs(out - base["out"]).max() / np.abs(base["out"]).max())
        print(f"{name + ', ' + label:<44} {took * 1e3:9.3f} ms  {launches:4d} launches  first run {compiled:5.1f} s  "
              f"ratio {took / base['time']:5.2f}x  difference from the default {difference:.1e}", flush=True)

    for label, weight_tiles, fuse in VARIANTS:
        _guarded(f"{name} {label}", lambda: run(label, weight_tiles, fuse), failures)
        if not base:
            return  # the default failed: nothing to compare with


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.bench.ablate", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                        help="the models' (and eager PyTorch's) type; kernels accumulate in float32")
    parser.add_argument("--device", default="cuda", choices=("cuda", "interp"),
                        help="interp: small models under Triton's interpreter, to check the script (no timing value)")
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/ablate.py: no CUDA GPU on this machine; nothing measured (--device interp checks the script)")
        return 0
    where = "Triton interpreter on the CPU (smoke run: small models, times mean nothing)" if args.device == "interp" \
        else torch.cuda.get_device_name()
    print(f"device: {where}; {args.dtype}, TF32 off (ratio = variant time / default time: above 1, the bet pays)")
    torch.backends.cuda.matmul.allow_tf32 = False
    failures: list[str] = []
    for name in names:
        ablate(name, 1 if args.device == "interp" else args.repeat, args.device, failures, args.dtype)
    if failures:
        print(f"{len(failures)} cases failed: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
