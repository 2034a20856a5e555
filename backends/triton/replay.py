"""Replaying a run: the launch path of an executable whose kernels run on one Triton device.

Launching from Python costs more than most of the kernels it launches: on the H200 of the
tenth session, BERT-base's kernels kept the GPU busy 2.05 ms of a 17.5 ms run, about 60-70 us
of host work per launch (argument lists, moves, Triton's argument binding). The buffers a
kernel reads and writes are fixed at compile time (the memory plan's arena, the constants),
except the values that come from the host at each run: graph inputs and the results of steps
on the host. So the first run is recorded (`Record`):
- a **segment** for each stretch of consecutive kernel steps, with their arguments bound;
  on `cuda` each segment is captured as one CUDA graph (one launch per segment; the capture
  stream is torch's current stream, which Triton launches on); on `interp` its launches are
  called in order, which is how the tests check a record on machines without a GPU;
- a **rerun** for each step that is not a kernel: a step on the host, a transfer, a node the
  NumPy backend runs for a Triton device (those write into their planned buffers again);
- a **fill** for each host value a kernel or a view reads: a buffer of its own on the device,
  into which each run copies the value after it is known (the inputs before anything runs);
- views and shapes known at compile time are not replayed: the first run fixed them.

Later runs copy the inputs in and go through the record. A schedule over several Triton
devices runs step by step (`why_not` says so).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...graph.types import Value

if TYPE_CHECKING:
    from .executor import Step, TritonDevice


@dataclass
class Fill:
    """A host value (a graph input, a host step's result) and the device buffer that recorded
    kernels read it from: each run copies the value in."""

    value: Value
    buffer: Any


@dataclass
class Segment:
    """Consecutive kernel launches on one device, arguments bound; `graph` the CUDA graph they
    were captured in (None on `interp`, or where capture failed: `note` says why)."""

    device: TritonDevice
    launches: list[tuple[Step, list[Any]]] = field(default_factory=list)
    graph: Any = None
    note: str = ""

    def replay(self) -> None:
        if self.graph is not None:
            with self.device.launching():
                self.graph.replay()
            return
        for step, args in self.launches:
            step.run(args)

    def capture(self) -> None:
        """On `cuda`: capture the launches into one CUDA graph (after the first run, so every
        kernel is compiled and loaded: capturing cannot load a module). A capture that fails
        leaves the launches replayed one by one, with the error in `note`."""
        if self.device.kind != "cuda":
            return
        import torch

        graph = torch.cuda.CUDAGraph()
        try:
            with self.device.launching(), torch.cuda.graph(graph):
                for step, args in self.launches:
                    step.run(args)
        except Exception as exc:  # noqa: BLE001 - the uncaptured replay is still right, only slower
            self.note = f"not captured as a CUDA graph ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            return
        self.graph = graph


@dataclass
class Rerun:
    """A step that is not a kernel, run again by each replay; then the fills of its results."""

    step: Step
    fills: list[Fill] = field(default_factory=list)


@dataclass
class Record:
    """A recorded run: `head` the fills of the graph inputs, `items` the segments and reruns in
    schedule order, `fixed` the result of every step that is not rerun (kernel results, views,
    shapes known at compile time) as the first run left it."""

    device: TritonDevice
    head: list[Fill] = field(default_factory=list)
    items: list[Segment | Rerun] = field(default_factory=list)
    fixed: dict[Value, Any] = field(default_factory=dict)
    _fills: dict[Value, list[Fill]] = field(default_factory=dict)  # while recording: where a value's fills go

    def start(self, inputs: list[Value]) -> None:
        for v in inputs:
            self._fills[v] = self.head

    def per_run(self, v: Value) -> bool:
        """Whether `v` is a host value that each run computes anew (an input, a host result)."""
        return v in self._fills

    def fill(self, v: Value, buffer: Any) -> None:
        self._fills[v].append(Fill(v, buffer))

    def launch(self, step: Step, args: list[Any]) -> None:
        if not self.items or not isinstance(self.items[-1], Segment):
            self.items.append(Segment(self.device))
        self.items[-1].launches.append((step, args))  # type: ignore[union-attr]

    def rerun(self, step: Step, host: bool) -> None:
        """Record a step each replay runs again; `host`: its results live on the host."""
        item = Rerun(step)
        self.items.append(item)
        if host:
            for v in step.outs:
                self._fills[v] = item.fills

    def finish(self) -> None:
        """Capture each segment (on `cuda`)."""
        self._fills.clear()
        for item in self.items:
            if isinstance(item, Segment):
                item.capture()

    @property
    def segments(self) -> list[Segment]:
        return [item for item in self.items if isinstance(item, Segment)]

    def describe(self) -> str:
        segments = self.segments
        captured = sum(s.graph is not None for s in segments)
        launches = sum(len(s.launches) for s in segments)
        reruns = len(self.items) - len(segments)
        what = (f"{captured} CUDA graph{'s' if captured != 1 else ''} per run" if captured == len(segments) and captured
                else f"{launches} recorded launches in {len(segments)} segment{'s' if len(segments) != 1 else ''}")
        notes = sorted({s.note for s in segments if s.note})
        return what + (f", {reruns} other step{'s' if reruns != 1 else ''} run each time" if reruns else "") + \
            "".join(f"; {note}" for note in notes)


def why_not(devices: dict[str, TritonDevice]) -> str | None:
    """Why a schedule cannot be replayed (None where it can)."""
    if len(devices) != 1:
        return f"its steps run on {len(devices)} Triton devices"
    return None
