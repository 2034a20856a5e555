"""onnxruntime on tilefold's optimized ONNX files against onnxruntime on the originals.

ResNet-50 (batch 1, 224x224) and BERT-base (seq 128) from transformers, random weights. Each
model is optimized for each target and written with `tilefold.save` in each ONNX form (logical:
ops on logical values; packed: ops on packed buffers); onnxruntime (CPU, 2
intra-op threads, sequential, one process) runs the original and every written file on the
same inputs, taking turns after a warm-up, and the median of N runs is printed with the ratio
optimized/original (above 1: the optimized file is slower), the session creation time (where
onnxruntime folds the unpacking of packed weights) and the largest output difference.

    python -m tilefold.bench.onnx_out [--models resnet50,bert] [--targets cpu,gpu] [--forms logical,packed]

Absolute times drift on shared machines; compare the ratios, measured side by side.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import tilefold

from . import models

MODELS: dict[str, tuple[Callable[[], Path], Callable[[np.random.Generator], dict[str, np.ndarray]]]] = {
    "resnet50": (models.resnet50, models.resnet50_inputs),
    "bert": (models.bert, models.bert_inputs),
}


@dataclass
class Row:
    model: str
    file: str
    session_seconds: float
    seconds: list[float]
    max_abs_diff: float
    onnx_nodes: int

    @property
    def ms(self) -> float:
        return 1e3 * statistics.median(self.seconds)


def session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(name: str, targets: Sequence[str], repeat: int, warmup: int, threads: int, folder: Path,
            forms: Sequence[str] = ("logical", "packed")) -> list[Row]:
    """Rows for the original and each target's optimized file, timed in turns."""
    import onnx

    make_path, make_inputs = MODELS[name]
    source = make_path()
    feeds = make_inputs(np.random.default_rng(0))
    files = {"original": source}
    graph = tilefold.load(source)
    for target in targets:
        optimized = tilefold.optimize(graph, target)
        for form in forms:
            out = folder / f"{name}.{target}.{form}.onnx"
            tilefold.save(optimized, out, form=form)
            files[f"{target} {form}"] = out
    sessions, created = {}, {}
    for label, path in files.items():
        start = time.perf_counter()
        sessions[label] = session(path, threads)
        created[label] = time.perf_counter() - start
    outputs = {label: s.run(None, feeds) for label, s in sessions.items()}
    for _ in range(warmup):
        for s in sessions.values():
            s.run(None, feeds)
    times: dict[str, list[float]] = {label: [] for label in files}
    for _ in range(repeat):
        for label, s in sessions.items():
            start = time.perf_counter()
            s.run(None, feeds)
            times[label].append(time.perf_counter() - start)
    reference = outputs["original"]
    rows = []
    for label, path in files.items():
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs[label], reference))
        nodes = len(onnx.load(path, load_external_data=False).graph.node)
        rows.append(Row(name, label, created[label], times[label], diff, nodes))
    return rows


def table(rows: list[Row], threads: int) -> Any:
    from rich.table import Table

    base = {r.model: r.ms for r in rows if r.file == "original"}
    t = Table("model", "file", "ONNX nodes", "session (s)", "median ms", "ratio to original", "max |diff|",
              title=f"onnxruntime CPU, {threads} threads: optimized files against the originals")
    for r in rows:
        t.add_row(r.model, r.file, str(r.onnx_nodes), f"{r.session_seconds:.2f}", f"{r.ms:.2f}",
                  f"{r.ms / base[r.model]:.3f}", f"{r.max_abs_diff:.2e}")
    return t


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.bench.onnx_out", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--targets", default="cpu,gpu")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--forms", default="logical,packed", help="ONNX forms to write (auto, logical, packed)")
    args = parser.parse_args(argv)
    from rich.console import Console

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tilefold-onnx-out-") as folder:
        for name in args.models.split(","):
            rows += measure(name, args.targets.split(","), args.repeat, args.warmup, args.threads, Path(folder),
                            args.forms.split(","))
    Console().print(table(rows, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
