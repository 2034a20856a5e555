"""Graph-structure ops: inputs, outputs, constants, identity, and the onnx.reference fallback."""
from __future__ import annotations

from ..registry import OpDef, register
from ..signature import LETTERS, Signature
from ..types import TensorType, type_of_constant


def _identity_signature(attrs, types, outs, consts=None):
    letters = LETTERS[: outs[0].rank]
    return Signature((tuple(letters),), (tuple(letters),))


register(OpDef("Input", infer=lambda a, t, c: [a["type"]], min_inputs=0, max_inputs=0,
               doc="A graph input; attrs: type."))
register(OpDef("Output", infer=lambda a, t, c: [], min_inputs=1, max_inputs=1,
               doc="A graph output; attrs: name."))
register(OpDef("Constant", infer=lambda a, t, c: [type_of_constant(a["value"])],
               min_inputs=0, max_inputs=0, doc="attrs: value (read-only ndarray or Splat)."))
register(OpDef("Identity", infer=lambda a, t, c: [TensorType(t[0].shape, t[0].dtype)],
               signature=_identity_signature, layout="agnostic", splat="movement", forwards=0))
register(OpDef(
    "OnnxReference",
    infer=lambda a, t, c: list(a["output_types"]),
    min_inputs=0, max_inputs=None,
    doc="An ONNX op tilefold has no kernel for, run by onnx.reference on the CPU. attrs: "
        "onnx_op, domain, proto (serialized NodeProto), opset, output_types.",
))
