"""Shape arithmetic shared by op entries: broadcasting and axis handling with symbolic dims."""
from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

from ..errors import UnsupportedOpError, VerifyError
from ..types import ConstValue, Dim, TensorType, as_array


def broadcast(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """Numpy broadcasting where a dim may be a symbol (equal symbols match; 1 yields)."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = [d for d in dims if d != 1]
        if not known:
            out.append(1)
            continue
        ints = {d for d in known if isinstance(d, int)}
        if len(ints) > 1:
            raise VerifyError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(ints.pop() if ints else known[0])
    return tuple(out)


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise VerifyError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def const_ints(value: ConstValue | None) -> list[int] | None:
    """A small integer constant (shape, axes, starts) as a list, or None when unknown."""
    if value is None:
        return None
    array = as_array(value)
    return [int(v) for v in array.reshape(-1)]


def same_as(types: Sequence[TensorType | None], index: int = 0) -> list[TensorType]:
    """Result typed like input `index` (unary elementwise ops)."""
    t = types[index]
    assert t is not None
    return [t.logical()]


# ---- symbolic dims -----------------------------------------------------------------
FRESH_MARK = "?"
"""Fresh dims (`"Reshape?0"`) stand for a size that depends on a value infer could not see.

They are named from the op and the output position only, so two nodes can produce the
same fresh name for different sizes: a fresh dim never equals anything, not even a dim
of the same name. A caller that knows the node should make them unique (`rename_fresh`).
"""


def fresh(op: str, index: int) -> str:
    return f"{op}{FRESH_MARK}{index}"


def is_fresh(dim: Dim) -> bool:
    return isinstance(dim, str) and FRESH_MARK in dim


def rename_fresh(types: Sequence[TensorType], prefix: str) -> list[TensorType]:
    """`types` with each fresh dim made a unique, ordinary symbol `prefix/Op#i` (prefix:
    the node's name), which then equals itself like any named dim."""
    return [
        t.with_shape(tuple(f"{prefix}/{d.replace(FRESH_MARK, '#')}" if is_fresh(d) else d
                           for d in t.shape))
        for t in types
    ]


def same_dim(a: Dim, b: Dim) -> bool:
    """Known to be equal: equal ints, or the same named symbol (never a fresh dim)."""
    return a == b and not is_fresh(a)


def conflict(a: Dim, b: Dim) -> bool:
    """Known to differ: two different ints. A symbol may be anything."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def _term(dim: Dim) -> str:
    return f"({dim})" if isinstance(dim, str) and ("+" in dim or "-" in dim) else str(dim)


def dim_mul(a: Dim, b: Dim) -> Dim:
    """a*b: an int when both are, else an expression symbol like `"N*4"`."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1 or b == 0:
        return b
    if b == 1 or a == 0:
        return a
    if isinstance(a, int):
        a, b = b, a
    return f"{_term(a)}*{_term(b)}"


def dim_add(a: Dim, b: Dim) -> Dim:
    """a+b: an int when both are, else an expression symbol like `"N+2"` / `"N-1"`."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if b == 0:
        return a
    if a == 0:
        return b
    if isinstance(a, int):
        a, b = b, a
    if isinstance(b, int) and b < 0:
        return f"{a}-{-b}"
    return f"{a}+{b}"


def dim_prod(dims: Sequence[Dim]) -> Dim:
    """Product, symbols first and the static factor last: `"N*S*12"`."""
    static = int(np.prod([d for d in dims if isinstance(d, int)], dtype=np.int64))
    out: Dim = 1
    for d in [d for d in dims if isinstance(d, str)] + [static]:
        out = dim_mul(out, d)
    return out


def dim_sum(dims: Sequence[Dim]) -> Dim:
    """Sum, symbols first and the static part last: `"N+M+3"`."""
    out: Dim = 0
    for d in [d for d in dims if isinstance(d, str)] + [sum(d for d in dims if isinstance(d, int))]:
        out = dim_add(out, d)
    return out


def fmt_shape(shape: Sequence[Dim]) -> str:
    return "[" + "x".join(str(d) for d in shape) + "]"


def norm_axes(axes: Sequence[int], rank: int, op: str) -> list[int]:
    """Axes made non-negative; a repeated axis is an error."""
    out = [norm_axis(a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise VerifyError(f"{op}: repeated axis in {list(axes)} for rank {rank}")
    return out


def length_of(t: TensorType | None, op: str, what: str) -> int:
    """Static length of a 1-D shape-tensor input (its values unknown)."""
    if t is None or t.rank != 1 or not isinstance(t.shape[0], int):
        shape = "missing" if t is None else fmt_shape(t.shape)
        raise UnsupportedOpError(
            f"{op}: input {what} must be constant or have a static 1-D shape, got {shape}"
        )
    return t.shape[0]


# ---- ONNX element types --------------------------------------------------------------
# graph/ does not import onnx, so the TensorProto codes tilefold can hold are listed here.
_ONNX_DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
    7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
    14: np.complex64, 15: np.complex128, 16: ml_dtypes.bfloat16,  # the Triton backend's; the NumPy one refuses it
}
_ONNX_OTHER = {8: "string", 17: "float8e4m3fn", 18: "float8e4m3fnuz",
               19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4",
               23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2"}


def onnx_dtype(code: int, op: str) -> np.dtype:
    """The numpy dtype of an ONNX TensorProto element type code (Cast `to`, stash_type)."""
    if code in _ONNX_DTYPES:
        return np.dtype(_ONNX_DTYPES[code])
    name = _ONNX_OTHER.get(code, f"code {code}")
    raise UnsupportedOpError(f"{op}: element type {name} is not supported by tilefold")


# ---- sliding windows (conv, pooling) -----------------------------------------------
def window_out(
    size: Dim, kernel: int, stride: int, dilation: int, pads: tuple[int, int],
    auto_pad: str, ceil_mode: bool, op: str, index: int,
) -> Dim:
    """Output length of one spatial dim of a conv / pool (ONNX rules, ceil_mode's last
    window must start inside the input or its left padding, as onnxruntime and torch)."""
    span = dilation * (kernel - 1) + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if isinstance(size, int):
            return -(-size // stride)
        return size if stride == 1 else fresh(op, index)
    if auto_pad == "VALID":
        pads = (0, 0)
    elif auto_pad != "NOTSET":
        raise VerifyError(f"{op}: unknown auto_pad {auto_pad!r}")
    if not isinstance(size, int):
        return size if stride == 1 and sum(pads) == span - 1 else fresh(op, index)
    room = size + pads[0] + pads[1] - span
    out = room // stride + 1
    if ceil_mode:  # a window may then overhang the padded input (EfficientNet's 320-wide pool of 2x2)
        out = -(-room // stride) + 1
        if (out - 1) * stride >= size + pads[0]:
            out -= 1
    if out < 1:
        raise VerifyError(
            f"{op}: window {span} (kernel {kernel}, dilation {dilation}) is larger than the "
            f"padded input {size + pads[0] + pads[1]} on spatial dim {index}"
        )
    return out


def window_attrs(op: str, attrs: dict, spatial: Sequence[Dim], kernel: Sequence[Dim]
                 ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A conv's or pool's strides, dilations and pads ([begin..., end...]; defaults 1, 1, 0),
    checked against its spatial dims and kernel."""
    n = len(spatial)
    strides = tuple(attrs.get("strides") or (1,) * n)
    dilations = tuple(attrs.get("dilations") or (1,) * n)
    pads = tuple(attrs.get("pads") or (0,) * (2 * n))
    if len(kernel) != n or len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise VerifyError(
            f"{op}: kernel_shape {tuple(kernel)}, strides {strides}, dilations {dilations} and "
            f"pads {pads} do not fit {n} spatial dims {fmt_shape(spatial)}"
        )
    if min(strides + dilations, default=1) < 1:
        raise VerifyError(f"{op}: strides {strides} and dilations {dilations} must be >= 1")
    return strides, dilations, pads


def window_shape(op: str, attrs: dict, spatial: Sequence[Dim], kernel: Sequence[int]) -> tuple[Dim, ...]:
    """Output spatial dims of a conv / pool from its ONNX attributes (strides, pads,
    dilations default to 1, 0, 1; pads are [begin..., end...])."""
    n = len(spatial)
    strides, dilations, pads = window_attrs(op, attrs, spatial, kernel)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    return tuple(
        window_out(spatial[i], kernel[i], strides[i], dilations[i], (pads[i], pads[n + i]),
                   auto_pad, ceil_mode, op, i)
        for i in range(n)
    )


def transposed_window(op: str, attrs: dict, spatial: Sequence[Dim], kernel: Sequence[Dim]
                      ) -> tuple[tuple[Dim, ...], tuple[int, ...]]:
    """Output spatial dims and begin pads of a ConvTranspose (ONNX rules): the full result
    of a dim of size s is stride (s - 1) + output_padding + dilation (k - 1) + 1, cropped by
    the pads, or to output_shape (or s * stride under SAME_*) with the pads that implies.
    A begin pad may be negative (output_shape past the full result adds zeros)."""
    n = len(spatial)
    strides, dilations, pads = window_attrs(op, attrs, spatial, kernel)
    extra = tuple(attrs.get("output_padding") or (0,) * n)
    if len(extra) != n:
        raise VerifyError(f"{op}: output_padding {extra} does not fit {n} spatial dims {fmt_shape(spatial)}")
    target = attrs.get("output_shape")
    target = tuple(target)[-n:] if target else None
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise VerifyError(f"{op}: unknown auto_pad {auto_pad!r}")
    outs: list[Dim] = []
    begins: list[int] = []
    for i, size in enumerate(spatial):
        if not isinstance(size, int) or not isinstance(kernel[i], int):
            outs.append(target[i] if target else fresh(op, i))
            begins.append(0 if auto_pad == "VALID" else pads[i])
            continue
        full = strides[i] * (size - 1) + extra[i] + dilations[i] * (kernel[i] - 1) + 1
        if target is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = target[i] if target is not None else size * strides[i]
            total = full - out
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        else:
            begin, end = (0, 0) if auto_pad == "VALID" else (pads[i], pads[n + i])
            out = full - begin - end
        if out < 1:
            raise VerifyError(f"{op}: spatial dim {i} of size {size} gives an empty result ({out})")
        outs.append(out)
        begins.append(begin)
    return tuple(outs), tuple(begins)
