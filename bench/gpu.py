"""The Triton backend on a GPU against PyTorch, in one process, as ratios (above 1: tilefold
is faster).

1. Templates on the same shapes as their PyTorch peers (cuBLAS, cuDNN, torch's softmax and
   layer norm): matmul with the weight packed in the gpu target's 16x16 tiles, row-major
   (K, N), and row-major transposed (N, K) read through Gemm transB: whether packing the
   weight pays is measured here, not assumed; conv on NCHWc16 vs cuDNN; softmax and layer norm.
2. End to end: ResNet-50 and BERT-base (bench/models.py exports), optimized for the gpu target
   and run by `TritonExecutable(device="cuda")`, against eager PyTorch and `torch.compile`
   (inductor) on the same inputs; outputs copied to the host on both sides.

Float32 matmuls use IEEE precision on both sides (TF32 off) unless --tf32.

    python -m tilefold.bench.gpu [--skip-models] [--tf32] [--repeat 20]

Runs only where CUDA is present; elsewhere it prints one line and exits with status 0
(`--device interp` runs the template part on tiny shapes under the interpreter, to check it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

MATMUL_SHAPES = ((4096, 4096, 4096), (2048, 1024, 4096), (128 * 8, 768, 3072), (128, 768, 768))
CONV_SHAPES = ((8, 64, 56, 56, 64, 3, 1), (8, 256, 56, 56, 64, 1, 1), (8, 128, 28, 28, 128, 3, 1),
               (8, 512, 7, 7, 512, 3, 1))
"""(batch, C, H, W, F, kernel, stride)."""
ROW_SHAPES = ((4096, 768), (8 * 12 * 128, 128), (1024, 4096))
SMOKE = {"matmul": ((20, 33, 18),), "conv": ((1, 5, 6, 6, 7, 3, 1),), "rows": ((9, 30),)}
"""Tiny shapes for `--device interp`: checks the script runs without a GPU (times mean nothing)."""


def _time(fn: Callable[[], Any], repeat: int) -> float:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _tf32(graph: Any) -> Any:
    from tilefold.backends.triton import set_launch

    for op in ("MatMul", "Gemm", "Conv"):
        if any(n.op == op for n in graph.nodes()):
            set_launch(graph, op, input_precision="tf32")
    return graph


def _one_node(op: str, inputs: list[tuple[str, np.ndarray, bool]], attrs: dict, target: str | None):
    """A one-node Graph (constants where the flag says so), optimized for `target` if given."""
    import tilefold
    from tilefold.graph import Graph
    from tilefold.graph.registry import infer, with_defaults
    from tilefold.graph.types import TensorType

    g = Graph(op)
    values, types = [], []
    for name, array, const in inputs:
        v = g.add_constant(array, name=name) if const else g.add_input(name, TensorType(array.shape, array.dtype))
        values.append(v)
        types.append(TensorType(array.shape, array.dtype))
    full = with_defaults(op, attrs)
    node = g.add_node(op, values, infer(op, full, types, [a if c else None for _, a, c in inputs]), full)
    g.add_output(type(values[0])(node.name), "y")
    return tilefold.optimize(g, target).graph if target else g


def _kernels(graph: Any, feeds: dict[str, Any], tf32: bool, device: str) -> Callable[[], Any]:
    """A function launching the graph's generated kernels alone, on device buffers from one
    run (no input checks, no copies to the host): what a template costs."""
    from tilefold.backends.triton import TritonExecutable

    exe = TritonExecutable(_tf32(graph) if tf32 else graph, device=device)
    buffers: dict = {}
    exe.run(feeds, keep=buffers)
    launches = [(step, [buffers[v] for v in step.ins]) for step in exe.steps if step.plan is not None]
    return lambda: [step.run(args) for step, args in launches]


def _row(name: str, ours: float, peer: float, peer_name: str) -> None:
    print(f"{name:<58} tilefold {ours * 1e3:9.3f} ms   {peer_name} {peer * 1e3:9.3f} ms   ratio {peer / ours:5.2f}x")


def bench_templates(repeat: int, tf32: bool, device: str = "cuda") -> None:
    import torch

    rng = np.random.default_rng(0)
    dev = torch.device("cpu" if device == "interp" else device)
    smoke = device == "interp"
    print("== templates (ratio = peer time / tilefold time) ==")
    for m, k, n in SMOKE["matmul"] if smoke else MATMUL_SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        a_dev = torch.from_numpy(a).to(dev)
        w_dev = torch.from_numpy(w).to(dev)
        peer = _time(lambda: torch.matmul(a_dev, w_dev), repeat)
        variants = {
            "packed 16x16 weight": _one_node("MatMul", [("a", a, False), ("w", w, True)], {}, "gpu"),
            "row-major (K, N) weight": _one_node("MatMul", [("a", a, False), ("w", w, True)], {}, None),
            "row-major transposed (N, K) weight": _one_node(
                "Gemm", [("a", a, False), ("w", np.ascontiguousarray(w.T), True)], {"transB": 1}, None),
        }
        for label, graph in variants.items():
            _row(f"matmul {m}x{k}x{n} {label}", _time(_kernels(graph, {"a": a_dev}, tf32, device), repeat), peer, "cuBLAS")
    for batch, c, h, wd, f, k, s in SMOKE["conv"] if smoke else CONV_SHAPES:
        x = rng.standard_normal((batch, c, h, wd)).astype(np.float32)
        w = (rng.standard_normal((f, c, k, k)) * 0.05).astype(np.float32)
        attrs = {"strides": (s, s), "pads": (k // 2,) * 4}
        graph = _one_node("Conv", [("x", x, False), ("w", w, True)], attrs, "gpu")
        x_dev, w_dev = torch.from_numpy(x).to(dev), torch.from_numpy(w).to(dev)
        peer = _time(lambda: torch.nn.functional.conv2d(x_dev, w_dev, stride=s, padding=k // 2), repeat)
        _row(f"conv {batch}x{c}x{h}x{wd} -> {f} k{k} s{s} (incl. NCHWc16 pack/unpack)",
             _time(_kernels(graph, {"x": x_dev}, tf32, device), repeat), peer, "cuDNN")
    for rows, cols in SMOKE["rows"] if smoke else ROW_SHAPES:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        x_dev = torch.from_numpy(x).to(dev)
        softmax = _kernels(_one_node("Softmax", [("x", x, False)], {"axis": -1}, None), {"x": x_dev}, tf32, device)
        _row(f"softmax {rows}x{cols}", _time(softmax, repeat), _time(lambda: torch.softmax(x_dev, -1), repeat), "torch")
        gamma = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        beta = rng.standard_normal(cols).astype(np.float32)
        norm = _kernels(_one_node("LayerNormalization", [("x", x, False), ("g", gamma, True), ("b", beta, True)],
                                  {"axis": -1}, None), {"x": x_dev}, tf32, device)
        g_dev, b_dev = torch.from_numpy(gamma).to(dev), torch.from_numpy(beta).to(dev)
        _row(f"layer norm {rows}x{cols}", _time(norm, repeat),
             _time(lambda: torch.nn.functional.layer_norm(x_dev, (cols,), g_dev, b_dev), repeat), "torch")


def bench_models(repeat: int, tf32: bool) -> None:
    import torch

    import tilefold
    from tilefold.backends.triton import TritonExecutable

    from . import models

    print("== end to end (ratio = peer time / tilefold time) ==")
    rng = np.random.default_rng(1)
    cases = [("resnet50", models.resnet50, models.resnet50_torch, models.resnet50_inputs(rng)),
             ("bert", models.bert, models.bert_torch, models.bert_inputs(rng))]
    for name, export, build, feeds in cases:
        graph = tilefold.optimize(export(), "gpu").graph
        exe = TritonExecutable(_tf32(graph) if tf32 else graph, device="cuda")
        dev_feeds = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        ours = _time(lambda: exe(dev_feeds), repeat)
        module = build().cuda()

        def eager(fn: Any = module) -> Any:
            with torch.no_grad():
                out = fn(**dev_feeds)
            return out[0].cpu()

        _row(f"{name} (optimized for gpu)", ours, _time(eager, repeat), "eager")
        compiled = torch.compile(module)
        _row(f"{name} (optimized for gpu)", ours, _time(lambda: eager(compiled), repeat), "inductor")
        print(f"  {len(exe.steps)} steps, NumPy fallback nodes: {len(exe.fallback_nodes)}, "
              f"transfers per run: {exe.transfers // (repeat + 1)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--tf32", action="store_true", help="let both sides use TF32 for float32 matmuls")
    parser.add_argument("--device", default="cuda", choices=("cuda", "interp"),
                        help="interp: tiny shapes under Triton's interpreter, to check the script (no timing value)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench/gpu.py: torch is not installed; nothing measured")
        return 0
    if args.device == "interp":
        print("device: Triton interpreter on the CPU (smoke run: tiny shapes, times mean nothing)")
        bench_templates(1, args.tf32, "interp")
        return 0
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA GPU on this machine; nothing measured (the Triton tests run on 'interp')")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    print(f"device: {torch.cuda.get_device_name()}, float32, TF32 {'on' if args.tf32 else 'off'}")
    bench_templates(args.repeat, args.tf32)
    if not args.skip_models:
        bench_models(args.repeat, args.tf32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
