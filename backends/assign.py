"""Device assignment: every node gets a device, and every edge that crosses devices an
explicit `Transfer` node.

A request is an ordered choice (`"cuda,cpu"`): the first present device is the default. An
affinity maps a node-name glob (`"layer1.*"`) or an op kind (`"op:Softmax"`) to its own
choice; a device already recorded on a node (from an optimized file, or set from Python) is
kept as that node's first choice. A node whose op the chosen device's backend lacks falls back
to the next present device in its choice, then in the default request.

Transfers: one per (value, destination device), shared by every reader there; existing
transfers are dissolved first, so that chains of them merge into one. Graph inputs arrive,
and outputs leave, in host memory (`devices.HOST`). A constant read on several devices is
cloned, one per device, so that each device's target packs its own copy at compile time.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..graph.errors import InputError, UnsupportedOpError, VerifyError, where
from ..graph.graph import CONSTANT, DEQUANTIZED, INPUT, OUTPUT, Graph, Node
from ..graph.types import Value
from .devices import HOST, Device, parse_request, present

TRANSFER = "Transfer"

Request = str | Sequence[str]


@dataclass
class Placement:
    """Where the nodes went: compute nodes per device and the transfers between devices."""

    nodes: dict[str, int] = field(default_factory=dict)
    transfers: dict[tuple[str, str], int] = field(default_factory=dict)
    transfer_bytes: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def transfer_count(self) -> int:
        return sum(self.transfers.values())

    def to_dict(self) -> dict:
        return {"nodes": dict(self.nodes), "transfers": self.transfer_count,
                "transfer_bytes": sum(self.transfer_bytes.values()),
                "by_route": {f"{a}->{b}": {"count": n, "bytes": self.transfer_bytes.get((a, b), 0)}
                             for (a, b), n in self.transfers.items()}}

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title="device placement", title_justify="left")
        table.add_column("device")
        table.add_column("compute nodes", justify="right")
        table.add_column("transfers in", justify="right")
        table.add_column("bytes in", justify="right")
        for device in sorted(set(self.nodes) | {b for _, b in self.transfers}):
            routes = [key for key in self.transfers if key[1] == device]
            table.add_row(device, str(self.nodes.get(device, 0)), str(sum(self.transfers[k] for k in routes)),
                          f"{sum(self.transfer_bytes.get(k, 0) for k in routes):,}")
        return table

    @classmethod
    def of(cls, graph: Graph) -> Placement:
        placement = cls()
        for node in graph.nodes():
            if node.op == TRANSFER:
                key = (node.attrs["source"], node.attrs["target"])
                placement.transfers[key] = placement.transfers.get(key, 0) + 1
                nbytes = node.outputs[0].nbytes() or 0
                placement.transfer_bytes[key] = placement.transfer_bytes.get(key, 0) + nbytes
            elif node.op not in (INPUT, OUTPUT, CONSTANT) and node.device is not None:
                placement.nodes[node.device] = placement.nodes.get(node.device, 0) + 1
        return placement


def assign_devices(graph: Graph, device: Request = "cpu", affinity: Mapping[str, Request] | None = None) -> Graph:
    """A copy of `graph` with a device on every node and Transfer nodes where edges cross."""
    graph = graph.copy()
    default = present(device)
    rules = [(pattern, parse_request(choice)) for pattern, choice in (affinity or {}).items()]
    _dissolve_transfers(graph)
    matched = {pattern: False for pattern, _ in rules}
    for node in graph.nodes():
        if node.op in (INPUT, OUTPUT):
            node.device = HOST
        elif node.op != CONSTANT:
            node.device = _choose(graph, node, rules, matched, default).name
    unmatched = [pattern for pattern, hit in matched.items() if not hit]
    if unmatched:
        raise InputError(f"device affinity pattern {unmatched[0]!r} matches no node of graph {graph.name!r}")
    split_constants(graph)
    _insert_transfers(graph)
    graph.meta["devices"] = sorted({n.device for n in graph.nodes() if n.device is not None})
    return graph


def _matches(pattern: str, node: Node) -> bool:
    if pattern.startswith("op:"):
        return node.op == pattern[3:]
    return fnmatch.fnmatchcase(node.name, pattern)


def _choose(graph: Graph, node: Node, rules: list[tuple[str, list[Device]]], matched: dict[str, bool],
            default: list[Device]) -> Device:
    choice: list[Device] = []
    for pattern, devices in rules:
        if _matches(pattern, node):
            matched[pattern] = True
            if not choice:
                choice = [d for d in devices if d.present]
    if not choice and node.device is not None:
        choice = [d for d in parse_request(node.device) if d.present]
    choice += [d for d in default if d not in choice]
    for candidate in choice:
        if candidate.supports(graph, node):
            return candidate
    names = ",".join(d.name for d in choice)
    raise UnsupportedOpError(f"{where(node)}: no device in {names!r} has a kernel for op {node.op}")


def _dissolve_transfers(graph: Graph) -> None:
    for node in graph.nodes():
        if node.op == TRANSFER:
            (source,) = graph.inputs_of(node.name)
            assert source is not None
            graph.replace_all_uses(Value(node.name), source)
            graph.remove_node(node.name)


def split_constants(graph: Graph) -> None:
    """Give each device its own copy of a constant read on several devices (arrays shared)."""
    for node in graph.nodes():
        if node.op != CONSTANT:
            continue
        by_device: dict[str, list[tuple[str, int]]] = {}
        for user, slot in graph.users(Value(node.name)):
            by_device.setdefault(graph.node(user).device or HOST, []).append((user, slot))
        devices = sorted(by_device, key=lambda d: (d != node.device, d))
        if devices:
            node.device = devices[0]
        for other in devices[1:]:
            copy = graph.add_constant(node.attrs["value"], name=f"{node.name}@{other}", type=node.outputs[0],
                                      dequantized=node.attrs.get(DEQUANTIZED))
            graph.node(copy.node).device = other
            for user, slot in by_device[other]:
                graph.set_input(user, slot, copy)


def _insert_transfers(graph: Graph) -> None:
    for node in graph.nodes():
        if node.op == CONSTANT or node.device is None:
            continue
        for slot, t in enumerate(node.outputs):
            value = Value(node.name, slot)
            by_device: dict[str, list[tuple[str, int]]] = {}
            for user, user_slot in graph.users(value):
                where_to = graph.node(user).device or HOST
                if where_to != node.device:
                    by_device.setdefault(where_to, []).append((user, user_slot))
            for target, uses in sorted(by_device.items()):
                moved = graph.add_node(TRANSFER, [value], [t], {"source": node.device, "target": target},
                                       name=f"to_{target.replace(':', '')}_{graph.value_name(value)}",
                                       origin=node.origin)
                moved.device = target
                for user, user_slot in uses:
                    graph.set_input(user, user_slot, Value(moved.name))


def fill_devices(graph: Graph) -> None:
    """Give nodes created after assignment (packs, unpacks, folded weights) the device of
    the nodes they serve: their readers', else their producer's."""
    for node in reversed(graph.nodes()):
        if node.device is None:
            readers = {_reads_on(graph.node(user)) for user in graph.consumers(node.name)} - {None}
            if len(readers) == 1 or (readers and node.op != CONSTANT):
                node.device = sorted(readers)[0]
    for node in graph.nodes():
        if node.device is None:
            sources = [graph.node(v.node).device for v in graph.inputs_of(node.name) if v is not None]
            node.device = next((d for d in sources if d is not None), HOST)
    split_constants(graph)


def _reads_on(node: Node) -> str | None:
    """The device whose memory a node reads its inputs from (a transfer reads its source's)."""
    return node.attrs["source"] if node.op == TRANSFER else node.device


def check_placement(graph: Graph) -> None:
    """Every edge joins nodes on one device, except through a Transfer from its source."""
    for node in graph.nodes():
        for value in graph.inputs_of(node.name):
            if value is None:
                continue
            producer = graph.node(value.node)
            if producer.device != _reads_on(node):
                raise VerifyError(
                    f"{where(node)} on {node.device} reads {graph.value_name(value)} from "
                    f"{producer.device} without a transfer")
