"""Data-movement ops: the reshape family, Transpose, Expand, Tile, DepthToSpace, SpaceToDepth,
Concat, Split, Slice, Pad.

Their shape-tensor inputs (shape, axes, repeats, split, starts/ends/steps, pads) are read
from constants; an unknown one gives fresh dims (`shapes.fresh`) where the result
depends on it, never a guess.

Signatures:
- Reshape / Flatten / Squeeze / Unsqueeze: only when the op just drops or inserts size-1
  dims (`a1b->ab`, `ab->a1b`); any real regrouping of elements has no signature (None).
- Transpose follows perm: perm (2, 0, 1) is `abc->cab`.
- Expand broadcasts like an elementwise op: `1b->ab`.
- Concat `ab,ab->ab` / Split `ab->ab,ab` along an axis, Slice `ab->ab` and Pad `ab->ab`:
  the dims keep their letters and stay parallel, but along the concatenated, split,
  sliced or padded axes the sizes differ between operands and results. Propagation must
  compare sizes and not carry a tiling through such a dim unless the tiles line up with
  the boundaries. A Slice with a negative (reversing) step, or with steps not known, has
  no signature.
- Tile, DepthToSpace and SpaceToDepth have none (they interleave a channel block with the
  spatial dims, which no per-dim tiling follows).
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..errors import VerifyError
from ..registry import OpDef, register
from ..signature import LETTERS, Signature, elementwise
from ..types import ConstValue, Dim, TensorType
from .shapes import (
    broadcast, const_ints, dim_add, dim_mul, dim_prod, dim_sum, fresh, length_of, norm_axes,
    norm_axis, same_dim,
)

_INT_MAX = 2**31 - 1  # slice ends at or past this mean "to the end" (exporters use INT32/64_MAX)


def _const(consts: Sequence[ConstValue | None], i: int) -> list[int] | None:
    return const_ints(consts[i]) if i < len(consts) else None


def _input(types: Sequence[TensorType | None], i: int) -> TensorType | None:
    return types[i] if i < len(types) else None


def _letters(rank: int) -> tuple[str, ...]:
    return tuple(LETTERS[:rank])


def _same_letters(types: Sequence[TensorType | None], outs: Sequence[TensorType],
                  data: Sequence[int]) -> Signature:
    """Operands listed in `data` and every result share one indexing; the rest are None."""
    letters = _letters(outs[0].rank)
    operands = tuple(letters if i in data and t is not None else None for i, t in enumerate(types))
    return Signature(operands, (letters,) * len(outs))


def relabel(in_shape: Sequence[Dim], out_shape: Sequence[Dim], extra: int = 0) -> Signature | None:
    """`a1b->ab`-style signature when out_shape is in_shape with size-1 dims dropped or
    inserted, else None. `extra` operands (shape tensors) follow as None."""
    core_in = [d for d in in_shape if d != 1]
    core_out = [d for d in out_shape if d != 1]
    if len(core_in) != len(core_out) or not all(same_dim(a, b) for a, b in zip(core_in, core_out)):
        return None

    def indexing(shape: Sequence[Dim]) -> tuple[str | None, ...]:
        names = iter(LETTERS)
        return tuple(None if d == 1 else next(names) for d in shape)

    return Signature((indexing(in_shape),) + (None,) * extra, (indexing(out_shape),))


def _relabel_signature(attrs, types, outs, consts=None):
    return relabel(types[0].shape, outs[0].shape, len(types) - 1)


# ---- Reshape, Flatten, Squeeze, Unsqueeze ------------------------------------------------
def _infer_minus_one(data: TensorType, known: list[Dim], target: list[int]) -> Dim:
    """The size a -1 stands for: elements of data over the product of the other dims."""
    in_syms = Counter(d for d in data.shape if isinstance(d, str))
    out_syms = Counter(d for d in known if isinstance(d, str))
    common = in_syms & out_syms
    in_syms, out_syms = in_syms - common, out_syms - common
    p_in = dim_prod([d for d in data.shape if isinstance(d, int)])
    p_out = dim_prod([d for d in known if isinstance(d, int)])
    if out_syms or p_out == 0 or p_in % p_out:
        if not out_syms and not in_syms:
            raise VerifyError(f"Reshape: cannot reshape {data} to {target}")
        return fresh("Reshape", target.index(-1))
    return dim_prod([*sorted(in_syms.elements()), p_in // p_out])


def _reshape_infer(attrs, types, consts):
    data, shape = types
    target = _const(consts, 1)
    if target is None:
        count = length_of(shape, "Reshape", "shape")
        return [TensorType(tuple(fresh("Reshape", i) for i in range(count)), data.dtype)]
    out: list[Dim] = []
    for i, t in enumerate(target):
        if t == 0 and not attrs["allowzero"]:
            if i >= data.rank:
                raise VerifyError(f"Reshape: shape {target} copies dim {i} of {data}, past its rank")
            out.append(data.shape[i])
        elif t < -1:
            raise VerifyError(f"Reshape: invalid size {t} in shape {target}")
        else:
            out.append(t)
    if out.count(-1) > 1:
        raise VerifyError(f"Reshape: shape {target} has more than one -1")
    if -1 in out:
        if attrs["allowzero"] and 0 in target:
            raise VerifyError(f"Reshape: shape {target} has both -1 and 0 with allowzero=1")
        i = out.index(-1)
        out[i] = _infer_minus_one(data, out[:i] + out[i + 1:], target)
    elif data.is_static and all(isinstance(d, int) for d in out) and dim_prod(out) != dim_prod(data.shape):
        raise VerifyError(f"Reshape: cannot reshape {data} to {target}: element counts differ")
    return [TensorType(tuple(out), data.dtype)]


register(OpDef(
    "Reshape", infer=_reshape_infer, signature=_relabel_signature, layout="sensitive",
    splat="movement", min_inputs=2, max_inputs=2, defaults={"allowzero": 0},
    doc="shape: int64 input; 0 copies the input dim (unless allowzero), -1 is inferred.",
))


def _flatten_infer(attrs, types, consts):
    data = types[0]
    axis = attrs["axis"]
    if not -data.rank <= axis <= data.rank:
        raise VerifyError(f"Flatten: axis {axis} is out of range for {data}")
    axis = axis + data.rank if axis < 0 else axis
    return [TensorType((dim_prod(data.shape[:axis]), dim_prod(data.shape[axis:])), data.dtype)]


register(OpDef("Flatten", infer=_flatten_infer, signature=_relabel_signature, layout="sensitive",
               splat="movement", defaults={"axis": 1},
               doc="2-D result: dims before axis times dims from axis on."))


def _squeeze_infer(attrs, types, consts):
    data, axes_t = types[0], _input(types, 1)
    if axes_t is None:
        return [TensorType(tuple(d for d in data.shape if d != 1), data.dtype)]
    axes = _const(consts, 1)
    if axes is None:
        count = length_of(axes_t, "Squeeze", "axes")
        return [TensorType(tuple(fresh("Squeeze", i) for i in range(data.rank - count)), data.dtype)]
    axes = norm_axes(axes, data.rank, "Squeeze")
    for a in axes:
        if isinstance(data.shape[a], int) and data.shape[a] != 1:
            raise VerifyError(f"Squeeze: dim {a} of {data} is not 1")
    return [TensorType(tuple(d for i, d in enumerate(data.shape) if i not in axes), data.dtype)]


register(OpDef(
    "Squeeze", infer=_squeeze_infer, signature=_relabel_signature, layout="sensitive",
    splat="movement", min_inputs=1, max_inputs=2,
    doc="Without axes, drops the dims that are statically 1 (a symbolic dim is kept).",
))


def _unsqueeze_infer(attrs, types, consts):
    data = types[0]
    axes = _const(consts, 1)
    if axes is None:
        count = length_of(types[1], "Unsqueeze", "axes")
        return [TensorType(tuple(fresh("Unsqueeze", i) for i in range(data.rank + count)), data.dtype)]
    rank = data.rank + len(axes)
    axes = norm_axes(axes, rank, "Unsqueeze")
    rest = iter(data.shape)
    return [TensorType(tuple(1 if i in axes else next(rest) for i in range(rank)), data.dtype)]


register(OpDef("Unsqueeze", infer=_unsqueeze_infer, signature=_relabel_signature,
               layout="sensitive", splat="movement", min_inputs=2, max_inputs=2))


RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
"""Ops whose result is their input reshaped row-major (shape or axes inputs aside)."""


# ---- Transpose ---------------------------------------------------------------------------
def transpose_perm(attrs: dict, rank: int) -> tuple[int, ...]:
    """A Transpose's perm: its attribute, or ONNX's default (the dims reversed)."""
    perm = attrs.get("perm")
    return tuple(range(rank - 1, -1, -1)) if perm is None else tuple(int(p) for p in perm)


def _perm(attrs, data: TensorType) -> tuple[int, ...]:
    perm = transpose_perm(attrs, data.rank)
    if sorted(perm) != list(range(data.rank)):
        raise VerifyError(f"Transpose: perm {perm} is not a permutation of the dims of {data}")
    return perm


def _transpose_infer(attrs, types, consts):
    data = types[0]
    return [TensorType(tuple(data.shape[p] for p in _perm(attrs, data)), data.dtype)]


def _transpose_signature(attrs, types, outs, consts=None):
    letters = _letters(types[0].rank)
    return Signature((letters,), (tuple(letters[p] for p in _perm(attrs, types[0])),))


register(OpDef("Transpose", infer=_transpose_infer, signature=_transpose_signature,
               layout="sensitive", splat="movement",
               doc="perm defaults to reversing the dims; result dim i is input dim perm[i]."))


# ---- Expand, Tile ------------------------------------------------------------------------
def _expand_infer(attrs, types, consts):
    data = types[0]
    shape = _const(consts, 1)
    if shape is None:
        rank = max(data.rank, length_of(types[1], "Expand", "shape"))
        padded = (1,) * (rank - data.rank) + data.shape
        shape = tuple(d if d != 1 else fresh("Expand", i) for i, d in enumerate(padded))
        return [TensorType(shape, data.dtype)]
    try:
        return [TensorType(broadcast(data.shape, shape), data.dtype)]
    except VerifyError:
        raise VerifyError(f"Expand: input {data} does not broadcast to shape {shape}") from None


def _expand_signature(attrs, types, outs, consts=None):
    sig = elementwise([types[0].shape], outs[0].shape)
    return Signature(sig.operands + (None,), sig.results)


register(OpDef("Expand", infer=_expand_infer, signature=_expand_signature, layout="sensitive",
               splat="movement", min_inputs=2, max_inputs=2,
               doc="Numpy broadcast of the input and the shape input (bidirectional)."))


def _tile_infer(attrs, types, consts):
    data = types[0]
    repeats = _const(consts, 1)
    if repeats is None:
        return [TensorType(tuple(fresh("Tile", i) for i in range(data.rank)), data.dtype)]
    if len(repeats) != data.rank or any(r < 0 for r in repeats):
        raise VerifyError(f"Tile: repeats {repeats} must be {data.rank} non-negative counts for {data}")
    return [TensorType(tuple(dim_mul(d, r) for d, r in zip(data.shape, repeats)), data.dtype)]


register(OpDef("Tile", infer=_tile_infer, layout="opaque", splat="movement",
               min_inputs=2, max_inputs=2))


# ---- DepthToSpace, SpaceToDepth ------------------------------------------------------------
def _block_attrs(op: str, attrs, data: TensorType, modes: tuple[str, ...]) -> int:
    block = attrs["blocksize"]
    if data.rank != 4:
        raise VerifyError(f"{op}: input {data} must be 4-D NCHW")
    if not isinstance(block, int) or block < 1:
        raise VerifyError(f"{op}: blocksize {block!r} must be a positive integer")
    if attrs.get("mode", "DCR") not in modes:
        raise VerifyError(f"{op}: mode {attrs['mode']!r} is not one of {', '.join(modes)}")
    return block


def _divided(op: str, dim: Dim, by: int, what: str, data: TensorType, index: int) -> Dim:
    """dim / by for a static dim (which must divide), by == 1, or a fresh dim."""
    if by == 1:
        return dim
    if not isinstance(dim, int):
        return fresh(op, index)
    if dim % by:
        raise VerifyError(f"{op}: {what} of input {data} must be a multiple of {by}")
    return dim // by


def _depth_to_space_infer(attrs, types, consts):
    data = types[0]
    b = _block_attrs("DepthToSpace", attrs, data, ("DCR", "CRD"))
    n, c, h, w = data.shape
    channels = _divided("DepthToSpace", c, b * b, f"channel dim {c}", data, 0)
    return [TensorType((n, channels, dim_mul(h, b), dim_mul(w, b)), data.dtype)]


register(OpDef("DepthToSpace", infer=_depth_to_space_infer, splat="movement", defaults={"mode": "DCR"},
               doc="NCHW -> N, C/b^2, H*b, W*b: channel blocks become b x b pixels; DCR takes the "
                   "block index from the channel's high part, CRD from its low part."))


def _space_to_depth_infer(attrs, types, consts):
    data = types[0]
    b = _block_attrs("SpaceToDepth", attrs, data, ("DCR", "CRD"))
    n, c, h, w = data.shape
    height = _divided("SpaceToDepth", h, b, f"height {h}", data, 1)
    width = _divided("SpaceToDepth", w, b, f"width {w}", data, 2)
    return [TensorType((n, dim_mul(c, b * b), height, width), data.dtype)]


register(OpDef("SpaceToDepth", infer=_space_to_depth_infer, splat="movement",
               doc="NCHW -> N, C*b^2, H/b, W/b, the inverse of DepthToSpace in the same mode (CRD, "
                   "from opset 28, for graphs built in Python: ONNX's converter cannot bring it to 21)."))


# ---- Concat, Split -----------------------------------------------------------------------
def _concat_infer(attrs, types, consts):
    present = [t for t in types if t is not None]
    first = present[0]
    if "axis" not in attrs:
        raise VerifyError("Concat: attribute 'axis' is required")
    axis = norm_axis(attrs["axis"], first.rank)
    text = ", ".join(str(t) for t in present)
    if any(t.rank != first.rank for t in present) or len({t.dtype for t in present}) > 1:
        raise VerifyError(f"Concat: inputs must share rank and element type, got {text}")
    out: list[Dim] = []
    for i in range(first.rank):
        dims = [t.shape[i] for t in present]
        if i == axis:
            out.append(dim_sum(dims))
            continue
        ints = {d for d in dims if isinstance(d, int)}
        if len(ints) > 1:
            raise VerifyError(f"Concat: inputs differ on dim {i} (axis={attrs['axis']}): {text}")
        out.append(ints.pop() if ints else dims[0])
    return [TensorType(tuple(out), first.dtype)]


def _concat_signature(attrs, types, outs, consts=None):
    return _same_letters(types, outs, range(len(types)))


register(OpDef("Concat", infer=_concat_infer, signature=_concat_signature, layout="sensitive",
               min_inputs=1, max_inputs=None, doc="attrs: axis (required)."))


def _split_infer(attrs, types, consts):
    data = types[0]
    axis = norm_axis(attrs["axis"], data.rank)
    size = data.shape[axis]
    split_t, sizes = _input(types, 1), _const(consts, 1)
    n = attrs.get("num_outputs")
    if split_t is not None and n is not None:
        raise VerifyError("Split: give either the split input or num_outputs, not both")
    if split_t is not None and sizes is None:
        sizes = [fresh("Split", i) for i in range(length_of(split_t, "Split", "split"))]
    elif split_t is not None:
        if any(s < 0 for s in sizes) or (isinstance(size, int) and sum(sizes) != size):
            raise VerifyError(f"Split: sizes {sizes} do not add up to dim {axis} of {data}")
    elif n is not None:
        if n < 1:
            raise VerifyError(f"Split: num_outputs must be >= 1, got {n}")
        if not isinstance(size, int):
            sizes = [size] if n == 1 else [fresh("Split", i) for i in range(n)]
        else:
            chunk = -(-size // n)
            sizes = [chunk] * (n - 1) + [size - chunk * (n - 1)]
            if sizes[-1] < 0:
                raise VerifyError(f"Split: dim {axis} of {data} cannot be split into {n} chunks")
    else:
        raise VerifyError("Split: needs the split input or the num_outputs attribute")
    return [TensorType(data.shape[:axis] + (s,) + data.shape[axis + 1:], data.dtype) for s in sizes]


def _split_signature(attrs, types, outs, consts=None):
    return _same_letters(types, outs, [0])


register(OpDef(
    "Split", infer=_split_infer, signature=_split_signature, layout="sensitive",
    min_inputs=1, max_inputs=2, defaults={"axis": 0},
    doc="Sizes from the split input, else num_outputs chunks of ceil(d/n), the last smaller.",
))


# ---- Slice -------------------------------------------------------------------------------
def _slice_len(size: Dim, start: int, end: int, step: int, i: int) -> Dim:
    """Length of data[start:end:step] along one dim of `size`, ONNX clamping rules."""
    if step == 0:
        raise VerifyError(f"Slice: step on axis {i} must not be 0")
    if not isinstance(size, int):
        if step == 1 and end >= _INT_MAX and start >= 0:
            return dim_add(size, -start)
        return fresh("Slice", i)
    return len(range(*slice_bounds(size, start, end, step), step))


def slice_bounds(size: int, start: int, end: int, step: int) -> tuple[int, int]:
    """Slice's start and end along a dim of `size`, counted from the end where negative and
    clamped as ONNX clamps them: the elements taken are range(start, end, step)."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return min(max(start, 0), size), min(max(end, 0), size)
    return min(max(start, 0), size - 1), min(max(end, -1), size - 1)


def _slice_infer(attrs, types, consts):
    data = types[0]
    starts, ends = _const(consts, 1), _const(consts, 2)
    axes_t, steps_t = _input(types, 3), _input(types, 4)
    axes = _const(consts, 3) if axes_t is not None else None
    steps = _const(consts, 4) if steps_t is not None else None
    count = len(starts) if starts is not None else length_of(types[1], "Slice", "starts")
    if axes_t is None:
        axes = list(range(count))
    if axes is not None:
        axes = norm_axes(axes, data.rank, "Slice")
    if steps_t is None:
        steps = [1] * count
    if starts is None or ends is None or steps is None:
        touched = range(data.rank) if axes is None else axes
        return [TensorType(tuple(fresh("Slice", i) if i in touched else d
                                 for i, d in enumerate(data.shape)), data.dtype)]
    if axes is None:
        return [TensorType(tuple(fresh("Slice", i) for i in range(data.rank)), data.dtype)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise VerifyError(
            f"Slice: starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length"
        )
    shape = list(data.shape)
    for a, s, e, t in zip(axes, starts, ends, steps):
        shape[a] = _slice_len(data.shape[a], s, e, t, a)
    return [TensorType(tuple(shape), data.dtype)]


def _slice_signature(attrs, types, outs, consts=None):
    steps_t = _input(types, 4)
    if steps_t is not None:
        steps = _const(list(consts) if consts is not None else [], 4)
        if steps is None or any(s < 0 for s in steps):
            return None
    return _same_letters(types, outs, [0])


register(OpDef("Slice", infer=_slice_infer, signature=_slice_signature, layout="sensitive",
               splat="movement", min_inputs=3, max_inputs=5,
               doc="starts, ends, optional axes and steps: int inputs, numpy-style clamping."))


# ---- Pad ---------------------------------------------------------------------------------
def _pad_infer(attrs, types, consts):
    data = types[0]
    pads = _const(consts, 1)
    axes_t = _input(types, 3)
    axes = _const(consts, 3) if axes_t is not None else list(range(data.rank))
    if axes is not None:
        axes = norm_axes(axes, data.rank, "Pad")
    if attrs["mode"] not in ("constant", "reflect", "edge", "wrap"):
        raise VerifyError(f"Pad: unknown mode {attrs['mode']!r}")
    value = _input(types, 2)
    if value is not None and (value.numel() not in (None, 1) or value.dtype != data.dtype):
        raise VerifyError(f"Pad: constant_value {value} must be one element of type {data.dtype}")
    if pads is None or axes is None:
        touched = range(data.rank) if axes is None else axes
        return [TensorType(tuple(fresh("Pad", i) if i in touched else d
                                 for i, d in enumerate(data.shape)), data.dtype)]
    if len(pads) != 2 * len(axes):
        raise VerifyError(f"Pad: pads {pads} must hold 2 values per padded axis of {data} (axes {axes})")
    shape = list(data.shape)
    for j, a in enumerate(axes):
        shape[a] = dim_add(shape[a], pads[j] + pads[j + len(axes)])
        if isinstance(shape[a], int) and shape[a] < 0:
            raise VerifyError(f"Pad: pads {pads} make dim {a} of {data} negative")
    return [TensorType(tuple(shape), data.dtype)]


def pad_widths(rank: int, pads: Sequence[int], axes: Sequence[int] | None) -> list[tuple[int, int]]:
    """Pad's (begin, end) amount for every dim of a rank-`rank` tensor, from its `pads`
    ([begin..., end...] per padded axis) and `axes` (None or empty: every dim)."""
    chosen = norm_axes(list(axes) if axes else list(range(rank)), rank, "Pad")
    if len(pads) != 2 * len(chosen):
        raise VerifyError(f"Pad: pads {list(pads)} must hold 2 values per padded axis (axes {chosen})")
    widths = [(0, 0)] * rank
    for i, axis in enumerate(chosen):
        widths[axis] = (int(pads[i]), int(pads[i + len(chosen)]))
    return widths


def _pad_signature(attrs, types, outs, consts=None):
    sig = _same_letters(types, outs, [0])
    value = _input(types, 2)
    operands = list(sig.operands)
    if value is not None:
        operands[2] = (None,) * value.rank
    return Signature(tuple(operands), sig.results)


register(OpDef(
    "Pad", infer=_pad_infer, signature=_pad_signature, layout="sensitive",
    min_inputs=2, max_inputs=4, defaults={"mode": "constant"},
    doc="pads: [begin..., end...] per axis (default all axes); negative pads crop.",
))
