"""Packed encodings as standard ONNX ops: pack = Pad, Reshape, Transpose; unpack = Transpose,
Reshape, Slice. Both follow `layout.encoding.pack`/`unpack` step for step (and are tested
against them through onnxruntime); steps that would do nothing are left out.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ...graph.errors import TilefoldError
from ...graph.types import Dim
from ...layout.encoding import PackedEncoding, split_order

Emit = Callable[..., str]
"""`emit(op, inputs, name_hint, **attrs) -> output tensor name`: adds one node."""
Const = Callable[[np.ndarray, str], str]
"""`const(array, name_hint) -> tensor name`: adds one small initializer."""


def split_shape(enc: PackedEncoding, shape: Sequence[int]) -> list[int]:
    tiles = enc.tiles()
    split: list[int] = []
    for d, size in enumerate(enc.padded_shape(shape)):
        split.extend([size // tiles[d], tiles[d]] if d in tiles else [size])
    return split


def _static(enc: PackedEncoding, shape: Sequence[Dim], hint: str) -> list[Dim]:
    """`shape`, which must be static where the encoding tiles (a permutation takes any dims)."""
    if enc.inner_tiles and not all(isinstance(d, int) for d in shape):
        raise TilefoldError(f"{hint}: cannot write a tiled layout of a tensor with symbolic dims {tuple(shape)} "
                            "as static ONNX ops; use form='logical'")
    return list(shape)


def lower_unpack(x: str, enc: PackedEncoding, shape: Sequence[Dim], emit: Emit, const: Const, hint: str) -> str:
    """The logical tensor of `shape` held by the packed buffer named `x`."""
    shape = _static(enc, shape, hint)
    rank = len(shape)
    order = split_order(enc, rank)
    inverse = [int(i) for i in np.argsort(order)]
    if inverse != list(range(len(order))):
        x = emit("Transpose", [x], f"{hint}/transpose", perm=inverse)
    padded = list(enc.padded_shape(shape))
    if len(order) != rank:
        x = emit("Reshape", [x, const(np.array(padded, np.int64), f"{hint}/shape")], f"{hint}/reshape")
    cut = [d for d in range(rank) if padded[d] != shape[d]]
    if cut:
        starts = const(np.zeros(len(cut), np.int64), f"{hint}/starts")
        ends = const(np.array([shape[d] for d in cut], np.int64), f"{hint}/ends")
        axes = const(np.array(cut, np.int64), f"{hint}/axes")
        x = emit("Slice", [x, starts, ends, axes], f"{hint}/slice")
    return x


def lower_pack(x: str, enc: PackedEncoding, shape: Sequence[Dim], dtype: np.dtype, emit: Emit, const: Const,
               hint: str) -> str:
    """The packed buffer of the logical tensor named `x` (padding filled with `enc.pad`, 0 if unknown)."""
    shape = _static(enc, shape, hint)
    rank = len(shape)
    padded = list(enc.padded_shape(shape))
    if padded != shape:
        pads = const(np.array([0] * rank + [p - d for p, d in zip(padded, shape)], np.int64), f"{hint}/pads")
        fill = const(np.array(0 if enc.pad is None else enc.pad, dtype=dtype), f"{hint}/fill")
        x = emit("Pad", [x, pads, fill], f"{hint}/pad")
    order = split_order(enc, rank)
    if len(order) != rank:
        x = emit("Reshape", [x, const(np.array(split_shape(enc, shape), np.int64), f"{hint}/shape")],
                 f"{hint}/reshape")
    if order != list(range(len(order))):
        x = emit("Transpose", [x], f"{hint}/transpose", perm=order)
    return x
