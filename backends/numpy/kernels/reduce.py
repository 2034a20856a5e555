"""Reductions (ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceLogSum, ReduceLogSumExp, ReduceSumSquare), ArgMax/ArgMin, TopK and CumSum.

Reductions take their axes as an optional input (opset >= 18 form); a missing or empty
axes input reduces every axis, unless `noop_with_empty_axes` asks for the input back.
Results keep the input's dtype (NumPy would widen small integer sums and mean integers
into float64); the reductions that square, exponentiate or take logarithms compute float16
in float32 (a float16 square overflows from 256 on) and cast back.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ....graph.ops.reduce import REDUCE_OPS
from ..registry import KernelSpec, Run, kernel
from .common import as_array, check_dtypes, const_ints, norm_axes

Reduce = Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]


def _extreme(dtype: np.dtype, highest: bool):
    """The identity of max (lowest value) or min (highest value), so empty sets reduce like ONNX."""
    if dtype.kind == "f":
        return np.inf if highest else -np.inf
    if dtype.kind == "b":
        return highest
    info = np.iinfo(dtype)
    return info.max if highest else info.min


def _wide(dtype: np.dtype) -> np.dtype:
    """The dtype the nonlinear reductions compute in: float32 for float16, else `dtype`."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _sum_square(dtype: np.dtype) -> Reduce:
    wide = _wide(dtype)
    return lambda x, axes, keep: np.sum(np.square(x, dtype=wide), axis=axes, keepdims=keep, dtype=wide)


def _l2(dtype: np.dtype) -> Reduce:
    """sqrt of the sum of squares; integers take the root in float64 and truncate, as onnxruntime."""
    square_sum = _sum_square(dtype)
    root = np.float64 if dtype.kind in "iu" else _wide(dtype)
    return lambda x, axes, keep: np.sqrt(square_sum(x, axes, keep), dtype=root)


def _log_sum(dtype: np.dtype) -> Reduce:
    """log of the sum: -inf for an empty set (log 0), as ONNX asks."""
    wide = _wide(dtype)

    def run(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        total = np.sum(x, axis=axes, keepdims=keep, dtype=wide)
        with np.errstate(divide="ignore"):
            return np.log(total, dtype=np.float64 if dtype.kind in "iu" else wide)

    return run


def _log_sum_exp(dtype: np.dtype) -> Reduce:
    """max + log(sum(exp(x - max))), so large inputs do not overflow; the shift is 0 where the
    max is infinite (an empty set's -inf, or an inf input) so no inf - inf NaN appears."""
    wide = np.dtype(np.float64) if dtype.kind in "iu" else _wide(dtype)

    def run(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        x = x.astype(wide, copy=False)
        peak = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
        shift = np.where(np.isfinite(peak), peak, 0).astype(wide, copy=False)
        total = np.sum(np.exp(x - shift), axis=axes, keepdims=keep)
        with np.errstate(divide="ignore"):
            result = np.log(total)
        result += shift if keep else np.squeeze(shift, axis=axes)
        return result

    return run


REDUCERS: dict[str, Callable[[np.dtype], Reduce]] = {
    "ReduceSum": lambda t: lambda x, axes, keep: np.sum(x, axis=axes, keepdims=keep, dtype=t),
    "ReduceProd": lambda t: lambda x, axes, keep: np.prod(x, axis=axes, keepdims=keep, dtype=t),
    "ReduceMax": lambda t: lambda x, axes, keep: np.max(x, axis=axes, keepdims=keep, initial=_extreme(t, False)),
    "ReduceMin": lambda t: lambda x, axes, keep: np.min(x, axis=axes, keepdims=keep, initial=_extreme(t, True)),
    "ReduceMean": lambda t: lambda x, axes, keep: np.mean(x, axis=axes, keepdims=keep),
    "ReduceL1": lambda t: lambda x, axes, keep: np.sum(np.absolute(x), axis=axes, keepdims=keep, dtype=t),
    "ReduceL2": _l2,
    "ReduceSumSquare": _sum_square,
    "ReduceLogSum": _log_sum,
    "ReduceLogSumExp": _log_sum_exp,
}
"""op -> (dtype -> `fn(x, axes, keepdims)` computing it with ONNX semantics); callers cast the
result to `dtype`."""


def reducer(op: str, dtype: np.dtype) -> Reduce:
    """`fn(x, axes, keepdims)` computing `op` with ONNX semantics in (or cast to) `dtype`."""
    return REDUCERS[op](np.dtype(dtype))


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


for _op in REDUCE_OPS:
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
