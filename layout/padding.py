"""What the padding of a packed tensor holds, and where it may be read.

A reduction reads a padded tiled dim only when the padding holds its identity
(`NEUTRAL_PAD`: zero for sums and means, which divide by the true count; -inf for max); a
result's padding is known to be zero only for a zero-keeping op (`KEEPS_ZERO`) whose operands
all hold zero padding over the result's padded dims; anything else is unknown (pad=None).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..graph.graph import Graph, Node
from ..graph.signature import Signature
from ..graph.types import TensorType, Value
from .encoding import PackedEncoding

NEUTRAL_PAD: dict[str, float] = {
    "ReduceSum": 0.0, "ReduceMean": 0.0, "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceSumSquare": 0.0,
    "GlobalAveragePool": 0.0, "ReduceMax": -np.inf, "GlobalMaxPool": -np.inf, "ReduceLogSumExp": -np.inf,
    "ReduceLogSum": 0.0, "ReduceMin": np.inf, "ReduceProd": 1.0,
}
"""What the padding of a reduced tiled dim must hold for the reduction to ignore it (a mean
divides by the true count). Other reductions (Softmax, LayerNormalization, ArgMax) go over a
tiled dim only when its tile divides it."""

KEEPS_ZERO = frozenset({
    "Identity", "Cast", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Gelu", "Tanh", "Erf", "Sin", "Sinh", "Asin",
    "Atan", "Asinh", "Atanh", "Tan", "Sqrt", "Abs", "Neg", "Sign", "Round", "Floor", "Ceil", "Softsign", "HardSwish",
    "Mish", "Celu", "ThresholdedRelu", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitShift",
    "Add", "Sub", "Mul", "Max", "Min", "Sum", "Where", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
    "Expand", "Concat", "Split", "Slice", "Gather", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
})
"""Ops whose result is zero wherever every operand is zero: zero padding in, zero padding out
(Where: the padding selects between two zeros)."""


def padded_dims(t: TensorType) -> list[int]:
    enc = t.encoding
    if not isinstance(enc, PackedEncoding):
        return []
    return [d for d, tile in enc.tiles().items() if isinstance(t.shape[d], int) and t.shape[d] % tile]


def _operand_letters(sig: Signature, i: int, t: TensorType | None) -> list[str | None] | None:
    """Operand i's letters; a constant reshaped to the result's rank (`Mapping.ranked`) gets
    the result's leading letters."""
    letters = sig.letters(i, False) if i < len(sig.operands) and t is not None else None
    if letters is not None and len(letters) < t.rank:
        letters = list(sig.results[0][: t.rank - len(letters)]) + letters
    return letters


def _result_pad(node: Node, sig: Signature, types: Sequence[TensorType | None], k: int,
                enc: PackedEncoding) -> float | None:
    """0 when result k's padding provably holds zeros: a zero-keeping op whose every indexed
    operand is packed with zero padding over each padded dim of the result (an operand that
    broadcasts along such a dim would write its values there); else None (unknown)."""
    if node.op not in KEEPS_ZERO:
        return None
    out = node.outputs[k]
    letters = sig.letters(k, True)
    padded = {letters[d]: out.shape[d] for d in padded_dims(TensorType(out.shape, out.dtype, enc))}
    for i, t in enumerate(types):
        mine = _operand_letters(sig, i, t)
        if mine is None:
            continue
        if not isinstance(t.encoding, PackedEncoding) or t.encoding.pad != 0.0:
            return None
        have = {mine[d]: t.shape[d] for d in padded_dims(t)}
        if any(have.get(letter) != size for letter, size in padded.items()):
            return None
    return 0.0


def padding_checked(graph: Graph, node: Node, sig: Signature, sources: Sequence[Value | None],
                     results: Sequence[PackedEncoding | None]) -> list[PackedEncoding | None] | None:
    """The results' encodings with what their padding holds, or None when padding would leak
    into a reduction (padding is never read into a result)."""
    types = [graph.type_of(v) if v is not None else None for v in sources]
    for i, t in enumerate(types):
        letters = _operand_letters(sig, i, t)
        if letters is None:
            continue
        for d in padded_dims(t):
            if sig.kind(letters[d]) == "reduction" and NEUTRAL_PAD.get(node.op, np.nan) != t.encoding.pad:
                return None
    checked: list[PackedEncoding | None] = []
    for k, enc in enumerate(results):
        out = node.outputs[k]
        if enc is None or not padded_dims(TensorType(out.shape, out.dtype, enc)):
            checked.append(enc)
        else:
            checked.append(enc.with_pad(_result_pad(node, sig, types, k, enc)))
    return checked
