"""Plain data of the IR: tensor types, splat constants, values.

graph/ depends on numpy and networkx only; encodings are defined by layout/ and
reach the IR through the small `Encoding` protocol below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

Dim = int | str
"""A dimension: a static size, or the name of a symbolic (dynamic) size."""


@runtime_checkable
class Encoding(Protocol):
    """What the IR needs of a (packed) layout encoding; layout/ implements it."""

    def physical_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]: ...

    def validate(self, shape: tuple[Dim, ...]) -> None: ...

    def pack(self, array: np.ndarray) -> np.ndarray:
        """The packed buffer of a logical array (a reader rebuilds a packed constant with it)."""
        ...


def is_float_dtype(dtype: np.dtype) -> bool:
    """A floating-point element type, bfloat16 included (ml_dtypes': NumPy's kind "V")."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


@dataclass(frozen=True)
class TensorType:
    """Logical shape, element type and physical encoding (None = identity, row-major)."""

    shape: tuple[Dim, ...]
    dtype: np.dtype
    encoding: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def numel(self) -> int | None:
        """Number of logical elements, or None when a dim is symbolic."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.is_static else None

    def nbytes(self) -> int | None:
        """Bytes of the buffer holding this tensor, padding of its encoding included."""
        if not self.is_static:
            return None
        shape = self.shape if self.encoding is None else self.encoding.physical_shape(self.shape)
        return int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype, self.encoding)

    def logical(self) -> TensorType:
        """The same tensor in the identity layout (its encoding dropped)."""
        return self if self.encoding is None else TensorType(self.shape, self.dtype)

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        enc = "" if self.encoding is None else f" {self.encoding}"
        return f"{self.dtype.name}[{dims}]{enc}"


@dataclass(frozen=True)
class Splat:
    """A constant whose every element is `value`: kept as one scalar, never materialized."""

    value: Any
    shape: tuple[int, ...]
    dtype: np.dtype = field(default=np.dtype(np.float32))

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "value", np.dtype(self.dtype).type(self.value).item())

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize

    def to_array(self) -> np.ndarray:
        """A read-only broadcast view: one element of memory whatever the shape."""
        return np.broadcast_to(np.array(self.value, dtype=self.dtype), self.shape)

    def reshape(self, shape: tuple[int, ...]) -> Splat:
        return Splat(self.value, shape, self.dtype)

    def astype(self, dtype: np.dtype) -> Splat:
        return Splat(np.array(self.value).astype(dtype).item(), self.shape, dtype)


ConstValue = np.ndarray | Splat


@dataclass(frozen=True, eq=False)
class Dequantized:
    """How a folded constant was computed: ONNX DequantizeLinear of integer `data` (`scale`,
    `zero_point`, `axis`, `block_size` as on the node). A constant keeps it (its `DEQUANTIZED`
    attribute) so that a written model stores the integers and the op again, not the floats:
    a quantized model's int8 weights stay a quarter of the size."""

    data: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    axis: int
    block_size: int

    def __repr__(self) -> str:
        def brief(a: np.ndarray | None) -> str:
            return "None" if a is None else f"{a.dtype}[{'x'.join(str(d) for d in a.shape)}]"

        return (f"Dequantized({brief(self.data)}, scale={brief(self.scale)}, zero_point={brief(self.zero_point)}, "
                f"axis={self.axis}, block_size={self.block_size})")

    def reshaped(self, shape: tuple[int, ...]) -> Dequantized | None:
        """The same for the value reshaped to `shape`; None where a per-axis or blocked scale
        would no longer line up."""
        if self.scale.size != 1:
            return None
        return Dequantized(freeze(self.data.reshape(shape)), self.scale, self.zero_point, 0, 0)


def as_array(value: ConstValue) -> np.ndarray:
    """A constant as an array; a splat as its read-only one-element broadcast view."""
    return value.to_array() if isinstance(value, Splat) else np.asarray(value)


def type_of_constant(value: ConstValue) -> TensorType:
    return TensorType(tuple(int(d) for d in value.shape), value.dtype)


def freeze(array: np.ndarray) -> np.ndarray:
    """A read-only array for a constant: kernels must never write into constants."""
    array = np.asarray(array)
    if array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array


class Value(NamedTuple):
    """One output slot of one node: the unit that edges carry."""

    node: str
    slot: int = 0

    def __str__(self) -> str:
        return self.node if self.slot == 0 else f"{self.node}:{self.slot}"
