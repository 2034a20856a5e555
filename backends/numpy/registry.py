"""The NumPy backend's kernel table: op name -> kernel factory.

A factory runs once per node at compile time with a `KernelSpec` (the node, its input
types and whichever inputs are constants) and returns `run(*inputs)`, so that work which
depends only on attributes or constant weights (weights rearranged into GEMM form, folded
scales) happens once. Missing optional inputs arrive as None.

Two declarations let the executor manage memory safely:
- `inplace`: the kernel is elementwise and accepts `out=`, a buffer the executor hands
  over when an input of the result's shape and dtype dies at this node;
- `views`: the results may share memory with input 0 (reshape, squeeze, transpose, slice,
  split, identity). A kernel that may return a view and does not say so is a bug, caught by the
  executor's `debug` mode.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...graph.graph import Node
from ...graph.types import ConstValue, TensorType

Run = Callable[..., Any]


@dataclass(frozen=True)
class KernelSpec:
    node: Node
    in_types: list[TensorType | None]
    consts: list[ConstValue | None]

    @property
    def attrs(self) -> dict[str, Any]:
        return self.node.attrs

    @property
    def out_types(self) -> list[TensorType]:
        return self.node.outputs

    def const_array(self, index: int) -> np.ndarray | None:
        """Constant input `index` as an array (a splat as a broadcast view), or None."""
        value = self.consts[index] if index < len(self.consts) else None
        if value is None:
            return None
        return value.to_array() if hasattr(value, "to_array") else value


@dataclass(frozen=True)
class KernelDef:
    op: str
    build: Callable[[KernelSpec], Run]
    inplace: bool = False
    views: bool = False


KERNELS: dict[str, KernelDef] = {}


def kernel(op: str, *, inplace: bool = False, views: bool = False):
    """Register a kernel factory `build(spec) -> run` for `op`."""

    def wrap(build: Callable[[KernelSpec], Run]) -> Callable[[KernelSpec], Run]:
        KERNELS[op] = KernelDef(op, build, inplace, views)
        return build

    return wrap


def simple(*ops: str, inplace: bool = False, views: bool = False):
    """Register `fn(attrs, *inputs[, out=])` for ops that need no compile-time work."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            KERNELS[op] = KernelDef(
                op, lambda spec, fn=fn: functools.partial(fn, spec.attrs), inplace, views
            )
        return fn

    return wrap


def supports(op: str) -> bool:
    return op in KERNELS
