"""Placement and layouts together: assign devices, then let each device's target choose the
layouts of the nodes it runs (propagation stops at transfers), then place what propagation
created (packs, unpacks, folded weights) with the nodes they serve."""
from __future__ import annotations

from typing import Mapping

from ..graph.graph import Graph
from ..layout import LayoutResult, optimize
from ..layout.targets import DeviceTargets, Target, get_target
from .assign import Request, assign_devices, check_placement, fill_devices
from .devices import HOST, parse_device


def place(graph: Graph, device: Request = "cpu", affinity: Mapping[str, Request] | None = None, *,
          targets: Mapping[str, str | Target] | None = None, verify: bool = False) -> LayoutResult:
    """Assign devices and optimize layouts per device. `targets` overrides a device's
    target by device name (default: its kind's, e.g. `cpu` -> "cpu", `interp` -> "gpu")."""
    placed = assign_devices(graph, device, affinity)
    chosen = {name: get_target((targets or {}).get(name) or parse_device(name).target)
              for name in placed.meta["devices"]}
    result = optimize(placed, DeviceTargets(chosen, chosen.get(HOST) or get_target("cpu")), verify=verify)
    fill_devices(result.after)
    check_placement(result.after)
    return result
