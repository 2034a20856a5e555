"""fold_scales: a Mul by a constant scalar moved into the weights of the product it scales.

torch's scaled_dot_product_attention, exported, scales queries and keys by d**-1/4 each after
splitting them into heads: Mul(Transpose(Reshape(Add(MatMul(x, W), b))), s). A scalar
commutes with the reshapes and the transpose, so (x W + b) s = x (W s) + b s: the scale
folds into W and b, and the Mul, a pass over the activations at run time (a kernel launch
of its own on a GPU), goes. The same holds for a Gemm (alpha and beta scaled, no copy), and
for one piece of a Split of the product's features (GPT-2's fused query, key and value: the
piece's columns of W and b scaled).

Only where every value on the way has one reader (another reader must still see the
unscaled value), the weight and bias are float constants that are not dequantized integers (a
scaled copy would lose them), and the Mul's result has its operand's type.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import DEQUANTIZED, Graph, Node
from ..ops.tensor import RESHAPES
from ..types import ConstValue, Splat, Value, as_array, is_float_dtype
from .fold import _apply
from .pipeline import Pass, PassResult

_SHAPE_ONLY = RESHAPES | {"Transpose"}


@dataclass
class _Scaled:
    """What a scale folds into: the (node, input slot) of each constant to scale (a MatMul's
    weight, and a bias Add's bias), or a Gemm whose alpha and beta scale instead; and the
    columns (features) of the result that the scaled value holds (None: all of them)."""

    constants: list[tuple[Node, int]]
    gemm: Node | None = None
    columns: slice | None = None


def scalar(graph: Graph, value: Value | None) -> float | None:
    """The value a one-element float constant holds, else None."""
    const = graph.constant_value(value)
    if const is None or not is_float_dtype(graph.type_of(value).dtype):  # type: ignore[arg-type]
        return None
    if isinstance(const, Splat):
        return float(const.value)
    array = as_array(const)
    return float(array.ravel()[0]) if array.size == 1 else None


def _float_weight(graph: Graph, value: Value | None) -> bool:
    """A float constant that is not a folded DequantizeLinear."""
    if graph.constant_value(value) is None or not is_float_dtype(graph.type_of(value).dtype):  # type: ignore[arg-type]
        return False
    return DEQUANTIZED not in graph.node(value.node).attrs  # type: ignore[union-attr]


def _read_once(graph: Graph, value: Value) -> bool:
    return len(graph.users(value)) == 1


def _piece(graph: Graph, value: Value) -> tuple[Value, slice] | None:
    """For a piece of a Split of its operand's last axis: the operand and the piece's columns."""
    split = graph.node(value.node)
    operand = graph.inputs_of(split.name)[0]
    if operand is None:
        return None
    rank = len(graph.type_of(operand).shape)
    if int(split.attrs.get("axis", 0)) % rank != rank - 1 or not all(t.is_static for t in split.outputs):
        return None
    start = sum(int(t.shape[-1]) for t in split.outputs[:value.slot])
    return operand, slice(start, start + int(split.outputs[value.slot].shape[-1]))


def _scaled(graph: Graph, value: Value) -> _Scaled | None:
    """What computes `value` through shape-only ops (and at most one Split of its features),
    every value on the way read once; None when it is not a product with float weights."""
    node = graph.node(value.node)
    while node.op in _SHAPE_ONLY and _read_once(graph, value):
        value = graph.inputs_of(node.name)[0]  # type: ignore[assignment]
        node = graph.node(value.node)
    if not _read_once(graph, value):
        return None
    columns = None
    if node.op == "Split":
        piece = _piece(graph, value)
        if piece is None or not _read_once(graph, piece[0]):
            return None
        value, columns = piece
        node = graph.node(value.node)
    if len(node.outputs) != 1:
        return None
    ins = graph.inputs_of(node.name)
    if node.op == "Add":
        for bias_slot in (1, 0):
            matmul = ins[1 - bias_slot]
            if matmul is not None and _biased_product(graph, matmul, ins[bias_slot]):
                return _Scaled([(node, bias_slot), (graph.node(matmul.node), 1)], columns=columns)
        return None
    if node.op == "MatMul" and _float_weight(graph, ins[1]):
        return _Scaled([(node, 1)], columns=columns)
    return _Scaled([], gemm=node) if node.op == "Gemm" and columns is None else None


def _biased_product(graph: Graph, matmul: Value | None, bias: Value | None) -> bool:
    """`matmul` is a MatMul of a float weight read only here, `bias` a float constant with a
    value per column (or one for all, where every column is scaled)."""
    if matmul is None or graph.node(matmul.node).op != "MatMul" or not _read_once(graph, matmul):
        return False
    return _float_weight(graph, bias) and _float_weight(graph, graph.inputs_of(matmul.node)[1])


def _times(const: ConstValue, factor: float, columns: slice | None) -> ConstValue | None:
    """`const` with its `columns` (last axis; all when None) multiplied by `factor`; None when
    it does not have one value per column."""
    if columns is None:
        return _apply(lambda c: c * factor, const)
    if len(const.shape) == 0 or const.shape[-1] < columns.stop:
        return None
    scaled = np.array(as_array(const))
    scaled[..., columns] *= scaled.dtype.type(factor)
    return scaled


def _fold(graph: Graph, target: _Scaled, factor: float) -> bool:
    """Scale the target's weights (or a Gemm's alpha and beta); False, changing nothing, where
    a constant has no value per column."""
    gemm = target.gemm
    if gemm is not None:
        gemm.attrs = {**gemm.attrs, "alpha": float(gemm.attrs.get("alpha", 1.0)) * factor,
                      "beta": float(gemm.attrs.get("beta", 1.0)) * factor}
        return True
    values = [graph.inputs_of(node.name)[slot] for node, slot in target.constants]
    scaled = [_times(graph.constant_value(v), factor, target.columns) for v in values]  # type: ignore[arg-type]
    if any(s is None for s in scaled):
        return False
    for (node, slot), value, new in zip(target.constants, values, scaled):
        name = f"{graph.value_name(value)}_scaled"  # type: ignore[arg-type]
        graph.set_input(node.name, slot, graph.add_constant(new, name=name))  # type: ignore[arg-type]
    return True


def _fold_scales(graph: Graph) -> PassResult:
    modified = False
    for mul in graph.nodes():
        if mul.op != "Mul" or mul.name not in graph or len(mul.outputs) != 1:
            continue
        a, b = graph.inputs_of(mul.name)[:2]
        for operand, other in ((a, b), (b, a)):
            factor = scalar(graph, other)
            if factor is None or operand is None or graph.type_of(operand) != mul.outputs[0]:
                continue
            target = _scaled(graph, operand)
            if target is None or not _fold(graph, target, factor):
                continue
            graph.replace_all_uses(Value(mul.name), operand)
            graph.remove_node(mul.name)
            modified = True
            break
    return PassResult(graph, modified)


fold_scales = Pass("fold_scales", _fold_scales)
