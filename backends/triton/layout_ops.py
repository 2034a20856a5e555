"""Layout and movement ops: Pack, Unpack, Identity and Cast as copies inside a chain, and
Transpose, Reshape (Flatten, Squeeze, Unsqueeze), the Gathers, Expand, Slice, Concat, Tile,
Trilu, OneHot, DepthToSpace, SpaceToDepth, the pools (pool.py), LRN (lrn.py), Resize (resize.py) and
Pad (pad.py) as chain heads.

In logical coordinates a Pack or an Unpack is the identity: the chain template
(elementwise.py) reads the operand through its encoding and writes the result through its
own, so the same kernel packs, unpacks, or repacks, and fuses with the elementwise ops around
it. Padding of a packed result is written by the executor before the launch (the buffer is
filled with the encoding's pad value) and never touched by the kernel, which writes only
logical elements; padding is never read, since every read is masked to the logical extent.

A head starts a chain by reading its operand at a remapped index of the chain's result:
a Transpose at the permuted index, a Reshape at the same row-major position (so a reshape of a
packed or permuted buffer is one copy), a Gather, GatherND or GatherElements at the looked-up
index (one outside its dim sets the kernel's codegen.Flag: an error after the run), an Expand
at the broadcast index, a Slice at start + i * step, a Concat from the
operand whose range holds i, a Tile at i modulo the operand's extent, a DepthToSpace or
SpaceToDepth at the channel and position its block order maps i to, a Trilu at i (0 outside
the triangle), a OneHot at i without its new axis (the looked-up index, compared with i's
coordinate on that axis), a Resize at the source indices of its taps (looked up in Tables: codegen.py),
a Pad at i - before, masked, clamped, reflected or wrapped by its mode.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...graph.errors import where
from ...graph.graph import Graph, Node
from ...graph.ops.tensor import RESHAPES, transpose_perm
from ...graph.types import Value
from . import lrn, pad, pool, resize
from .codegen import Flag
from .indexing import (broadcast_index, is_float, is_integer, offset, parameter, register_dtype, triton_dtype,
                       unravel, value_ok, walks_block)


def _copy(args: list[str], node: Node, consts: list[Any]) -> str:
    return args[0]


def _cast(args: list[str], node: Node, consts: list[Any]) -> str:
    """Float values in a chain are float32 (rounded through a narrower result dtype), bools
    int1, integers their own type."""
    out = node.outputs[0]
    name = triton_dtype(out.dtype)
    if name == "tl.int1":
        return f"({args[0]} != 0)"
    if name == "tl.float32" or is_integer(out):
        return f"{args[0]}.to({name})"
    return f"{args[0]}.to({name}).to(tl.float32)"


COPIES = {"Pack": _copy, "Unpack": _copy, "Identity": _copy, "Cast": _cast}


def _load(graph: Graph, value: Value, index: list[str | None], params: list[Value], note: str,
          blocks: list[str]) -> str:
    """A load at `index`; masked when the index walks the block (else one scalar per program)."""
    t = graph.type_of(value)
    mask = ", mask=mask" if walks_block(index, blocks) else ""
    load = f"tl.load({parameter(params, value)} + {offset(t, index)}{mask})"
    if t.dtype.name in ("float16", "bfloat16"):
        load += ".to(tl.float32)"
    return f"{load}  # {graph.value_name(value)}: {t}, {note}"


def _head(node: Node, graph: Graph, index: list[str | None], names: list[str], params: list[Value],
          lines: list[str] | None = None, blocks: list[str] | None = None) -> tuple[list[str], str]:
    """A head reading its first operand at `index` (masked where the index walks `blocks`,
    the result's names by default), after `lines`."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    load = _load(graph, value, index, params, f"{node.name} ({node.op})", names if blocks is None else blocks)
    return [*(lines or []), f"x_t = {load}"], "x_t"


def looked_up(graph: Graph, node: Node, indices: Value, index: list[str | None], params: list[Any], note: str,
              blocks: list[str], var: str, size: int) -> list[str]:
    """Lines loading `var` from `node`'s indices at `index`, a negative one counted from the end
    of a dim of `size`. One outside [-size, size) sets a codegen.Flag (the executor raises after
    the run, as the NumPy backend does at once) and is read as 0, so that no load or store leaves
    its buffer meanwhile."""
    masked = "mask & " if walks_block(index, blocks) else ""
    lines = [f"{var} = {_load(graph, indices, index, params, note, blocks)}",
             f"{var} = tl.where({var} < 0, {var} + {size}, {var})",
             f"{var}_out = ({var} < 0) | ({var} >= {size})"]
    flag = parameter(params, Flag(f"{where(node)}: {graph.value_name(indices)} ({note})", size))
    return lines + [f"tl.store({flag} + 0 * {var}, tl.where({var}_out, 1, 0), mask={masked}{var}_out)",
                    f"{var} = tl.where({var}_out, 0, {var})"]


def transpose_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Result dim j is operand dim perm[j]."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    t = graph.type_of(value)
    perm = transpose_perm(node.attrs, t.rank)
    index: list[str | None] = [None] * t.rank
    for j, p in enumerate(perm):
        index[p] = names[j]
    return _head(node, graph, index, names, params)


def reshape_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """The operand element at the result element's row-major position `offs`."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    t = graph.type_of(value)
    src = [f"j{d}" for d in range(t.rank)]
    lines = unravel("offs", [int(d) for d in t.shape], src)
    return lines + [f"x_t = {_load(graph, value, list(src), params, f'{node.name} ({node.op})', src)}"], "x_t"


def gather_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Gather along `axis`: result index (a, i, b) reads data (a, indices[i], b); negative
    indices count from the end."""
    data, indices = graph.inputs_of(node.name)[:2]
    assert data is not None and indices is not None
    d_t, i_t = graph.type_of(data), graph.type_of(indices)
    axis = int(node.attrs.get("axis", 0)) % d_t.rank
    idx_names = names[axis:axis + i_t.rank]
    lines = looked_up(graph, node, indices, list(idx_names), params, "indices", names, "idx", int(d_t.shape[axis]))
    index: list[str | None] = list(names[:axis]) + ["idx"] + list(names[axis + i_t.rank:])
    return _head(node, graph, index, names, params, lines, list(names) + (["idx"] if idx_names else []))


def gather_nd_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """GatherND: result index (b..., i..., r...) reads data (b..., idx[b..., i..., 0..k-1], r...),
    the batch dims b first; negative indices count from the end."""
    data, indices = graph.inputs_of(node.name)[:2]
    assert data is not None and indices is not None
    d_t, i_t = graph.type_of(data), graph.type_of(indices)
    batch = int(node.attrs.get("batch_dims", 0))
    k = int(i_t.shape[-1])
    lead = names[:i_t.rank - 1]
    lines, found = [], []
    for m in range(k):
        lines += looked_up(graph, node, indices, [*lead, str(m)], params, f"indices[..., {m}]", names, f"idx{m}",
                           int(d_t.shape[batch + m]))
        found.append(f"idx{m}")
    index: list[str | None] = [*names[:batch], *found, *names[i_t.rank - 1:]]
    return _head(node, graph, index, names, params, lines, list(names) + (found if lead else []))


def gather_elements_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """GatherElements along `axis`: result index i reads data at i with its `axis` coordinate
    replaced by indices[i]; negative indices count from the end."""
    data, indices = graph.inputs_of(node.name)[:2]
    assert data is not None and indices is not None
    d_t = graph.type_of(data)
    axis = int(node.attrs.get("axis", 0)) % d_t.rank
    lines = looked_up(graph, node, indices, list(names), params, "indices", names, "idx", int(d_t.shape[axis]))
    return _head(node, graph, [*names[:axis], "idx", *names[axis + 1:]], names, params, lines, [*names, "idx"])


def constant_ints(graph: Graph, node: Node, slot: int) -> list[int] | None:
    """Input `slot` as a list of ints when it is a constant (None when missing or computed)."""
    values = graph.inputs_of(node.name)
    value = values[slot] if len(values) > slot else None
    const = graph.constant_value(value) if value is not None else None
    return None if const is None else [int(v) for v in np.asarray(const).reshape(-1)]


def depth_to_space_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Result (n, c, h * b + di, w * b + dj) reads channel (di * b + dj) * C' + c (DCR) or
    c * b * b + di * b + dj (CRD) at (h, w)."""
    b = int(node.attrs["blocksize"])
    per_block = int(node.outputs[0].shape[1])
    n, c, y, x = names
    di, dj = f"({y} % {b})", f"({x} % {b})"
    channel = (f"({di} * {b} + {dj}) * {per_block} + {c}" if node.attrs.get("mode", "DCR") == "DCR"
               else f"{c} * {b * b} + {di} * {b} + {dj}")
    return _head(node, graph, [n, channel, f"{y} // {b}", f"{x} // {b}"], names, params)


def space_to_depth_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Result (n, (di * b + dj) * C + c, h, w) reads (n, c, h * b + di, w * b + dj)."""
    b = int(node.attrs["blocksize"])
    channels = int(graph.type_of(graph.inputs_of(node.name)[0]).shape[1])  # type: ignore[arg-type]
    n, c, y, x = names
    lines = [f"q = {c} // {channels}"]
    return _head(node, graph, [n, f"{c} % {channels}", f"{y} * {b} + q // {b}", f"{x} * {b} + q % {b}"], names,
                 params, lines)


def tile_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Result index i reads the operand at i modulo its extent, per dim."""
    t = graph.type_of(graph.inputs_of(node.name)[0])  # type: ignore[arg-type]
    index: list[str | None] = [f"{i} % {int(d)}" if int(d) > 1 else None for i, d in zip(names, t.shape)]
    return _head(node, graph, index, names, params)


def trilu_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """The operand where column - row >= k (upper) or <= k (lower), else 0."""
    k = (constant_ints(graph, node, 1) or [0])[0]
    row, col = names[-2:]
    keep = f"({col} - {row} >= {k})" if node.attrs.get("upper", 1) else f"({col} - {row} <= {k})"
    lines, var = _head(node, graph, list(names), names, params)
    zero = register_dtype(node.outputs[0])
    return [*lines, f"x_t = tl.where({keep}, {var}, tl.zeros([BLOCK], dtype={zero}))"], "x_t"


def one_hot_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """values[1] where the index at the result index without the new axis (truncated to an
    integer, counted from depth when negative) is the coordinate on that axis, else values[0];
    an index outside [-depth, depth) matches no coordinate."""
    indices, _, values = graph.inputs_of(node.name)
    assert indices is not None and values is not None
    axis = int(node.attrs.get("axis", -1)) % len(names)
    depth = int(node.outputs[0].shape[axis])
    lines = [f"idx = {_load(graph, indices, [*names[:axis], *names[axis + 1:]], params, 'indices', names)}"]
    if is_float(graph.type_of(indices)):
        lines.append("idx = idx.to(tl.int64)")
    lines.append(f"idx = tl.where(idx < 0, idx + {depth}, idx)")
    pointer, v_t = parameter(params, values), graph.type_of(values)
    widen = ".to(tl.float32)" if is_float(v_t) else ""
    for k, name in enumerate(("off", "on")):
        load = f"tl.load({pointer} + {offset(v_t, [str(k)])}){widen}"
        lines.append(f"{name} = {load}  # {graph.value_name(values)}[{k}]")
    return [*lines, f"x_t = tl.where(idx == {names[axis]}, on, off)"], "x_t"


def expand_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Expand: the operand broadcast numpy-style to the result."""
    value = graph.inputs_of(node.name)[0]
    assert value is not None
    index = broadcast_index(graph.type_of(value), names, [int(d) for d in node.outputs[0].shape])
    return _head(node, graph, index, names, params)


def slice_starts(graph: Graph, node: Node) -> dict[int, tuple[int, int]] | None:
    """Slice with constant starts/axes/steps: axis -> (first index, step), clamped as ONNX does."""
    values = list(graph.inputs_of(node.name)) + [None] * 5
    t = graph.type_of(values[0])  # type: ignore[arg-type]
    consts = [graph.constant_value(v) if v is not None else None for v in values[:5]]
    if consts[1] is None or (values[3] is not None and consts[3] is None) or (values[4] is not None
                                                                            and consts[4] is None):
        return None
    starts = [int(v) for v in np.asarray(consts[1]).reshape(-1)]
    axes = [int(a) % t.rank for a in np.asarray(consts[3]).reshape(-1)] if consts[3] is not None else list(
        range(len(starts)))
    steps = [int(v) for v in np.asarray(consts[4]).reshape(-1)] if consts[4] is not None else [1] * len(starts)
    found = {}
    for axis, start, step in zip(axes, starts, steps):
        size = int(t.shape[axis])
        start = start + size if start < 0 else start
        found[axis] = (min(max(start, 0), size if step > 0 else size - 1), step)
    return found


def slice_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Slice: result index i along a sliced axis reads start + i * step."""
    starts = slice_starts(graph, node) or {}
    index: list[str | None] = [
        names[d] if d not in starts else f"{starts[d][0]} + {names[d]} * {starts[d][1]}" for d in range(len(names))]
    return _head(node, graph, index, names, params)


def concat_head(graph: Graph, node: Node, names: list[str], params: list[Value]) -> tuple[list[str], str]:
    """Concat: each operand loaded where the result index falls in its range of the axis."""
    values = [v for v in graph.inputs_of(node.name) if v is not None]
    axis = int(node.attrs["axis"]) % len(names)
    lines = [f"x_t = tl.zeros([BLOCK], dtype={register_dtype(node.outputs[0])})"]
    low = 0
    for k, value in enumerate(values):
        size = int(graph.type_of(value).shape[axis])
        if size == 0:
            continue
        index: list[str | None] = [f"{names[d]} - {low}" if d == axis and low else names[d] for d in range(len(names))]
        inside = f"({names[axis]} >= {low}) & ({names[axis]} < {low + size})"
        t = graph.type_of(value)
        load = f"tl.load({parameter(params, value)} + {offset(t, index)}, mask=mask & {inside})"
        load += ".to(tl.float32)" if t.dtype.name in ("float16", "bfloat16") else ""
        lines.append(f"x_t = tl.where({inside}, {load}, x_t)  # {graph.value_name(value)}: {t}")
        low += size
    return lines, "x_t"


HEADS = {"Transpose": transpose_head, "Gather": gather_head, "GatherND": gather_nd_head,
         "GatherElements": gather_elements_head, "DepthToSpace": depth_to_space_head,
         "SpaceToDepth": space_to_depth_head, "Tile": tile_head, "Trilu": trilu_head, "OneHot": one_hot_head,
         "MaxPool": pool.pool_head, "AveragePool": pool.pool_head, "LRN": lrn.lrn_head, "Resize": resize.resize_head,
         "Pad": pad.pad_head, "Expand": expand_head, "Slice": slice_head, "Concat": concat_head,
         **{op: reshape_head for op in RESHAPES}}


SUPPORTS = {"MaxPool": pool.supports, "AveragePool": pool.supports, "LRN": lrn.supports,
            "Resize": resize.supports, "Pad": pad.supports}
"""Heads with a module of their own, which decides the variants it runs."""


def supports_head(graph: Graph, node: Node) -> bool:
    """A movement op on a static float, bool or integer operand (the Gathers: integer indices;
    Tile, Trilu, OneHot: constant repeats, k and depth), or a variant a head's own module supports."""
    if node.op in SUPPORTS:
        return SUPPORTS[node.op](graph, node)
    if node.op not in HEADS or len(node.outputs) != 1:
        return False
    values = graph.inputs_of(node.name)
    x, out = values[0], node.outputs[0]
    x_type = graph.type_of(x) if x is not None else None
    if x_type is None or not value_ok(x_type) or not value_ok(out):
        return False
    if node.op in ("Gather", "GatherND", "GatherElements"):
        i_t = graph.type_of(values[1]) if len(values) > 1 and values[1] is not None else None
        return i_t is not None and i_t.is_static and i_t.dtype.kind == "i"
    if node.op == "Slice":
        return slice_starts(graph, node) is not None
    if node.op in ("DepthToSpace", "SpaceToDepth"):
        return x_type.rank == 4 and (node.op == "DepthToSpace" or node.attrs.get("mode", "DCR") == "DCR")
    if node.op == "Tile":
        return constant_ints(graph, node, 1) is not None
    if node.op == "Trilu":
        return x_type.rank >= 2 and (len(values) < 2 or values[1] is None or constant_ints(graph, node, 1) is not None)
    if node.op == "OneHot":
        v_t = graph.type_of(values[2]) if len(values) > 2 and values[2] is not None else None
        return x_type.dtype != np.bool_ and constant_ints(graph, node, 1) is not None and value_ok(v_t)
    if node.op == "Concat":
        return all(v is not None and value_ok(graph.type_of(v)) for v in values)
    return True

