"""Runs a placed Graph with generated Triton kernels on one or several Triton devices, falling
back per node to the NumPy backend.

Compiling groups the nodes into kernels (fusion.py), generates and builds each kernel
(templates, codegen.py) with its launch configuration (launch.py, verified first), fixes one
schedule (a step per kernel group, view, transfer or NumPy node) and plans the memory of that
schedule (plan.plan_memory).

Devices. Every step runs where its nodes are placed (`node.device`; a node without one on the
executable's `device`): on a Triton device (`interp[:N]`, `cuda[:N]`) its generated kernel,
on `cpu` the NumPy kernel. One executable runs all the devices of a graph, rather than one
executable per device and a runner between them: a placement goes back and forth (a, then b,
then a again), so per-device executables would need the graph cut into segments, each with
its own inputs and outputs, and a runner to order them and hand values over. With one schedule
and a device per step, the `Transfer` nodes that device assignment inserted are the only place
where a value moves between Triton devices (reading another Triton device's buffer without one
is refused at compile time), and each device still has its own arena and its own constants.

Memory, per Triton device:
- one arena, a torch uint8 tensor of the plan's `arena_bytes` on that device, allocated at
  compile time; every buffer a step writes there is a typed view at its planned offset, sized
  from its encoding (padding included). The plan follows this executable's schedule (a fused
  group reads its operands and writes its result at one step) and its views, so lifetimes are
  what the kernels really do. The arena is reused by every run: outputs handed back are copies;
- a kernel writes one result buffer, or one per output of its node (a Split: the template's
  `results`), then one per value its group `writes` besides (a shared prologue's result),
  each passed in its pointer slot; a padded packed result is filled with its pad
  value (zero where the padding is unknown) before the kernel writes, so the kernels write
  logical elements only;
- a template's `prefill` (a scatter's data) is copied into its result buffer on the device
  before each launch, and the kernel changes only some elements of it;
- a view (a plain reshape) is its source's buffer relabelled, as the plan aliases it;
- constants move to their device once, at compile time, outside the arena, and are never
  written; graph inputs belong to the caller and move to a device on first use (counted);
- a kernel's flags (codegen.Flag: a lookup sets its flag for an index out of range) are one
  int32 tensor per device, zeroed before each run and read after it (one small copy to the
  host per device, not counted as a transfer): a set flag is the NumPy backend's error;
- a kernel's tables (codegen.Table: lookup arrays a template works out at generation time, a
  Resize's source rows and weights) move to its device once, at compile time, outside the
  arena, and are never written; they are its step's (`Step.tables`), not graph Values, so the
  schedule and the memory plan never see them, and each launch passes them in their slots;
- the plan gives every computed value a buffer, also those never materialized: a fused group's
  intermediate results (kept in registers), shapes known at compile time, unread extra
  outputs. Nobody writes those bytes; each lives within its own step, so at worst the arena is
  a little larger than needed;
- `check_arena` recounts, from the steps alone, which buffers are live at each step and checks
  that no two of them share arena bytes (a debug check the tests run).

Launching. The first run goes step by step and is recorded; later runs replay the record
(replay.py): on a GPU each stretch of consecutive kernels is one captured CUDA graph, and the
steps between them (host nodes, transfers) run as they are. `replay=False`, a schedule over
several Triton devices, or `keep` (autotuning) runs step by step; `launch_path` says which.

An executable runs one call at a time (its arenas and its record are shared by every call).

Host steps (nodes placed on `cpu`, transfers to `cpu`) keep NumPy allocation: NumPy kernels
return fresh arrays rather than writing into a given buffer, so planning them would only add a
copy (the host's plan is reported, not used). A node on a Triton device that no template runs
falls back to the NumPy backend: its operands are copied to the host and its results into
their planned buffers, each move an explicit, counted transfer (`transfers`, `transfer_bytes`),
as is each `Transfer` node. A node with a result or an operand whose shape is known only at
run time (NonZero's count, TopK's K from a tensor), even with the inputs' shapes fixed, has no
buffer a plan could size: unplaced, it runs on the host the same way (its operands copied
there, counted; its results stay there); placed on a Triton device, it is a one-line error.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ...graph.errors import InputError, TilefoldError, VerifyError, where
from ...graph.graph import CONSTANT, INPUT, Graph, Node
from ...graph.types import Splat, TensorType, Value, as_array
from ...layout.encoding import unpack
from ..devices import HOST, parse_device
from ..plan import MemoryPlan, plan_memory
from . import codegen
from .fusion import Fusion, Group
from .indexing import physical_shape
from .launch import config as launch_config, kernel_groups, verify_launch
from .listing import KernelListing, ListedKernel
from .replay import Record, Segment, why_not
from .specialize import specialize
from .templates import TEMPLATES, static_result


@dataclass
class Step:
    """One step of the schedule: `run(args)` gives the values `outs` from the values `ins`,
    on `device` (a Triton device's name, or `cpu`: NumPy on the host). `buffers` holds the
    planned arena view of each of `outs` (None where it is not in an arena: host values, views,
    values known at compile time); `tables` the device copy of each of the kernel's tables."""

    group: Group
    run: Callable[..., list[Any]]
    ins: list[Value]
    outs: list[Value]
    frees: list[Value] = field(default_factory=list)
    plan: codegen.KernelPlan | None = None
    device: str = HOST
    buffers: list[Any] = field(default_factory=list)
    tables: list[Any] = field(default_factory=list)


def kernel_name(group: Group) -> str:
    """`k_` and the group's first ops from its anchor on (`k_MatMul_Add_Gelu`): named by what it
    computes, not by its nodes, so that identical kernels of different nodes are one source
    (codegen.build)."""
    ops = [n.op for n in group.nodes[group.head:]]
    names = "_".join(ops[:3]) + ("_etc" if len(ops) > 3 else "")
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
        name, group.kind, [n.name for n in nodes], source, list(params), template.results(nodes) + group.writes,
        grid=lambda cfg: template.grid(graph, nodes, cfg), constexprs=template.constexprs,
        config=launch_config(graph, group))


def kernel_plans(graph: Graph, *, fuse: bool | Fusion = True,
                 shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[codegen.KernelPlan]:
    """Every kernel the graph runs, in launch order; `shapes` (input name -> shape)
    specializes a graph with symbolic dims first."""
    if shapes is not None:
        graph = specialize(graph, shapes)
    return [plan_group(graph, g) for g in kernel_groups(graph, fuse) if g.kind in TEMPLATES]


def kernel_sources(graph: Graph, *, fuse: bool | Fusion = True,
                   shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[tuple[list[str], str]]:
    """(node names, generated source) of every kernel the graph runs, in launch order."""
    return [(plan.nodes, plan.source) for plan in kernel_plans(graph, fuse=fuse, shapes=shapes)]


def kernel_listing(graph: Graph, *, fuse: bool | Fusion = True,
                   shapes: Mapping[str, tuple[int, ...]] | None = None) -> KernelListing:
    """Every kernel the graph runs with its nodes, template, launch configuration and source;
    a configuration the executor would refuse raises VerifyError here too."""
    if shapes is not None:
        graph = specialize(graph, shapes)
    verify_launch(graph, fuse)
    return KernelListing([ListedKernel(plan.nodes, plan.kind, dict(plan.config), plan.source)
                          for plan in kernel_plans(graph, fuse=fuse)])


DEVICE_NOTES = {
    "cuda": "generated Triton kernels on the GPU",
    "interp": "Triton's interpreter on the CPU: for testing the GPU path without a GPU (slow; small shapes)",
}
"""What each device is, for the CLI and reports to say."""


def _schedule(groups: list[Group]) -> tuple[list[list[str]], set[str]]:
    return [group.names for group in groups], {group.anchor.name for group in groups if group.kind == "view"}


def executor_memory(graph: Graph, dims: Mapping[str, int] | None = None, fuse: bool | Fusion = True) -> MemoryPlan:
    """The memory plan a TritonExecutable of this placed graph allocates: planned with its
    schedule (a fused kernel group reads and writes at one step) and its views, which the
    graph-order plan (`plan_memory(graph)`) does not know about."""
    schedule, views = _schedule(kernel_groups(graph, fuse))
    return plan_memory(graph, dims, schedule=schedule, views=views)


@dataclass
class TritonDevice:
    """One Triton device of an executable: its canonical name, kind ("cuda" or "interp"),
    torch device (the host's for `interp`) and arena."""

    name: str
    kind: str
    torch_device: Any
    arena: Any = None
    flags: list[codegen.Flag] = field(default_factory=list)
    flag_words: Any = None  # an int32 tensor, one word per flag, allocated after the kernels are built

    def launching(self) -> contextlib.AbstractContextManager:
        """Triton launches on the current CUDA device: make it this one."""
        import torch

        return torch.cuda.device(self.torch_device) if self.kind == "cuda" else contextlib.nullcontext()


def triton_device(name: str) -> TritonDevice:
    """The Triton device named `name` ("interp", "interp:1", "cuda", "cuda:1"); one-line errors
    for a name the Triton backend does not run and for a GPU that is not there."""
    import torch

    kind = name.split(":")[0]
    if kind not in codegen.DEVICES:
        raise TilefoldError(f"unknown Triton device {name!r}: expected 'cuda', 'cuda:N', 'interp' or 'interp:N'")
    device = parse_device(name)
    if kind == "cuda" and not device.present:
        if not torch.cuda.is_available():
            raise TilefoldError(f"device {name!r} is not available here (no CUDA GPU); use device='interp' to run "
                                "the Triton kernels with the interpreter on the CPU")
        raise TilefoldError(f"device {name!r} is not available here ({torch.cuda.device_count()} CUDA GPU(s))")
    torch_device = torch.device("cpu") if kind == "interp" else torch.device("cuda", device.index)
    return TritonDevice(device.name, kind, torch_device)


class TritonExecutable:
    """A graph compiled for the Triton backend; call it with a dict of named inputs (numpy
    arrays or torch tensors); returns a dict of named numpy arrays.

    `device`: where nodes without a device run: "cuda" (or "cuda:N") runs JIT-compiled kernels
    on the GPU; "interp" (or "interp:N") runs the same kernels with Triton's interpreter on the
    CPU, for testing without a GPU (slow: small shapes only). Nodes placed on other Triton
    devices run there, nodes placed on `cpu` on the NumPy backend. `fuse=False` gives every node
    its own kernel, a `Fusion` turns some fusions off. `memory`: a memory plan to use instead
    of planning one (for tests and debugging: it must plan this graph's schedule, `schedule`
    and `views`)."""

    def __init__(self, graph: Graph, *, device: str = "cuda", fuse: bool | Fusion = True, verify: bool = True,
                 allow_fallback: bool = True, memory: MemoryPlan | None = None, replay: bool = True) -> None:
        self.graph = graph
        default = triton_device(device)
        self.device = default.name
        self.kind = default.kind
        self.torch_device = default.torch_device
        self.devices: dict[str, TritonDevice] = {default.name: default}
        self.note = DEVICE_NOTES[self.kind]
        self.fallback_nodes: list[str] = []
        self.transfers = 0
        self.transfer_bytes = 0
        self._consts: dict[Value, Any] = {}
        self._device_consts: dict[tuple[str, Value], Any] = {}
        self._inputs: dict[str, Value] = {name: Value(name) for name in graph.inputs}
        self._outputs: list[tuple[str, Value]] = []
        self.steps: list[Step] = []
        self.schedule: list[list[str]] = []
        self.views: set[str] = set()
        self.memory: MemoryPlan | None = None
        self._options = {"fuse": fuse, "verify": verify, "allow_fallback": allow_fallback, "replay": replay}
        self._record: Record | None = None
        self.replay_blocked: str | None = None if replay else "replay=False"
        self._variants: dict[tuple, TritonExecutable] | None = None
        if not all(t.is_static for t in graph.input_types().values()):
            self._variants = {}  # symbolic dims: one specialization (and plan) per set of input shapes
            return
        if verify:
            verify_launch(graph, fuse)
        self._compile(fuse, allow_fallback, memory)

    @property
    def arenas(self) -> dict[str, Any]:
        """Each Triton device's arena (a torch uint8 tensor), by device name."""
        return {name: d.arena for name, d in self.devices.items() if d.arena is not None}

    # ---- compile ---------------------------------------------------------------------------------
    def _compile(self, fuse: bool | Fusion, allow_fallback: bool, memory: MemoryPlan | None) -> None:
        import torch

        g = self.graph
        for node in g.nodes():
            if node.op == CONSTANT:
                self._consts[Value(node.name)] = node.attrs["value"]
            elif node.op == INPUT:
                self._inputs[node.name] = Value(node.name)
        self._outputs = list(zip(g.output_names(), g.output_values()))  # as declared, not as run
        groups = kernel_groups(g, fuse)
        where_run = {group.output.node: self._group_device(group) for group in groups}
        self.schedule, self.views = _schedule(groups)
        self.memory = memory or plan_memory(self._placed(groups, where_run), schedule=self.schedule,
                                            views=self.views)
        planned = {b.value: b for name, p in self.memory.devices.items() if name in self.devices for b in p.buffers}
        for name, device in self.devices.items():
            nbytes = self.memory.devices[name].arena_bytes if name in self.memory.devices else 0
            device.arena = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device)
        home: dict[Value, str] = {}
        for group in groups:
            step = self._step(group, where_run[group.output.node], allow_fallback, planned)
            self._check_reads(step, home)
            for v in step.outs:
                home[v] = step.device if step.group.kind not in ("static",) else HOST
            self.steps.append(step)
        for device in self.devices.values():
            if device.flags:
                device.flag_words = torch.zeros(len(device.flags), dtype=torch.int32, device=device.torch_device)
        if len(self.devices) > 1:
            self.note = "; ".join(f"{', '.join(n for n, d in self.devices.items() if d.kind == kind)}: "
                                  f"{DEVICE_NOTES[kind]}" for kind in sorted({d.kind for d in self.devices.values()}))
        last: dict[Value, int] = {}
        for i, step in enumerate(self.steps):
            for v in step.ins:
                last[v] = i
        keep = set(self._consts) | {v for _, v in self._outputs}
        for v, i in last.items():
            if v not in keep:
                self.steps[i].frees.append(v)
        self.replay_blocked = self.replay_blocked or why_not(self.devices)

    @property
    def launch_path(self) -> str:
        """How a run launches its kernels (replay.py): one CUDA graph, recorded launches, or
        step by step and why."""
        if self.replay_blocked is not None:
            return f"step by step ({self.replay_blocked})"
        if self._record is None:
            return "step by step on the first run, which is recorded for the later runs"
        return self._record.describe()

    def _node_device(self, node: Node) -> str:
        """Where a node runs: `cpu` (the host), or a Triton device (registered on first use)."""
        name = _placement(node)
        if name is None:
            return self.device
        if name == HOST:
            return HOST
        try:
            device = triton_device(name)
        except TilefoldError as exc:
            raise TilefoldError(f"{where(node)} is placed on {name!r}: {exc}") from None
        self.devices.setdefault(device.name, device)
        return device.name

    def _group_device(self, group: Group) -> str:
        """Where a group runs: its nodes' device, but the host for a node of a shape known only at
        run time (a Triton device's buffers are planned at compile time) that no one placed."""
        devices = {self._node_device(n) for n in group.nodes}
        if len(devices) > 1:
            raise TilefoldError(f"{where(group.anchor)}: one kernel's nodes are placed on {sorted(devices)}; "
                                "place them on one device or put a Transfer between them")
        device = devices.pop()
        dynamic = None if device == HOST else _dynamic(self.graph, group)
        if dynamic is None:
            return device
        node, what = dynamic
        if _placement(node) is not None:
            raise TilefoldError(f"{where(node)} is placed on {device!r}, but its {what} has a shape known only at "
                                f"run time; a Triton device needs static shapes: place it on {HOST!r}")
        return HOST

    def _placed(self, groups: list[Group], where_run: dict[str, str]) -> Graph:
        """A copy of the graph with every compute node on the device it runs on, for planning."""
        placed = self.graph.copy()
        for group in groups:
            for node in group.nodes:
                placed.node(node.name).device = where_run[group.output.node]
        return placed

    def _check_reads(self, step: Step, home: Mapping[Value, str]) -> None:
        """A step on a Triton device reads no other Triton device's buffer: that takes a Transfer
        (host steps may read device buffers: each read is a counted copy to the host)."""
        if step.device == HOST or step.group.anchor.op == "Transfer":
            return
        for v in step.ins:
            other = home.get(v, HOST)
            if other not in (HOST, step.device):
                raise TilefoldError(f"{where(step.group.anchor)} on {step.device} reads "
                                    f"{self.graph.value_name(v)} from {other} without a Transfer")

    def _buffer(self, value: Value, device: str, planned: Mapping[Value, Any]) -> Any:
        """The planned arena view holding `value` on `device`, typed and shaped by its encoding."""
        import torch

        t = self.graph.type_of(value)
        shape = physical_shape(t)
        dtype = _torch_dtype(t.dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * t.dtype.itemsize
        buf = planned.get(value)
        arena = self.devices[device].arena
        if buf is None or buf.device != device or buf.nbytes != nbytes or buf.offset + nbytes > arena.numel():
            raise TilefoldError(f"the memory plan has no buffer of {nbytes} bytes for "
                                f"{self.graph.value_name(value)} on {device} (a plan for another schedule?)")
        return arena[buf.offset:buf.offset + nbytes].view(dtype).view(shape) if nbytes else \
            torch.empty(shape, dtype=dtype, device=arena.device)

    def _step(self, group: Group, device: str, allow_fallback: bool, planned: Mapping[Value, Any]) -> Step:
        g = self.graph
        node = group.anchor
        if group.kind in TEMPLATES:
            return self._kernel_step(group, device, planned)
        inputs = [v for v in g.inputs_of(node.name)]
        if group.kind == "view":
            shape = physical_shape(node.outputs[0])
            return Step(group, lambda args: [self._to_device(args[0], device).reshape(shape)], [inputs[0]],
                        [Value(node.name)], device=device, buffers=[None])
        if group.kind == "static":
            value = static_result(g, node)
            return Step(group, lambda args: [value], [], [Value(node.name)], device=device, buffers=[None])
        if group.kind == "transfer":
            if device == HOST:
                return Step(group, lambda args: [self._host(args[0])], [inputs[0]], [Value(node.name)],
                            device=HOST, buffers=[None])
            out = self._buffer(Value(node.name), device, planned)

            def move(args: list[Any]) -> list[Any]:
                return [self._count(_write(out, args[0]))]

            return Step(group, move, [inputs[0]], [Value(node.name)], device=device, buffers=[out])
        return self._numpy_step(group, inputs, device, allow_fallback, planned)

    def _kernel_step(self, group: Group, device: str, planned: Mapping[Value, Any]) -> Step:
        """A generated kernel's step: its planned result buffers (one per `plan.outputs`, in
        the order of the kernel's result pointers), each padded packed one filled before a launch,
        the first a copy of the template's `prefill` operand where it names one (a scatter's data)."""
        plan = plan_group(self.graph, group)
        source = TEMPLATES[group.kind].prefill(self.graph, group.nodes)
        copied = None if source is None else plan.inputs.index(source)
        target = self.devices[device]
        kernel = codegen.build(plan.source, plan.name, target.kind)
        outs = [self._buffer(v, device, planned) for v in plan.outputs]
        pads = [(out, _pad_value(self.graph.type_of(v))) for out, v in zip(outs, plan.outputs)]
        pads = [(out, pad) for out, pad in pads if pad is not None]
        cfg = plan.config
        grid, consts = plan.grid(cfg), plan.constexprs(cfg)
        warps, stages = int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 2))
        tables = [_from_numpy(t.array).to(target.torch_device) for t in plan.tables]
        first_flag = len(target.flags)
        target.flags.extend(plan.flags)
        flag_slots = range(first_flag, len(target.flags))

        empty = all(out.numel() == 0 for out in outs)  # nothing to write (a reduction kept a dim of 0)

        def run(args: list[Any], cfg: dict[str, Any] | None = None) -> list[Any]:
            if empty:
                return list(outs)
            for out, pad in pads:
                out.fill_(pad)  # the arena holds an earlier buffer's bytes: the padding must be the pad value
            if copied is not None:
                outs[0].copy_(args[copied].reshape(outs[0].shape))
            flags = [target.flag_words[k:k + 1] for k in flag_slots]
            pointers = [*plan.arguments(args, tables, flags), *outs]
            with target.launching():
                if cfg is None:
                    codegen.launch(kernel, target.kind, grid, pointers, consts, warps, stages)
                else:
                    codegen.launch(kernel, target.kind, plan.grid(cfg), pointers, plan.constexprs(cfg),
                                   int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 2)))
            return list(outs)

        for v in plan.inputs:
            self._device_const(v, device)
        return Step(group, run, plan.inputs, plan.outputs, plan=plan, device=device, buffers=outs, tables=tables)

    def _numpy_step(self, group: Group, inputs: list[Value | None], device: str, allow_fallback: bool,
                    planned: Mapping[Value, Any]) -> Step:
        """A node on the NumPy backend: on the host its results stay NumPy arrays (fresh ones);
        on a Triton device those that something reads are copied into their planned buffers
        (TopK's unread indices are not moved)."""
        from ..numpy.executor import node_kernel

        node = group.anchor
        _, _, kernel = node_kernel(self.graph, node, inputs, allow_fallback=allow_fallback)
        self.fallback_nodes.append(node.name)
        present = [v for v in inputs if v is not None]
        outs = [Value(node.name, k) for k in range(len(node.outputs))]
        buffers = [None if device == HOST else self._buffer(v, device, planned) for v in outs]
        wanted = [bool(self.graph.users(v)) for v in outs]

        def run(args: list[Any]) -> list[Any]:
            it = iter(self._host(a) for a in args)
            full = [None if v is None else next(it) for v in inputs]
            with np.errstate(all="ignore"):
                result = kernel(*full)
            results = list(result) if isinstance(result, tuple) else [result]
            if device == HOST:
                return results
            return [self._count(_write(buf, r)) if read else None for buf, r, read in zip(buffers, results, wanted)]

        return Step(group, run, present, outs, device=device, buffers=buffers)

    # ---- moves ---------------------------------------------------------------------------------
    def _device_const(self, v: Value, device: str) -> None:
        if v in self._consts and (device, v) not in self._device_consts:
            value = self._consts[v]
            t = self.graph.type_of(v)
            array = np.full(physical_shape(t), value.value, dtype=value.dtype) if isinstance(value, Splat) \
                else np.ascontiguousarray(value)
            self._device_consts[device, v] = _from_numpy(array.copy()).to(self.devices[device].torch_device)

    def _to_device(self, x: Any, device: str) -> Any:
        """`x` on `device`: as it is when it is there already, else moved (a counted transfer)."""
        target = self.devices[device].torch_device
        if _is_tensor(x):
            return x if x.device == target else self._count(x.to(target))
        return self._count(_from_numpy(np.asarray(x)).to(target))

    def _host(self, x: Any) -> np.ndarray:
        """`x` in host memory, never a view of an arena (a counted transfer for a torch tensor)."""
        if _is_tensor(x):
            return _to_numpy(self._count(x.detach()).to("cpu", copy=True))
        return x

    def _count(self, x: Any) -> Any:
        """Count `x` (a tensor or an array) as one transfer of its bytes."""
        self.transfers += 1
        self.transfer_bytes += int(x.numel()) * int(x.element_size()) if _is_tensor(x) else int(np.asarray(x).nbytes)
        return x

    # ---- run -----------------------------------------------------------------------------------
    def __call__(self, feeds: Mapping[str, Any] | None = None, /, **kwargs: Any) -> dict[str, np.ndarray]:
        return self.run({**(feeds or {}), **kwargs})

    def run(self, feeds: Mapping[str, Any], *, keep: dict[Value, Any] | None = None,
            tensors: bool = False) -> dict[str, Any]:
        """Run once; the outputs as NumPy arrays, or with `tensors` as torch tensors on the
        executable's device (what the torch.compile backend hands back). `keep`, when given,
        receives every buffer (for autotuning and tests: arena views, overwritten as the plan
        reuses their bytes) and runs step by step. Without it, a replayable executable records
        its first run and replays the record after (replay.py)."""
        buffers = self._bind(feeds)
        if self._variants is not None:
            key = tuple(tuple(buffers[v].shape) for v in self._inputs.values())
            if key not in self._variants:
                shapes = {name: tuple(buffers[v].shape) for name, v in self._inputs.items()}
                self._variants[key] = TritonExecutable(specialize(self.graph, shapes), device=self.device,
                                                       **self._options)
            inner = self._variants[key]
            outputs = inner.run(feeds, keep=keep, tensors=tensors)
            self.steps, self.fallback_nodes = inner.steps, inner.fallback_nodes
            self.schedule, self.views, self.memory, self.devices = inner.schedule, inner.views, inner.memory, inner.devices
            self.transfers, self.transfer_bytes = inner.transfers, inner.transfer_bytes
            self.replay_blocked, self._record = inner.replay_blocked, inner._record
            return outputs
        record = None
        if keep is None and self.replay_blocked is None:
            if self._record is not None:
                return self._replay(self._record, buffers, tensors)
            (device,) = self.devices.values()
            record = Record(device)
            record.start(list(self._inputs.values()))
        self._execute(buffers, keep, record)
        self._check_flags()
        outputs = self._collect(buffers, tensors)
        if record is not None:
            record.finish()
            self._record = record
        return outputs

    def _execute(self, buffers: dict[Value, Any], keep: dict[Value, Any] | None, record: Record | None) -> None:
        """Every step in schedule order on `buffers` (the bound inputs; results are added, freed
        values dropped); `record`, when given, records the run (replay.py)."""
        moved: dict[tuple[Value, str], Any] = {}
        self._zero_flags()
        for step in self.steps:
            if record is not None and _reads_device_copies(step):
                for v in step.ins:
                    if record.per_run(v) and (v, step.device) not in moved:
                        moved[v, step.device] = self._fill(self._new_buffer(buffers[v], step.device), buffers[v])
                        record.fill(v, moved[v, step.device])
            args = [self._arg(step, v, buffers, moved) for v in step.ins]
            results = self._run_step(step, args)
            if record is not None:
                if step.plan is not None:
                    record.launch(step, args)
                if step.plan is not None or step.group.kind in ("view", "static"):
                    record.fixed.update(zip(step.outs, results))
                else:
                    record.rerun(step, host=step.device == HOST)
            for v, r in zip(step.outs, results):
                buffers[v] = r
            if keep is not None:
                keep.update(buffers)
                keep.update(zip(step.ins, args))  # what the step read: device copies of inputs and constants
            for v in step.frees:
                buffers.pop(v, None)
                for device in self.devices:
                    moved.pop((v, device), None)

    def _replay(self, record: Record, buffers: dict[Value, Any], tensors: bool) -> dict[str, Any]:
        """A run through the record of the first: fills, segments and reruns in order."""
        self._zero_flags()
        buffers.update(record.fixed)
        for fill in record.head:
            self._fill(fill.buffer, buffers[fill.value])
        for item in record.items:
            if isinstance(item, Segment):
                item.replay()
                continue
            step = item.step
            results = self._run_step(step, [self._arg(step, v, buffers, {}) for v in step.ins])
            buffers.update(zip(step.outs, results))
            for fill in item.fills:
                self._fill(fill.buffer, buffers[fill.value])
        self._check_flags()
        return self._collect(buffers, tensors)

    def _run_step(self, step: Step, args: list[Any]) -> list[Any]:
        try:
            return step.run(args)
        except TilefoldError:
            raise
        except Exception as exc:
            raise TilefoldError(f"{where(step.group.anchor)} failed at run time: {type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:300]}") from exc

    def _collect(self, buffers: Mapping[Value, Any], tensors: bool = False) -> dict[str, Any]:
        """The named outputs, unpacked, as host arrays or (`tensors`) as tensors on the
        executable's device; copies either way, since the arena is reused by the next run."""
        outputs = {}
        for name, v in self._outputs:
            t = self.graph.type_of(v)
            x = self._consts[v] if v in self._consts else buffers[v]
            if tensors and _is_tensor(x) and t.encoding is None:
                moved = self._to_device(x, self.device)
                outputs[name] = moved.clone() if moved is x else moved
                continue
            array = np.array(as_array(x)) if v in self._consts else self._host(x) if _is_tensor(x) else np.array(x)
            if t.encoding is not None:
                array = unpack(array, t.encoding, tuple(int(d) for d in t.shape))
            outputs[name] = self._to_device(array, self.device) if tensors else array
        return outputs

    def _zero_flags(self) -> None:
        for device in self.devices.values():
            if device.flag_words is not None:
                device.flag_words.zero_()

    def _check_flags(self) -> None:
        """The NumPy backend's error for the first lookup (in schedule order) that met an index
        out of range during the run."""
        for device in self.devices.values():
            if device.flag_words is None:
                continue
            words = device.flag_words.cpu().numpy()
            for flag, word in zip(device.flags, words):
                if word:
                    raise InputError(f"{flag.what}: an index is out of range [-{flag.size}, {flag.size - 1}] "
                                     f"(found on {device.name} after the run)")

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
            x = x.detach().contiguous() if is_tensor else np.asarray(x)  # kernels address dense buffers
            check_input(name, _Meta(tuple(x.shape), _numpy_dtype(x.dtype)) if is_tensor else x, types[name], symbols)
            buffers[value] = x
        return buffers

    def _new_buffer(self, x: Any, device: str) -> Any:
        """An empty contiguous buffer on `device` for a copy of `x` (a tensor or an array)."""
        import torch

        dtype = x.dtype if _is_tensor(x) else _torch_dtype(np.asarray(x).dtype)
        return torch.empty(tuple(x.shape), dtype=dtype, device=self.devices[device].torch_device)

    def _fill(self, buffer: Any, x: Any) -> Any:
        """Copy `x` into `buffer` (a counted transfer where `x` is on another device); returns it."""
        if not (_is_tensor(x) and x.device == buffer.device):
            self._count(x)
        return _write(buffer, x)

    def _arg(self, step: Step, v: Value, buffers: dict[Value, Any], moved: dict[tuple[Value, str], Any]) -> Any:
        if v in self._consts:
            if step.plan is None:
                return as_array(self._consts[v])
            return self._device_consts[step.device, v]
        x = buffers[v]
        if not _reads_device_copies(step):
            return x
        if (v, step.device) not in moved:  # a host value a kernel reads: moved once per device and run
            moved[v, step.device] = self._to_device(x, step.device)
        return moved[v, step.device]


def _reads_device_copies(step: Step) -> bool:
    """Whether a step reads its operands on its Triton device (a kernel, a view), where host
    values are moved to it once per run."""
    return step.device != HOST and (step.plan is not None or step.group.kind == "view")


def _pad_value(t: TensorType) -> float | None:
    """What a kernel's result buffer is filled with before the launch: the pad value (zero
    where the padding is unknown) of a padded packed result; None for every other."""
    enc = t.encoding
    if enc is None or not enc.is_padded(tuple(int(d) for d in t.shape)):
        return None
    return enc.pad if enc.pad is not None else 0


def _placement(node: Node) -> str | None:
    """The device a node was placed on (a Transfer: its target), None where it was not."""
    return node.attrs.get("target") if node.op == "Transfer" else node.device


def _dynamic(graph: Graph, group: Group) -> tuple[Node, str] | None:
    """The first node of `group` with a result or an operand of non-static type, and which
    (`result int64[2xunk__0]`), None where every type is static; a shape known at compile time
    (`static`) reads no operand."""
    for node in group.nodes:
        reads = [] if group.kind == "static" else [v for v in graph.inputs_of(node.name) if v is not None]
        values = [(f"result {t}", t) for t in node.outputs] + \
                 [(f"operand {graph.value_name(v)}, {graph.type_of(v)},", graph.type_of(v)) for v in reads]
        for what, t in values:
            if not t.is_static:
                return node, what
    return None


def check_arena(exe: TritonExecutable) -> None:
    """Recount, from the steps alone, which arena buffers are live at each step, and check
    that no two of them share a byte and each lies inside its arena (VerifyError otherwise).

    A buffer is where a step's planned view of its result lies (its address in the arena); it
    is live from the step that writes it to the last step that reads it or a view of it
    (graph outputs to the end). Independent of the plan's own lifetimes and offsets."""
    region: dict[Value, tuple[str, int, int]] = {}
    root: dict[Value, Value] = {}
    span: dict[Value, list[int]] = {}
    for i, step in enumerate(exe.steps):
        for v in step.ins:
            r = root.get(v, v)
            if r in span:
                span[r][1] = i
        if step.group.kind == "view":
            root[step.outs[0]] = root.get(step.ins[0], step.ins[0])
            continue
        for v, buf in zip(step.outs, step.buffers):
            if buf is None or buf.numel() == 0:
                continue
            arena = exe.devices[step.device].arena
            start = buf.data_ptr() - arena.data_ptr()
            stop = start + buf.numel() * buf.element_size()
            if start < 0 or stop > arena.numel():
                raise VerifyError(f"{exe.graph.value_name(v)} at bytes {start}..{stop} lies outside the "
                                  f"{arena.numel()}-byte arena of {step.device}")
            region[v], span[v] = (step.device, start, stop), [i, i]
    for _, v in exe._outputs:
        r = root.get(v, v)
        if r in span:
            span[r][1] = len(exe.steps)
    values = sorted(region, key=lambda v: span[v][0])
    for k, a in enumerate(values):
        device, lo, hi = region[a]
        for b in values[k + 1:]:
            if span[b][0] > span[a][1]:
                break
            other, lo2, hi2 = region[b]
            if other == device and lo < hi2 and lo2 < hi:
                raise VerifyError(f"{exe.graph.value_name(a)} (steps {span[a][0]}..{span[a][1]}, bytes {lo}..{hi}) "
                                  f"and {exe.graph.value_name(b)} (steps {span[b][0]}..{span[b][1]}, bytes "
                                  f"{lo2}..{hi2}) share arena bytes on {device}")


def _is_tensor(x: Any) -> bool:
    """A torch tensor (NumPy 2 arrays have a `device` too, so ask torch)."""
    import torch

    return isinstance(x, torch.Tensor)


def _from_numpy(array: np.ndarray) -> Any:
    """A torch tensor of `array`, copied where it is read-only (a constant's or an input's view:
    torch wants memory it may write)."""
    import torch

    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":  # an ml_dtypes array, which torch does not take: its bits
        return _from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _to_numpy(x: Any) -> np.ndarray:
    """A host torch tensor as an array (bfloat16 as an ml_dtypes array of its bits)."""
    import torch

    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def _write(out: Any, x: Any) -> Any:
    """Copy a torch tensor or an array (any device) into the buffer `out`; returns `out`."""
    source = x if _is_tensor(x) else _from_numpy(np.asarray(x))
    out.copy_(source.reshape(out.shape))
    return out


def _torch_dtype(dtype: np.dtype) -> Any:
    return _from_numpy(np.zeros(0, dtype=dtype)).dtype


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

    return _to_numpy(torch.empty(0, dtype=dtype)).dtype
