"""The layout ops: `Pack` stores a tensor in a packed encoding, `Unpack` brings it back.

Both keep the logical shape and dtype; only the encoding of the result changes. Their
buffers differ (padding, permuted and tiled dims), so each is a runtime layout change
unless propagation folds it into a constant (layout/ does that, since a packed constant keeps
its encoding, and a packed splat its one value) or cancels it. The encoding objects come from
layout/ and reach the IR through the `Encoding` protocol (graph/types.py).
"""
from __future__ import annotations

from ..errors import VerifyError
from ..registry import OpDef, register
from ..types import TensorType


def _pack(attrs, types, consts):
    (x,) = types
    if x.encoding is not None:
        raise VerifyError(f"Pack: input is already packed ({x}); unpack it first")
    encoding = attrs["encoding"]
    encoding.validate(x.shape)
    return [TensorType(x.shape, x.dtype, encoding)]


def _unpack(attrs, types, consts):
    (p,) = types
    if p.encoding is None:
        raise VerifyError(f"Unpack: input {p} is not packed")
    return [TensorType(p.shape, p.dtype)]


register(OpDef("Pack", infer=_pack,
               doc="attrs: encoding. The packed buffer of its input (tensor.pack)."))
register(OpDef("Unpack", infer=_unpack,
               doc="The logical (row-major) tensor held by a packed buffer (tensor.unpack)."))


def _transfer(attrs, types, consts):
    (x,) = types
    return [x]


register(OpDef("Transfer", infer=_transfer, defaults={"source": "cpu"},
               doc="attrs: source, target (device names). The same buffer, copied from the source "
                   "device's memory to the target's. Opaque to layout propagation, so that no pack "
                   "moves across a device boundary unaccounted for."))
