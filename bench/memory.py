"""Memory: tilefold's planned peak against the plan without reuse and against the resident
memory that onnxruntime and tilefold's NumPy run actually add.

For each model: the arena of the memory plan (per device; buffers sized from their
encodings, padding included), its lower bound (the most bytes live at one step), the plan
without reuse (every buffer alive to the end), constants as stored (a splat is one element),
and, measured in fresh subprocesses, the peak resident memory (VmHWM, reset before each step)
added by loading (onnxruntime's session creation; tilefold's load, optimize and compile) and
by one run, for onnxruntime and for tilefold's NumPy run of the optimized graph. The light ResNet-50 from the onnx package holds splat weights: its stored
constants are a few bytes, so its footprint must stay near its activations.

    python -m tilefold.bench.memory [--models light-resnet50,resnet50,bert] [--target cpu]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Sequence

import onnx
from rich.console import Console
from rich.table import Table

import tilefold
from tilefold.backends.plan import plan_memory

from . import models
from .light import light_path

MODELS = ("light-resnet50", "resnet50", "bert")

_RSS_SCRIPT = r"""
import json, sys
import numpy as np
which, name, path, target = sys.argv[1:5]
import onnx, onnxruntime, tilefold
from tilefold.bench import models
rng = np.random.default_rng(0)
feeds = models.bert_inputs(rng) if name == "bert" else models.random_inputs(onnx.load(path), rng)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
def peak_added(fn):
    open("/proc/self/clear_refs", "w").write("5")  # resets VmHWM, the peak resident size
    before = status("VmRSS")
    result = fn()
    return result, status("VmHWM") - before
if which == "onnxruntime":
    options = onnxruntime.SessionOptions(); options.intra_op_num_threads = 2
    run, load = peak_added(lambda: onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run)
    _, once = peak_added(lambda: run(None, feeds))
else:
    run, load = peak_added(lambda: tilefold.compile(tilefold.optimize(path, target).graph))
    _, once = peak_added(lambda: run(feeds))
print(json.dumps([load, once]))
"""


def _path(name: str) -> str:
    if name == "light-resnet50":
        return str(light_path("resnet50"))
    return str({"resnet50": models.resnet50, "bert": models.bert}[name]())


def _rss(which: str, name: str, path: str, target: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, which, name, path, target],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--target", default="cpu")
    args = parser.parse_args(argv)
    console = Console(width=160)
    table = Table(title=f"memory, MiB (target {args.target})", title_justify="left")
    for column in ("model", "arena", "live peak", "no reuse", "arena/no reuse", "padding", "constants",
                   "ort load", "tilefold load", "ort run", "tilefold run", "tilefold/ort (load+run)"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name in args.models.split(","):
        path = _path(name)
        graph = tilefold.optimize(tilefold.load(onnx.load(path)), args.target).graph
        plan = plan_memory(graph)
        host = plan.devices["cpu"]
        (ort_load, ort_run), (tf_load, tf_run) = (_rss(which, name, path, args.target)
                                                  for which in ("onnxruntime", "tilefold"))
        table.add_row(name, _mib(host.arena_bytes), _mib(host.peak_live_bytes), _mib(host.naive_bytes),
                      f"{host.arena_bytes / host.naive_bytes:.2f}", _mib(host.padding_bytes),
                      _mib(host.constant_bytes), _mib(ort_load), _mib(tf_load), _mib(ort_run), _mib(tf_run),
                      f"{(tf_load + tf_run) / (ort_load + ort_run):.2f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
