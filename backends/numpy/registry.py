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

Two more say how a kernel meets packed encodings (backends/numpy/packed.py adapts the rest):
- `physical`: the kernel is elementwise, so it runs unchanged on physical buffers laid out
  alike (every `inplace` kernel is);
- `packed`: factories registered with `packed_kernel(op)` that handle packed operand and
  result encodings natively; each returns `run`, or None to decline those encodings.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...graph.graph import Node
from ...graph.types import ConstValue, TensorType

Run = Callable[..., Any]
PackedBuild = Callable[["KernelSpec"], "Run | None"]


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
    physical: bool = False
    packed: tuple[PackedBuild, ...] = ()


KERNELS: dict[str, KernelDef] = {}


def kernel(op: str, *, inplace: bool = False, views: bool = False, physical: bool | None = None):
    """Register a kernel factory `build(spec) -> run` for `op`; `physical` defaults to `inplace`."""

    def wrap(build: Callable[[KernelSpec], Run]) -> Callable[[KernelSpec], Run]:
        packed = KERNELS[op].packed if op in KERNELS else ()
        KERNELS[op] = KernelDef(op, build, inplace, views, inplace if physical is None else physical, packed)
        return build

    return wrap


def packed_kernel(op: str):
    """Add a native factory `build(spec) -> run | None` for `op` on packed encodings."""

    def wrap(build: PackedBuild) -> PackedBuild:
        kdef = KERNELS[op]
        KERNELS[op] = dataclasses.replace(kdef, packed=kdef.packed + (build,))
        return build

    return wrap


def simple(*ops: str, inplace: bool = False, views: bool = False):
    """Register `fn(attrs, *inputs[, out=])` for ops that need no compile-time work."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            KERNELS[op] = KernelDef(
                op, lambda spec, fn=fn: functools.partial(fn, spec.attrs), inplace, views, inplace
            )
        return fn

    return wrap


def supports(op: str) -> bool:
    return op in KERNELS


KERNEL_SETS = ("numpy", "aten")


def kernel_set(name: str) -> dict[str, KernelDef]:
    """The kernel table of a named set: "numpy" (the default), or "aten" (kernels/aten.py:
    PyTorch's one-pass kernels for Gelu, Erf, Sigmoid, Softmax and LayerNormalization; imports
    torch)."""
    if name == "numpy":
        return KERNELS
    if name == "aten":
        from .kernels.aten import ATEN

        return {**KERNELS, **ATEN}
    from ...graph.errors import TilefoldError

    raise TilefoldError(f"unknown kernel set {name!r}: choose one of {', '.join(KERNEL_SETS)}")
