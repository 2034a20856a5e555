"""CPU benchmark of the torch.compile path: backend="tilefold" against eager PyTorch and
torch.compile with inductor, one process, ResNet-50 (batch 1, 224x224) and BERT-base (seq 128).

    python -m tilefold.bench.torch_cpu [--models resnet50,bert] [--repeat 10] [--threads 2]

Compile time is the first call (Dynamo tracing, aot_autograd, conversion, layout
optimization, kernel building) minus one steady-state call. After a warm-up the runners take
turns, so that load drift on a shared machine hits them alike, each call after an idle gap
(OpenBLAS threads, which tilefold's NumPy kernels use, spin for a while after a call and
would otherwise slow whichever runner comes next: eager measured 124-169 ms without the gap,
against 74 ms alone); the median is reported with the ratio to eager PyTorch (below 1: faster
than eager) and the largest difference from eager.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from . import models
from .cpu_models import time_interleaved

MODELS = ("resnet50", "bert")
RUNNERS = ("eager", "inductor", "tilefold")


def model_case(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], Callable[[Any], torch.Tensor]]:
    rng = np.random.default_rng(0)
    if name == "resnet50":
        feeds = models.resnet50_inputs(rng)
        return models.resnet50_torch(), (torch.from_numpy(feeds[models.RESNET_INPUT]),), lambda o: o.logits
    if name == "bert":
        feeds = models.bert_inputs(rng)
        args = tuple(torch.from_numpy(feeds[k]) for k in models.BERT_INPUTS)
        return models.bert_torch(), args, lambda o: o.last_hidden_state
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def bench_model(name: str, runners: Sequence[str], repeat: int, warmup: int, gap: float) -> list[dict[str, Any]]:
    model, args, first = model_case(name)
    functions = {"eager": model}
    for runner in runners:
        if runner != "eager":
            functions[runner] = torch.compile(model, backend=runner)
    rows: dict[str, dict[str, Any]] = {}
    with torch.no_grad():
        reference = first(model(*args))
        for runner in runners:
            fn = functions[runner]
            start = time.perf_counter()
            out = first(fn(*args))
            first_call = time.perf_counter() - start
            start = time.perf_counter()
            fn(*args)
            steady = time.perf_counter() - start
            error = float((out - reference).abs().max() / reference.abs().max())
            rows[runner] = {"model": name, "runner": runner, "compile_s": max(first_call - steady, 0.0),
                            "seconds": [], "error": error}
            for _ in range(warmup):
                fn(*args)
        times = time_interleaved({r: functools.partial(functions[r], *args) for r in runners},
                                 repeat=repeat, gap=gap)
        for runner, seconds in times.items():
            rows[runner]["seconds"] = seconds
    eager_ms = 1e3 * statistics.median(rows["eager"]["seconds"]) if "eager" in rows else None
    for row in rows.values():
        row["ms"] = 1e3 * statistics.median(row["seconds"])
        row["vs_eager"] = row["ms"] / eager_ms if eager_ms else None
    return list(rows.values())


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'model':<10} {'runner':<10} {'median ms':>10} {'/ eager':>8} {'compile s':>10} {'max err':>9}"]
    for r in rows:
        ratio = f"{r['vs_eager']:.3f}" if r["vs_eager"] is not None else "-"
        compile_s = "-" if r["runner"] == "eager" else f"{r['compile_s']:.2f}"
        lines.append(f"{r['model']:<10} {r['runner']:<10} {r['ms']:>10.1f} {ratio:>8} {compile_s:>10} "
                     f"{r['error']:>9.1e}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.bench.torch_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--runners", default=",".join(RUNNERS), help=f"from {', '.join(RUNNERS)} (eager first)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per runner (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--gap", type=float, default=0.1, help="idle seconds before each timed call")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runners = [r for r in args.runners.split(",") if r]
    print(f"cores: {os.cpu_count()}  torch threads: {args.threads}  median of {args.repeat} runs after "
          f"{args.warmup} warm-up  (numpy's BLAS threads: its own setting, e.g. OPENBLAS_NUM_THREADS)", flush=True)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows += bench_model(name, runners, args.repeat, args.warmup, args.gap)
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
