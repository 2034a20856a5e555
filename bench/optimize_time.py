"""Optimization time: `tilefold.load` + `tilefold.optimize` against onnxruntime's session
creation, and propagation's scaling with graph size.

1. ResNet-50 and BERT-base (bench/models.py, cached exports): the median time of
   `tilefold.load` (ONNX -> Graph, simplified) plus `tilefold.optimize` (materialize,
   propagate, fold, report) against `onnxruntime.InferenceSession` creation with
   ORT_ENABLE_ALL and `optimized_model_filepath` set (it optimizes and writes the model),
   as a ratio (below 1: tilefold is faster).
2. Generated chains of 1,000 / 3,000 / 10,000 ops built directly as Graphs (blocks of an
   anchor and three elementwise ops; `residual`: the block's input also feeds its Add):
   `tilefold.optimize` time per op, which stays flat when propagation is linear in the
   graph's size, and the runtime layout ops before and after.

    python -m tilefold.bench.optimize_time [--models resnet50,bert] [--sizes 1000,3000,10000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

import tilefold
from tilefold.graph import Graph, Splat, TensorType, Value
from tilefold.graph.registry import REGISTRY, infer

from . import models

MODELS = ("resnet50", "bert")
CHAINS = ("conv-cpu", "conv-residual-cpu", "matmul-gpu")


def _median_seconds(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


# ---- models ----------------------------------------------------------------------------------
@dataclass
class ModelRow:
    model: str
    load: float
    optimize: float
    onnxruntime: float
    ops_before: int
    ops_after: int

    @property
    def tilefold(self) -> float:
        return self.load + self.optimize


def onnxruntime_session_seconds(path: os.PathLike, repeat: int) -> float:
    """Median time to create an ORT_ENABLE_ALL session that also writes its optimized model."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        def create() -> Any:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
            options.log_severity_level = 3
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        return _median_seconds(create, repeat)[0]


def bench_model(name: str, *, repeat: int, target: str = "cpu", cache_dir: str | None = None) -> ModelRow:
    path = models.resnet50(cache_dir) if name == "resnet50" else models.bert(cache_dir)
    loads, optimizes, report = [], [], None
    for _ in range(repeat):  # load and optimize taking turns, each timed on its own
        start = time.perf_counter()
        graph = tilefold.load(path)
        middle = time.perf_counter()
        report = tilefold.optimize(graph, target).report
        loads.append(middle - start)
        optimizes.append(time.perf_counter() - middle)
    ort_seconds = onnxruntime_session_seconds(path, repeat)
    data = report.to_dict()
    return ModelRow(name, statistics.median(loads), statistics.median(optimizes), ort_seconds,
                    data["layout_ops_before"], data["layout_ops_after"])


def format_models(rows: Sequence[ModelRow]) -> str:
    head = (f"{'model':<10}{'load s':>9}{'optimize s':>12}{'tilefold s':>12}{'onnxrt s':>10}"
            f"{'/ onnxrt':>10}{'layout ops before -> after':>29}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.model:<10}{r.load:>9.2f}{r.optimize:>12.2f}{r.tilefold:>12.2f}{r.onnxruntime:>10.2f}"
                     f"{r.tilefold / r.onnxruntime:>9.2f}x{f'{r.ops_before} -> {r.ops_after}':>29}")
    return "\n".join(lines)


# ---- generated chains --------------------------------------------------------------------------
def _add(graph: Graph, op: str, inputs: Sequence[Value], **attrs: Any) -> Value:
    """A node with the registry's attribute defaults and inferred result type."""
    attrs = {**REGISTRY[op].defaults, **attrs}
    types = [graph.type_of(v) for v in inputs]
    outs = infer(op, attrs, types, [graph.constant_value(v) for v in inputs])
    return Value(graph.add_node(op, list(inputs), outs[:1], attrs).name)


def chain(kind: str, ops: int, *, residual: bool = False, seed: int = 0) -> Graph:
    """A chain of `ops` compute ops: blocks of anchor -> Relu -> Add -> Mul by a splat.

    conv: Conv 3x3 (8 channels, 8x8 image, bias); matmul: MatMul 64x64 on a (16, 64) batch.
    The Add adds a constant per-channel shift ((1, 8, 1, 1) or (1, 64)), or with `residual`
    the block's input, which then has two consumers (the anchor and the Add); the first block
    is never residual, like a network's stem, so that no residual reads the graph input.
    """
    rng = np.random.default_rng(seed)
    graph = Graph(f"{kind}-chain-{ops}")
    shape, shift = ((1, 8, 8, 8), (1, 8, 1, 1)) if kind == "conv" else ((16, 64), (1, 64))
    x = graph.add_input("x", TensorType(shape, np.float32))
    half = graph.add_constant(Splat(0.5, (), np.float32), name="half")
    for block in range(ops // 4):
        if kind == "conv":
            w = graph.add_constant(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), name="w")
            b = graph.add_constant(rng.standard_normal(8).astype(np.float32), name="b")
            y = _add(graph, "Conv", [x, w, b], pads=(1, 1, 1, 1))
        else:
            w = graph.add_constant(rng.standard_normal((64, 64)).astype(np.float32), name="w")
            y = _add(graph, "MatMul", [x, w])
        y = _add(graph, "Relu", [y])
        if residual and block > 0:
            other = x
        else:
            other = graph.add_constant(rng.standard_normal(shift).astype(np.float32), name="shift")
        y = _add(graph, "Add", [y, other])
        x = _add(graph, "Mul", [y, half])
    graph.add_output(x, "y")
    return graph


@dataclass
class ChainRow:
    chain: str
    target: str
    ops: int
    seconds: float
    ops_before: int
    ops_after: int

    @property
    def us_per_op(self) -> float:
        return 1e6 * self.seconds / self.ops


def bench_chain(name: str, ops: int, repeat: int) -> ChainRow:
    parts = name.split("-")
    kind, target = parts[0], parts[-1]
    graph = chain(kind, ops, residual="residual" in parts)
    seconds, optimized = _median_seconds(lambda: tilefold.optimize(graph, target), repeat)
    data = optimized.report.to_dict()
    return ChainRow(name, target, ops, seconds, data["layout_ops_before"], data["layout_ops_after"])


def format_chains(rows: Sequence[ChainRow]) -> str:
    head = f"{'chain':<20}{'ops':>8}{'optimize s':>12}{'us / op':>10}{'vs smallest':>13}{'layout ops before -> after':>29}"
    lines = [head, "-" * len(head)]
    for name in dict.fromkeys(r.chain for r in rows):
        group = [r for r in rows if r.chain == name]
        base = group[0].us_per_op
        for r in group:
            lines.append(f"{r.chain:<20}{r.ops:>8}{r.seconds:>12.3f}{r.us_per_op:>10.1f}{r.us_per_op / base:>12.2f}x"
                         f"{f'{r.ops_before} -> {r.ops_after}':>29}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.bench.optimize_time", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)} (or none)")
    parser.add_argument("--chains", default=",".join(CHAINS), help=f"comma-separated, from {', '.join(CHAINS)} (or none)")
    parser.add_argument("--sizes", default="1000,3000,10000", help="ops per generated chain")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median reported)")
    parser.add_argument("--cache-dir", default=None, help="where the exported models are cached")
    args = parser.parse_args(argv)

    names = [m for m in args.models.split(",") if m and m != "none"]
    chains = [c for c in args.chains.split(",") if c and c != "none"]
    for item, allowed in [(n, MODELS) for n in names] + [(c, CHAINS) for c in chains]:
        if item not in allowed:
            parser.error(f"unknown choice {item!r}; choose from {', '.join(allowed)}")
    print(f"cores: {os.cpu_count()}  median of {args.repeat} runs", flush=True)
    if names:
        rows = [bench_model(n, repeat=args.repeat, cache_dir=args.cache_dir) for n in names]
        print(format_models(rows))
        print()
    if chains:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        print(format_chains([bench_chain(c, n, args.repeat) for c in chains for n in sizes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
