"""Optional autotuning: time a few launch configurations per kernel on real inputs and write
the fastest back onto the graph's nodes (`node.launch`), where it stays as data.

Candidates are the kernel's current configuration (defaults and any user setting) and its
neighbours (halved and doubled blocks, other warps and stages), nearest first, so a small
`limit` still tries the current one and single changes to it. Each is verified (launch.check)
before it is timed, so a tuned graph always verifies. Timings
use the kernel alone, on the buffers of one run of the whole graph. Under the interpreter the
timings mean nothing (the mechanism is what the tests check); on a GPU each candidate runs
`repeats` times after one warm-up launch, synchronized.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Mapping

from ...graph.errors import VerifyError
from ...graph.graph import Graph
from .executor import TritonExecutable
from .launch import DOT_KINDS, check, defaults


def candidates(base: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Configurations near `base`, nearest first: `base` itself, then those that change one
    setting, then two, and so on. Blocks x1/2 and x2, warps 4/8, stages 2..4 (matmul, conv,
    attention: the blocks of its rows and columns, not its head dims); BLOCK x1/2..x4 and warps
    2..8 for the others. Not yet checked against the kernel."""
    if kind in DOT_KINDS:
        axes: dict[str, tuple[Any, ...]] = {k: (base[k] // 2, base[k], base[k] * 2)
                                            for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in base}
        axes |= {"num_warps": (4, 8), "num_stages": (2, 3, 4)}
    else:
        axes = {"BLOCK": (max(1, base["BLOCK"] // 2), base["BLOCK"], base["BLOCK"] * 2, base["BLOCK"] * 4),
                "num_warps": (2, 4, 8)}
    found = [base] + [{**base, **dict(zip(axes, values))} for values in itertools.product(*axes.values())]
    found.sort(key=lambda c: sum(c[k] != base.get(k) for k in axes))  # stable: base stays first
    unique: list[dict[str, Any]] = []
    for c in found:
        if c not in unique:
            unique.append(c)
    return unique


def _valid(graph: Graph, group: Any, configs: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The first `limit` configurations the kernel accepts (launch.check)."""
    valid = []
    for cfg in configs:
        try:
            check(graph, group, cfg)
        except VerifyError:
            continue
        valid.append(cfg)
        if len(valid) == limit:
            break
    return valid


def autotune(graph: Graph, feeds: Mapping[str, Any], *, device: str = "cuda", repeats: int = 10,
             limit: int = 12) -> dict[str, dict[str, Any]]:
    """Tune every generated kernel of `graph` on `feeds`; writes the winners onto the nodes
    and returns them by node name."""
    import torch

    exe = TritonExecutable(graph, device=device)
    buffers: dict = {}
    exe.run(feeds, keep=buffers)
    chosen: dict[str, dict[str, Any]] = {}
    for step in exe.steps:
        if step.plan is None:
            continue
        group = step.group
        args = [buffers[v] for v in step.ins]
        best: tuple[float, dict[str, Any]] | None = None
        base = defaults(graph, group) | (group.anchor.launch or {})
        for cfg in _valid(graph, group, candidates(base, group.kind), limit):
            step.run(args, cfg)  # warm-up (and compile)
            if exe.kind == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats if exe.kind == "cuda" else 1):
                step.run(args, cfg)
            if exe.kind == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            if best is None or seconds < best[0]:
                best = (seconds, cfg)
        if best is not None:
            group.anchor.launch = dict(best[1])
            chosen[group.anchor.name] = dict(best[1])
    return chosen
