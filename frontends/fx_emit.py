"""The Emitter: what an ATen rule (fx_ops.py) uses to add nodes to a tilefold Graph.

Every node it adds gets its output types from tilefold's own shape inference (the op
registry); a node that stands for an fx node is checked against the shape and dtype torch
traced (`meta["val"]`), so that a rule that disagrees with torch is caught at conversion,
as an UnsupportedOpError naming the node, never a wrong answer at run time.
"""
from __future__ import annotations

from typing import Any, Sequence

import ml_dtypes
import numpy as np
import torch
import torch.fx

from ..graph import registry
from ..graph.errors import UnsupportedOpError
from ..graph.graph import Graph
from ..graph.types import ConstValue, Splat, TensorType, Value

_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}
_ONNX_CODES = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.int16): 5,
               np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.bool_): 9, np.dtype(np.float16): 10,
               np.dtype(np.float64): 11, np.dtype(ml_dtypes.bfloat16): 16}


def supported_dtype(dtype: torch.dtype) -> bool:
    return dtype in _DTYPES


def torch_to_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype; UnsupportedOpError for those numpy lacks (bfloat16, ...)."""
    try:
        return np.dtype(_DTYPES[dtype])
    except KeyError:
        raise UnsupportedOpError(f"element type {dtype} is not supported by tilefold") from None


def tensor_type(val: torch.Tensor) -> TensorType:
    """The TensorType of a (fake) tensor with static shape."""
    return TensorType(tuple(int(d) for d in val.shape), torch_to_numpy_dtype(val.dtype))


def out_val(node: torch.fx.Node) -> Any:
    """The traced result of an fx node: a (fake) tensor, or a tuple of them."""
    return node.meta["val"]


def arg(node: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    """An argument given positionally or by keyword, else its default."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


class Emitter:
    """Adds tilefold nodes to `graph` for fx nodes; `values` maps fx nodes to their Values."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.values: dict[torch.fx.Node, Any] = {}

    # ---- operands ----------------------------------------------------------------------
    def value(self, node: Any) -> Value:
        """The Value an fx node (a tensor) produced."""
        if not isinstance(node, torch.fx.Node):
            raise UnsupportedOpError(f"expected a tensor operand, got {node!r}")
        value = self.values[node]
        if not isinstance(value, Value):
            raise UnsupportedOpError(f"fx node {node.name!r} is not a single tensor")
        return value

    def tensor(self, x: Any, dtype: torch.dtype) -> Value:
        """An operand (fx node or Python number) as a tensor of `dtype` (Cast when needed)."""
        if not isinstance(x, torch.fx.Node):
            return self.scalar(x, dtype)
        return self.cast(self.value(x), dtype)

    def cast(self, value: Value, dtype: torch.dtype | np.dtype) -> Value:
        """`value` as `dtype` (a Cast when its dtype differs)."""
        target = torch_to_numpy_dtype(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)
        if self.graph.type_of(value).dtype == target:
            return value
        return self.op("Cast", [value], {"to": _ONNX_CODES[target]})

    def scalar(self, number: Any, dtype: torch.dtype | np.dtype) -> Value:
        np_dtype = torch_to_numpy_dtype(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)
        return self.constant(np.array(number, dtype=np_dtype))

    def ints(self, values: Sequence[int]) -> Value:
        return self.constant(np.array([int(v) for v in values], dtype=np.int64))

    def constant(self, value: ConstValue, name: str | None = None) -> Value:
        return self.graph.add_constant(value, name=name or "const")

    # ---- nodes ---------------------------------------------------------------------------
    def op(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        node: torch.fx.Node | None = None,
        n_out: int = 1,
        result: int | None = None,
    ) -> Any:
        """Add `op`; returns its Value (a tuple of `n_out` Values when n_out > 1). With `node`,
        the result is checked against the node's traced value (its item `result` when the
        fx node has several results and this op gives only that one)."""
        graph = self.graph
        full = registry.with_defaults(op, {k: v for k, v in (attrs or {}).items() if v is not None})
        types = [None if v is None else graph.type_of(v) for v in inputs]
        consts = [graph.constant_value(v) for v in inputs]
        name = node.name if node is not None else op.lower()
        try:
            outs = registry.infer(op, full, types, consts)[:n_out]
        except Exception as exc:  # a rule that builds an op tilefold rejects: not convertible
            raise UnsupportedOpError(f"fx node {name!r}: {op} rejects its operands: {exc}") from None
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        added = graph.add_node(op, list(inputs), outs, full, name=name, origin=name)
        values = tuple(Value(added.name, i) for i in range(n_out))
        if node is not None:
            traced = out_val(node)
            if result is not None:
                traced = traced[result]
            expected = list(traced) if n_out > 1 else [traced]
            for got, want in zip(outs, expected):
                _check_type(name, op, got, want)
        return values if n_out > 1 else values[0]


def _check_type(name: str, op: str, got: TensorType, want: torch.Tensor) -> None:
    shape = tuple(int(d) for d in want.shape)
    if got.shape != shape or got.dtype != torch_to_numpy_dtype(want.dtype):
        raise UnsupportedOpError(
            f"fx node {name!r}: tilefold's {op} gives {got} where torch gives {want.dtype}{list(shape)}"
        )


__all__ = ["Emitter", "Splat", "arg", "out_val", "supported_dtype", "tensor_type", "torch_to_numpy_dtype"]
