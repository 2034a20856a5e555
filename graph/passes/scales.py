"""fold_scales: a Mul by a constant scalar moved into the weights of the product it scales.

torch's scaled_dot_product_attention, exported, scales queries and keys by d**-1/4 each after
splitting them into heads: Mul(Transpose(Reshape(Add(MatMul(x, W), b))), s). A scalar
commutes with the reshapes and the transpose, so (x W + b) s = x (W s) + b s: the scale
folds into W and b, and the Mul, a pass over the activations at run time (a kernel launch
of its own on a GPU), goes. The same holds for a Gemm (alpha and beta scaled, no copy).

Only where every value on the way has one reader (another reader must still see the
unscaled value), the weight and bias are float constants that are not dequantized integers (a
scaled copy would lose them), and the Mul's result has its operand's type.
"""
from __future__ import annotations

from ..graph import DEQUANTIZED, Graph, Node
from ..ops.tensor import RESHAPES
from ..types import Splat, Value, as_array
from .fold import _apply
from .pipeline import Pass, PassResult

_SHAPE_ONLY = RESHAPES | {"Transpose"}


def _scalar(graph: Graph, value: Value | None) -> float | None:
    """The value a one-element float constant holds, else None."""
    const = graph.constant_value(value)
    if const is None or graph.type_of(value).dtype.kind != "f":  # type: ignore[arg-type]
        return None
    if isinstance(const, Splat):
        return float(const.value)
    return float(as_array(const).ravel()[0]) if as_array(const).size == 1 else None


def _float_weight(graph: Graph, value: Value | None) -> bool:
    """A float constant that is not a folded DequantizeLinear."""
    if graph.constant_value(value) is None or graph.type_of(value).dtype.kind != "f":  # type: ignore[arg-type]
        return False
    return DEQUANTIZED not in graph.node(value.node).attrs  # type: ignore[union-attr]


def _product(graph: Graph, value: Value) -> Node | None:
    """The MatMul, bias Add or Gemm that computes `value` through shape-only ops, every value
    on the way read once; None when there is none."""
    node = graph.node(value.node)
    while node.op in _SHAPE_ONLY and len(graph.users(value)) == 1:
        value = graph.inputs_of(node.name)[0]  # type: ignore[assignment]
        node = graph.node(value.node)
    if len(graph.users(value)) != 1 or len(node.outputs) != 1:
        return None
    ins = graph.inputs_of(node.name)
    if node.op == "Add":
        return node if any(_biased_product(graph, m, b) for m, b in ((ins[0], ins[1]), (ins[1], ins[0]))) else None
    if node.op == "MatMul":
        return node if _float_weight(graph, ins[1]) else None
    return node if node.op == "Gemm" else None


def _biased_product(graph: Graph, matmul: Value | None, bias: Value | None) -> bool:
    """`matmul` is a MatMul of a float weight read only here, `bias` a float constant."""
    if matmul is None or graph.node(matmul.node).op != "MatMul" or len(graph.users(matmul)) != 1:
        return False
    return _float_weight(graph, bias) and _float_weight(graph, graph.inputs_of(matmul.node)[1])


def _scale_constant(graph: Graph, node: Node, slot: int, factor: float) -> None:
    value = graph.inputs_of(node.name)[slot]
    assert value is not None
    scaled = _apply(lambda c: c * factor, graph.constant_value(value))
    graph.set_input(node.name, slot, graph.add_constant(scaled, name=f"{graph.value_name(value)}_scaled"))


def _fold(graph: Graph, product: Node, factor: float) -> None:
    if product.op == "Gemm":
        product.attrs = {**product.attrs, "alpha": float(product.attrs.get("alpha", 1.0)) * factor,
                         "beta": float(product.attrs.get("beta", 1.0)) * factor}
        return
    if product.op == "Add":
        ins = graph.inputs_of(product.name)
        bias_slot = 1 if _biased_product(graph, ins[0], ins[1]) else 0
        _scale_constant(graph, product, bias_slot, factor)
        product = graph.node(ins[1 - bias_slot].node)  # type: ignore[union-attr]
    _scale_constant(graph, product, 1, factor)


def _fold_scales(graph: Graph) -> PassResult:
    modified = False
    for mul in graph.nodes():
        if mul.op != "Mul" or mul.name not in graph or len(mul.outputs) != 1:
            continue
        a, b = graph.inputs_of(mul.name)[:2]
        for operand, other in ((a, b), (b, a)):
            factor = _scalar(graph, other)
            if factor is None or operand is None or graph.type_of(operand) != mul.outputs[0]:
                continue
            product = _product(graph, operand)
            if product is None:
                continue
            _fold(graph, product, factor)
            graph.replace_all_uses(Value(mul.name), operand)
            graph.remove_node(mul.name)
            modified = True
            break
    return PassResult(graph, modified)


fold_scales = Pass("fold_scales", _fold_scales)
