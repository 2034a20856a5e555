"""Per-node CPU profile: each node's best time over several runs of the NumPy executor,
grouped by op and shape, with the GFLOP/s of Conv, MatMul and Gemm and the page faults per
run (a kernel whose temporaries fault on every run pays about 2 us a page here).

    python -m tilefold.bench.nodes [--model resnet50|bert|mobilenet_v2] [--graph plain|optimized] [--runs 8] [--top 30]

The sum of the best times is what a run would take if no node were ever disturbed: set
beside a whole run's median (bench/cpu_models.py), it separates slow kernels from noise.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

import tilefold
from tilefold.backends.numpy import NumpyExecutable

from . import cpu_models


@dataclass
class NodeTimes:
    best: dict[str, float] = field(default_factory=dict)  # seconds, each node's best run
    faults: dict[str, float] = field(default_factory=dict)  # minor page faults per run


def best_times(exe: NumpyExecutable, feeds: dict[str, np.ndarray], runs: int) -> NodeTimes:
    """Each node's best time over `runs` runs of the whole schedule, and its page faults."""
    out = NodeTimes()
    with np.errstate(all="ignore"):
        for _ in range(runs):
            buffers = exe._bind(feeds)
            for step in exe.steps:
                args = [buffers[i] if i >= 0 else None for i in step.ins]
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                result = exe._call(step, args)
                elapsed = time.perf_counter() - start
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                name = step.node.name
                out.best[name] = min(out.best.get(name, elapsed), elapsed)
                out.faults[name] = out.faults.get(name, 0.0) + faults / runs
                for index, array in zip(step.outs, result if len(step.outs) > 1 else (result,)):
                    if index >= 0:
                        buffers[index] = array
                for index in step.frees:
                    buffers[index] = None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.bench.nodes", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", choices=cpu_models.MODELS + cpu_models.EXTRA_MODELS)
    parser.add_argument("--graph", default="optimized", choices=["plain", "optimized"])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)

    case = cpu_models.case(args.model)
    graph = tilefold.load(case.path)
    if args.graph == "optimized":
        graph = tilefold.optimize(graph, "cpu").graph
    exe = NumpyExecutable(graph)
    exe(case.feeds)
    times = best_times(exe, case.feeds, args.runs)
    best = times.best
    groups: dict[tuple[str, str], list[float]] = {}
    for step in exe.steps:
        node = step.node
        shapes = [graph.type_of(v).shape for v in graph.inputs_of(node.name)[:2] if v is not None]
        key = (node.op, " ".join("x".join(map(str, s)) for s in shapes))
        group = groups.setdefault(key, [0, 0.0, 0.0, 0.0])
        group[0] += 1
        group[1] += best[node.name]
        group[2] += cpu_models.node_flops(graph, node)
        group[3] += times.faults[node.name]
    total = sum(best.values())
    print(f"{args.model} ({args.graph}): sum of each node's best of {args.runs} runs: {1e3 * total:.1f} ms")
    print(f"page faults per run: {sum(times.faults.values()):.0f}")
    print(f"{'op':<20}{'nodes':>6}{'ms':>9}{'share':>8}{'GFLOP/s':>9}{'faults':>8}  operand shapes")
    for (op, shapes), (count, seconds, flops, faults) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:args.top]:
        rate = f"{flops / seconds / 1e9:.0f}" if flops else "-"
        print(f"{op:<20}{count:>6}{1e3 * seconds:>9.2f}{100 * seconds / total:>7.1f}%{rate:>9}{faults:>8.0f}  {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
