"""Index-driven and shape-producing ops: Gather, GatherElements, GatherND, ScatterElements,
ScatterND, OneHot, NonZero, Trilu, EyeLike, Shape, Size, ConstantOfShape and Range.

Only Gather with a 1-D or scalar index has an iteration signature: it moves elements along
its axis (a window dim, dropped for a scalar index) and leaves every other dim as it is, so
that a layout with those dims permuted or tiled passes through it (torch's nearest
upsampling, index_select, one channel of a channels-last attention map). Its kernels read
each index logically, so its axis may be tiled too where data and result hold whole tiles
along it (`tiled_windows`: rotary's rotate_half as a Gather of the tiled head dim). The
others have none (Trilu's and EyeLike's masks depend on positions, the other gathers and the
scatters read and write data-dependent positions, the rest make new tensors), so layout
stops at them.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedOpError, VerifyError
from ..registry import OpDef, register
from ..signature import LETTERS, Signature
from ..types import TensorType, as_array
from .shapes import conflict, const_ints, fmt_shape, fresh, length_of, norm_axis, onnx_dtype

INT64 = np.dtype(np.int64)


def _check_indices(op: str, indices: TensorType) -> None:
    if indices.dtype not in (np.dtype(np.int32), INT64):
        raise VerifyError(f"{op}: indices {indices} must be int32 or int64")


def _gather_infer(attrs, types, consts):
    data, indices = types
    _check_indices("Gather", indices)
    if data.rank == 0:
        raise VerifyError(f"Gather: data {data} must have rank >= 1")
    axis = norm_axis(attrs["axis"], data.rank)
    return [TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)]


def _gather_signature(attrs, types, outs, consts=None):
    """`abc,_->abc` with the gathered axis a window dim, for a 1-D index; `abc,_->ac` for a
    scalar one (the window dim dropped: one channel of an attention map); None otherwise."""
    data, indices = types
    if data is None or indices is None or indices.rank > 1:
        return None
    letters = tuple(LETTERS[: data.rank])
    axis = letters[norm_axis(attrs["axis"], data.rank)]
    result = letters if indices.rank else tuple(d for d in letters if d != axis)
    return Signature((letters, None), (result,), {axis: "window"})


register(OpDef("Gather", infer=_gather_infer, signature=_gather_signature, layout="sensitive",
               tiled_windows=True, min_inputs=2, max_inputs=2, defaults={"axis": 0},
               doc="numpy.take along axis: data[:axis] + indices.shape + data[axis+1:]."))


def _gather_elements_infer(attrs, types, consts):
    data, indices = types
    _check_indices("GatherElements", indices)
    if data.rank == 0 or indices.rank != data.rank:
        raise VerifyError(f"GatherElements: data {data} and indices {indices} must have one rank >= 1")
    norm_axis(attrs["axis"], data.rank)
    return [TensorType(indices.shape, data.dtype)]


register(OpDef("GatherElements", infer=_gather_elements_infer, min_inputs=2, max_inputs=2,
               defaults={"axis": 0}, doc="numpy.take_along_axis; the result has indices' shape."))


def _gather_nd_infer(attrs, types, consts):
    data, indices = types
    _check_indices("GatherND", indices)
    b = attrs["batch_dims"]
    if indices.rank < 1 or data.rank < 1:
        raise VerifyError(f"GatherND: data {data} and indices {indices} must have rank >= 1")
    k = indices.shape[-1]
    if not isinstance(k, int):
        raise UnsupportedOpError(f"GatherND: the last dim of indices {indices} must be static")
    if b < 0 or b + k > data.rank or b >= indices.rank:
        raise VerifyError(f"GatherND: indices {indices} with batch_dims={b} do not fit data {data}")
    return [TensorType(indices.shape[:-1] + data.shape[b + k:], data.dtype)]


register(OpDef("GatherND", infer=_gather_nd_infer, min_inputs=2, max_inputs=2,
               defaults={"batch_dims": 0},
               doc="Result: indices.shape[:-1] + data.shape[batch_dims + indices.shape[-1]:]."))


def _trilu_infer(attrs, types, consts):
    data = types[0]
    if data.rank < 2:
        raise VerifyError(f"Trilu: input {data} must have rank >= 2")
    k = types[1] if len(types) > 1 else None
    if k is not None and k.rank != 0:
        raise VerifyError(f"Trilu: k {k} must be a scalar")
    return [TensorType(data.shape, data.dtype)]


register(OpDef("Trilu", infer=_trilu_infer, min_inputs=1, max_inputs=2, defaults={"upper": 1},
               doc="Upper (or lower) triangle of the last two dims, shifted by the scalar k."))


# ---- scatters -------------------------------------------------------------------------------
SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _check_scatter(op: str, attrs, data: TensorType, indices: TensorType, updates: TensorType) -> None:
    _check_indices(op, indices)
    if attrs["reduction"] not in SCATTER_REDUCTIONS:
        raise VerifyError(f"{op}: reduction {attrs['reduction']!r} is not one of {', '.join(SCATTER_REDUCTIONS)}")
    if updates.dtype != data.dtype:
        raise VerifyError(f"{op}: updates {updates} must have the element type of data {data}")


def _scatter_elements_infer(attrs, types, consts):
    data, indices, updates = types
    _check_scatter("ScatterElements", attrs, data, indices, updates)
    if data.rank == 0 or indices.rank != data.rank or updates.rank != data.rank:
        raise VerifyError(f"ScatterElements: data {data}, indices {indices} and updates {updates} "
                          "must have one rank >= 1")
    if any(conflict(i, u) for i, u in zip(indices.shape, updates.shape)):
        raise VerifyError(f"ScatterElements: indices {indices} and updates {updates} must have one shape")
    norm_axis(attrs["axis"], data.rank)
    return [TensorType(data.shape, data.dtype)]


register(OpDef("ScatterElements", infer=_scatter_elements_infer, min_inputs=3, max_inputs=3,
               defaults={"axis": 0, "reduction": "none"},
               doc="A copy of data with updates written (or reduced) at indices along axis, the "
                   "inverse of GatherElements; with reduction none a repeated position keeps the "
                   "last update (as onnxruntime)."))


def _scatter_nd_infer(attrs, types, consts):
    data, indices, updates = types
    _check_scatter("ScatterND", attrs, data, indices, updates)
    if indices.rank < 1 or data.rank < 1:
        raise VerifyError(f"ScatterND: data {data} and indices {indices} must have rank >= 1")
    k = indices.shape[-1]
    if not isinstance(k, int):
        raise UnsupportedOpError(f"ScatterND: the last dim of indices {indices} must be static")
    if k > data.rank:
        raise VerifyError(f"ScatterND: indices {indices} address {k} dims of data {data}")
    want = indices.shape[:-1] + data.shape[k:]
    if updates.rank != len(want) or any(conflict(u, w) for u, w in zip(updates.shape, want)):
        raise VerifyError(f"ScatterND: updates {updates} must have shape {fmt_shape(want)} "
                          f"(indices {indices}, data {data})")
    return [TensorType(data.shape, data.dtype)]


register(OpDef("ScatterND", infer=_scatter_nd_infer, min_inputs=3, max_inputs=3,
               defaults={"reduction": "none"},
               doc="A copy of data with the slices addressed by indices[..., :k] replaced by (or "
                   "reduced with) updates, the inverse of GatherND; a repeated position keeps the "
                   "last update under reduction none (as onnxruntime)."))


def _one_hot_infer(attrs, types, consts):
    indices, depth, values = types
    if depth.numel() not in (1, None) or depth.rank > 1:
        raise VerifyError(f"OneHot: depth {depth} must be a scalar or hold one element")
    if values.rank != 1 or conflict(values.shape[0], 2):
        raise VerifyError(f"OneHot: values {values} must be 1-D [off, on]")
    axis = attrs["axis"]
    if not -indices.rank - 1 <= axis <= indices.rank:
        raise VerifyError(f"OneHot: axis {axis} is out of range for indices {indices}")
    axis %= indices.rank + 1
    size = const_ints(consts[1])
    if size is not None and size[0] < 1:
        raise VerifyError(f"OneHot: depth {size[0]} must be >= 1")
    dim = fresh("OneHot", 0) if size is None else size[0]
    return [TensorType(indices.shape[:axis] + (dim,) + indices.shape[axis:], values.dtype)]


register(OpDef("OneHot", infer=_one_hot_infer, min_inputs=3, max_inputs=3, defaults={"axis": -1},
               doc="values[1] where an index (negative ones count from depth) equals the position "
                   "along the new axis, values[0] elsewhere: an index outside [-depth, depth) "
                   "gives a row of values[0]."))


def _non_zero_infer(attrs, types, consts):
    count = fresh("NonZero", 0) if consts[0] is None else int(np.count_nonzero(as_array(consts[0])))
    return [TensorType((max(types[0].rank, 1), count), INT64)]


register(OpDef("NonZero", infer=_non_zero_infer,
               doc="int64 (rank, count) coordinates of the nonzero elements in row-major order "
                   "(a 0-d input counts as 1-D, as onnxruntime); unless the input is a constant, the "
                   "count is known only at run time."))


def _eye_like_infer(attrs, types, consts):
    data = types[0]
    if data.rank != 2:
        raise VerifyError(f"EyeLike: input {data} must be 2-D")
    code = attrs.get("dtype")
    return [TensorType(data.shape, data.dtype if code is None else onnx_dtype(code, "EyeLike"))]


register(OpDef("EyeLike", infer=_eye_like_infer, defaults={"k": 0},
               doc="Ones on diagonal k (above the main one when k > 0) of the input's 2-D shape, in "
                   "attr dtype (default: the input's); only the input's shape is read."))


# ---- shapes as values ----------------------------------------------------------------------
def _shape_range(attrs, rank: int) -> tuple[int, int]:
    start, end = attrs["start"], attrs.get("end")
    end = rank if end is None else end
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return start, max(start, end)


def _shape_infer(attrs, types, consts):
    start, end = _shape_range(attrs, types[0].rank)
    return [TensorType((end - start,), INT64)]


def _shape_value(attrs, types) -> np.ndarray | None:
    """The dims when the selected ones are static, even if others are symbolic."""
    start, end = _shape_range(attrs, types[0].rank)
    dims = types[0].shape[start:end]
    return np.array(dims, dtype=INT64) if all(isinstance(d, int) for d in dims) else None


def _size_value(attrs, types) -> np.ndarray | None:
    count = types[0].numel()
    return None if count is None else np.array(count, dtype=INT64)


register(OpDef("Shape", infer=_shape_infer, static_value=_shape_value, defaults={"start": 0},
               doc="int64 dims [start:end) of the input (end defaults to the rank)."))
register(OpDef("Size", infer=lambda a, t, c: [TensorType((), INT64)], static_value=_size_value,
               doc="int64 scalar: the number of elements."))


def _constant_of_shape_infer(attrs, types, consts):
    value = attrs.get("value")
    dtype = np.dtype(np.float32)
    if value is not None:
        value = as_array(value)
        if value.size != 1:
            raise VerifyError(f"ConstantOfShape: value must hold one element, got shape {value.shape}")
        dtype = value.dtype
    dims = const_ints(consts[0] if consts else None)
    if dims is None:
        count = length_of(types[0], "ConstantOfShape", "input")
        return [TensorType(tuple(fresh("ConstantOfShape", i) for i in range(count)), dtype)]
    if any(d < 0 for d in dims):
        raise VerifyError(f"ConstantOfShape: shape {dims} has a negative dim")
    return [TensorType(tuple(dims), dtype)]


register(OpDef("ConstantOfShape", infer=_constant_of_shape_infer,
               doc="A tensor of the shape input filled with attr value (default float32 0); "
                   "folding makes it a Splat."))


def _range_infer(attrs, types, consts):
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1 or any(t.rank != 0 for t in types):
        text = ", ".join(map(str, types))
        raise VerifyError(f"Range: start, limit and delta must be scalars of one type, got {text}")
    dtype = types[0].dtype
    if any(c is None for c in consts[:3]):
        return [TensorType((fresh("Range", 0),), dtype)]
    start, limit, delta = (as_array(c).item() for c in consts[:3])
    if delta == 0:
        raise VerifyError("Range: delta must not be 0")
    if dtype.kind in "iu":
        count = -(-(limit - start) // delta)
    else:
        count = math.ceil((limit - start) / delta)
    return [TensorType((max(int(count), 0),), dtype)]


register(OpDef("Range", infer=_range_infer, min_inputs=3, max_inputs=3,
               doc="1-D: max(ceil((limit - start) / delta), 0) elements of start's type."))
