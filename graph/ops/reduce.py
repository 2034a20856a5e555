"""Reductions: ReduceMean/Sum/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare (axes as an
optional input), ArgMax/ArgMin, TopK and CumSum.

Signature of a reduction over axis 1 of a rank-3 tensor: `abc->ac` (b reduction), or
`abc->a1c` with keepdims, where the kept dim is a broadcast singleton of the result.

The signature needs the reduced axes. They come from the constant `axes` input when the
caller passes constants (the optional fourth argument of every signature function here);
without it they are recovered from the input and result shapes when that is unambiguous
(a dim that becomes 1 under keepdims; the only way to drop dims without keepdims), else
the signature is None.
"""
from __future__ import annotations

from itertools import combinations
from typing import Sequence

import numpy as np

from ..errors import VerifyError
from ..registry import OpDef, register
from ..signature import LETTERS, Signature
from ..types import ConstValue, Dim, TensorType
from .shapes import const_ints, fresh, is_fresh, length_of, norm_axes, norm_axis, same_dim

INT64 = np.dtype(np.int64)
_DEFAULTS = {"keepdims": 1, "noop_with_empty_axes": 0}


def _axes(op: str, attrs: dict, types: Sequence[TensorType | None],
          consts: Sequence[ConstValue | None]) -> list[int] | None:
    """The reduced axes (all of them when none are given), or None when not known."""
    rank = types[0].rank
    given = types[1] if len(types) > 1 else None
    if given is None:
        return [] if attrs["noop_with_empty_axes"] else list(range(rank))
    values = const_ints(consts[1] if len(consts) > 1 else None)
    if values is None and given.shape == (0,):
        values = []
    if values is None:
        return None
    if not values:
        return [] if attrs["noop_with_empty_axes"] else list(range(rank))
    return sorted(norm_axes(values, rank, op))


def _reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes)


def _reduce_infer(op: str):
    def infer(attrs, types, consts):
        data = types[0]
        axes = _axes(op, attrs, types, consts)
        keepdims = bool(attrs["keepdims"])
        if axes is not None:
            return [TensorType(_reduced_shape(data.shape, axes, keepdims), data.dtype)]
        count = length_of(types[1], op, "axes")
        if keepdims:
            shape = tuple(1 if d == 1 else fresh(op, i) for i, d in enumerate(data.shape))
        else:
            shape = tuple(fresh(op, i) for i in range(data.rank - count))
        return [TensorType(shape, data.dtype)]

    return infer


def _axes_from_shapes(shape: Sequence[Dim], out: Sequence[Dim], keepdims: bool) -> list[int] | None:
    """The reduced axes that turn `shape` into `out`, when exactly one choice does it."""
    if any(is_fresh(d) for d in out):
        return None
    if keepdims:
        if len(out) != len(shape):
            return None
        axes = []
        for i, (d, o) in enumerate(zip(shape, out)):
            if o == 1 and d != 1:
                axes.append(i)
            elif not same_dim(d, o) and not (d == 1 == o):
                return None
        return axes
    found = [
        list(drop) for drop in combinations(range(len(shape)), len(shape) - len(out))
        if all(same_dim(a, b) or a == 1 == b
               for a, b in zip((d for i, d in enumerate(shape) if i not in drop), out))
    ]
    # choices that differ only in which size-1 dims they drop reduce the same values
    distinct = {tuple(i for i in drop if shape[i] != 1) for drop in found}
    return found[0] if len(distinct) == 1 else None


def _reduction_signature(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> Signature:
    letters = tuple(LETTERS[: len(shape)])
    result = tuple(None if i in axes else ch for i, ch in enumerate(letters) if keepdims or i not in axes)
    return Signature((letters,), (result,), {letters[i]: "reduction" for i in axes})


def _reduce_signature(op: str):
    def signature(attrs, types, outs, consts=None):
        consts = list(consts) if consts is not None else [None] * len(types)
        axes = _axes(op, attrs, types, consts)
        keepdims = bool(attrs["keepdims"])
        if axes is None:
            axes = _axes_from_shapes(types[0].shape, outs[0].shape, keepdims)
        if axes is None:
            return None
        sig = _reduction_signature(types[0].shape, axes, keepdims)
        return Signature(sig.operands + (None,) * (len(types) - 1), sig.results, sig.kinds)

    return signature


REDUCE_OPS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
"""The ONNX reductions with an optional axes input and keepdims / noop_with_empty_axes."""

for _op in REDUCE_OPS:
    register(OpDef(
        _op, infer=_reduce_infer(_op), signature=_reduce_signature(_op), layout="sensitive",
        min_inputs=1, max_inputs=2, defaults=dict(_DEFAULTS),
        doc="axes: optional int64 input (none or empty: all axes, or none with "
            "noop_with_empty_axes). Unknown axes give fresh dims.",
    ))


def _arg_infer(op: str):
    def infer(attrs, types, consts):
        data = types[0]
        if data.rank == 0:
            raise VerifyError(f"{op}: input {data} must have rank >= 1")
        axis = norm_axis(attrs["axis"], data.rank)
        return [TensorType(_reduced_shape(data.shape, [axis], bool(attrs["keepdims"])), INT64)]

    return infer


def _arg_signature(attrs, types, outs, consts=None):
    axis = norm_axis(attrs["axis"], types[0].rank)
    return _reduction_signature(types[0].shape, [axis], bool(attrs["keepdims"]))


for _op in ("ArgMax", "ArgMin"):
    register(OpDef(
        _op, infer=_arg_infer(_op), signature=_arg_signature, layout="sensitive",
        defaults={"axis": 0, "keepdims": 1, "select_last_index": 0},
        doc="int64 index of the extreme value along axis.",
    ))


def _topk_infer(attrs, types, consts):
    data, k = types[0], types[1]
    if data.rank == 0:
        raise VerifyError(f"TopK: input {data} must have rank >= 1")
    if k is not None and k.rank != 1:
        raise VerifyError(f"TopK: K {k} must be 1-D with one element")
    axis = norm_axis(attrs["axis"], data.rank)
    ks = const_ints(consts[1]) if len(consts) > 1 else None
    size: Dim = fresh("TopK", 0)
    if ks is not None:
        extent = data.shape[axis]
        if len(ks) != 1 or ks[0] < 0 or (isinstance(extent, int) and ks[0] > extent):
            raise VerifyError(f"TopK: K={ks} must be one value in [0, {extent}] (axis {axis} of input {data})")
        size = ks[0]
    shape = data.shape[:axis] + (size,) + data.shape[axis + 1:]
    return [TensorType(shape, data.dtype), TensorType(shape, INT64)]


register(OpDef("TopK", infer=_topk_infer, min_inputs=2, max_inputs=2,
               defaults={"axis": -1, "largest": 1, "sorted": 1},
               doc="The K largest (or smallest) values along axis and their int64 indices, sorted, the "
                   "lower index first among equal values (a selection: no iteration signature)."))


def _cumsum_infer(attrs, types, consts):
    data, axis = types[0], types[1]
    if data.rank == 0:
        raise VerifyError(f"CumSum: input {data} must have rank >= 1")
    if axis is not None and axis.rank > 1 or (axis is not None and axis.rank == 1 and axis.shape != (1,)):
        raise VerifyError(f"CumSum: axis {axis} must be a scalar")
    return [TensorType(data.shape, data.dtype)]


register(OpDef("CumSum", infer=_cumsum_infer, min_inputs=2, max_inputs=2, defaults={"exclusive": 0, "reverse": 0},
               doc="Running sums along the scalar axis input (a scan: no iteration signature, so layout "
                   "stops here)."))
