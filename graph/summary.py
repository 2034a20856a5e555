"""A graph at a glance: ops by count, inputs and outputs, weights, layout ops, devices.

    s = graph.summary()     # GraphSummary: text in a terminal, a table in Jupyter, rich-printable
    s.ops["Conv"], s.runtime_layout_ops, s.weight_bytes

graph/ comes before layout/ and backends/, so layout and transfer ops are recognised by their
op names (the `_LAYOUT_OPS` and `_TRANSFER_OPS` tables), and kernel coverage is asked of a
caller-supplied `has_kernel` predicate rather than of a backend.
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from .types import Splat

_STRUCTURAL = frozenset({INPUT, OUTPUT, CONSTANT})
_LAYOUT_OPS = ("Pack", "Unpack")
_TRANSFER_OPS = frozenset({"transfer", "copy", "to_device"})
"""Lower-cased op names of device transfers (the devices stage names its op; any of these)."""
_FALLBACK_OP = "OnnxReference"


def is_transfer(op: str) -> bool:
    """Whether `op` names a copy between devices."""
    return op.lower() in _TRANSFER_OPS


@dataclass
class GraphSummary:
    """What a graph holds; `rows()` feeds the text, rich and HTML forms alike."""

    name: str
    nodes: int
    ops: dict[str, int]
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    constants: int
    parameters: int
    weight_bytes: int
    splats: int
    packed_constants: int
    packed_values: int
    runtime_layout_ops: dict[str, int]
    constant_layout_ops: int
    transfers: int
    devices: dict[str, int]
    fallback_ops: dict[str, int]
    no_kernel: list[str] | None = None

    @property
    def op_total(self) -> int:
        """Operations, graph inputs, outputs and constants left out."""
        return sum(self.ops.values())

    def rows(self) -> list[tuple[str, str]]:
        rows = [("input", f"{n}: {t}") for n, t in self.inputs]
        rows += [("output", f"{n}: {t}") for n, t in self.outputs]
        rows += [
            ("nodes", f"{self.nodes} ({self.op_total} ops, {self.constants} constants)"),
            ("ops", ", ".join(f"{op} {n}" for op, n in self.ops.items()) or "none"),
            ("parameters", f"{self.parameters:,} elements; {_human(self.weight_bytes)} stored"),
            ("splats", f"{self.splats} constant(s) kept as one value each"),
            ("packed", f"{self.packed_values} computed value(s), {self.packed_constants} constant(s)"),
            ("runtime Pack/Unpack", _counts(self.runtime_layout_ops)),
            ("Pack/Unpack of constants", str(self.constant_layout_ops)),
        ]
        if self.devices:
            rows.append(("devices", _counts(self.devices) + f"; {self.transfers} transfer(s)"))
        fallback = _counts(self.fallback_ops) if self.fallback_ops else "none"
        rows.append(("via onnx.reference", fallback))
        if self.no_kernel is not None:
            rows.append(("no kernel", ", ".join(self.no_kernel) or "none"))
        return rows

    def title(self) -> str:
        return f"graph {os.path.basename(self.name)}"

    def __str__(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join([self.title()] + [f"  {k:<{width}}  {v}" for k, v in rows])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text form: the table, not the dataclass fields

    def __rich__(self) -> Any:
        from rich.markup import escape
        from rich.table import Table

        table = Table("", "", title=escape(self.title()), show_header=False)
        for key, value in self.rows():
            table.add_row(key, escape(value))
        return table

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        return f"<table><caption>{html.escape(self.title())}</caption>{body}</table>"


def summary(graph: Graph, has_kernel: Callable[[str], bool] | None = None) -> GraphSummary:
    """Summarize `graph`; with `has_kernel(op)` (a backend's predicate) also list the ops it lacks."""
    nodes = graph.nodes()
    constants = [n for n in nodes if n.op == CONSTANT]
    ops: dict[str, int] = {}
    for op, count in graph.op_counts().items():
        if op not in _STRUCTURAL:
            ops[op] = count
    runtime: dict[str, int] = {}
    constant_layout = 0
    devices: dict[str, int] = {}
    fallback: dict[str, int] = {}
    for node in nodes:
        if node.op in _LAYOUT_OPS:
            if _reads_constant(graph, node):
                constant_layout += 1
            else:
                runtime[node.op] = runtime.get(node.op, 0) + 1
        if node.device is not None:
            devices[node.device] = devices.get(node.device, 0) + 1
        if node.op == _FALLBACK_OP:
            onnx_op = str(node.attrs.get("onnx_op", "?"))
            fallback[onnx_op] = fallback.get(onnx_op, 0) + 1
    no_kernel = None
    if has_kernel is not None:
        no_kernel = sorted(op for op in ops if not has_kernel(op))
    return GraphSummary(
        name=str(graph.meta.get("source", graph.name)),
        nodes=len(nodes),
        ops=ops,
        inputs=[(name, str(t)) for name, t in graph.input_types().items()],
        outputs=[(name, str(graph.type_of(v))) for name, v in zip(graph.output_names(), graph.output_values())],
        constants=len(constants),
        parameters=graph.parameter_count(),
        weight_bytes=sum(stored_bytes(n) for n in constants),
        splats=sum(1 for n in constants if isinstance(n.attrs["value"], Splat)),
        packed_constants=sum(1 for n in constants if n.outputs[0].encoding is not None),
        packed_values=sum(1 for n in nodes if n.op != CONSTANT for t in n.outputs if t.encoding is not None),
        runtime_layout_ops=dict(sorted(runtime.items())),
        constant_layout_ops=constant_layout,
        transfers=sum(1 for n in nodes if is_transfer(n.op)),
        devices=dict(sorted(devices.items())),
        fallback_ops=dict(sorted(fallback.items())),
        no_kernel=no_kernel,
    )


def stored_bytes(node: Node) -> int:
    """Bytes a constant stores: its encoding's padding included, one element for a splat."""
    value = node.attrs["value"]
    if isinstance(value, Splat):
        return value.dtype.itemsize
    declared = node.outputs[0].nbytes()
    return declared if declared is not None else int(np.asarray(value).nbytes)


def _reads_constant(graph: Graph, node: Node) -> bool:
    source = graph.inputs_of(node.name)[0]
    return source is not None and graph.constant_value(source) is not None


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) if counts else "none"


def _human(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


__all__ = ["GraphSummary", "is_transfer", "stored_bytes", "summary"]
