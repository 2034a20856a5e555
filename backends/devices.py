"""Devices: the kinds tilefold runs on, and device requests (`"cuda,cpu"`) resolved to them.

A device kind names its layout target (the tiling policy its kernels want), says whether it
is present on this machine, and whether its backend can run a node. Kinds live in a registry
(a user may add one); a request is an ordered choice, and the first present device wins.

    cpu        NumPy kernels on the host.
    interp[:N] the Triton backend's kernels run by Triton's interpreter on the host: slow,
               for testing the GPU path without a GPU. Every index is present (each is its
               own arena in host memory), so two GPUs can be tested as `interp:0,interp:1`;
               plain `interp` is `interp:0` and keeps that short name.
    cuda[:N]   the Triton backend's kernels on an NVIDIA GPU (`cuda` is `cuda:0`).

Device names are canonical (`Device.name`): the placement, memory plans and executors compare
names, so every name a node carries comes from a parsed Device (`canonical`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..graph.errors import InputError
from ..graph.graph import Graph, Node

HOST = "cpu"
"""Where graph inputs arrive and outputs are returned: host memory."""


@dataclass(frozen=True)
class DeviceKind:
    name: str
    target: str
    available: Callable[[int], bool]
    supports: Callable[[Graph, Node], bool]
    indexed: bool = False
    short_zero: bool = False
    """Index 0 is named by the kind alone (`interp`, not `interp:0`)."""
    doc: str = ""


@dataclass(frozen=True)
class Device:
    kind: DeviceKind
    index: int = 0

    @property
    def name(self) -> str:
        if not self.kind.indexed or (self.index == 0 and self.kind.short_zero):
            return self.kind.name
        return f"{self.kind.name}:{self.index}"

    @property
    def target(self) -> str:
        return self.kind.target

    @property
    def present(self) -> bool:
        return self.kind.available(self.index)

    def supports(self, graph: Graph, node: Node) -> bool:
        return self.kind.supports(graph, node)


DEVICE_KINDS: dict[str, DeviceKind] = {}


def register_device_kind(kind: DeviceKind) -> DeviceKind:
    DEVICE_KINDS[kind.name] = kind
    return kind


def parse_device(text: str) -> Device:
    """`"cpu"`, `"interp"` (= `"interp:0"`), `"interp:1"`, `"cuda"` (= `"cuda:0"`) or `"cuda:1"`
    to a Device."""
    name, _, index = text.strip().partition(":")
    kind = DEVICE_KINDS.get(name)
    if kind is None:
        known = ", ".join(f"{k}[:N]" if v.indexed else k for k, v in sorted(DEVICE_KINDS.items()))
        raise InputError(f"unknown device {text.strip()!r}; known devices: {known}")
    if index and not (kind.indexed and index.isdigit()):
        raise InputError(f"bad device {text.strip()!r}: {name} takes no index" if not kind.indexed
                         else f"bad device {text.strip()!r}: the index must be a number, e.g. {name}:0")
    return Device(kind, int(index) if index else 0)


def canonical(name: str) -> str:
    """The canonical name of a device name: `"interp:0"` -> `"interp"`, `"cuda"` -> `"cuda:0"`."""
    return parse_device(name).name


def parse_request(request: str | Sequence[str]) -> list[Device]:
    """An ordered device choice, `"cuda,cpu"` or `["cuda", "cpu"]`, every name checked."""
    items = request.split(",") if isinstance(request, str) else list(request)
    devices = [parse_device(item) for item in items if item.strip()]
    if not devices:
        raise InputError(f"empty device request {request!r}")
    return devices


def present(request: str | Sequence[str]) -> list[Device]:
    """The devices of a request that this machine has, in order of preference."""
    devices = parse_request(request)
    found = [d for d in devices if d.present]
    if not found:
        names = ", ".join(d.name for d in devices)
        raise InputError(f"no usable device in {names!r}: none of them is present on this machine")
    return found


def _numpy_supports(graph: Graph, node: Node) -> bool:
    from .numpy.registry import KERNELS

    return node.op in KERNELS


def _triton_supports(graph: Graph, node: Node) -> bool:
    from .triton import supports

    return supports(graph, node)


def _triton_installed(index: int) -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return index >= 0


def _cuda_present(index: int) -> bool:
    import torch

    return torch.cuda.is_available() and index < torch.cuda.device_count()


register_device_kind(DeviceKind("cpu", "cpu", lambda i: i == 0, _numpy_supports,
                                 doc="NumPy kernels on the host"))
register_device_kind(DeviceKind("interp", "gpu", _triton_installed, _triton_supports, indexed=True, short_zero=True,
                                doc="Triton kernels under Triton's interpreter on the host (for testing; slow)"))
register_device_kind(DeviceKind("cuda", "gpu", _cuda_present, _triton_supports, indexed=True,
                                doc="Triton kernels on an NVIDIA GPU"))
