"""Resize as a chain head, when its plan is constant (static X; constant roi, scales, sizes).

Per resampled axis the host works out, when the kernel is generated, the very tables the NumPy
kernel uses (`taps` in backends/numpy/kernels/resize.py, so both backends agree on every
coordinate mode, rounding mode, antialias, exclude_outside and cubic coefficient): for each
output position along the axis, the clamped source index of each tap, its weight (linear,
cubic), and whether a tf_crop_and_resize position lies outside the input. They reach the
kernel as Tables (codegen.py): pointer parameters that are not graph Values.

Result element (i0, ..., ir) reads X at its own index along the axes the Resize leaves as they
are, and sums, over every combination of taps of the resampled axes (nested loops, one per
axis with more than one tap), X at the looked-up source indices times the product of their
weights. Nearest is a gather with no arithmetic, bit-exact. A position outside the input along
any axis takes extrapolation_value. X may be packed (the gpu target hands it NCHWc16): every
read goes through its encoding (indexing.offset).

Numerics: the NumPy kernel resamples axis by axis, rounding to float32 between axes; the head
sums the tensor product in one pass, so interpolated results agree to float32 rounding. A
product of more than MAX_TAPS taps (a strong antialiased downscale) stays on the NumPy backend.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...graph.errors import VerifyError
from ...graph.graph import Graph, Node
from ...graph.ops.resize import AxisResize, check_attrs, unchanged
from ...graph.registry import with_defaults
from ..numpy.kernels.resize import static_plan, taps
from ..numpy.registry import KernelSpec
from .codegen import Table
from .indexing import is_float, offset, parameter, physical_shape

MAX_TAPS = 64
"""The most tap combinations one result element may sum (4 x 4 bicubic is 16)."""

AxisTaps = tuple[AxisResize, np.ndarray, "np.ndarray | None", "np.ndarray | None"]
"""A resampled axis: its plan, source indices (out, taps), weights (out, taps) or None for
nearest, and the outside mask (out,) or None."""


def axis_taps(graph: Graph, node: Node) -> tuple[dict[str, Any], list[AxisTaps]] | None:
    """The attributes (defaults filled in) and the taps of every axis the Resize resamples,
    when its plan is constant; else None."""
    values = list(graph.inputs_of(node.name))
    if not values or values[0] is None:
        return None
    spec = KernelSpec(node, [graph.type_of(v) if v is not None else None for v in values],
                      [graph.constant_value(v) if v is not None else None for v in values])
    attrs = with_defaults("Resize", node.attrs)
    try:
        check_attrs(attrs)
        plan = static_plan(spec)
    except VerifyError:
        return None
    if plan is None:
        return None
    shape = [int(d) for d in spec.in_types[0].shape]  # type: ignore[union-attr]
    return attrs, [(r, *taps(attrs, r, shape[r.axis])) for r in plan if not unchanged(r)]


def supports(graph: Graph, node: Node) -> bool:
    """A Resize with a constant plan, a static float operand and result with elements, and at
    most MAX_TAPS tap combinations per result element."""
    if node.op != "Resize" or len(node.outputs) != 1:
        return False
    x, out = graph.inputs_of(node.name)[0], node.outputs[0]
    if x is None:
        return False
    x_t = graph.type_of(x)
    if not (is_float(x_t) and is_float(out) and x_t.is_static and out.is_static and x_t.numel() and out.numel()):
        return False
    found = axis_taps(graph, node)
    return found is not None and math.prod(index.shape[1] for _, index, _, _ in found[1]) <= MAX_TAPS


def _table(params: list[Any], node: Node, what: str, array: np.ndarray) -> tuple[str, str]:
    """A new table parameter: its name in the kernel, and a comment saying what it holds."""
    param = parameter(params, Table(f"{node.name}: {what}", array))
    return param, f"  # {what}: {array.dtype}[{'x'.join(map(str, array.shape))}]"


def resize_head(graph: Graph, node: Node, names: list[str], params: list[Any]) -> tuple[list[str], str]:
    """Lines summing the taps of result element `names` into `x_r`."""
    value = graph.inputs_of(node.name)[0]
    found = axis_taps(graph, node)
    assert value is not None and found is not None
    attrs, axes = found
    t = graph.type_of(value)
    x = parameter(params, value)
    wide = "" if t.dtype.name == "float32" else ".to(tl.float32)"
    big = int(np.prod(physical_shape(t), dtype=np.int64)) >= 2**31
    index: list[str | None] = list(names)
    lines = [f"# {node.name} ({node.op}, {attrs['mode']}) over {graph.value_name(value)}: {t}"]
    if attrs["mode"] != "nearest":
        lines.append("x_r = tl.zeros([BLOCK], dtype=tl.float32)")
    indent, weight = "", ""
    outside: list[tuple[str, str]] = []
    for r, rows, weights, out in axes:
        a, count = r.axis, rows.shape[1]
        where = f"{names[a]} * {count} + t{a}" if count > 1 else names[a]
        rows_param, note = _table(params, node, f"source indices along axis {a}", rows.astype(np.int32))
        if count > 1:
            lines.append(f"{indent}for t{a} in range({count}):")
            indent += "    "
        load = f"tl.load({rows_param} + {where}, mask=mask)" + (".to(tl.int64)" if big else "")
        lines.append(f"{indent}j{a} = {load}{note}")
        index[a] = f"j{a}"
        if weights is not None:
            w_param, note = _table(params, node, f"weights along axis {a}", weights.astype(np.float32))
            w = f"tl.load({w_param} + {where}, mask=mask)"
            lines.append(f"{indent}w{a} = {w if not weight else f'{weight} * {w}'}{note}")
            weight = f"w{a}"
        if out is not None and out.any():
            o_param, note = _table(params, node, f"outside the input along axis {a}", out.astype(np.int32))
            outside.append((f"o{a}", f"o{a} = tl.load({o_param} + {names[a]}, mask=mask) != 0{note}"))
    read = f"tl.load({x} + {offset(t, index)}, mask=mask){wide}"
    lines.append(f"{indent}x_r += {weight} * {read}" if weight else f"{indent}x_r = {read}")
    if outside:
        fill = float(np.float32(attrs["extrapolation_value"]))
        literal = repr(fill) if math.isfinite(fill) else f"float('{fill}')"
        lines += [line for _, line in outside]
        lines.append(f"x_r = tl.where({' | '.join(name for name, _ in outside)}, {literal}, x_r)")
    return lines, "x_r"
