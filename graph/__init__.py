"""The IR: graph, values, tensor types, op registry, verifier, passes."""
from . import ops as _ops  # noqa: F401  (registers the built-in ops)
from .errors import InputError, ModelError, TilefoldError, UnsupportedOpError, VerifyError
from .graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from .registry import CANONICAL_OPSET, REGISTRY, OpDef, register
from .signature import Signature
from .types import Dim, Splat, TensorType, Value

__all__ = [
    "CANONICAL_OPSET", "CONSTANT", "INPUT", "OUTPUT", "REGISTRY", "Dim", "Graph", "InputError",
    "ModelError", "Node", "OpDef", "Signature", "Splat", "TensorType", "TilefoldError",
    "UnsupportedOpError", "Value", "VerifyError", "register",
]
