"""The `torch.compile` backend "tilefold": dynamo -> aot_autograd (core ATen) -> Graph ->
layout optimization -> the NumPy backend on the CPU, or the Triton backend on a GPU.

    torch.compile(model, backend="tilefold")                       # entry point, target "cpu"
    torch.compile(model, backend="tilefold", options={"target": "gpu", "report": print})
    torch.compile(model.cuda(), backend="tilefold", options={"device": "cuda"})  # Triton kernels, target "gpu"
    torch.compile(model, backend=tilefold.frontends.fx.backend(target="cpu", report=callback))

This module is the glue between the stages, so it imports tilefold's layout engine and
NumPy backend (lazily, inside functions); fx.py / fx_ops.py stay frontend-only.

1. Inference only: with autograd recording (grad enabled and an input requiring grad)
   compilation stops with a TilefoldError saying why (tilefold freezes the weights and
   has no backward kernels).
2. aot_autograd with the core ATen decomposition table gives the ATen graph; its
   `fw_metadata.static_input_indices` are the parameters and buffers that Dynamo lifted
   as graph inputs.
3. Freezing and its guard: the real parameter tensors arrive with every call. A compiled
   variant folds the tensors it was built with; each call keys the variant by those
   tensors' identity, storage and version counter, so another instance of the module
   (Dynamo reuses one graph for all instances of a class) or an in-place update of the
   weights builds (refolds) a new variant instead of using stale constants.
4. Dynamic shapes: a graph Dynamo marked dynamic is specialized per concrete input shapes
   (`make_fx` on the call's tensors), each specialization compiled once and cached.
5. Ops tilefold cannot run: the ATen graph is split with PyTorch's capability-based
   partitioner; supported partitions run on tilefold, the rest eagerly in PyTorch, with one
   warning naming the ops.
6. Running, on the NumPy backend (device "cpu"): inputs as zero-copy numpy views of the
   torch tensors, outputs back through `torch.from_numpy` (copied only when they alias an
   input, a constant or another output). On a Triton device ("cuda", "cuda:N"; "interp" runs
   the same kernels through Triton's interpreter on CPU tensors, for testing): the tensors go
   to the executor as they are, and the outputs come back as new tensors on that device.
   Tensors on another device than the backend's run eagerly (step 5).
"""
from __future__ import annotations

import collections
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.fx

from ..graph.errors import TilefoldError, UnsupportedOpError
from ..graph.graph import Graph
from .fx import NUMPY_BACKEND, Accepts, decompositions, graph_from_fx, unsupported_nodes
from .fx_emit import torch_to_numpy_dtype

MAX_VARIANTS = 8
"""Compiled variants (weight sets x shapes) kept per graph; the least recently used goes."""


class TilefoldFallbackWarning(UserWarning):
    """Part of a compiled graph runs eagerly in PyTorch because tilefold lacks its ops."""


@dataclass
class BackendReport:
    """What the `report` callback receives for each graph tilefold compiles."""

    graph: Graph  # as converted from ATen and simplified (what `tilefold.from_torch` gives)
    optimized: Any  # tilefold.Optimized: .graph, .report (LayoutReport), .before
    fallback: dict[str, str] = field(default_factory=dict)  # ATen op -> why it runs eagerly
    seconds: float = 0.0
    executable: Any = None  # what runs it: a NumpyExecutable, or a TritonExecutable on a Triton device


@dataclass(frozen=True)
class Options:
    target: str | None = None  # the device's: "cpu" on the host, "gpu" on a Triton device
    device: str = "cpu"
    report: Callable[[BackendReport], Any] | None = None

    @property
    def layout_target(self) -> str:
        return self.target or ("cpu" if self.device == "cpu" else "gpu")

    @property
    def accepts(self) -> Accepts:
        """The tensors the device's backend runs: the NumPy backend host tensors but bfloat16;
        the Triton backend bfloat16 too, and on a GPU its tensors and host ones (0-d
        constants, which the executor moves to the GPU)."""
        if self.device == "cpu":
            return NUMPY_BACKEND
        return Accepts(frozenset({"cpu", "cuda"} if self.device.startswith("cuda") else {"cpu"}), bfloat16=True)


def backend(*, target: str | None = None, device: str = "cpu",
            report: Callable[[BackendReport], Any] | None = None) -> Callable[..., Any]:
    """A torch.compile backend: layouts for `target` (a registered target name; by default
    the device's), run on `device` ("cpu": the NumPy backend; "cuda", "cuda:N": Triton kernels
    on that GPU; "interp": the same kernels under Triton's interpreter, for testing),
    `report(BackendReport)` called per compiled graph."""
    options = Options(target, device, report)
    _check_options(options)

    def tilefold(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return compile_graph(gm, example_inputs, options)

    return tilefold


def tilefold_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                     options: dict[str, Any] | None = None, mode: str | None = None) -> Any:
    """The backend registered as "tilefold"; `torch.compile(..., options={...})` passes
    target, device and report here."""
    try:
        chosen = Options(**(options or {}))
    except TypeError:
        known = ", ".join(Options.__dataclass_fields__)
        raise TilefoldError(f"tilefold backend: unknown option in {sorted(options or {})}; known: {known}") from None
    _check_options(chosen)
    return compile_graph(gm, example_inputs, chosen)


def _check_options(options: Options) -> None:
    """One-line errors for an unknown target, an unknown device, a GPU that is not there."""
    from ..layout.targets import get_target

    if options.device != "cpu":
        from ..backends.triton.executor import triton_device

        try:
            triton_device(options.device)
        except TilefoldError as exc:
            raise TilefoldError(f"tilefold backend: {exc}; 'cpu' runs the NumPy backend") from None
    get_target(options.layout_target)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options) -> Any:
    """Compile one Dynamo graph (see module docstring)."""
    from torch._dynamo.backends.common import aot_autograd

    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        raise TilefoldError(
            "tilefold compiles for inference only: run the model under torch.no_grad() or "
            "torch.inference_mode() (training is not supported: tilefold folds the weights into "
            "constants and has no backward kernels)"
        )

    def inference_compiler(aten: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
        context = torch._guards.TracingContext.try_get()
        meta = context.fw_metadata if context is not None else None
        static = tuple(meta.static_input_indices) if meta is not None else ()
        return Runner(aten, static, options)

    return aot_autograd(fw_compiler=inference_compiler, inference_compiler=inference_compiler,
                        decompositions=decompositions)(gm, example_inputs)


class Runner:
    """The compiled function aot_autograd calls (boxed: one list of arguments)."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, static: Sequence[int], options: Options) -> None:
        self.gm = gm
        self.static = tuple(static)
        self.options = options
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.names = [n.name for n in placeholders]
        self.dynamic = any(_symbolic(n.meta.get("val")) for n in placeholders)
        self.variants: collections.OrderedDict[Any, Callable[[list[Any]], Any]] = collections.OrderedDict()
        self.builds = 0

    def __call__(self, args: list[Any]) -> Any:
        key = self._key(args)
        variant = self.variants.get(key)
        if variant is None:
            variant = self._build(args)
            self.variants[key] = variant
            if len(self.variants) > MAX_VARIANTS:
                self.variants.popitem(last=False)
        else:
            self.variants.move_to_end(key)
        return variant(args)

    def _key(self, args: list[Any]) -> Any:
        weights = tuple(_identity(args[i]) for i in self.static)
        if not self.dynamic:
            return weights
        return weights, tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)

    def _build(self, args: list[Any]) -> Callable[[list[Any]], Any]:
        from torch.fx.experimental.proxy_tensor import make_fx

        self.builds += 1
        gm = self.gm
        if self.dynamic:
            gm = make_fx(self.gm, tracing_mode="fake")(*args)
            gm.graph.eliminate_dead_code()
            gm.recompile()
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        frozen = {names[i]: args[i] for i in self.static}
        return build_variant(gm, frozen, self.options)


def _symbolic(val: Any) -> bool:
    if isinstance(val, torch.SymInt):
        return True
    return isinstance(val, torch.Tensor) and any(not isinstance(d, int) for d in val.shape)


def _identity(tensor: Any) -> tuple[int, int, int]:
    """What the weight guard compares: the tensor object, its storage and its version."""
    try:
        version = tensor._version
    except RuntimeError:  # inference tensors keep no version counter (and cannot be changed in place)
        version = -1
    return id(tensor), tensor.data_ptr(), version


# ---- variants -------------------------------------------------------------------------------
def build_variant(gm: torch.fx.GraphModule, frozen: dict[str, torch.Tensor], options: Options
                  ) -> Callable[[list[Any]], Any]:
    """A callable running `gm` (static shapes) with tilefold where it can, eager PyTorch elsewhere."""
    bad = {node.name: (str(node.target), reason)
           for node, reason in unsupported_nodes(gm, options.accepts).items()}
    while True:
        try:
            if not bad:
                return GraphRun(_compile(gm, frozen, options, {}), gm)
            return _partitioned(gm, frozen, options, bad)
        except UnsupportedOpError as exc:  # a rule refused at conversion: run that node eagerly
            name = getattr(exc, "fx_node", None)
            if name is None or name in bad:
                raise
            node = next(n for n in gm.graph.nodes if n.name == name)
            bad[name] = (str(node.target), str(exc))


def _compile(gm: torch.fx.GraphModule, frozen: dict[str, torch.Tensor], options: Options,
             fallback: dict[str, str]) -> Any:
    import tilefold
    from ..backends.numpy import NumpyExecutable, evaluate_node
    from ..graph.passes.pipeline import simplify

    start = time.perf_counter()
    converted = graph_from_fx(gm, frozen, accepts=options.accepts)
    graph = simplify(converted.copy(), evaluate_node)
    optimized = tilefold.optimize(graph, options.layout_target)
    if options.device == "cpu":
        executable = NumpyExecutable(optimized.graph, allow_fallback=False, kernels="aten")  # torch is loaded here
    else:
        from ..backends.triton import TritonExecutable

        executable = TritonExecutable(optimized.graph, device=options.device, allow_fallback=False)
    executable.fx_outputs = converted.meta["fx_outputs"]
    if options.report is not None:
        options.report(BackendReport(graph, optimized, dict(fallback), time.perf_counter() - start, executable))
    return executable


class GraphRun:
    """Runs an executable on torch tensors: a NumPy one through zero-copy numpy views in and
    `torch.from_numpy` out; a Triton one on the tensors themselves, its outputs new tensors on
    its device."""

    def __init__(self, executable: Any, gm: torch.fx.GraphModule) -> None:
        from ..backends.numpy import NumpyExecutable

        self.executable = executable
        self.on_tensors = not isinstance(executable, NumpyExecutable)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        inputs = set(executable.graph.inputs)
        self.feeds = [(i, n.name) for i, n in enumerate(placeholders) if n.name in inputs]
        self.plan = executable.fx_outputs
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.single = not isinstance(outputs, (tuple, list))
        vals = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None
                for o in ([outputs] if self.single else outputs)]
        self.kinds = [(v.device, v.dtype) if isinstance(v, torch.Tensor) else None for v in vals]  # as traced
        self.dtypes = [None if kind is None else torch_to_numpy_dtype(kind[1]) for kind in self.kinds]

    def __call__(self, args: Sequence[Any]) -> Any:
        if self.on_tensors:
            return self._on_tensors(args)
        feeds = {name: args[i].detach().numpy() for i, name in self.feeds}
        results = self.executable(feeds)
        seen: list[np.ndarray] = []
        outs: list[Any] = []
        for entry, dtype in zip(self.plan, self.dtypes):
            if isinstance(entry, dict):
                outs.append(entry["value"])
                continue
            array = np.asarray(results[entry])
            if dtype is not None and array.dtype != dtype:
                array = array.astype(dtype)
            if _must_copy(array, feeds.values(), seen):
                array = array.copy()
            seen.append(array)
            outs.append(torch.from_numpy(array))
        return outs[0] if self.single else tuple(outs)

    def _on_tensors(self, args: Sequence[Any]) -> Any:
        """The Triton executable's run: every output a tensor of its own (`run(tensors=True)`),
        of the dtype and on the device that tracing saw."""
        results = self.executable.run({name: args[i].detach() for i, name in self.feeds}, tensors=True)
        outs: list[Any] = []
        for entry, kind in zip(self.plan, self.kinds):
            if isinstance(entry, dict):
                outs.append(entry["value"])
                continue
            tensor = results[entry]
            outs.append(tensor if kind is None else tensor.to(*kind))
        return outs[0] if self.single else tuple(outs)


def _must_copy(array: np.ndarray, inputs: Any, outputs: list[np.ndarray]) -> bool:
    """An output that torch may write must own its memory: not a constant's (read-only), an
    input's or another output's."""
    if not array.flags.writeable or not array.flags.c_contiguous and array.size > 1:
        return True
    return any(np.may_share_memory(array, other) for other in (*inputs, *outputs))


class _Submodule(torch.nn.Module):
    """A fused partition replaced by its tilefold executable (same calling convention)."""

    def __init__(self, run: GraphRun) -> None:
        super().__init__()
        self.run = run

    def forward(self, *args: Any) -> Any:
        return self.run(args)


def _partitioned(gm: torch.fx.GraphModule, frozen: dict[str, torch.Tensor], options: Options,
                 bad: dict[str, tuple[str, str]]) -> Callable[[list[Any]], Any]:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    eager = set(bad)

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
            if node.op != "call_function" or node.name in eager:
                return False
            return not (node.target.__name__ == "getitem" and node.args[0].name in eager)

    fallback: dict[str, str] = {}
    for target, reason in bad.values():
        fallback.setdefault(target, reason)
    ops = ", ".join(f"{op} ({why})" for op, why in sorted(fallback.items()))
    warnings.warn(f"tilefold runs these ops eagerly in PyTorch: {ops}", TilefoldFallbackWarning)

    split = torch.fx.GraphModule(gm, _copy_graph(gm))
    partitioner = CapabilityBasedPartitioner(split, Support(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions, prefix="tilefold_")
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith("tilefold_"):
            continue
        sub = fused.get_submodule(node.target)
        sub_frozen = {p.name: frozen[p.name] for p in sub.graph.nodes if p.op == "placeholder" and p.name in frozen}
        if not any(n.op == "call_function" for n in sub.graph.nodes):
            continue
        executable = _compile(sub, sub_frozen, options, fallback)
        setattr(fused, node.target, _Submodule(GraphRun(executable, sub)))
    fused.recompile()

    def run(args: list[Any]) -> Any:
        return fused(*args)

    run.module = fused  # type: ignore[attr-defined]
    return run


def _copy_graph(gm: torch.fx.GraphModule) -> torch.fx.Graph:
    graph = torch.fx.Graph()
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, mapping)
    graph.output(out)
    return graph
