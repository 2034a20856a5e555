"""Scatters: ScatterElements and ScatterND.

Both copy data and write updates at flat positions computed from the indices (negative ones
count from the end; one outside its dim is an InputError naming the node). With a reduction,
`ufunc.at` combines every update, repeated positions included; without one, a repeated
position keeps its last update, as onnxruntime does, whatever order NumPy assigns in.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ....graph.errors import InputError, where
from ..registry import KernelSpec, Run, kernel
from .common import check_dtypes, prod, unsupported

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _row_strides(shape: Sequence[int]) -> np.ndarray:
    """Element strides of a C-contiguous array of `shape`."""
    return np.array([prod(shape[i + 1:]) for i in range(len(shape))], dtype=np.int64)


def _checked(spec: KernelSpec, indices: np.ndarray, extents: np.ndarray, data_shape: tuple[int, ...],
             what: str) -> np.ndarray:
    """`indices` (int64) with negative ones counted from the end of their dim (extents
    broadcast against them); InputError on the first index outside [-extent, extent)."""
    indices = indices.astype(np.int64, copy=False)
    bad = (indices < -extents) | (indices >= extents)
    if bad.any():
        at = np.argwhere(bad)[0]
        extent = int(np.broadcast_to(extents, indices.shape)[tuple(at)])
        raise InputError(f"{where(spec.node)}: index {int(indices[tuple(at)])} {what} is out of range "
                         f"[-{extent}, {extent - 1}] for data of shape {data_shape}")
    return np.where(indices < 0, indices + extents, indices)


def _scatter(out: np.ndarray, positions: np.ndarray, updates: np.ndarray, reduction: str) -> np.ndarray:
    """Write (or reduce) rows `updates` into rows `positions` of the 2-D view `out`."""
    if reduction != "none":
        _REDUCE[reduction].at(out, positions, updates)
        return out
    if positions.size > 1:
        _, last_first = np.unique(positions[::-1], return_index=True)
        keep = positions.size - 1 - last_first
        positions, updates = positions[keep], updates[keep]
    out[positions] = updates
    return out


def _reduction(spec: KernelSpec) -> str:
    reduction = spec.attrs.get("reduction", "none")
    if reduction != "none" and reduction not in _REDUCE:
        raise unsupported(spec, f"reduction {reduction!r}")
    return reduction


@kernel("ScatterElements")
def _scatter_elements(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    axis_attr, reduction = int(spec.attrs.get("axis", 0)), _reduction(spec)

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        axis = axis_attr % data.ndim
        along = _checked(spec, indices, np.int64(data.shape[axis]), data.shape, f"on axis {axis}")
        strides = _row_strides(data.shape)
        flat = along * strides[axis]
        for d in range(data.ndim):
            if d != axis:
                flat = flat + (np.arange(indices.shape[d]) * strides[d]).reshape(
                    [-1 if e == d else 1 for e in range(data.ndim)])
        out = data.copy()
        _scatter(out.reshape(-1), flat.reshape(-1), updates.reshape(-1), reduction)
        return out

    return run


@kernel("ScatterND")
def _scatter_nd(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    reduction = _reduction(spec)

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        k = indices.shape[-1]
        extents = np.array(data.shape[:k], dtype=np.int64)
        coords = _checked(spec, indices, extents, data.shape, f"in the first {k} dims")
        flat = (coords * _row_strides(data.shape[:k])).sum(-1).reshape(-1)
        out = data.copy()
        rows = out.reshape(prod(data.shape[:k]), prod(data.shape[k:]))
        _scatter(rows, flat, updates.reshape(flat.size, rows.shape[1]), reduction)
        return out

    return run
