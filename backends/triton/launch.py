"""Launch configuration as data on the nodes: defaults, user overrides, verification.

A kernel's configuration (block sizes, `num_warps`, `num_stages`, for matmul the dot's
`input_precision`) is stored on its group's anchor, the first node but a prologue's
(`node.launch`, a dict; the ONNX writer keeps it), so it travels with the graph:
`set_launch(graph, "matmul*", BLOCK_M=64)` from Python, or the attribute in an optimized ONNX
file. What is not set comes from the defaults, computed here from shapes and dtypes and the
facts of the gpu target the graph was optimized for (`GpuTarget.block`, the tile;
`GpuTarget.programs`, the grid that keeps the GPU busy: the target owns the device facts; the
per-template rules live with each template). `verify_launch` rejects unknown keys, block sizes
that are not powers of two, a block that does not cover whole tiles of a packed operand it
reads or a packed result it writes (the tile and the block must agree), and rows longer than
a reduction's block.
"""
from __future__ import annotations

import fnmatch
from typing import Any

from ...graph.errors import VerifyError, where
from ...graph.graph import Graph, Node
from ...layout.targets import TARGETS, GpuTarget
from .fusion import Fusion, Group, Rules, group_nodes
from .templates import (TEMPLATES, absorbs, classify, ends, epilogue_shapes, merges, part_epilogue, shares, spans,
                        takes_prologue)


DOT_KINDS = ("matmul", "conv", "attention")
"""Kernels whose every block is a side of a `tl.dot` operand (16 at least)."""


def gpu_target(graph: Graph) -> GpuTarget:
    """The target whose facts (its tile, the smallest block a kernel uses; the programs a grid
    should reach) the defaults are computed from: the one the graph was optimized for where
    that is a registered GpuTarget (a user's, for another GPU), else the built-in gpu target."""
    for name in (graph.meta.get("target"), "gpu"):
        target = TARGETS.get(name) if isinstance(name, str) else None
        if isinstance(target, GpuTarget):
            return target
    return GpuTarget()


def defaults(graph: Graph, group: Group) -> dict[str, Any]:
    return TEMPLATES[group.kind].defaults(graph, group.nodes, gpu_target(graph))


def config(graph: Graph, group: Group) -> dict[str, Any]:
    """The group's launch configuration: the defaults, overridden by its anchor's `launch`."""
    return {**defaults(graph, group), **(group.anchor.launch or {})}


def _is_pow2(value: Any) -> bool:
    return isinstance(value, int) and value > 0 and value & (value - 1) == 0


def check(graph: Graph, group: Group, chosen: dict[str, Any]) -> None:
    """Raise VerifyError (one line: node, key, tile, block) for a bad configuration."""
    template = TEMPLATES[group.kind]
    anchor = group.anchor
    unknown = sorted(set(chosen) - template.keys)
    if unknown:
        raise VerifyError(f"{where(anchor)}: unknown launch key {unknown[0]!r} for the {group.kind} kernel; "
                          f"known: {', '.join(sorted(template.keys))}")
    for key, value in chosen.items():
        if key.startswith("BLOCK") and not _is_pow2(value):
            raise VerifyError(f"{where(anchor)}: launch {key}={value!r} is not a positive power of two")
        if key == "num_warps" and not _is_pow2(value):
            raise VerifyError(f"{where(anchor)}: launch num_warps={value!r} is not a positive power of two")
        if key in ("num_stages", "GROUP_M") and not (isinstance(value, int) and value >= 1):
            raise VerifyError(f"{where(anchor)}: launch {key}={value!r} must be an integer >= 1")
    if group.kind in DOT_KINDS:
        for key in sorted(k for k in chosen if k.startswith("BLOCK")):
            if chosen[key] < 16:
                raise VerifyError(f"{where(anchor)}: launch {key}={chosen[key]} is below 16, the smallest tl.dot block")
        if chosen.get("input_precision", "ieee") not in ("ieee", "tf32", "tf32x3"):
            raise VerifyError(f"{where(anchor)}: launch input_precision={chosen['input_precision']!r}; "
                              "expected 'ieee', 'tf32' or 'tf32x3'")
    for what, t, dim, key in template.tiles(graph, group.nodes):
        tile = t.encoding.tiles().get(dim) if t.encoding is not None else None
        if tile is not None and chosen[key] % tile:
            raise VerifyError(f"{where(anchor)}: launch {key}={chosen[key]} does not cover whole tiles of "
                              f"{what}, {t}: dim {dim} is tiled by {tile}")
    problem = template.check(graph, group.nodes, chosen)
    if problem:
        raise VerifyError(f"{where(anchor)}: launch {problem}")


def kernel_groups(graph: Graph, fuse: bool | Fusion = True) -> list[Group]:
    rules = Rules(classify, epilogue_shapes, takes_prologue, merges, ends, spans, absorbs, shares, part_epilogue)
    return group_nodes(graph, rules, fuse)


def verify_launch(graph: Graph, fuse: bool | Fusion = True) -> None:
    """Check every kernel's configuration against its nodes' encodings (VerifyError)."""
    groups = [g for g in kernel_groups(graph, fuse) if g.kind in TEMPLATES]
    for group in groups:
        check(graph, group, config(graph, group))
    launched = {g.anchor.name for g in groups}
    for node in graph.nodes():
        if node.launch and node.name not in launched:
            raise VerifyError(f"{where(node)}: has a launch configuration but runs no generated kernel "
                              "(fused into another node's kernel, or run by the NumPy backend)")


def set_launch(graph: Graph, pattern: str | Node, **settings: Any) -> list[str]:
    """Set launch keys on the nodes named by `pattern` (a node, a name, or an fnmatch
    pattern over node names or ops); returns the names changed. Checked by `verify_launch`."""
    if isinstance(pattern, Node):
        chosen = [pattern]
    else:
        chosen = [n for n in graph.nodes()
                  if n.name == pattern or fnmatch.fnmatchcase(n.name, pattern) or n.op == pattern]
    if not chosen:
        raise VerifyError(f"set_launch: pattern {pattern!r} matches no node of graph {graph.name!r}")
    for node in chosen:
        node.launch = {**(node.launch or {}), **settings}
    return [n.name for n in chosen]
