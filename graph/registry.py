"""The op registry: the one place that knows an op.

An `OpDef` holds an op's arity, attribute defaults, shape/dtype inference, iteration
signature, layout kind and purity. Op semantics are those of ONNX at opset
`CANONICAL_OPSET` (the ONNX frontend upgrades older models to it); tilefold's own ops
(pack, unpack, transfer, ...) are registered the same way. Backends keep their kernels
in tables keyed by the same op names; `kernels_for` is not here because graph/ never
imports a backend.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from .errors import UnsupportedOpError, VerifyError, where
from .signature import Signature
from .types import ConstValue, Dequantized, TensorType

CANONICAL_OPSET = 21

LayoutKind = Literal["agnostic", "sensitive", "anchor", "opaque"]
"""How layout propagation treats an op (TVM's three kinds plus anchors):
agnostic: follows its signature (elementwise, activations); sensitive: follows its
signature after adjusting axis attributes (reductions, concat, transpose, reshape);
anchor: chooses a layout (matmul, conv); opaque: layout stops here.

`splat` says how the op acts on splat constants, so folding keeps them unmaterialized:
"elementwise" (the result is a splat of f(values)), "movement" (the value passes through
unchanged into the inferred result shape: reshape, transpose, expand, slice).
`static_value(attrs, types)` gives the result when input types alone decide it (Shape,
Size on static shapes), else None. `forwards = i`: result 0 is input i unchanged
(Identity, inference Dropout), so simplification may bypass the node."""

InferFn = Callable[[dict[str, Any], list[TensorType | None], list[ConstValue | None]], list[TensorType]]
SignatureFn = Callable[
    [dict[str, Any], list[TensorType | None], list[TensorType], list[ConstValue | None]], Signature | None
]
"""(attrs, input types, output types, constant inputs) -> signature, or None (opaque)."""


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: InferFn
    signature: SignatureFn | None = None
    layout: LayoutKind = "opaque"
    pure: bool = True
    min_inputs: int = 1
    max_inputs: int | None = 1  # None = variadic
    defaults: dict[str, Any] = field(default_factory=dict)
    splat: Literal["elementwise", "movement"] | None = None
    static_value: Callable[[dict[str, Any], list[TensorType | None]], Any] | None = None
    forwards: int | None = None
    broadcasts: bool = False
    """Its operands broadcast NumPy-style (right-aligned) against its result, so layout
    propagation may give a lower-rank constant operand the result's rank to pack it."""
    tiled_windows: bool = False
    """Its kernels index its window dims logically (a tile boundary inside a window is an
    index like any other, padding never read), so layout propagation may tile them."""
    fold_origin: Callable[[dict[str, Any], list[ConstValue | None]], Dequantized | None] | None = None
    """(attrs, constant inputs) -> what a constant folded from this op keeps of how it was
    computed (DequantizeLinear: its integers, as a `Dequantized`), or None."""
    doc: str = ""

    def check_arity(self, n: int, node: object) -> None:
        high = "any" if self.max_inputs is None else self.max_inputs
        if n < self.min_inputs or (self.max_inputs is not None and n > self.max_inputs):
            raise VerifyError(
                f"{where(node)} takes {self.min_inputs} to {high} inputs, got {n}"
            )


REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an op (a user may register their own from Python)."""
    REGISTRY[opdef.name] = opdef
    return opdef


def get(op: str, node: object | None = None) -> OpDef:
    try:
        return REGISTRY[op]
    except KeyError:
        subject = where(node) if node is not None else f"op {op!r}"
        raise UnsupportedOpError(f"{subject}: op {op!r} is not supported by tilefold") from None


def is_registered(op: str) -> bool:
    return op in REGISTRY


def infer(
    op: str,
    attrs: dict[str, Any],
    types: Sequence[TensorType | None],
    consts: Sequence[ConstValue | None] | None = None,
    node: object | None = None,
) -> list[TensorType]:
    """Output types of `op` applied to inputs of `types` (constants where known)."""
    opdef = get(op, node)
    full = {**opdef.defaults, **attrs}
    consts = list(consts) if consts is not None else [None] * len(types)
    try:
        return opdef.infer(full, list(types), consts)
    except VerifyError as exc:
        if node is None:
            raise
        raise VerifyError(f"{where(node)}: {exc}") from None


def signature(
    op: str,
    attrs: dict[str, Any],
    types: Sequence[TensorType | None],
    out_types: Sequence[TensorType],
    consts: Sequence[ConstValue | None] | None = None,
) -> Signature | None:
    """The iteration signature of `op` on these operands, or None when it has none."""
    opdef = get(op)
    if opdef.signature is None:
        return None
    consts = list(consts) if consts is not None else [None] * len(types)
    return opdef.signature({**opdef.defaults, **attrs}, list(types), list(out_types), consts)


def with_defaults(op: str, attrs: dict[str, Any]) -> dict[str, Any]:
    return {**get(op).defaults, **attrs}

