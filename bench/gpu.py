"""The Triton backend on a GPU against PyTorch, in one process, as ratios (above 1: tilefold
is faster).

1. Templates on the same shapes as their PyTorch peers (cuBLAS, cuDNN, torch's softmax and
   layer norm): matmul with the weight packed in the gpu target's 16x16 tiles, row-major
   (K, N), and row-major transposed (N, K) read through Gemm transB: whether packing the
   weight pays is measured here, not assumed; conv on NCHWc16 vs cuDNN; softmax and layer norm;
   attention (Q K^T scaled, softmax, times V: one flash-attention kernel) against torch's
   scaled_dot_product_attention.
2. End to end: ResNet-50 and BERT-base (bench/models.py exports), optimized for the gpu target
   and run by `TritonExecutable(device="cuda")`, against eager PyTorch and `torch.compile`
   (inductor) on the same inputs; outputs copied to the host on both sides. Also printed: the
   compile times, the largest error against eager, the GPU's busy time in one run, and the
   run launched step by step from Python (`replay=False`) beside the default, which replays
   each later run as one CUDA graph (backends/triton/replay.py): what launching costs.

bench/ablate.py measures, end to end, the same weights row-major against tiled, and each of
the fusions that are bets (a matmul's norm prologue, flash attention, SwiGLU's paired parts).

`--tune N` also autotunes the packed matmul and the conv (backends/triton/autotune.py, up to N
launch configurations each, nearest the defaults first) and prints the tuned row with the
configuration it chose: whether tuning closes the gap to cuBLAS is measured, not assumed.

Float32 matmuls use IEEE precision on both sides (TF32 off) unless --tf32. `--dtype float16`
or `bfloat16` runs the templates on operands of that type (tilefold accumulates in float32,
as cuBLAS does); the ONNX models stay float32. `--torch-compile` adds ResNet-50 and BERT-base
as PyTorch modules in `--dtype` through `torch.compile(backend="tilefold", options={"device":
"cuda"})` against eager PyTorch in the same type.

    python -m tilefold.bench.gpu [--skip-templates] [--skip-models] [--skip-inductor] [--tf32]
                                 [--dtype float32|float16|bfloat16] [--torch-compile] [--tune N]
                                 [--repeat 20]

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
ATTENTION_SHAPES = ((1, 12, 128, 64), (8, 12, 128, 64), (1, 12, 1024, 64), (2, 16, 2048, 128))
"""(batch, heads, sequence, head dim): BERT-base at batch 1 and 8, longer sequences."""
SMOKE = {"matmul": ((20, 33, 18),), "conv": ((1, 5, 6, 6, 7, 3, 1),), "rows": ((9, 30),),
         "attention": ((1, 2, 20, 24),)}
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
    """`graph` with TF32 products: on the anchor of each kernel with a tl.dot (a node fused into
    another's kernel takes no configuration of its own)."""
    from tilefold.backends.triton import set_launch
    from tilefold.backends.triton.launch import DOT_KINDS, kernel_groups

    for group in kernel_groups(graph):
        if group.kind in DOT_KINDS:
            set_launch(graph, group.anchor, input_precision="tf32")
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


def _attention_graph(q: np.ndarray, kt: np.ndarray, v: np.ndarray) -> Any:
    """softmax(Q K^T / sqrt(d)) V on inputs q, kt (K transposed), v: the attention template's
    run of three groups, which it runs as one kernel."""
    from tilefold.graph import Graph
    from tilefold.graph.registry import infer, with_defaults
    from tilefold.graph.types import TensorType, Value

    g = Graph("attention")
    values = {name: g.add_input(name, TensorType(a.shape, a.dtype)) for name, a in (("q", q), ("kt", kt), ("v", v))}
    scale = g.add_constant(np.array(1 / np.sqrt(q.shape[-1])).astype(q.dtype), name="scale")

    def add(op: str, inputs: list[Any], **attrs: Any) -> Any:
        full = with_defaults(op, attrs)
        types = [g.type_of(x) for x in inputs]
        return Value(g.add_node(op, inputs, infer(op, full, types, [g.constant_value(x) for x in inputs]), full).name)

    scores = add("Mul", [add("MatMul", [values["q"], values["kt"]]), scale])
    g.add_output(add("MatMul", [add("Softmax", [scores], axis=-1), values["v"]]), "y")
    return g


def _kernels(graph: Any, feeds: dict[str, Any], tf32: bool, device: str) -> Callable[[], Any]:
    """A function launching the graph's generated kernels alone, on device buffers from one
    run (no input checks, no copies to the host): what a template costs."""
    from tilefold.backends.triton import TritonExecutable

    exe = TritonExecutable(_tf32(graph) if tf32 else graph, device=device)
    buffers: dict = {}
    exe.run(feeds, keep=buffers)
    launches = [(step, [buffers[v] for v in step.ins]) for step in exe.steps if step.plan is not None]
    return lambda: [step.run(args) for step, args in launches]


def _tuned(graph: Any, feeds: dict[str, Any], tune: int, device: str) -> str:
    """Autotune `graph`'s kernels in place over up to `tune` configurations each; what was
    chosen (`BLOCK_M=64 ... num_stages=3`), for the row's label."""
    from tilefold.backends.triton.autotune import autotune

    chosen = autotune(graph, feeds, device=device, limit=tune)
    return "; ".join(" ".join(f"{k}={v}" for k, v in sorted(cfg.items()) if k != "input_precision")
                     for cfg in chosen.values())


def _row(name: str, ours: float, peer: float, peer_name: str) -> None:
    print(f"{name:<58} tilefold {ours * 1e3:9.3f} ms   {peer_name} {peer * 1e3:9.3f} ms   ratio {peer / ours:5.2f}x")


def _guarded(name: str, case: Callable[[], None], failures: list[str]) -> None:
    """Run one benchmark case; a case that raises is printed as one FAILED line and counted, so
    that one broken template does not hide the rest of a run on a lent GPU."""
    try:
        case()
    except Exception as error:  # noqa: BLE001 - reported, and main() exits non-zero
        failures.append(name)
        first = str(error).strip().splitlines()
        print(f"FAILED {name}: {type(error).__name__}: {first[0] if first else ''}", flush=True)


DTYPES = ("float32", "float16", "bfloat16")


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def bench_templates(repeat: int, tf32: bool, device: str = "cuda", dtype: str = "float32", tune: int = 0
                    ) -> list[str]:
    """Prints one row per template and shape, operands of `dtype` on both sides (tilefold
    accumulates float16 and bfloat16 in float32), and with `tune` the packed matmul and the
    conv autotuned; returns the cases that failed."""
    import torch

    rng = np.random.default_rng(0)
    dev = torch.device("cpu" if device == "interp" else device)
    kind = _numpy_dtype(dtype)

    def data(*shape: int, scale: float = 1.0) -> tuple[np.ndarray, Any]:
        """Random operands of `dtype`, as an array and as a tensor on the device (the same values)."""
        array = (rng.standard_normal(shape) * scale).astype(np.float32).astype(kind)
        return array, torch.from_numpy(array.astype(np.float32)).to(dev, getattr(torch, dtype))
    smoke = device == "interp"
    failures: list[str] = []
    print("== templates (ratio = peer time / tilefold time) ==")

    def matmul(m: int, k: int, n: int) -> None:
        a, a_dev = data(m, k)
        w, w_dev = data(k, n)
        peer = _time(lambda: torch.matmul(a_dev, w_dev), repeat)
        variants = {
            "packed 16x16 weight": lambda: _one_node("MatMul", [("a", a, False), ("w", w, True)], {}, "gpu"),
            "row-major (K, N) weight": lambda: _one_node("MatMul", [("a", a, False), ("w", w, True)], {}, None),
            "row-major transposed (N, K) weight": lambda: _one_node(
                "Gemm", [("a", a, False), ("w", np.ascontiguousarray(w.T), True)], {"transB": 1}, None),
        }
        for label, build in variants.items():
            name = f"matmul {m}x{k}x{n} {label}"
            _guarded(name, lambda: _row(name, _time(_kernels(build(), {"a": a_dev}, tf32, device), repeat),
                                        peer, "cuBLAS"), failures)
        if tune:
            name = f"matmul {m}x{k}x{n} packed, tuned"

            def tuned() -> None:
                graph = variants["packed 16x16 weight"]()
                chosen = _tuned(_tf32(graph) if tf32 else graph, {"a": a_dev}, tune, device)
                _row(f"{name} ({chosen})", _time(_kernels(graph, {"a": a_dev}, tf32, device), repeat), peer, "cuBLAS")
            _guarded(name, tuned, failures)

    def conv(batch: int, c: int, h: int, wd: int, f: int, k: int, s: int) -> None:
        x, x_dev = data(batch, c, h, wd)
        w, w_dev = data(f, c, k, k, scale=0.05)
        attrs = {"strides": (s, s), "pads": (k // 2,) * 4}
        graph = _one_node("Conv", [("x", x, False), ("w", w, True)], attrs, "gpu")
        peer = _time(lambda: torch.nn.functional.conv2d(x_dev, w_dev, stride=s, padding=k // 2), repeat)
        name = f"conv {batch}x{c}x{h}x{wd} -> {f} k{k} s{s} (incl. NCHWc16 pack/unpack)"
        _row(name, _time(_kernels(graph, {"x": x_dev}, tf32, device), repeat), peer, "cuDNN")
        if tune:
            chosen = _tuned(_tf32(graph) if tf32 else graph, {"x": x_dev}, tune, device)
            _row(f"{name}, tuned ({chosen})", _time(_kernels(graph, {"x": x_dev}, tf32, device), repeat), peer,
                 "cuDNN")

    def softmax(rows: int, cols: int) -> None:
        x, x_dev = data(rows, cols)
        kernels = _kernels(_one_node("Softmax", [("x", x, False)], {"axis": -1}, None), {"x": x_dev}, tf32, device)
        _row(f"softmax {rows}x{cols}", _time(kernels, repeat), _time(lambda: torch.softmax(x_dev, -1), repeat), "torch")

    def layer_norm(rows: int, cols: int) -> None:
        x, x_dev = data(rows, cols)
        gamma = rng.uniform(0.5, 1.5, cols).astype(np.float32).astype(kind)
        beta, b_dev = data(cols)
        norm = _kernels(_one_node("LayerNormalization", [("x", x, False), ("g", gamma, True), ("b", beta, True)],
                                  {"axis": -1}, None), {"x": x_dev}, tf32, device)
        g_dev = torch.from_numpy(gamma.astype(np.float32)).to(dev, getattr(torch, dtype))
        _row(f"layer norm {rows}x{cols}", _time(norm, repeat),
             _time(lambda: torch.nn.functional.layer_norm(x_dev, (cols,), g_dev, b_dev), repeat), "torch")

    def attention(batch: int, heads: int, seq: int, dim: int) -> None:
        q, q_dev = data(batch, heads, seq, dim)
        k, k_dev = data(batch, heads, seq, dim)
        v, v_dev = data(batch, heads, seq, dim)
        graph = _attention_graph(q, np.ascontiguousarray(k.transpose(0, 1, 3, 2)), v)
        kt_dev = k_dev.transpose(2, 3).contiguous()
        feeds = {"q": q_dev, "kt": kt_dev, "v": v_dev}
        peer = _time(lambda: torch.nn.functional.scaled_dot_product_attention(q_dev, k_dev, v_dev), repeat)
        _row(f"attention {batch}x{heads}x{seq}x{dim}", _time(_kernels(graph, feeds, tf32, device), repeat), peer,
             "torch sdpa")

    for shape in SMOKE["matmul"] if smoke else MATMUL_SHAPES:
        matmul(*shape)
    for shape in SMOKE["conv"] if smoke else CONV_SHAPES:
        _guarded(f"conv {shape}", lambda: conv(*shape), failures)
    for shape in SMOKE["rows"] if smoke else ROW_SHAPES:
        _guarded(f"softmax {shape}", lambda: softmax(*shape), failures)
        _guarded(f"layer norm {shape}", lambda: layer_norm(*shape), failures)
    for shape in SMOKE["attention"] if smoke else ATTENTION_SHAPES:
        _guarded(f"attention {shape}", lambda: attention(*shape), failures)
    return failures


def _max_error(ours: dict[str, np.ndarray], reference: Any) -> float:
    """The largest difference between tilefold's first output and the reference's, as a
    fraction of the reference's largest magnitude."""
    got = np.asarray(next(iter(ours.values())), np.float64)
    want = np.asarray(reference.float().numpy(), np.float64).reshape(got.shape)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _busy(name: str, fn: Callable[[], Any], wall: float) -> None:
    """How much of one run the GPU spends in kernels (torch.profiler), and the kernels that
    take most of it: whether a model is bound by its kernels or by launching them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = {e.key: e.self_device_time_total for e in kernels}
    top = sorted(busy.items(), key=lambda kv: -kv[1])[:5]
    print(f"  {name}: GPU busy in kernels {sum(busy.values()) / 1e3:.3f} ms of a {wall * 1e3:.3f} ms run; most: "
          + ", ".join(f"{k[:40]} {v / 1e3:.3f} ms" for k, v in top), flush=True)


def bench_models(repeat: int, tf32: bool, inductor: bool = True) -> list[str]:
    """End to end against eager and inductor, with each side's first-call (compile) time and
    tilefold's largest error against eager; returns the models that failed."""
    import torch

    import tilefold
    from tilefold.backends.triton import TritonExecutable

    from . import models

    print("== end to end (ratio = peer time / tilefold time) ==")
    rng = np.random.default_rng(1)
    failures: list[str] = []
    cases = [("resnet50", models.resnet50, models.resnet50_torch, models.resnet50_inputs(rng)),
             ("bert", models.bert, models.bert_torch, models.bert_inputs(rng))]

    measured: list[tuple[str, Any, float, Callable[[Any], Any]]] = []

    def run(name: str, export: Callable[[], Any], build: Callable[[], Any], feeds: dict[str, np.ndarray]) -> None:
        start = time.perf_counter()
        path = export()
        exported = time.perf_counter()
        graph = tilefold.optimize(path, "gpu").graph
        optimized = time.perf_counter()
        exe = TritonExecutable(_tf32(graph) if tf32 else graph, device="cuda")
        dev_feeds = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        first = exe(dev_feeds)
        compiled = time.perf_counter()
        print(f"  {name}: export {exported - start:.1f} s, optimize {optimized - exported:.1f} s, "
              f"first run (kernel compiles) {compiled - optimized:.1f} s", flush=True)
        ours = _time(lambda: exe(dev_feeds), repeat)
        stepped = TritonExecutable(_tf32(graph) if tf32 else graph, device="cuda", replay=False)
        stepped(dev_feeds)
        by_step = _time(lambda: stepped(dev_feeds), repeat)
        print(f"  {name}: launched {exe.launch_path}: {ours * 1e3:.3f} ms; step by step from Python "
              f"(replay=False): {by_step * 1e3:.3f} ms", flush=True)

        def forward(fn: Any) -> Any:
            with torch.no_grad():
                out = fn(**dev_feeds)
            return out[0].cpu()

        module = build().cuda()
        print(f"  {name}: largest error against eager, relative to its largest output: "
              f"{_max_error(first, forward(module)):.2e}")
        _row(f"{name} (optimized for gpu)", ours, _time(lambda: forward(module), repeat), "eager")
        launches = sum(step.plan is not None for step in exe.steps)
        print(f"  {len(exe.steps)} steps ({launches} kernel launches), "
              f"NumPy fallback nodes: {len(exe.fallback_nodes)}, "
              f"transfers per run: {exe.transfers // (repeat + 2)}", flush=True)
        measured.append((name, module, ours, forward))
        _guarded(f"{name} profile", lambda: _busy(name, lambda: stepped(dev_feeds), by_step), failures)

    def compiled(name: str, module: Any, ours: float, forward: Callable[[Any], Any]) -> None:
        compiled_module = torch.compile(module)
        start = time.perf_counter()
        forward(compiled_module)
        print(f"  {name}: inductor's first call (compile) {time.perf_counter() - start:.1f} s", flush=True)
        _row(f"{name} (optimized for gpu)", ours, _time(lambda: forward(compiled_module), repeat), "inductor")

    for name, export, build, feeds in cases:
        _guarded(name, lambda: run(name, export, build, feeds), failures)
    # after every eager row: inductor's compiles are the slow part
    for name, module, ours, forward in measured if inductor else ():
        _guarded(f"{name} inductor", lambda: compiled(name, module, ours, forward), failures)
    return failures


def bench_compiled(repeat: int, dtype: str, device: str = "cuda") -> list[str]:
    """ResNet-50 and BERT-base (transformers modules) through `torch.compile(backend="tilefold",
    options={"device": ...})` against eager PyTorch, both in `dtype` (float16 and bfloat16 with
    float32 accumulation on tilefold's side); returns the models that failed."""
    import torch

    from . import models

    print(f"== torch.compile(backend='tilefold') on {device}, {dtype} (ratio = eager time / tilefold time) ==")
    rng = np.random.default_rng(2)
    where = torch.device("cpu" if device == "interp" else device)
    kind = getattr(torch, dtype)
    failures: list[str] = []
    small = device == "interp"  # the smoke run: tiny inputs, times mean nothing
    cases = [("resnet50", models.resnet50_torch, models.resnet50_inputs(rng, size=32 if small else 224)),
             ("bert", models.bert_torch, models.bert_inputs(rng, seq=8 if small else 128))]

    def run(name: str, build: Callable[[], Any], feeds: dict[str, np.ndarray]) -> None:
        exact = build().to(where)
        module = build().to(where, kind)
        inputs = {k: torch.from_numpy(v).to(where) for k, v in feeds.items()}

        def forward(fn: Any, floats: Any = kind) -> Any:
            with torch.no_grad():
                return fn(**{k: v.to(floats) if v.is_floating_point() else v for k, v in inputs.items()})[0]

        compiled = torch.compile(module, backend="tilefold", options={"device": device})
        start = time.perf_counter()
        first = forward(compiled)
        print(f"  {name}: first call (export, optimize, kernel compiles) {time.perf_counter() - start:.1f} s",
              flush=True)
        want = forward(exact, torch.float32)

        def error(got: Any) -> float:
            return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))

        print(f"  {name}: largest error against the float32 model, relative to its largest output: tilefold "
              f"{error(first):.2e}, eager {dtype} {error(forward(module)):.2e}", flush=True)
        _row(f"{name} torch.compile(tilefold, {dtype})", _time(lambda: forward(compiled), repeat),
             _time(lambda: forward(module), repeat), "eager")

    for name, build, feeds in cases:
        _guarded(f"{name} torch.compile", lambda: run(name, build, feeds), failures)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--skip-templates", action="store_true")
    parser.add_argument("--skip-inductor", action="store_true", help="end to end against eager PyTorch only")
    parser.add_argument("--tf32", action="store_true", help="let both sides use TF32 for float32 matmuls")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the templates' operands, and --torch-compile's models (the ONNX models stay float32)")
    parser.add_argument("--torch-compile", action="store_true",
                        help="also ResNet-50 and BERT-base through torch.compile(backend='tilefold') in --dtype")
    parser.add_argument("--tune", type=int, default=0, metavar="N",
                        help="also autotune the packed matmul and the conv over up to N configurations each")
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
        failures = bench_templates(1, args.tf32, "interp", args.dtype, args.tune)
        if args.torch_compile:
            failures += bench_compiled(1, args.dtype, "interp")
        return 1 if failures else 0
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA GPU on this machine; nothing measured (the Triton tests run on 'interp')")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    print(f"device: {torch.cuda.get_device_name()}, templates in {args.dtype}, TF32 {'on' if args.tf32 else 'off'}")
    failures = [] if args.skip_templates else bench_templates(args.repeat, args.tf32, dtype=args.dtype,
                                                              tune=args.tune)
    if not args.skip_models:
        failures += bench_models(args.repeat, args.tf32, inductor=not args.skip_inductor)
    if args.torch_compile:
        failures += bench_compiled(args.repeat, args.dtype)
    if failures:
        print(f"{len(failures)} cases failed: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
