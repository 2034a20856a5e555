"""Shape and data-movement kernels.

Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Expand, Slice and Split return views of
their data input (declared `views`; the executor ties every output's storage to that
input): no bytes move until a consumer needs another layout. Everything else returns
fresh arrays.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ....graph.errors import InputError, where
from ....graph.graph import Node
from ....graph.ops.tensor import pad_widths
from ..registry import KernelSpec, Run, kernel
from .common import as_array, check_dtypes, const_ints, norm_axes, prod, unsupported, view_of_first


def _ints(array: np.ndarray | None) -> list[int]:
    return [] if array is None else [int(v) for v in np.asarray(array).reshape(-1)]


def _maybe_const(spec: KernelSpec, index: int) -> tuple[bool, list[int] | None]:
    """(present, constant values or None when computed at run time) of optional input `index`."""
    present = index < len(spec.in_types) and spec.in_types[index] is not None
    return present, (const_ints(spec, index) if present else None)


# ---- views -------------------------------------------------------------------------------
def reshape_target(in_shape: Sequence[int], shape: Sequence[int], allowzero: bool, node: Node) -> list[int]:
    """ONNX Reshape's target: 0 copies the input dim (unless allowzero), -1 is inferred by NumPy;
    an InputError for a 0 past the input's rank (a shape computed from the inputs)."""
    if not allowzero and any(d == 0 for d in shape[len(in_shape):]):
        raise InputError(f"{where(node)}: shape {list(shape)} copies a dim past the rank of its input "
                         f"of shape {tuple(in_shape)} (a 0 with allowzero=0)")
    return [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]


@kernel("Reshape", views=True)
def _reshape(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    allowzero = bool(spec.attrs.get("allowzero", 0))
    fixed = const_ints(spec, 1)

    def run(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        target = fixed if fixed is not None else _ints(shape)
        x = view_of_first(x, shape)
        return x.reshape(reshape_target(x.shape, target, allowzero, spec.node))

    return run


@kernel("Flatten", views=True)
def _flatten(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    axis_attr = int(spec.attrs.get("axis", 1))

    def run(x: np.ndarray) -> np.ndarray:
        axis = axis_attr + x.ndim if axis_attr < 0 else axis_attr
        return x.reshape(prod(x.shape[:axis]), prod(x.shape[axis:]))

    return run


@kernel("Transpose", views=True)
def _transpose(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    perm = spec.attrs.get("perm")
    return lambda x: np.transpose(x, perm)


@kernel("Squeeze", views=True)
def _squeeze(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    present, fixed = _maybe_const(spec, 1)

    def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        chosen = fixed if fixed is not None else _ints(axes)
        x = view_of_first(x, axes)
        if not present or not chosen:
            return np.squeeze(x)
        return np.squeeze(x, axis=norm_axes(chosen, x.ndim))

    return run


@kernel("Unsqueeze", views=True)
def _unsqueeze(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    fixed = const_ints(spec, 1)

    def run(x: np.ndarray, axes: np.ndarray) -> np.ndarray:
        chosen = fixed if fixed is not None else _ints(axes)
        x = view_of_first(x, axes)
        return np.expand_dims(x, norm_axes(chosen, x.ndim + len(chosen)))

    return run


@kernel("Expand", views=True)
def _expand(spec: KernelSpec) -> Run:
    """A read-only broadcast view: the executor never writes into it in place."""
    check_dtypes(spec)
    fixed = const_ints(spec, 1)

    def run(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        target = tuple(fixed if fixed is not None else _ints(shape))
        x = view_of_first(x, shape)
        return np.broadcast_to(x, np.broadcast_shapes(x.shape, target))

    return run


def slice_index(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int],
                axes: Sequence[int] | None, steps: Sequence[int] | None) -> tuple[slice, ...]:
    """Basic-indexing slices for ONNX Slice (clamping as the spec says, negative steps included)."""
    rank = len(shape)
    axes = list(axes) if axes else list(range(len(starts)))
    steps = list(steps) if steps else [1] * len(starts)
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= rank
        dim = shape[axis]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            index[axis] = slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
        else:
            start = min(max(start, 0), dim - 1)
            end = min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


@kernel("Slice", views=True)
def _slice(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    fixed = [const_ints(spec, i) if i < len(spec.consts) else None for i in range(1, 5)]
    if fixed[3] is not None and 0 in fixed[3]:
        raise unsupported(spec, "Slice with a zero step")

    def run(x: np.ndarray, *args: np.ndarray | None) -> np.ndarray:
        values = [f if f is not None else (_ints(a) if a is not None else None)
                  for f, a in zip(fixed, list(args) + [None] * (4 - len(args)))]
        return view_of_first(x, *args)[slice_index(x.shape, *values)]

    return run


def split_sizes(length: int, count: int, given: Sequence[int] | None) -> list[int]:
    """The part sizes of a Split of a dim of `length`: the `split` input's values where it is
    `given`, else `count` equal parts, the last one smaller when the dim does not divide."""
    if given is not None:
        return [int(s) for s in given]
    part = -(-length // count)
    return [min(part, max(length - part * i, 0)) for i in range(count)]


@kernel("Split", views=True)
def _split(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    axis_attr = int(spec.attrs.get("axis", 0))
    count = int(spec.attrs.get("num_outputs", 0) or len(spec.out_types))
    single = len(spec.out_types) == 1  # the executor takes a lone result as is, not a tuple
    present, fixed = _maybe_const(spec, 1)

    def run(x: np.ndarray, split: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        axis = axis_attr % x.ndim
        given = (fixed if fixed is not None else _ints(split)) if present else None
        sizes = split_sizes(x.shape[axis], count, given)
        parts = np.split(view_of_first(x, split), np.cumsum(sizes)[:-1], axis=axis)
        return parts[0] if single else tuple(parts)

    return run


_BLOCK_ORDERS = {
    # (reshape of the input into blocks, transpose that interleaves them) per op and mode
    ("DepthToSpace", "DCR"): (lambda n, c, h, w, b: (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)),
    ("DepthToSpace", "CRD"): (lambda n, c, h, w, b: (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)),
    ("SpaceToDepth", "DCR"): (lambda n, c, h, w, b: (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4)),
    ("SpaceToDepth", "CRD"): (lambda n, c, h, w, b: (n, c, h // b, b, w // b, b), (0, 1, 3, 5, 2, 4)),
}


def _block_kernel(op: str):
    def build(spec: KernelSpec) -> Run:
        """A reshape, a transpose and a reshape: a view when blocksize 1 leaves the order as is."""
        check_dtypes(spec)
        block = int(spec.attrs["blocksize"])
        blocks, perm = _BLOCK_ORDERS[op, spec.attrs.get("mode", "DCR")]

        def run(x: np.ndarray) -> np.ndarray:
            n, c, h, w = x.shape
            out = {"DepthToSpace": (n, c // (block * block), h * block, w * block),
                   "SpaceToDepth": (n, c * block * block, h // block, w // block)}[op]
            return x.reshape(blocks(n, c, h, w, block)).transpose(perm).reshape(out)

        return run

    kernel(op, views=True)(build)


_block_kernel("DepthToSpace")
_block_kernel("SpaceToDepth")


# ---- copies ------------------------------------------------------------------------------
@kernel("Concat")
def _concat(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    axis = int(spec.attrs["axis"])
    return lambda *xs: np.concatenate(xs, axis=axis % xs[0].ndim)


@kernel("Gather")
def _gather(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    axis = int(spec.attrs.get("axis", 0))
    return lambda x, indices: as_array(np.take(x, indices, axis=axis % x.ndim))


@kernel("GatherElements")
def _gather_elements(spec: KernelSpec) -> Run:
    """np.take_along_axis on the part of the data the indices span: along the other axes the
    indices may be shorter than the data (onnxruntime and torch.gather allow it)."""
    check_dtypes(spec)
    axis_attr = int(spec.attrs.get("axis", 0))

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        axis = axis_attr % x.ndim
        spanned = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
        return np.take_along_axis(x[spanned], indices, axis=axis)

    return run


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND with fancy indexing over the flattened batch dims."""
    k = indices.shape[-1]
    batch = prod(data.shape[:batch_dims])
    flat_data = data.reshape(batch, *data.shape[batch_dims:])
    flat_idx = indices.reshape(batch, -1, k)
    rows = np.arange(batch).reshape(batch, 1)
    picked = flat_data[(rows, *(flat_idx[..., j] for j in range(k)))]
    return picked.reshape((*indices.shape[:-1], *data.shape[batch_dims + k:]))  # a tuple: () is a shape too


@kernel("GatherND")
def _gather_nd(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    batch_dims = int(spec.attrs.get("batch_dims", 0))
    return lambda x, indices: gather_nd(x, indices, batch_dims)


@kernel("Tile")
def _tile(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    fixed = const_ints(spec, 1)
    return lambda x, repeats: np.tile(x, fixed if fixed is not None else _ints(repeats))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@kernel("Pad")
def _pad(spec: KernelSpec) -> Run:
    """np.pad, after which negative pads crop."""
    check_dtypes(spec)
    mode = spec.attrs.get("mode", "constant")
    if mode not in _PAD_MODES:
        raise unsupported(spec, f"Pad mode {mode!r} is not supported")
    fixed_pads = const_ints(spec, 1)
    fixed_axes = const_ints(spec, 3) if len(spec.consts) > 3 else None

    def run(x: np.ndarray, pads: np.ndarray, value: np.ndarray | None = None,
            axes: np.ndarray | None = None) -> np.ndarray:
        amounts = fixed_pads if fixed_pads is not None else _ints(pads)
        chosen = fixed_axes if fixed_axes is not None else (_ints(axes) if axes is not None else None)
        widths = pad_widths(x.ndim, amounts, chosen)
        grow = [(max(b, 0), max(e, 0)) for b, e in widths]
        options: dict[str, Any] = {}
        if mode == "constant":
            fill = np.asarray(value).reshape(-1) if value is not None else np.zeros(0)
            options["constant_values"] = fill[0] if fill.size else 0
        y = np.pad(x, grow, mode=_PAD_MODES[mode], **options)
        if any(b < 0 or e < 0 for b, e in widths):
            y = y[tuple(slice(-min(b, 0), y.shape[i] + min(e, 0)) for i, (b, e) in enumerate(widths))]
            y = np.ascontiguousarray(y)
        return y

    return run


@kernel("Trilu")
def _trilu(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    upper = bool(spec.attrs.get("upper", 1))

    def run(x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
        diagonal = int(np.asarray(k)) if k is not None else 0
        return np.triu(x, diagonal) if upper else np.tril(x, diagonal)

    return run


@kernel("OneHot")
def _one_hot(spec: KernelSpec) -> Run:
    """A comparison of the indices (wrapped from the end when negative) with every position
    along the new axis; out-of-range indices match none."""
    check_dtypes(spec)
    axis_attr = int(spec.attrs.get("axis", -1))
    fixed = const_ints(spec, 1)
    dtype = spec.out_types[0].dtype

    def run(indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> np.ndarray:
        size = fixed[0] if fixed is not None else int(np.asarray(depth).reshape(-1)[0])
        axis = axis_attr % (indices.ndim + 1)
        index = indices.astype(np.int64)
        index = np.expand_dims(np.where(index < 0, index + size, index), axis)
        positions = np.arange(size).reshape([-1 if d == axis else 1 for d in range(indices.ndim + 1)])
        off, on = np.asarray(values).reshape(-1)[:2]
        return np.where(index == positions, on, off).astype(dtype, copy=False)

    return run


# ---- shapes and generators -----------------------------------------------------------------
@kernel("Shape")
def _shape(spec: KernelSpec) -> Run:
    start = int(spec.attrs.get("start", 0))
    end = spec.attrs.get("end")
    return lambda x: np.array(x.shape[start:end], dtype=np.int64)


@kernel("Size")
def _size(spec: KernelSpec) -> Run:
    return lambda x: np.array(x.size, dtype=np.int64)


@kernel("ConstantOfShape")
def _constant_of_shape(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    dtype = spec.out_types[0].dtype
    value = spec.attrs.get("value")
    fill = np.asarray(value).reshape(-1)[0] if value is not None else 0
    return lambda shape: np.full(tuple(_ints(shape)), fill, dtype=dtype)


@kernel("Range")
def _range(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    dtype = spec.out_types[0].dtype

    def run(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
        return np.arange(start.item(), limit.item(), delta.item()).astype(dtype, copy=False)

    return run


@kernel("EyeLike")
def _eye_like(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    dtype, k = spec.out_types[0].dtype, int(spec.attrs.get("k", 0))
    return lambda x: np.eye(x.shape[0], x.shape[1], k, dtype=dtype)


@kernel("NonZero")
def _non_zero(spec: KernelSpec) -> Run:
    check_dtypes(spec)
    return lambda x: np.array(np.nonzero(np.atleast_1d(x)), dtype=np.int64).reshape(max(x.ndim, 1), -1)
