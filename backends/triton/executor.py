"""Runs a Graph with generated Triton kernels, falling back per node to the NumPy backend.

Compiling groups the nodes into kernels (fusion.py), generates and builds each kernel
(templates, codegen.py) with its launch configuration (launch.py, verified first), and fixes
one schedule. Running it:
- every value has one buffer, sized from its encoding (padding included): a torch tensor on
  the device (`cuda`; on the host for `interp`), or a NumPy array on the host for values the
  NumPy backend produced; a buffer is dropped after its last use;
- a padded packed result is allocated filled with its pad value (zero where the padding is
  unknown), so the kernels write logical elements only;
- a node no template runs (or placed on the host) runs on the NumPy backend: its operands
  move to the host and its results back on the device's first use, each move an explicit,
  counted transfer (`transfers`, `transfer_bytes`); a `Transfer` node moves its value;
- constants move to the device once, at compile time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ...graph.errors import InputError, TilefoldError, where
from ...graph.graph import CONSTANT, INPUT, OUTPUT, Graph
from ...graph.types import Splat, TensorType, Value, as_array
from ...layout.encoding import unpack
from . import codegen
from .fusion import Group
from .indexing import physical_shape
from .launch import config as launch_config, kernel_groups, verify_launch
from .specialize import specialize
from .templates import TEMPLATES, static_result


@dataclass
class Step:
    group: Group
    run: Callable[[list[Any]], list[Any]]
    ins: list[Value]
    outs: list[Value]
    frees: list[Value] = field(default_factory=list)
    plan: codegen.KernelPlan | None = None


def kernel_name(group: Group) -> str:
    names = "_".join(n.name for n in group.nodes[:3]) + ("_etc" if len(group.nodes) > 3 else "")
    clean = "".join(ch if ch.isalnum() else "_" for ch in names)
    return f"k_{clean}"[:60]


def plan_group(graph: Graph, group: Group) -> codegen.KernelPlan:
    """The generated kernel of one templated group (source, operands, launch functions)."""
    template = TEMPLATES[group.kind]
    name = kernel_name(group)
    body, params = template.kernel(graph, group.nodes, name)
    header = "# " + ", ".join(f"{n.name} ({n.op})" for n in group.nodes) + "\n"
    source = codegen.module_source(header + body)
    nodes = group.nodes
    return codegen.KernelPlan(
        name, group.kind, [n.name for n in nodes], source, list(params), [group.output],
        grid=lambda cfg: template.grid(graph, nodes, cfg), constexprs=template.constexprs,
        config=launch_config(graph, group))


def kernel_sources(graph: Graph, *, fuse: bool = True,
                   shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[tuple[list[str], str]]:
    """(node names, generated source) of every kernel the graph runs, in launch order;
    `shapes` (input name -> shape) specializes a graph with symbolic dims first."""
    if shapes is not None:
        graph = specialize(graph, shapes)
    return [(plan.nodes, plan.source) for plan in
            (plan_group(graph, g) for g in kernel_groups(graph, fuse) if g.kind in TEMPLATES)]


DEVICE_NOTES = {
    "cuda": "generated Triton kernels on the GPU",
    "interp": "Triton's interpreter on the CPU: for testing the GPU path without a GPU (slow; small shapes)",
}
"""What each device is, for the CLI and reports to say."""


class TritonExecutable:
    """A graph compiled for the Triton backend; call it with a dict of named inputs (numpy
    arrays or torch tensors); returns a dict of named numpy arrays.

    `device`: "cuda" (or "cuda:N") runs JIT-compiled kernels on the GPU; "interp" runs the same
    kernels with Triton's interpreter on the CPU, for testing without a GPU (slow: small
    shapes only). `fuse=False` gives every node its own kernel."""

    def __init__(self, graph: Graph, *, device: str = "cuda", fuse: bool = True, verify: bool = True,
                 allow_fallback: bool = True) -> None:
        import torch

        self.graph = graph
        kind = device.split(":")[0]
        if kind not in codegen.DEVICES:
            raise TilefoldError(f"unknown Triton device {device!r}: expected 'cuda', 'cuda:N' or 'interp'")
        if kind == "cuda" and not torch.cuda.is_available():
            raise TilefoldError("device 'cuda' is not available here (no CUDA GPU); use device='interp' to run "
                                "the Triton kernels with the interpreter on the CPU")
        self.device = device
        self.kind = kind
        self.note = DEVICE_NOTES[kind]
        self.torch_device = torch.device("cpu" if kind == "interp" else device)
        self.fallback_nodes: list[str] = []
        self.transfers = 0
        self.transfer_bytes = 0
        self._consts: dict[Value, Any] = {}
        self._inputs: dict[str, Value] = {name: Value(name) for name in graph.inputs}
        self._outputs: list[tuple[str, Value]] = []
        self.steps: list[Step] = []
        self._options = {"fuse": fuse, "verify": verify, "allow_fallback": allow_fallback}
        self._variants: dict[tuple, TritonExecutable] | None = None
        if not all(t.is_static for t in graph.input_types().values()):
            self._variants = {}  # symbolic dims: one specialization per set of input shapes
            return
        if verify:
            verify_launch(graph, fuse)
        self._compile(fuse, allow_fallback)

    # ---- compile ---------------------------------------------------------------------------------
    def _compile(self, fuse: bool, allow_fallback: bool) -> None:
        g = self.graph
        for node in g.nodes():
            if node.op == CONSTANT:
                self._consts[Value(node.name)] = node.attrs["value"]
            elif node.op == INPUT:
                self._inputs[node.name] = Value(node.name)
            elif node.op == OUTPUT:
                self._outputs.append((node.attrs["name"], g.inputs_of(node.name)[0]))  # type: ignore[arg-type]
        self._device_consts: dict[Value, Any] = {}
        for group in kernel_groups(g, fuse):
            self.steps.append(self._step(group, allow_fallback))
        last: dict[Value, int] = {}
        for i, step in enumerate(self.steps):
            for v in step.ins:
                last[v] = i
        keep = set(self._consts) | {v for _, v in self._outputs}
        for v, i in last.items():
            if v not in keep:
                self.steps[i].frees.append(v)

    def _step(self, group: Group, allow_fallback: bool) -> Step:
        g = self.graph
        node = group.anchor
        if group.kind in TEMPLATES:
            plan = plan_group(g, group)
            kernel = codegen.build(plan.source, plan.name, self.kind)
            out_t = group.nodes[-1].outputs[0]
            cfg = plan.config
            grid, consts = plan.grid(cfg), plan.constexprs(cfg)
            warps, stages = int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 2))

            def run(args: list[Any], cfg: dict[str, Any] | None = None) -> list[Any]:
                out = self._allocate(out_t)
                if cfg is None:
                    codegen.launch(kernel, self.kind, grid, [*args, out], consts, warps, stages)
                else:
                    codegen.launch(kernel, self.kind, plan.grid(cfg), [*args, out], plan.constexprs(cfg),
                                   int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 2)))
                return [out]

            for v in plan.inputs:
                self._device_const(v)
            return Step(group, run, plan.inputs, plan.outputs, plan=plan)
        inputs = [v for v in g.inputs_of(node.name)]
        if group.kind == "view":
            shape = tuple(int(d) for d in node.outputs[0].shape)
            return Step(group, lambda args: [self._device(args[0]).reshape(shape)], [inputs[0]], [Value(node.name)])
        if group.kind == "static":
            value = static_result(g, node)
            return Step(group, lambda args: [value], [], [Value(node.name)])
        if group.kind == "transfer":
            to_host = node.attrs.get("target", "cpu") == "cpu"
            return Step(group, lambda args: [self._host(args[0]) if to_host else self._device(args[0])],
                        [inputs[0]], [Value(node.name)])
        return self._numpy_step(group, inputs, allow_fallback)

    def _numpy_step(self, group: Group, inputs: list[Value | None], allow_fallback: bool) -> Step:
        from ..numpy.executor import node_kernel

        node = group.anchor
        _, _, kernel = node_kernel(self.graph, node, inputs, allow_fallback=allow_fallback)
        self.fallback_nodes.append(node.name)
        present = [v for v in inputs if v is not None]
        outs = [Value(node.name, k) for k in range(len(node.outputs))]

        def run(args: list[Any]) -> list[Any]:
            it = iter(self._host(a) for a in args)
            full = [None if v is None else next(it) for v in inputs]
            with np.errstate(all="ignore"):
                result = kernel(*full)
            return list(result) if isinstance(result, tuple) else [result]

        return Step(group, run, present, outs)

    # ---- buffers -------------------------------------------------------------------------------
    def _allocate(self, t: TensorType) -> Any:
        import torch

        shape = physical_shape(t)
        dtype = _torch_dtype(t.dtype)
        enc = t.encoding
        if enc is not None and enc.is_padded(tuple(int(d) for d in t.shape)):
            return torch.full(shape, enc.pad if enc.pad is not None else 0, dtype=dtype, device=self.torch_device)
        return torch.empty(shape, dtype=dtype, device=self.torch_device)

    def _device_const(self, v: Value) -> None:
        import torch

        if v in self._consts and v not in self._device_consts:
            value = self._consts[v]
            t = self.graph.type_of(v)
            array = np.full(physical_shape(t), value.value, dtype=value.dtype) if isinstance(value, Splat) \
                else np.ascontiguousarray(value)
            self._device_consts[v] = torch.from_numpy(array.copy()).to(self.torch_device)

    def _device(self, x: Any) -> Any:
        import torch

        if isinstance(x, torch.Tensor):
            return x if x.device == self.torch_device else self._count(x.to(self.torch_device))
        array = np.ascontiguousarray(x)
        if not array.flags.writeable:  # a constant's (or an input's) read-only view: torch wants its own
            array = array.copy()
        return self._count(torch.from_numpy(array).to(self.torch_device))

    def _host(self, x: Any) -> np.ndarray:
        import torch

        if isinstance(x, torch.Tensor):
            return self._count(x.detach().cpu()).numpy()
        return x

    def _count(self, x: Any) -> Any:
        self.transfers += 1
        self.transfer_bytes += int(x.numel()) * int(x.element_size())
        return x

    # ---- run -----------------------------------------------------------------------------------
    def __call__(self, feeds: Mapping[str, Any] | None = None, /, **kwargs: Any) -> dict[str, np.ndarray]:
        return self.run({**(feeds or {}), **kwargs})

    def run(self, feeds: Mapping[str, Any], *, keep: dict[Value, Any] | None = None) -> dict[str, np.ndarray]:
        """Run once; `keep`, when given, receives every buffer (for autotuning and tests)."""
        buffers = self._bind(feeds)
        if self._variants is not None:
            key = tuple(tuple(buffers[v].shape) for v in self._inputs.values())
            if key not in self._variants:
                shapes = {name: tuple(buffers[v].shape) for name, v in self._inputs.items()}
                self._variants[key] = TritonExecutable(specialize(self.graph, shapes), device=self.device,
                                                       **self._options)
            inner = self._variants[key]
            outputs = inner.run(feeds, keep=keep)
            self.steps, self.fallback_nodes = inner.steps, inner.fallback_nodes
            self.transfers, self.transfer_bytes = inner.transfers, inner.transfer_bytes
            return outputs
        for step in self.steps:
            args = [self._arg(step, v, buffers) for v in step.ins]
            try:
                results = step.run(args)
            except TilefoldError:
                raise
            except Exception as exc:
                raise TilefoldError(f"{where(step.group.anchor)} failed at run time: {type(exc).__name__}: "
                                    f"{' '.join(str(exc).split())[:300]}") from exc
            for v, r in zip(step.outs, results):
                buffers[v] = r
            if keep is not None:
                keep.update(buffers)
                keep.update({v: self._device_consts[v] for v in step.ins if v in self._device_consts})
            for v in step.frees:
                buffers.pop(v, None)
        outputs = {}
        for name, v in self._outputs:
            t = self.graph.type_of(v)
            if v in self._consts:
                array = np.array(as_array(self._consts[v]))
            else:
                array = np.array(self._host(buffers[v]))
            if t.encoding is not None:
                array = unpack(array, t.encoding, tuple(int(d) for d in t.shape))
            outputs[name] = array
        return outputs

    def _bind(self, feeds: Mapping[str, Any]) -> dict[Value, Any]:
        """Check the inputs (one-line InputErrors) and bind them to their values."""
        from ..numpy.executor import check_input

        unknown = sorted(set(feeds) - set(self._inputs))
        if unknown:
            raise InputError(f"unknown input name {unknown[0]!r}; the model's inputs are {sorted(self._inputs)}")
        buffers: dict[Value, Any] = {}
        symbols: dict[str, int] = {}
        types = self.graph.input_types()
        for name, value in self._inputs.items():
            if name not in feeds:
                raise InputError(f"missing input {name!r}; the model's inputs are {sorted(self._inputs)}")
            x = feeds[name]
            is_tensor = hasattr(x, "detach")
            x = x.detach() if is_tensor else np.asarray(x)
            check_input(name, _Meta(tuple(x.shape), _numpy_dtype(x.dtype)) if is_tensor else x, types[name], symbols)
            buffers[value] = x
        return buffers

    def _arg(self, step: Step, v: Value, buffers: dict[Value, Any]) -> Any:
        if v in self._consts:
            if step.plan is None:
                return as_array(self._consts[v])
            return self._device_consts[v]
        x = buffers[v]
        if step.plan is not None:
            x = buffers[v] = self._device(x)
        return x


def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


@dataclass
class _Meta:
    """Shape and dtype of a torch tensor, for input checks that must not copy it to the host."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _numpy_dtype(dtype: Any) -> np.dtype:
    import torch

    return torch.empty(0, dtype=dtype).numpy().dtype
