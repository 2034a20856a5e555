"""Optimization time: `tilefold.load` + `tilefold.optimize` against onnxruntime's session
creation, and propagation's scaling with graph size.

1. ResNet-50 and BERT-base (bench/models.py, cached exports): the median time of
   `tilefold.load` (read, check, convert, infer shapes, build the Graph, simplify) plus
   `tilefold.optimize` (materialize, propagate, fold: every weight packed into its target
   layout, report) against `onnxruntime.InferenceSession` creation with ORT_ENABLE_ALL and
   `optimized_model_filepath` set (it reads, optimizes and writes the model), as a ratio
   (below 1: tilefold is faster), with the spread of the per-run ratios. The two take turns,
   run by run, after one untimed warm-up run each (its times are printed too: tilefold's
   includes its lazy imports); what each run made is freed outside the timed part. This
   process never imports torch: a child process finds (or exports) the models, so that, as
   for `tilefold optimize`, no torch and transformers objects (200,000 of them) burden
   Python's garbage collector while tilefold runs. tilefold writes no file here;
   onnxruntime's time includes writing its optimized model.
2. Generated chains of 1,000 / 3,000 / 10,000 ops built directly as Graphs (blocks of an
   anchor and three elementwise ops; `residual`: the block's input also feeds its Add):
   `tilefold.optimize` time per op, which stays flat when propagation is linear in the
   graph's size, and the runtime layout ops before and after.

    python -m tilefold.bench.optimize_time [--models resnet50,bert] [--sizes 1000,3000,10000]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

import tilefold
from tilefold.graph import Graph, Splat, TensorType, Value
from tilefold.graph.registry import REGISTRY, infer

MODELS = ("resnet50", "bert")
CHAINS = ("conv-cpu", "conv-residual-cpu", "matmul-gpu")


# ---- models ----------------------------------------------------------------------------------
@dataclass
class ModelRow:
    model: str
    load: float  # medians, seconds
    optimize: float
    onnxruntime: float
    ops_before: int
    ops_after: int
    ratios: tuple[float, ...] = ()  # tilefold / onnxruntime, run by run
    first_tilefold: float = float("nan")  # the warm-up runs
    first_onnxruntime: float = float("nan")

    @property
    def tilefold(self) -> float:
        return self.load + self.optimize


def model_paths(names: Sequence[str], cache_dir: str | None = None) -> dict[str, str]:
    """The cached exports of `names` (made on first use), found by a child process: the export
    and the cache's file name need torch and transformers, which the timing process keeps out."""
    code = ("import sys; from tilefold.bench import models\n"
            "for name in sys.argv[2:]: print(getattr(models, name)(sys.argv[1] or None))")
    run = subprocess.run([sys.executable, "-c", code, cache_dir or "", *names], capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"finding the models {', '.join(names)} failed:\n{run.stderr}")
    return dict(zip(names, run.stdout.splitlines()[-len(names):]))


def onnxruntime_session(path: os.PathLike | str, out_dir: str) -> Any:
    """An ORT_ENABLE_ALL session that also writes its optimized model into `out_dir`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = os.path.join(out_dir, "optimized.onnx")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def bench_model(name: str, path: os.PathLike | str, *, repeat: int, target: str = "cpu") -> ModelRow:
    """tilefold (load, then optimize, each timed) and onnxruntime's session, taking turns."""
    loads, optimizes, sessions, report = [], [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        first: list[float] = []
        for run in range(repeat + 1):  # run 0 warms up
            start = time.perf_counter()
            graph = tilefold.load(path)
            middle = time.perf_counter()
            optimized = tilefold.optimize(graph, target)
            end = time.perf_counter()
            report = optimized.report
            del graph, optimized  # freed outside the timed part, as the session below
            session = onnxruntime_session(path, tmp)
            done = time.perf_counter()
            del session
            if run == 0:
                first = [end - start, done - end]
                continue
            loads.append(middle - start)
            optimizes.append(end - middle)
            sessions.append(done - end)
    data = report.to_dict()
    ratios = tuple((l + o) / s for l, o, s in zip(loads, optimizes, sessions))
    return ModelRow(name, statistics.median(loads), statistics.median(optimizes), statistics.median(sessions),
                    data["layout_ops_before"], data["layout_ops_after"], ratios, *first)


def format_models(rows: Sequence[ModelRow]) -> str:
    head = (f"{'model':<10}{'load s':>9}{'optimize s':>12}{'tilefold s':>12}{'onnxrt s':>10}"
            f"{'/ onnxrt':>10}{'runs: min-max':>15}{'layout ops before -> after':>29}")
    lines = [head, "-" * len(head)]
    for r in rows:
        spread = f"{min(r.ratios):.2f}-{max(r.ratios):.2f}x" if r.ratios else "-"
        lines.append(f"{r.model:<10}{r.load:>9.2f}{r.optimize:>12.2f}{r.tilefold:>12.2f}{r.onnxruntime:>10.2f}"
                     f"{r.tilefold / r.onnxruntime:>9.2f}x{spread:>15}{f'{r.ops_before} -> {r.ops_after}':>29}")
    firsts = ", ".join(f"{r.model} {r.first_tilefold:.2f} s against {r.first_onnxruntime:.2f} s" for r in rows)
    lines += [
        "",
        "tilefold: tilefold.load (read, check, convert to opset 21, infer shapes, build, simplify) + tilefold.optimize",
        "(materialize, propagate, every weight packed into its target layout, report); no file written.",
        "onnxruntime: InferenceSession creation, ORT_ENABLE_ALL, writing its optimized model (optimized_model_filepath).",
        f"Both in this process ({'torch not imported' if 'torch' not in sys.modules else 'TORCH IMPORTED'});"
        " imports excluded; medians of the runs",
        f"after one warm-up run each; warm-up runs (tilefold's with its lazy imports): {firsts}.",
    ]
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
    gc_seconds: float = 0.0  # of `seconds`, in Python's cyclic garbage collector

    @property
    def us_per_op(self) -> float:
        return 1e6 * self.seconds / self.ops

    @property
    def gc_us_per_op(self) -> float:
        return 1e6 * self.gc_seconds / self.ops


class GcClock:
    """Seconds Python's cyclic garbage collector ran while the block ran (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._tick)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._tick)


def bench_chain(name: str, ops: int, repeat: int) -> ChainRow:
    parts = name.split("-")
    kind, target = parts[0], parts[-1]
    graph = chain(kind, ops, residual="residual" in parts)
    runs = []
    for _ in range(repeat):
        with GcClock() as clock:
            start = time.perf_counter()
            optimized = tilefold.optimize(graph, target)
            runs.append((time.perf_counter() - start, clock.seconds))
    seconds, gc_seconds = sorted(runs)[(len(runs) - 1) // 2]  # the median run
    data = optimized.report.to_dict()
    return ChainRow(name, target, ops, seconds, data["layout_ops_before"], data["layout_ops_after"], gc_seconds)


def format_chains(rows: Sequence[ChainRow]) -> str:
    head = (f"{'chain':<20}{'ops':>8}{'optimize s':>12}{'us / op':>10}{'vs smallest':>13}{'gc us / op':>12}"
            f"{'rest us / op':>14}{'layout ops before -> after':>29}")
    lines = [head, "-" * len(head)]
    for name in dict.fromkeys(r.chain for r in rows):
        group = [r for r in rows if r.chain == name]
        base = group[0].us_per_op
        for r in group:
            lines.append(f"{r.chain:<20}{r.ops:>8}{r.seconds:>12.3f}{r.us_per_op:>10.1f}{r.us_per_op / base:>12.2f}x"
                         f"{r.gc_us_per_op:>12.1f}{r.us_per_op - r.gc_us_per_op:>14.1f}"
                         f"{f'{r.ops_before} -> {r.ops_after}':>29}")
    lines += ["", "gc: time in Python's cyclic garbage collector during optimize (gc.callbacks); its full collections",
              "rescan every live object, the input graph's and the two new graphs' included, so its share per op grows",
              "until the heap dwarfs what was alive before;",
              "rest: everything else (materialize, propagate, fold, report)."]
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
        paths = model_paths(names, args.cache_dir)
        rows = [bench_model(n, paths[n], repeat=args.repeat) for n in names]
        print(format_models(rows))
        print()
    if chains:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        print(format_chains([bench_chain(c, n, args.repeat) for c in chains for n in sizes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
