"""The `tilefold` command: `run` a model on the CPU (optionally against onnxruntime), `inspect` it,
`optimize` its layouts for a target and report the layout traffic.

Every failure a user can cause prints one line `tilefold: error: ...` and exits 2; a
`--compare` that finds outputs beyond the tolerances exits 1.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .graph import Graph, InputError, TilefoldError
from .graph.graph import DEQUANTIZED

EXIT_MISMATCH, EXIT_ERROR = 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    try:
        return args.func(args, console)
    except TilefoldError as exc:
        print(f"tilefold: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilefold", description="Graph-level tensor-layout optimizer.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a model on the CPU (NumPy kernels)")
    run.add_argument("model", help="an ONNX file")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input from a .npy file (repeatable); the others are random")
    run.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                     help="size of a symbolic dim for random inputs (default 1)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--output-dir", type=Path, help="write each output as NAME.npy here")
    run.add_argument("--compare", choices=["onnxruntime"], help="compare the outputs with a reference")
    run.add_argument("--rtol", type=float, default=1e-3)
    run.add_argument("--atol", type=float, default=1e-5)
    run.add_argument("--repeat", type=int, default=1, help="time this many runs (median)")
    run.add_argument("--device", default="cpu", metavar="REQUEST",
                     help="ordered device choice, e.g. cpu, interp,cpu or cuda,cpu: the first present wins; "
                          "nodes a device lacks fall back to the next (interp: Triton kernels under Triton's "
                          "interpreter on the CPU, for testing)")
    run.add_argument("--affinity", action="append", default=[], metavar="PATTERN=REQUEST",
                     help="place nodes matching a name glob (or op:Kind) on a device (repeatable)")
    run.add_argument("--target", help="optimize layouts for this target before running (default: as loaded)")
    run.add_argument("--no-fallback", action="store_true",
                     help="fail instead of running ops without a tilefold kernel through onnx.reference")
    run.add_argument("--kernels", choices=["numpy", "aten"], default="numpy",
                     help="the NumPy backend's kernel set: aten runs Gelu, Erf, Sigmoid, Softmax and "
                          "LayerNormalization with PyTorch's one-pass kernels (faster; importing torch costs seconds)")
    run.set_defaults(func=cmd_run)

    inspect = sub.add_parser("inspect", help="summarize a model's graph")
    inspect.add_argument("model", help="an ONNX file")
    inspect.set_defaults(func=cmd_inspect)

    opt = sub.add_parser("optimize", help="choose packed layouts for a target and report the layout traffic")
    opt.add_argument("model", help="an ONNX file")
    opt.add_argument("--target", default="cpu", help="a registered target (built in: cpu, gpu)")
    opt.add_argument("--report", choices=["table", "json"], default="table",
                     help="json: the report as JSON on stdout, nothing else")
    opt.add_argument("--check", action="store_true",
                     help="run the optimized and the unoptimized graph on random inputs; exit 1 if they differ")
    opt.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                     help="size of a symbolic dim for --check's random inputs (default 1)")
    opt.add_argument("--seed", type=int, default=0, help="seed of --check's random inputs")
    opt.add_argument("--rtol", type=float, default=1e-4)
    opt.add_argument("--atol", type=float, default=1e-5)
    opt.add_argument("--verify", action="store_true", help="run the IR verifier after every pass")
    opt.add_argument("--device", metavar="REQUEST",
                     help="place nodes on devices first (e.g. interp,cpu); each device's target plans its nodes")
    opt.add_argument("--affinity", action="append", default=[], metavar="PATTERN=REQUEST",
                     help="place nodes matching a name glob (or op:Kind) on a device (repeatable)")
    opt.add_argument("-o", "--output", type=Path, metavar="PATH",
                     help="write the optimized model here as a standard ONNX file (onnxruntime runs it; "
                          "tilefold reads it back as the optimized graph)")
    opt.add_argument("--form", choices=["auto", "logical", "packed"], default="auto",
                     help="how packed values are written: logical (ops on logical values), packed (ops on "
                          "packed buffers, layout changes as Pad/Reshape/Transpose/Slice), auto (the faster "
                          "in onnxruntime)")
    opt.set_defaults(func=cmd_optimize)

    kernels = sub.add_parser("kernels", help="print the Triton kernels a model runs on a GPU (generated source)")
    kernels.add_argument("model", help="an ONNX file")
    kernels.add_argument("--target", default="gpu", help="optimize for this target first (default gpu)")
    kernels.add_argument("--node", metavar="PATTERN", help="only kernels containing a node matching this glob")
    kernels.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                         help="size of a symbolic dim (default 1): kernels are generated for static shapes")
    kernels.set_defaults(func=cmd_kernels)
    return parser


# ---- run ------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace, console: Console) -> int:
    import tilefold

    t0 = time.perf_counter()
    graph = tilefold.load(args.model, progress=sys.stderr.isatty())
    affinity = _pairs(args.affinity, "--affinity") or None
    if args.target:
        graph = tilefold.optimize(graph, args.target).graph
    t1 = time.perf_counter()
    exe = tilefold.compile(graph, device=args.device, affinity=affinity, allow_fallback=not args.no_fallback,
                           kernels=args.kernels)
    t2 = time.perf_counter()
    if getattr(exe, "note", None):
        console.print(f"[yellow]{escape(exe.note)}[/yellow]")
    if exe.graph is not graph:
        from .backends.assign import Placement

        console.print(Placement.of(exe.graph))
    feeds = make_inputs(graph, _pairs(args.input, "--input"), _dims(args.dim), args.seed)
    times, outputs = [], {}
    for _ in range(max(1, args.repeat)):
        start = time.perf_counter()
        outputs = exe(feeds)
        times.append(time.perf_counter() - start)

    console.print(_outputs_table(outputs))
    console.print(
        f"load {1e3 * (t1 - t0):.1f} ms, compile {1e3 * (t2 - t1):.1f} ms, "
        f"run {1e3 * statistics.median(times):.2f} ms (median of {len(times)})"
    )
    if getattr(exe, "launch_path", None):
        console.print(f"kernel launches: {exe.launch_path}")
    reference_nodes = [n for n in exe.fallback_nodes if exe.graph.node(n).op == "OnnxReference"]
    if reference_nodes:
        console.print(f"[yellow]{len(reference_nodes)} node(s) ran through onnx.reference (no tilefold "
                      f"kernel): {', '.join(reference_nodes[:8])}[/yellow]")
    if args.output_dir:
        write_outputs(outputs, args.output_dir)
        console.print(f"wrote {len(outputs)} output(s) to {args.output_dir}")
    if args.compare:
        literal = quantized(graph)
        if literal:
            console.print("[yellow]a quantized (QDQ) model: compared with onnxruntime's graph optimizations off, "
                          "so that it runs the QuantizeLinear/DequantizeLinear ops as written (its fused integer "
                          "kernels round differently); a value at a rounding boundary may still land one "
                          "quantization step apart (--atol)[/yellow]")
        reference = run_onnxruntime(args.model, feeds, literal=literal)
        ok = _compare(console, outputs, reference, args.rtol, args.atol)
        return 0 if ok else EXIT_MISMATCH
    return 0


def make_inputs(graph: Graph, files: dict[str, str], dims: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Inputs from .npy files where given, random ones elsewhere (floats N(0,1), ints in [0, 2))."""
    types = graph.input_types()
    unknown = sorted(set(files) - set(types))
    if unknown:
        raise InputError(f"unknown input name {unknown[0]!r}; the model's inputs are {sorted(types)}")
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, t in types.items():
        if name in files:
            try:
                feeds[name] = np.load(files[name], allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise InputError(f"input {name!r}: cannot read {files[name]}: {exc}") from None
            continue
        shape = tuple(d if isinstance(d, int) else dims.get(d, 1) for d in t.shape)
        if t.dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(t.dtype)
        elif t.dtype.kind in "iu":
            feeds[name] = rng.integers(0, 2, size=shape).astype(t.dtype)
        elif t.dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise InputError(f"input {name!r} has dtype {t.dtype}: pass it with --input {name}=FILE.npy")
    return feeds


QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def quantized(graph: Graph) -> bool:
    """Whether a loaded model quantizes: QuantizeLinear or DequantizeLinear nodes, or weights
    folded from DequantizeLinear (which remember it)."""
    return any(n.op in QDQ_OPS or DEQUANTIZED in n.attrs for n in graph.nodes())


def run_onnxruntime(model: str | os.PathLike, feeds: dict[str, np.ndarray], *, literal: bool = False
                    ) -> dict[str, np.ndarray]:
    """onnxruntime's outputs; `literal` turns its graph optimizations off, so that it runs each
    node as written (a QDQ model's fused integer kernels round differently from its ops)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if literal:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise TilefoldError(f"onnxruntime cannot load {model}: {str(exc).splitlines()[0]}") from None
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def max_errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Largest absolute error and largest error relative to the reference's scale."""
    if got.size == 0:
        return 0.0, 0.0
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    diff = np.where(np.isnan(got) & np.isnan(want), 0.0, diff) if got.dtype.kind == "f" else diff
    scale = max(float(np.max(np.abs(want))), np.finfo(np.float32).tiny) if want.size else 1.0
    return float(np.max(diff)), float(np.max(diff)) / scale


def _compare(console: Console, outputs: dict, reference: dict, rtol: float, atol: float) -> bool:
    ok, rows = compare_outputs(outputs, reference, rtol, atol)
    console.print(comparison_table(rows, rtol, atol, ok, "against onnxruntime"))
    return ok


def compare_outputs(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float, atol: float
                    ) -> tuple[bool, list[dict[str, Any]]]:
    """Per output of `want`: within the tolerances of `got`'s, and the largest errors."""
    ok, rows = True, []
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            ok = False
            rows.append({"output": name, "ok": False, "error": f"shape {None if g is None else g.shape} vs {w.shape}"})
            continue
        abs_err, rel_err = max_errors(g, w)
        close = bool(np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
        ok &= close
        rows.append({"output": name, "ok": close, "max_abs_err": abs_err, "max_rel_err": rel_err})
    return ok, rows


def comparison_table(rows: list[dict[str, Any]], rtol: float, atol: float, ok: bool, title: str) -> Table:
    table = Table("output", "max abs err", "max rel err (to max |ref|)", "within rtol/atol", title=title,
                  caption=f"rtol={rtol} atol={atol}: " + ("[green]match[/green]" if ok else "[red]MISMATCH[/red]"))
    for r in rows:
        if "error" in r:
            table.add_row(escape(r["output"]), "-", "-", f"[red]{escape(r['error'])}[/red]")
        else:
            table.add_row(escape(r["output"]), f"{r['max_abs_err']:.3g}", f"{r['max_rel_err']:.3g}",
                          "[green]yes[/green]" if r["ok"] else "[red]NO[/red]")
    return table


def _outputs_table(outputs: dict[str, np.ndarray]) -> Table:
    table = Table("output", "shape", "dtype", "mean", "std", "min", "max", title="outputs")
    for name, value in outputs.items():
        stats = ["-"] * 4
        if value.size and value.dtype.kind in "fiub":
            v = value.astype(np.float64)
            stats = [f"{x:.4g}" for x in (v.mean(), v.std(), v.min(), v.max())]
        table.add_row(escape(name), str(tuple(value.shape)), str(value.dtype), *stats)
    return table


def write_outputs(outputs: dict[str, np.ndarray], directory: Path) -> None:
    """Each output as DIR/NAME.npy, written to a temporary file first and renamed."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TilefoldError(f"cannot create output directory {directory}: {exc.strerror}") from None
    for name, value in outputs.items():
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        target = directory / f"{safe}.npy"
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".npy.tmp")
            with os.fdopen(fd, "wb") as f:
                np.save(f, value)
            os.replace(tmp, target)
        except OSError as exc:
            raise TilefoldError(f"cannot write {target}: {exc.strerror}") from None


# ---- inspect --------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    import tilefold
    from .backends.numpy import supports
    from .graph.summary import summary

    graph = tilefold.load(args.model, progress=sys.stderr.isatty())
    console.print(summary(graph, has_kernel=supports))
    return 0


# ---- optimize -------------------------------------------------------------------------
def cmd_optimize(args: argparse.Namespace, console: Console) -> int:
    import tilefold
    from .layout.targets import get_target

    get_target(args.target)  # an unknown target fails before the model is read
    if args.output is not None:
        from .backends.onnx import check_output_path, save_onnx

        check_output_path(args.output)  # so does an output that cannot be written
    dims = _dims(args.dim)
    progress = sys.stderr.isatty()
    start = time.perf_counter()
    graph = tilefold.load(args.model, progress=progress)
    load_seconds = time.perf_counter() - start
    affinity = _pairs(args.affinity, "--affinity") or None
    with Console(stderr=True).status("optimizing", spinner="dots") if progress else contextlib.nullcontext():
        optimized = tilefold.optimize(graph, args.target, verify=args.verify, device=args.device,
                                      affinity=affinity, dims=dims)
    report = optimized.report
    report.load_seconds = load_seconds
    written = None
    if args.output is not None:
        start = time.perf_counter()
        written = save_onnx(optimized.graph, args.output, progress=progress, form=args.form)
        written.seconds["total"] = time.perf_counter() - start
    ok, rows = True, []
    if args.check:
        ok, rows = check_outputs(graph, optimized.graph, dims, args.seed, args.rtol, args.atol)
    if args.report == "json":
        data = report.to_dict()
        if optimized.placement is not None:
            data["placement"] = optimized.placement.to_dict()
            data["memory"] = optimized.memory.to_dict()
        if args.check:
            data["check"] = {"ok": ok, "rtol": args.rtol, "atol": args.atol, "seed": args.seed, "outputs": rows}
        if written is not None:
            data["output"] = _written_dict(written)
        print(json.dumps(data, indent=2))
    else:
        console.print(report)
        if optimized.placement is not None:
            console.print(optimized.placement)
            console.print(optimized.memory)
        if args.check:
            console.print(comparison_table(rows, args.rtol, args.atol, ok,
                                           "optimized against unoptimized (NumPy backend, same random inputs)"))
        if written is not None:
            console.print(written_table(graph, optimized.graph, report, written))
    return 0 if ok else EXIT_MISMATCH


def cmd_kernels(args: argparse.Namespace, console: Console) -> int:
    import fnmatch

    import tilefold
    from .backends.triton import KernelListing, kernel_listing

    optimized = tilefold.optimize(tilefold.load(args.model, progress=sys.stderr.isatty()), args.target)
    dims = _dims(args.dim)
    shapes = {name: tuple(dims.get(d, 1) if isinstance(d, str) else d for d in t.shape)
              for name, t in optimized.graph.input_types().items()}
    listing = KernelListing([k for k in kernel_listing(optimized.graph, shapes=shapes).kernels
                             if args.node is None or any(fnmatch.fnmatchcase(n, args.node) for n in k.nodes)])
    if args.node is not None and not listing:
        raise InputError(f"no kernel runs a node matching {args.node!r}")
    print(listing)
    console.print(f"{len(listing)} kernel(s); target {optimized.report.target}", style="dim")
    return 0


def _written_dict(written: Any) -> dict[str, Any]:
    return {"path": str(written.path), "data_path": None if written.data_path is None else str(written.data_path),
            "file_bytes": written.file_bytes, "weight_bytes": written.weight_bytes,
            "onnx_ops": written.onnx_ops, "seconds": written.seconds}


def written_table(source: Graph, optimized: Graph, report: Any, written: Any) -> Table:
    """The summary of `optimize -o`: ops, runtime layout ops, weight bytes and time per stage."""
    from .layout.report import _human

    def ops(g: Graph) -> int:
        return sum(n for op, n in g.op_counts().items() if op not in ("Input", "Output", "Constant"))

    table = Table("", "before", "after", title=escape(f"wrote {written.path.name}"),
                  caption=escape(str(written.path.resolve().parent)))
    table.add_row("ops (tilefold graph)", str(ops(source)), str(ops(optimized)))
    table.add_row("ONNX nodes written", "", str(sum(written.onnx_ops.values())))
    table.add_row("runtime layout ops", str(report.before.count()), str(report.after.count()))
    table.add_row("weight bytes", _human(report.before.weight_bytes), _human(written.weight_bytes))
    table.add_row("file size", "", _human(written.file_bytes) + ("" if written.data_path is None
                                                                  else f" (external data {written.data_path.name})"))
    stages = [("load", report.load_seconds), ("optimize", report.optimize_seconds),
              ("write", written.seconds.get("total"))]
    table.add_row("time", "", ", ".join(f"{name} {1e3 * sec:.0f} ms" for name, sec in stages if sec is not None))
    return table


def check_outputs(
    reference: Graph, optimized: Graph, dims: dict[str, int], seed: int, rtol: float, atol: float
) -> tuple[bool, list[dict[str, Any]]]:
    """Run both graphs on the NumPy backend with the same random inputs and compare outputs."""
    import tilefold

    feeds = make_inputs(reference, {}, dims, seed)
    want = tilefold.compile(reference)(feeds)
    got = tilefold.compile(optimized)(feeds)
    return compare_outputs(got, want, rtol, atol)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(f"{flag} {item!r}: expected NAME=VALUE")
        pairs[name] = value
    return pairs


def _dims(items: list[str]) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in _pairs(items, "--dim").items()}
    except ValueError:
        raise InputError(f"--dim expects SYMBOL=INTEGER, got {items}") from None


if __name__ == "__main__":
    sys.exit(main())
