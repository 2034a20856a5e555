"""Built-in op entries; importing this package registers them.

Modules by family: core (graph structure), elementwise, linalg (the anchors), nn
(normalizations, softmax, pooling), reduce, tensor (data movement), indexing (gathers,
shape-producing ops), resize, quantize (QDQ).
"""
from . import core  # noqa: F401
from . import elementwise, indexing, layout, linalg, nn, quantize, reduce, resize, tensor  # noqa: F401

ONNX_OPS: frozenset[str] = frozenset("""
Relu LeakyRelu Sigmoid HardSigmoid HardSwish Tanh Erf Gelu Softplus Elu Sqrt Exp Log Neg Abs
Reciprocal Floor Ceil Round Sin Cos Sign Not IsNaN IsInf
Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Softsign Mish Selu Celu ThresholdedRelu Shrink
Add Sub Mul Div Pow Mod Max Min Sum Mean Equal Less LessOrEqual Greater GreaterOrEqual And Or
Xor BitwiseAnd BitwiseOr BitwiseXor BitwiseNot BitShift PRelu Where Clip Cast CastLike Identity Dropout
MatMul Gemm Conv ConvTranspose BatchNormalization InstanceNormalization LayerNormalization LRN Softmax LogSoftmax MaxPool
AveragePool GlobalAveragePool GlobalMaxPool
ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp
ReduceSumSquare ArgMax ArgMin TopK
Reshape Flatten Transpose Squeeze Unsqueeze Expand Concat Split Slice Gather GatherElements
GatherND Tile Pad Shape Size ConstantOfShape Range Trilu CumSum Resize
ScatterElements ScatterND DepthToSpace SpaceToDepth OneHot Einsum EyeLike NonZero
QuantizeLinear DequantizeLinear
""".split())
"""The ONNX ops (default domain, opset 21 semantics) that tilefold registers and runs
natively; any other ONNX op becomes an OnnxReference node."""

SHAPE_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Tile": frozenset({1}),
    "ConstantOfShape": frozenset({0}), "Range": frozenset({0, 1, 2}),
    "Slice": frozenset({1, 2, 3, 4}), "Pad": frozenset({1, 3}), "Split": frozenset({1}),
    "Squeeze": frozenset({1}), "Unsqueeze": frozenset({1}), "TopK": frozenset({1}),
    "Resize": frozenset({1, 2, 3}), "OneHot": frozenset({1}), "NonZero": frozenset({0}),
    **{op: frozenset({1}) for op in reduce.REDUCE_OPS},
}
"""Input slots whose values decide result shapes (shape, axes, pads, repeats, ...): infer
reads them from constants, and they are `None` operands of the iteration signature."""
