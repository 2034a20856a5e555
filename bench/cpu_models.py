"""CPU benchmark: tilefold's NumPy backend against onnxruntime and eager PyTorch, one process.

ResNet-50 (batch 1, 224x224) and BERT-base (seq 128) from transformers, random weights
(MobileNetV2 too, when named).
Every runner gets the same inputs; after a warm-up, the runners take turns (so that load drift
on a shared machine hits all alike) and the median of N runs is reported with
the ratios tilefold/onnxruntime and tilefold/eager (above 1: tilefold is slower), the
GFLOP/s reached (FLOP = 2 x the multiply-adds of Conv/MatMul/Gemm) and tilefold's top ops.

    python -m tilefold.bench.cpu_models [--models resnet50,bert,mobilenet_v2] [--repeat 10] [--graph plain,optimized]
                                        [--kernels numpy,aten]

Absolute times drift on shared machines; compare the ratios, measured side by side.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import tilefold
from tilefold.backends.numpy import RunStats
from tilefold.graph import Graph

from . import models

GraphTransform = Callable[[Graph], Graph]
MODELS = ("resnet50", "bert")
EXTRA_MODELS = ("mobilenet_v2",)
"""Timed when named: MobileNetV2's depthwise convs (`--models mobilenet_v2`)."""


@dataclass
class Case:
    """One model: its ONNX file, its inputs and its eager PyTorch twin."""

    name: str
    path: Path
    feeds: dict[str, np.ndarray]
    eager: Callable[[], Any]  # builds the torch module (same weights as the export)
    torch_call: Callable[[Any, dict[str, Any]], Any]


@dataclass
class Row:
    model: str
    runner: str
    seconds: list[float]
    flops: float
    error: float | None = None  # max |out - onnxruntime| / max |onnxruntime|
    per_op: dict[str, float] = field(default_factory=dict)  # seconds per run, tilefold rows

    @property
    def ms(self) -> float:
        return 1e3 * statistics.median(self.seconds)

    @property
    def best_ms(self) -> float:
        return 1e3 * min(self.seconds)


def case(name: str, cache_dir: str | os.PathLike | None = None) -> Case:
    """A model's benchmark case: its cached export, fixed inputs and eager twin."""
    rng = np.random.default_rng(0)
    if name == "resnet50":
        return Case(
            name, models.resnet50(cache_dir), models.resnet50_inputs(rng), models.resnet50_torch,
            lambda m, f: m(f[models.RESNET_INPUT]).logits,
        )
    if name == "bert":
        return Case(
            name, models.bert(cache_dir), models.bert_inputs(rng), models.bert_torch,
            lambda m, f: m(*(f[k] for k in models.BERT_INPUTS)).last_hidden_state,
        )
    if name == "mobilenet_v2":
        return Case(
            name, models.mobilenet_v2(cache_dir), models.resnet50_inputs(rng), models.mobilenet_v2_torch,
            lambda m, f: m(f[models.RESNET_INPUT]).logits,
        )
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS + EXTRA_MODELS)}")


def graph_variants() -> dict[str, GraphTransform]:
    """The tilefold graphs to time: the plain one, and the one `tilefold.optimize` gives (cpu target)."""
    return {"plain": lambda g: g, "optimized": lambda g: tilefold.optimize(g, "cpu").graph}


def matmul_flops(graph: Graph) -> float:
    """2 x multiply-adds of every Conv, MatMul and Gemm, from the graph's static types."""
    return float(sum(node_flops(graph, node) for node in graph.nodes()))


def node_flops(graph: Graph, node: Any) -> int:
    """2 x the multiply-adds of one Conv, MatMul or Gemm (0 for other ops or dynamic shapes)."""
    if node.op not in ("Conv", "MatMul", "Gemm"):
        return 0
    ins = [graph.type_of(v) if v is not None else None for v in graph.inputs_of(node.name)]
    out = node.outputs[0]
    if not out.is_static or ins[0] is None or ins[1] is None or not ins[1].is_static:
        return 0
    if node.op == "Conv":
        k = int(np.prod(ins[1].shape[1:]))  # C/group x kernel
    elif node.op == "MatMul":
        k = int(ins[1].shape[-2]) if ins[1].rank >= 2 else int(ins[1].shape[0])
    else:
        k = int(ins[1].shape[1] if node.attrs.get("transB", 0) else ins[1].shape[0])
    return 2 * int(out.numel()) * k


def time_interleaved(
    runners: Mapping[str, Callable[[], Any]], *, repeat: int, gap: float
) -> dict[str, list[float]]:
    """Seconds per call of each runner, taking turns so that load drift hits all of them alike.

    Before each timed call the process sleeps `gap` seconds, so that the thread pools of the
    previous runner (OpenBLAS, onnxruntime and OpenMP spin after a call) are idle again.
    """
    times: dict[str, list[float]] = {label: [] for label in runners}
    for _ in range(repeat):
        for label, run in runners.items():
            time.sleep(gap)
            start = time.perf_counter()
            run()
            times[label].append(time.perf_counter() - start)
    return times


def _error(out: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max()) or 1.0
    return float(np.abs(np.asarray(out, dtype=np.float64) - ref).max()) / scale


def bench_model(
    c: Case,
    *,
    repeat: int = 10,
    warmup: int = 2,
    threads: int = 2,
    gap: float = 0.1,
    variants: Mapping[str, GraphTransform] | None = None,
    peers: Sequence[str] = ("onnxruntime", "eager"),
    kernel_sets: Sequence[str] = ("numpy",),
) -> list[Row]:
    """Time tilefold (each graph variant on each NumPy kernel set), onnxruntime and eager
    PyTorch on one model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(c.path), options, providers=["CPUExecutionProvider"])
    first = session.get_outputs()[0].name
    reference = session.run([first], c.feeds)[0]

    runners: dict[str, Callable[[], Any]] = {}
    errors: dict[str, float] = {}
    stats: dict[str, RunStats] = {}
    base = tilefold.load(c.path)
    flops = matmul_flops(base)
    for label, transform in (variants or graph_variants()).items():
        graph = transform(base)
        for kernels in kernel_sets:
            exe = tilefold.compile(graph, kernels=kernels)
            name = f"tilefold {label}" + ("" if kernels == "numpy" else f" ({kernels})")
            errors[name] = _error(exe(c.feeds)[first], reference)
            stats[name] = RunStats()  # accumulates over the timed runs; costs ~1 us a node
            runners[name] = lambda exe=exe, st=stats[name]: exe.run(c.feeds, stats=st)
    if "onnxruntime" in peers:
        runners["onnxruntime"] = lambda: session.run(None, c.feeds)
        errors["onnxruntime"] = 0.0

    torch_threads = None
    if "eager" in peers:
        import torch

        torch_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        module = c.eager()
        torch_feeds = {k: torch.from_numpy(v) for k, v in c.feeds.items()}

        def eager() -> Any:
            with torch.no_grad():
                return c.torch_call(module, torch_feeds)

        errors["eager pytorch"] = _error(eager().numpy(), reference)
        runners["eager pytorch"] = eager
    try:
        for run in runners.values():
            for _ in range(warmup):
                run()
        for st in stats.values():
            st.per_op.clear()
        times = time_interleaved(runners, repeat=repeat, gap=gap)
    finally:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
    return [
        Row(c.name, label, seconds, flops, errors[label],
            {op: sec / repeat for op, sec in stats[label].per_op.items()} if label in stats else {})
        for label, seconds in times.items()
    ]


def format_table(rows: Sequence[Row]) -> str:
    """One line per (model, runner): median and best ms, GFLOP/s (of the median), ratios of
    the medians to onnxruntime and eager. The best run beside the median shows how much of a
    runner's time is the shared machine's noise: memory-bound kernels suffer most from it."""
    head = f"{'model':<14}{'runner':<22}{'median ms':>10}{'best ms':>9}{'GFLOP/s':>9}{'/ onnxrt':>10}{'/ eager':>9}{'max rel err':>13}"
    lines = [head, "-" * len(head)]
    for model in dict.fromkeys(r.model for r in rows):
        group = [r for r in rows if r.model == model]
        ort_ms = next((r.ms for r in group if r.runner == "onnxruntime"), None)
        eager_ms = next((r.ms for r in group if r.runner == "eager pytorch"), None)
        for r in group:
            vs_ort = f"{r.ms / ort_ms:.2f}x" if ort_ms else "-"
            vs_eager = f"{r.ms / eager_ms:.2f}x" if eager_ms else "-"
            err = f"{r.error:.1e}" if r.error is not None else "-"
            gflops = r.flops / (r.ms * 1e-3) / 1e9
            lines.append(f"{r.model:<14}{r.runner:<22}{r.ms:>10.1f}{r.best_ms:>9.1f}{gflops:>9.1f}{vs_ort:>10}{vs_eager:>9}{err:>13}")
        lines.append(f"{'':<14}({group[0].flops / 1e9:.2f} GFLOP per run)")
    return "\n".join(lines)


def format_top_ops(rows: Sequence[Row], top: int = 8) -> str:
    """tilefold's most expensive ops per model and graph variant (ms per run, share)."""
    lines = []
    for r in rows:
        if not r.per_op:
            continue
        total = sum(r.per_op.values())
        lines.append(f"{r.model} / {r.runner}: top ops, mean per run ({1e3 * total:.1f} ms in kernels)")
        for op, sec in sorted(r.per_op.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {op:<22}{1e3 * sec:>9.1f} ms{100 * sec / total:>7.1f}%")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.bench.cpu_models", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS + EXTRA_MODELS)}")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per runner (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op and torch threads")
    parser.add_argument("--gap", type=float, default=0.1, help="idle seconds before each timed call")
    parser.add_argument("--graph", default=None, help=f"tilefold graph variants (default: all of {', '.join(graph_variants())})")
    parser.add_argument("--peers", default="onnxruntime,eager", help="peers to time: onnxruntime, eager")
    parser.add_argument("--kernels", default="numpy",
                        help="the NumPy backend's kernel sets to time, comma-separated: numpy, aten")
    parser.add_argument("--top", type=int, default=8, help="tilefold ops to list per model")
    parser.add_argument("--cache-dir", default=None, help="where the exported models are cached")
    args = parser.parse_args(argv)

    available = graph_variants()
    chosen = args.graph.split(",") if args.graph else list(available)
    unknown = [v for v in chosen if v not in available]
    if unknown:
        parser.error(f"unknown graph variant {unknown[0]!r}; available: {', '.join(available)}")
    variants = {v: available[v] for v in chosen}
    peers = [p for p in args.peers.split(",") if p]

    print(f"cores: {os.cpu_count()}  threads (onnxruntime, torch): {args.threads}  "
          f"median of {args.repeat} runs after {args.warmup} warm-up", flush=True)
    rows: list[Row] = []
    for name in args.models.split(","):
        rows += bench_model(case(name, args.cache_dir), repeat=args.repeat, warmup=args.warmup,
                            threads=args.threads, gap=args.gap, variants=variants, peers=peers,
                            kernel_sets=args.kernels.split(","))
    print(format_table(rows))
    print()
    print(format_top_ops(rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
