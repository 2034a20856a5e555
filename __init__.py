"""tilefold: a graph-level tensor-layout optimizer.

    g = tilefold.load("model.onnx")          # ONNX file -> Graph (simplified)
    g = tilefold.from_torch(module, (x,))    # or a PyTorch module, through core ATen
    exe = tilefold.compile(g, device="cpu")  # NumPy backend
    outputs = exe({"input": x})              # dict of named numpy arrays

    opt = tilefold.optimize(g, target="cpu") # packed layouts, folded into the weights
    opt.report                               # runtime layout ops and bytes, before/after
    exe = tilefold.compile(opt.graph)        # same outputs, less layout traffic
    tilefold.save(opt, "model.opt.onnx")     # a standard ONNX file that onnxruntime runs

    opt = tilefold.optimize(g, device="interp,cpu")  # placed per device, each device's layouts
    exe = tilefold.compile(opt.graph, device="interp,cpu")  # Triton kernels (interpreted) + NumPy
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .graph import Graph, TilefoldError
from .graph.passes.pipeline import simplify

if TYPE_CHECKING:
    from .backends.assign import Placement
    from .backends.plan import MemoryPlan
    from .layout.report import LayoutReport

__version__ = "0.1.0"


def load(model: str | os.PathLike | bytes | Any, *, simplify_graph: bool = True, progress: bool = False,
         target: str | None = None) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a Graph, simplified by default.

    A file tilefold optimized comes back as the optimized graph, exactly as written, unless
    `target` names another target: then it comes back plain, to be planned again."""
    from .backends.numpy import evaluate_node
    from .frontends.onnx import load_onnx

    graph = load_onnx(model, progress=progress, target=target)
    if graph.meta.get("target"):
        return graph
    return simplify(graph, evaluate_node) if simplify_graph else graph


@dataclass
class Optimized:
    """What `optimize` returns: the optimized graph, its layout report, and the graph before
    propagation (every anchor wrapped in Pack/Unpack: the baseline the report compares with).
    With a device request, also where the nodes went (`placement`) and each device's memory
    plan (`memory`)."""

    graph: Graph
    report: LayoutReport
    before: Graph
    placement: Placement | None = None
    memory: MemoryPlan | None = None

    def _repr_html_(self) -> str:
        return self.report._repr_html_()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        self.report._repr_pretty_(printer, cycle)

    def draw(self, **options: Any) -> Any:
        """The graph before and after propagation side by side, layout ops marked."""
        from .graph.draw import draw_comparison

        return draw_comparison(self.before, self.graph, **options)

    def kernels(self) -> Any:
        """The Triton kernels the optimized graph runs on a GPU: per kernel its nodes, template,
        launch configuration and generated source."""
        from .backends.triton import kernel_listing

        return kernel_listing(self.graph)


def optimize(graph: Graph | str | os.PathLike, target: str = "cpu", *, verify: bool = False,
             device: str | Sequence[str] | None = None, affinity: Mapping[str, Any] | None = None,
             dims: Mapping[str, int] | None = None) -> Optimized:
    """Give the anchors (Conv, MatMul, Gemm) the target's packed layouts and fold the layout
    changes into the weights; `graph` is left unchanged.

    `graph` may also be a path, read with `load`. `target` names a registered tiling policy
    (built in: "cpu", "gpu"); `verify` runs the IR verifier after every pass. The optimized
    graph computes the same outputs and runs with `compile`.

    With `device` (an ordered request such as "cuda,cpu" or "interp,cpu") and optionally
    `affinity` ({node-name glob or "op:Kind": request}), nodes are first placed on devices
    (backends/assign.py) and each device's own target plans its nodes (`target` is then not
    used); `dims` sizes symbolic dims for the memory plan, which, where Triton devices run
    nodes of a graph of static shapes, is the one the Triton executor allocates.
    """
    import time

    from .layout import optimize as optimize_layout
    from .layout.report import LayoutReport

    load_seconds = None
    if not isinstance(graph, Graph):
        start = time.perf_counter()
        graph = load(graph)
        load_seconds = time.perf_counter() - start
    if device is None and affinity is None:
        result = optimize_layout(graph, target, verify=verify)
        return Optimized(result.after, LayoutReport.from_result(result, load_seconds=load_seconds), result.before)
    from .backends.assign import Placement
    from .backends.place import place
    from .backends.plan import plan_memory

    result = place(graph, device or "cpu", affinity, verify=verify)
    placed = result.after
    memory = None
    if any(n.device not in (None, "cpu") for n in placed.nodes()) and all(
            t.is_static for t in placed.input_types().values()):
        from .backends.triton.executor import executor_memory

        memory = executor_memory(placed, dims)  # what the Triton executor allocates: its fused schedule
    return Optimized(placed, LayoutReport.from_result(result, load_seconds=load_seconds), result.before,
                     Placement.of(placed), memory or plan_memory(placed, dims))


def compile(graph: Graph, *, device: str | Sequence[str] = "cpu", affinity: Mapping[str, Any] | None = None,
            allow_fallback: bool = True, debug: bool = False, kernels: str = "numpy"):
    """Compile a Graph for a device request; the result is called with a dict of named inputs.

    "cpu" runs the NumPy kernels. A request with a Triton device ("interp,cpu", "cuda,cpu")
    or an `affinity` places every node first (explicit transfers between devices; nodes a
    device lacks fall back to the next in the request) and runs the Triton backend: each node
    on its own device, several Triton devices at once ("interp:0" and "interp:1", two GPUs)
    each with its own memory arena, and the nodes placed on the host with the NumPy kernels.
    `kernels="aten"` gives the NumPy backend PyTorch's one-pass kernels for Gelu, Erf, Sigmoid,
    Softmax and LayerNormalization (faster; it imports torch, so it is for callers that have it
    loaded)."""
    from .backends.devices import HOST, present
    from .backends.numpy.registry import kernel_set

    kernel_set(kernels)  # an unknown set is refused whatever the devices
    devices = present(device)
    placed_before = any(n.device not in (None, HOST) for n in graph.nodes())
    if affinity is None and devices[0].name == HOST and not placed_before:
        from .backends.numpy import NumpyExecutable

        return NumpyExecutable(graph, allow_fallback=allow_fallback, debug=debug, kernels=kernels)
    from .backends.assign import assign_devices, check_placement

    placed = assign_devices(graph, device, affinity)
    accelerators = [d for d in placed.meta["devices"] if d != HOST]
    if not accelerators:
        from .backends.numpy import NumpyExecutable

        return NumpyExecutable(placed, allow_fallback=allow_fallback, debug=debug, kernels=kernels)
    if kernels != "numpy":
        raise TilefoldError(f"kernels={kernels!r} is for the NumPy backend alone; a request with a Triton "
                            f"device ({', '.join(accelerators)}) runs its host nodes on the default kernels")
    check_placement(placed)
    from .backends.triton import TritonExecutable

    default = next((d.name for d in devices if d.name in accelerators), accelerators[0])
    return TritonExecutable(placed, device=default, allow_fallback=allow_fallback)


def save(graph: Graph | Optimized, path: str | os.PathLike, *, progress: bool = False, **options: Any) -> None:
    """Write a Graph (optimized or not) as a standard ONNX file that onnxruntime runs and
    `load` reads back; written to a temporary file and renamed, so a failure leaves no
    partial file. `options` go to the writer (`backends/onnx`)."""
    from .backends.onnx import save_onnx

    save_onnx(graph.graph if isinstance(graph, Optimized) else graph, path, progress=progress, **options)


def from_torch(module: Any, example_inputs: Any, *, simplify_graph: bool = True, **options: Any) -> Graph:
    """Trace a `torch.nn.Module` for inference into the Graph that `torch.compile(module,
    backend="tilefold")` sees (core ATen, weights frozen into constants), simplified as
    `load` simplifies (the backend does the same)."""
    from .backends.numpy import evaluate_node
    from .frontends.fx import from_torch as _from_torch

    graph = _from_torch(module, example_inputs, **options)
    return simplify(graph, evaluate_node) if simplify_graph else graph


def run(model: str | os.PathLike | Graph, feeds: dict[str, Any], *, device: str = "cpu") -> dict[str, Any]:
    """Load (if needed), compile and run once."""
    graph = model if isinstance(model, Graph) else load(model)
    return compile(graph, device=device)(feeds)


__all__ = ["Graph", "Optimized", "TilefoldError", "compile", "from_torch", "load", "optimize", "run", "save",
           "__version__"]
