"""The memory plan: per device, where each computed buffer lives in one arena, from its
encoding's size (padding included) and its lifetime in the schedule.

A buffer is live from the step that writes it to the last step that reads it (graph outputs
to the end); an executor that runs several nodes in one step (a fused kernel) passes its
schedule, so that lifetimes follow what it really reads and writes when. Views (a reshape of a contiguous buffer, a transfer within host memory) take no
memory of their own: they extend the lifetime of the buffer they view. Offsets are assigned
greedily by size, largest first, each at the lowest address free for its whole lifetime
(the "greedy by size" planner of TFLite's arena; optimal planning is NP-hard and this one
is within a few percent of the live peak on CNNs and transformers). Constants and graph
inputs are not in the arena: constants are read-only, inputs belong to the caller; both are
reported beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from ..graph.errors import InputError
from ..graph.graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from ..graph.ops.tensor import RESHAPES
from ..graph.types import Splat, TensorType, Value
from .devices import HOST

ALIGN = 64
VIEW_OPS = RESHAPES | {"Identity", "Dropout"}
"""Ops whose result can be the input's buffer, relabelled (when the sizes agree)."""


@dataclass(frozen=True)
class Buffer:
    value: Value
    device: str
    nbytes: int
    logical_bytes: int
    start: int
    end: int
    offset: int = -1

    def overlaps_in_time(self, other: Buffer) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass
class DevicePlan:
    device: str
    buffers: list[Buffer] = field(default_factory=list)
    steps: int = 0
    arena_bytes: int = 0
    constant_bytes: int = 0
    input_bytes: int = 0

    def live_bytes(self, step: int) -> int:
        return sum(b.nbytes for b in self.buffers if b.start <= step <= b.end)

    @property
    def peak_live_bytes(self) -> int:
        """The most bytes live at one step: a lower bound for any arena."""
        events: dict[int, int] = {}
        for b in self.buffers:
            events[b.start] = events.get(b.start, 0) + b.nbytes
            events[b.end + 1] = events.get(b.end + 1, 0) - b.nbytes
        live = peak = 0
        for step in sorted(events):
            live += events[step]
            peak = max(peak, live)
        return peak

    @property
    def naive_bytes(self) -> int:
        """Every buffer alive to the end: what a plan without reuse needs."""
        return sum(_aligned(b.nbytes) for b in self.buffers)

    @property
    def padding_bytes(self) -> int:
        return sum(b.nbytes - b.logical_bytes for b in self.buffers)


@dataclass
class MemoryPlan:
    devices: dict[str, DevicePlan]

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {
            name: {
                "arena_bytes": p.arena_bytes, "peak_live_bytes": p.peak_live_bytes,
                "naive_bytes": p.naive_bytes, "padding_bytes": p.padding_bytes,
                "constant_bytes": p.constant_bytes, "input_bytes": p.input_bytes, "buffers": len(p.buffers),
            }
            for name, p in self.devices.items()
        }

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title="memory plan", title_justify="left")
        for column in ("device", "arena", "live peak", "no reuse", "padding", "constants", "buffers"):
            table.add_column(column, justify="left" if column == "device" else "right")
        for name, p in self.devices.items():
            table.add_row(name, *(_human(n) for n in (p.arena_bytes, p.peak_live_bytes, p.naive_bytes,
                                                       p.padding_bytes, p.constant_bytes)), str(len(p.buffers)))
        return table


def plan_memory(graph: Graph, dims: Mapping[str, int] | None = None, *,
                schedule: Sequence[Sequence[str]] | None = None, views: Collection[str] | None = None) -> MemoryPlan:
    """Plan every device's arena; `dims` sizes the graph's symbolic dims (default 1).

    `schedule` gives the steps an executor runs, each a list of node names run together (a
    fused kernel group: its operands are read and its result written at that one step);
    default: every compute node its own step, in topological order. `views` names the nodes
    whose result the executor makes a view of their first operand (default: the `VIEW_OPS`);
    a node is a view only where the sizes and devices agree, and, unless `views` names it (the
    executor checked that its layout leaves every element in place), the encodings."""
    dims = dict(dims or {})
    compute = [n for n in graph.nodes() if n.op not in (INPUT, OUTPUT, CONSTANT)]
    step_of = _steps(compute, schedule)
    steps = len(schedule) if schedule is not None else len(compute)
    plans: dict[str, DevicePlan] = {}

    def plan_for(device: str | None) -> DevicePlan:
        name = device or HOST
        return plans.setdefault(name, DevicePlan(name, steps=steps))

    for node in graph.nodes():
        if node.op == CONSTANT:
            plan_for(node.device).constant_bytes += _stored_bytes(node.attrs["value"])
        elif node.op == INPUT:
            plan_for(node.device).input_bytes += _size(node.outputs[0], dims, node)[0]

    root: dict[Value, Value | None] = {}
    lifetimes: dict[Value, list[int]] = {}
    sizes: dict[Value, tuple[int, int]] = {}
    owner: dict[Value, str | None] = {}
    for node in compute:
        step = step_of[node.name]
        inputs = graph.inputs_of(node.name)
        for value in inputs:
            if value is not None and root.get(value) is not None:
                span = lifetimes[root[value]]  # type: ignore[index]
                span[1] = max(span[1], step)
        for slot, t in enumerate(node.outputs):
            value = Value(node.name, slot)
            size = _size(t, dims, node)
            source = inputs[0] if inputs else None
            is_view = node.op in VIEW_OPS if views is None else node.name in views
            if slot == 0 and is_view and source is not None and _same_buffer(graph, source, t, dims, node,
                                                                               views is not None):
                root[value] = root.get(source)
                continue
            root[value], lifetimes[value], sizes[value], owner[value] = value, [step, step], size, node.device
    for value in graph.output_values():
        if root.get(value) is not None:
            lifetimes[root[value]][1] = steps  # type: ignore[index]

    for value, (first, last) in lifetimes.items():
        nbytes, logical = sizes[value]
        plan_for(owner[value]).buffers.append(Buffer(value, owner[value] or HOST, nbytes, logical, first, last))
    for plan in plans.values():
        plan.buffers, plan.arena_bytes = _place(plan.buffers)
    return MemoryPlan(dict(sorted(plans.items())))


def _steps(compute: list[Node], schedule: Sequence[Sequence[str]] | None) -> dict[str, int]:
    """The step that runs each compute node; a schedule must run each exactly once, in an
    order where every node comes after its operands' producers (not checked here)."""
    if schedule is None:
        return {node.name: step for step, node in enumerate(compute)}
    step_of: dict[str, int] = {}
    for step, names in enumerate(schedule):
        for name in names:
            if name in step_of:
                raise InputError(f"schedule runs node {name!r} twice (steps {step_of[name]} and {step})")
            step_of[name] = step
    missing = [n.name for n in compute if n.name not in step_of]
    if missing:
        raise InputError(f"schedule never runs node {missing[0]!r} ({len(missing)} compute node(s) missing)")
    return step_of


def _same_buffer(graph: Graph, source: Value, t: TensorType, dims: Mapping[str, int], node: Node,
                 checked: bool) -> bool:
    """Whether `node`'s result can be `source`'s buffer: same device and size, and the same
    encoding unless the caller `checked` the layouts element by element."""
    producer = graph.node(source.node)
    source_type = producer.outputs[source.slot]
    return (producer.device == node.device and (checked or source_type.encoding == t.encoding)
            and _size(source_type, dims, producer) == _size(t, dims, node))


def _place(buffers: list[Buffer]) -> tuple[list[Buffer], int]:
    """Greedy by size: largest first, each at the lowest offset free during its lifetime."""
    placed: list[Buffer] = []
    arena = 0
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.start)):
        need = _aligned(b.nbytes)
        busy = sorted((p.offset, p.offset + _aligned(p.nbytes)) for p in placed if p.overlaps_in_time(b))
        offset = 0
        for lo, hi in busy:
            if offset + need <= lo:
                break
            offset = max(offset, hi)
        placed.append(replace(b, offset=offset))
        arena = max(arena, offset + need)
    placed.sort(key=lambda b: (b.start, b.offset))
    return placed, arena


def _size(t: TensorType, dims: Mapping[str, int], node: Node) -> tuple[int, int]:
    shape = []
    for d in t.shape:
        if isinstance(d, str):
            d = dims.get(d, 1)
        shape.append(int(d))
    static = TensorType(tuple(shape), t.dtype, t.encoding)
    logical = int(np.prod(shape, dtype=np.int64)) * t.dtype.itemsize
    total = static.nbytes()
    if total is None:
        raise InputError(f"cannot size {node.name!r}: shape {t.shape} is not static")
    return total, logical


def _stored_bytes(value: Any) -> int:
    return value.dtype.itemsize if isinstance(value, Splat) else int(value.nbytes)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
