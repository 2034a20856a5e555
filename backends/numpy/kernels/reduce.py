"""Reductions (ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd), ArgMax/ArgMin and TopK.

Reductions take their axes as an optional input (opset >= 18 form); a missing or empty
axes input reduces every axis, unless `noop_with_empty_axes` asks for the input back.
Results keep the input's dtype (NumPy would widen small integer sums and mean integers
into float64).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..registry import KernelSpec, Run, kernel
from .common import as_array, check_dtypes, const_ints, norm_axes


def _extreme(dtype: np.dtype, highest: bool):
    """The identity of max (lowest value) or min (highest value), so empty sets reduce like ONNX."""
    if dtype.kind == "f":
        return np.inf if highest else -np.inf
    if dtype.kind == "b":
        return highest
    info = np.iinfo(dtype)
    return info.max if highest else info.min


def reducer(op: str, dtype: np.dtype) -> Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]:
    """`fn(x, axes, keepdims)` computing `op` with ONNX semantics in `dtype`."""
    if op == "ReduceSum":
        return lambda x, axes, keep: np.sum(x, axis=axes, keepdims=keep, dtype=dtype)
    if op == "ReduceProd":
        return lambda x, axes, keep: np.prod(x, axis=axes, keepdims=keep, dtype=dtype)
    if op == "ReduceMax":
        low = _extreme(dtype, highest=False)
        return lambda x, axes, keep: np.max(x, axis=axes, keepdims=keep, initial=low)
    if op == "ReduceMin":
        high = _extreme(dtype, highest=True)
        return lambda x, axes, keep: np.min(x, axis=axes, keepdims=keep, initial=high)
    return lambda x, axes, keep: np.mean(x, axis=axes, keepdims=keep)


def _register_reduce(op: str) -> None:
    @kernel(op)
    def build(spec: KernelSpec) -> Run:
        check_dtypes(spec)
        dtype = spec.out_types[0].dtype
        keep = bool(spec.attrs.get("keepdims", 1))
        noop = bool(spec.attrs.get("noop_with_empty_axes", 0))
        has_axes = len(spec.in_types) > 1 and spec.in_types[1] is not None
        fixed_axes = const_ints(spec, 1) if has_axes else []
        reduce = reducer(op, dtype)

        def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
            chosen = fixed_axes if fixed_axes is not None else [int(a) for a in axes.reshape(-1)]
            if not chosen:
                if noop:
                    return x.copy()
                chosen = list(range(x.ndim))
            result = reduce(x, norm_axes(chosen, x.ndim), keep)
            return as_array(result).astype(dtype, copy=False)

        return run


for _op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
    _register_reduce(_op)


def _register_arg(op: str, fn: Callable) -> None:
    @kernel(op)
    def build(spec: KernelSpec) -> Run:
        check_dtypes(spec)
        axis_attr = int(spec.attrs.get("axis", 0))
        keep = bool(spec.attrs.get("keepdims", 1))
        last = bool(spec.attrs.get("select_last_index", 0))

        def run(x: np.ndarray) -> np.ndarray:
            axis = axis_attr % x.ndim
            if last:  # the first hit in the reversed axis is the last one in the original
                index = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=keep)
            else:
                index = fn(x, axis=axis, keepdims=keep)
            return as_array(index).astype(np.int64, copy=False)

        return run


_register_arg("ArgMax", np.argmax)
_register_arg("ArgMin", np.argmin)


@kernel("TopK")
def _topk(spec: KernelSpec) -> Run:
    """A stable argsort along the axis, so equal values keep the lower index first, as ONNX
    asks; for the largest, the sort runs over the flipped axis and its order is reversed
    (negating would overflow the lowest integer and misorder unsigned ones)."""
    check_dtypes(spec)
    axis_attr, largest = int(spec.attrs.get("axis", -1)), bool(spec.attrs.get("largest", 1))

    def run(x: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        axis, count = axis_attr % x.ndim, int(np.asarray(k).reshape(-1)[0])
        if largest:
            order = x.shape[axis] - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        else:
            order = np.argsort(x, axis=axis, kind="stable")
        index = np.take(order, np.arange(count), axis=axis).astype(np.int64, copy=False)
        return np.take_along_axis(x, index, axis), index

    return run


@kernel("CumSum")
def _cumsum(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    exclusive, reverse = bool(spec.attrs.get("exclusive", 0)), bool(spec.attrs.get("reverse", 0))

    def run(x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        a = int(np.asarray(axis).reshape(-1)[0])
        a = a + x.ndim if a < 0 else a
        if not 0 <= a < x.ndim:
            raise ValueError(f"axis {int(np.asarray(axis).reshape(-1)[0])} out of range for rank {x.ndim}")
        src = np.flip(x, a) if reverse else x
        y = np.cumsum(src, axis=a, dtype=x.dtype)
        if exclusive:
            y = np.concatenate([np.zeros_like(np.take(y, [0], axis=a)), np.take(y, range(x.shape[a] - 1), axis=a)],
                               axis=a)
        return np.flip(y, a).copy() if reverse else y

    return run
