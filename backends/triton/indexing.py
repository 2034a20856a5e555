"""Addressing a buffer from logical indices: the one place that knows how an encoding lays
out a tensor, for every template.

A value's buffer is `layout.encoding.pack(logical, encoding)`. A kernel indexes it with one
expression per logical dim (a scalar, or a block like `rm[:, None]`); `offset` turns those
into the element offset in the physical buffer: a dim tiled by t contributes
`(i // t) * outer_stride + (i % t) * inner_stride`, an untiled dim `i * stride`. Templates
therefore iterate in logical coordinates and read or write packed and plain operands alike;
when a block covers whole tiles (the launch verifier checks it), each tile is read
contiguously.
"""
from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from ...graph.types import TensorType
from ...layout.encoding import PackedEncoding
from ...layout.targets import GpuTarget


def physical_shape(t: TensorType) -> tuple[int, ...]:
    shape = tuple(int(d) for d in t.shape)
    return shape if t.encoding is None else tuple(t.encoding.physical_shape(shape))


def strides(shape: Sequence[int]) -> list[int]:
    """Row-major strides, in elements, of a tensor of `shape`."""
    found = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        found[i] = found[i + 1] * int(shape[i + 1])
    return found


def _term(index: str, stride: int) -> str:
    return index if stride == 1 else f"{index} * {stride}"


_ATOM = re.compile(r"^[A-Za-z_]\w*(\[[^\]]*\])?$")


def _paren(expr: str) -> str:
    """`expr` as an operand of `*`, `//`, `%`: names and subscripts stay bare."""
    return expr if _ATOM.match(expr) else f"({expr})"


def offset(t: TensorType, index: Sequence[str | None]) -> str:
    """The element offset of logical index `index` (one expression per dim of `t`; None
    for a dim read at 0, a broadcast dim) in the physical buffer of `t`."""
    shape = [int(d) for d in t.shape]
    if len(index) != len(shape):
        raise ValueError(f"{len(index)} indices for a rank-{len(shape)} tensor")
    terms: list[str] = []
    if t.encoding is None:
        for i, stride in zip(index, strides(shape)):
            if i is not None and stride:
                terms.append(_term(_paren(i), stride))
        return " + ".join(terms) or "0"
    enc: PackedEncoding = t.encoding
    phys = physical_shape(t)
    steps = strides(phys)
    rank = len(shape)
    outer_axis = {d: a for a, d in enumerate(enc.outer_perm(rank))}
    inner_axis = {d: rank + j for j, d in enumerate(enc.inner_dims_pos)}
    tiles = enc.tiles()
    for d, i in enumerate(index):
        if i is None:
            continue
        before = len(terms)
        if d in tiles:
            tile = tiles[d]
            if phys[outer_axis[d]] > 1:
                terms.append(_term(f"({_paren(i)} // {tile})", steps[outer_axis[d]]))
            if tile > 1:
                terms.append(_term(f"({_paren(i)} % {tile})", steps[inner_axis[d]]))
        elif phys[outer_axis[d]] > 1:
            terms.append(_term(_paren(i), steps[outer_axis[d]]))
        if len(terms) == before:  # a dim of one element: no address, but the index's block shape,
            terms.append(f"0 * {_paren(i)}")  # which a masked load or store needs in its pointer
    return " + ".join(terms) or "0"


def walks_block(index: Sequence[str | None], blocks: Sequence[str] | set[str]) -> bool:
    """Whether an index reads different elements in a block's lanes: one of its expressions
    mentions one of `blocks`, the names that vary across lanes (a Slice's `2 + i0 * 2` does
    too, so its load must be masked where the lanes run past the result)."""
    names = [re.escape(b) for b in blocks]
    if not names:
        return False
    pattern = re.compile(r"(?<!\w)(" + "|".join(names) + r")(?!\w)")
    return any(i is not None and pattern.search(i) is not None for i in index)


def broadcast_index(t: TensorType, index: Sequence[str], out_shape: Sequence[int]) -> list[str | None]:
    """Index of an operand `t` broadcast (numpy rules, right-aligned) to `out_shape`."""
    lead = len(out_shape) - t.rank
    return [None if int(t.shape[d]) == 1 and int(out_shape[lead + d]) != 1 else index[lead + d]
            for d in range(t.rank)]


def unravel(flat: str, shape: Sequence[int], names: Sequence[str]) -> list[str]:
    """Lines `name_d = flat // stride % size` splitting a flat row-major index into dims."""
    lines = []
    for d, (name, size, stride) in enumerate(zip(names, shape, strides(shape))):
        expr = flat if stride == 1 else f"{flat} // {stride}"
        if d > 0:
            expr = f"{_paren(expr)} % {size}"
        lines.append(f"{name} = {expr}")
    return lines


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def filling_blocks(m: int, n: int, count: int, target: GpuTarget, largest: int = 128) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for `count` results of m x n: powers of two covering them, at most
    `largest`, the larger halved first while the grid has fewer programs than the target
    wants and a block is above its tile. Smaller blocks use a multiprocessor less well, and an
    idle one not at all."""
    bm = min(largest, max(target.block, next_pow2(m)))
    bn = min(largest, max(target.block, next_pow2(n)))
    while count * -(-m // bm) * -(-n // bn) < target.programs and max(bm, bn) > target.block:
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2
    return bm, bn


def triton_dtype(dtype: np.dtype | str) -> str:
    """The `tl.` name of a numpy dtype."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) or dtype != "bfloat16" else "bfloat16"
    table = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "float64": "tl.float64",
             "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint64": "tl.uint64",
             "uint32": "tl.uint32", "uint16": "tl.uint16", "uint8": "tl.uint8", "bool": "tl.int1"}
    return table[name]


FLOATS = frozenset({"float32", "float16", "bfloat16"})

NAN = ", propagate_nan=tl.PropagateNan.ALL"
"""The argument that makes tl.minimum/tl.maximum return NaN for a NaN, as ONNX, NumPy and
PyTorch have it: by default they may drop it (they do on the GPU, and Triton's interpreter
changed its answer between versions). Relu and Clip are written with `tl.where`, which keeps it."""


def parameter(params: list, item: object) -> str:
    """Append a kernel operand (a graph Value, a codegen.Table or a codegen.Flag) to `params`;
    the name of its pointer parameter in the generated source (`in0`, `in1`, ...)."""
    params.append(item)
    return f"in{len(params) - 1}"


def literal(value: float | int | bool) -> str:
    """A Python scalar as kernel source: NaN and the infinities spelled as float() calls (their
    repr, `nan` and `inf`, are no names in a kernel)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "float('nan')" if value != value else f"float('{value}')"
    return repr(value)


def is_float(t: TensorType | None) -> bool:
    return t is not None and t.dtype.name in FLOATS


INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
"""Integer dtypes kernels compute in (ids, positions, masks made of them; image bytes), in their own type."""


def is_integer(t: TensorType | None) -> bool:
    return t is not None and t.dtype.name in INTEGERS


def register_dtype(t: TensorType) -> str:
    """The `tl.` type a chain computes a value of type `t` in."""
    return "tl.float32" if is_float(t) else triton_dtype(t.dtype)


def value_ok(t: TensorType | None) -> bool:
    """A static float, bool, int32 or int64 tensor: what chain kernels load and store (floats
    computed in float32, bools as int1, integers in their own type)."""
    return t is not None and t.is_static and (is_float(t) or t.dtype == np.bool_ or is_integer(t))
