"""Optional autotuning: time a few launch configurations per kernel on real inputs and write
the fastest back onto the graph's nodes (`node.launch`), where it stays as data.

Candidates are derived from the defaults (halved and doubled blocks, other warps and stages);
each is verified (launch.check) before it is timed, so a tuned graph always verifies. Timings
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
from .launch import check, defaults

MATMUL_KINDS = ("matmul", "conv")


def candidates(base: dict[str, Any], kind: str, limit: int = 12) -> list[dict[str, Any]]:
    """Configurations near `base`: blocks x1/2 and x2, warps 4/8, stages 2..4 (matmul, conv);
    BLOCK x1/2..x4 and warps 2..8 for the others."""
    if kind in MATMUL_KINDS:
        blocks = [[base[k] // 2, base[k], base[k] * 2] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")]
        options = itertools.product(*blocks, (4, 8), (2, 3, 4))
        found = [{**base, "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": s}
                 for m, n, k, w, s in options]
    else:
        found = [{**base, "BLOCK": b, "num_warps": w}
                 for b, w in itertools.product((base["BLOCK"], base["BLOCK"] * 2, base["BLOCK"] * 4,
                                                max(1, base["BLOCK"] // 2)), (2, 4, 8))]
    found.sort(key=lambda c: c != base)
    unique = []
    for c in found:
        if c not in unique:
            unique.append(c)
    return unique[:limit]


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
        for cfg in candidates(defaults(graph, group) | (group.anchor.launch or {}), group.kind, limit):
            try:
                check(graph, group, cfg)
            except VerifyError:
                continue
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
