"""Resize and Gather on packed buffers, along axes that no tile splits.

Both move elements along some axes (Resize's resampled axes, Gather's axis) and leave every
other axis as it is; their signatures make the moving axes window dims, which layout
propagation tiles only for Gather (whose kernels read each index logically; a tiled axis
then takes the unpacked path, packed.py). Where no tile splits them, each moving axis is
one buffer axis, so the plain computation runs on the buffer itself with each logical axis
mapped to its buffer axis, and its result is already in the result's layout: an NHWC
upsampling reads and writes NHWC, with no transposed copy.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ....graph.ops.resize import check_attrs, unchanged
from ....graph.registry import with_defaults
from ..registry import KernelSpec, Run, packed_kernel
from .common import as_array, check_dtypes
from .packed_layout import as_encoding
from .resize import resize, static_plan


def buffer_axes(spec: KernelSpec, moving: list[int]) -> Callable[[int], int] | None:
    """Logical dim -> buffer axis, when input 0 and the one result share a layout, the other
    inputs are unpacked, and no tile splits a `moving` dim; else None (another path runs)."""
    x, y = spec.in_types[0], spec.out_types[0]
    if x is None or len(spec.out_types) != 1 or not (x.is_static and y.is_static):
        return None
    enc = as_encoding(x.encoding)
    if not enc.same_layout(as_encoding(y.encoding)) or any(t is not None and t.encoding is not None
                                                              for t in spec.in_types[1:]):
        return None
    if any(d in enc.tiles() for d in moving):
        return None
    perm = enc.outer_perm(x.rank)
    return perm.index


@packed_kernel("Resize")
def _resize_packed(spec: KernelSpec) -> Run | None:
    plan = static_plan(spec)
    if plan is None:
        return None
    axis = buffer_axes(spec, [r.axis for r in plan if not unchanged(r)])
    if axis is None:
        return None
    check_dtypes(spec)
    attrs = with_defaults("Resize", spec.attrs)
    check_attrs(attrs)
    on_buffer = [dataclasses.replace(r, axis=axis(r.axis)) for r in plan]
    return lambda p, *rest: resize(attrs, p, on_buffer)


@packed_kernel("Gather")
def _gather_packed(spec: KernelSpec) -> Run | None:
    indices = spec.in_types[1]
    x = spec.in_types[0]
    if x is None or indices is None or indices.rank != 1:
        return None
    logical = int(spec.attrs.get("axis", 0)) % x.rank
    axis = buffer_axes(spec, [logical])
    if axis is None:
        return None
    check_dtypes(spec)
    on_buffer = axis(logical)
    return lambda p, index: as_array(np.take(p, index, axis=on_buffer))
