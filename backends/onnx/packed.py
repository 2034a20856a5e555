"""The packed form: every value held in its buffer, as tilefold's own backends hold it.

The rules that differ from the logical form (lower.py):
1. A packed constant is its physical buffer as is; a packed splat is ConstantOfShape of the
   buffer's shape; one folded from DequantizeLinear is that op on its integers, packed.
2. `Pack` is Pad/Reshape/Transpose and `Unpack` is Transpose/Reshape/Slice (layout_ops.py):
   the runtime layout changes the plan left are real ops here.
3. An elementwise op (registry layout kind "agnostic") runs on its operands' buffers when
   they line up with its result's buffer (`lines_up`): same outer order and tiled dims, equal
   tiles, or a tile of 1 over a broadcast dim; a rank-0 operand broadcasts anywhere.
4. Any other op reads its operands unpacked (each buffer unpacked once) and packs its results.
5. An output is the logical tensor: its buffer unpacked.
"""
from __future__ import annotations

from ...graph.errors import TilefoldError, where
from ...graph.graph import Node
from ...graph.registry import REGISTRY
from ...graph.types import Splat, TensorType, Value
from ...layout.encoding import PackedEncoding
from .layout_ops import lower_pack, lower_unpack
from .lower import LOWER, Lowering, Rule, _constant, _splat, _standard, stored_dequantized

_IDENTITY = PackedEncoding((), ())


def logical_name(self: Lowering, value: Value) -> str:
    """The tensor holding `value` unpacked (the unpacking emitted once per value)."""
    t = self.graph.type_of(value)
    if t.encoding is None:
        return self.names[value]
    if value not in self.logical:
        hint = f"{value.node}/unpack" if value.slot == 0 else f"{value.node}:{value.slot}/unpack"
        self.logical[value] = lower_unpack(self.names[value], t.encoding, t.shape, self.emit, self.const, hint)
    return self.logical[value]


def lines_up(operand: TensorType, result: TensorType) -> bool:
    """Whether numpy-style broadcasting of `operand`'s buffer against `result`'s computes the
    op on the logical values (rule 3)."""
    if operand.rank == 0 and operand.encoding is None:
        return True
    if operand.rank != result.rank:
        return False
    a, b = operand.encoding or _IDENTITY, result.encoding or _IDENTITY
    if not isinstance(a, PackedEncoding) or not isinstance(b, PackedEncoding):
        return False
    rank = result.rank
    if a.outer_perm(rank) != b.outer_perm(rank) or a.inner_dims_pos != b.inner_dims_pos:
        return False
    for d, ta, tb in zip(a.inner_dims_pos, a.inner_tiles, b.inner_tiles):
        size, full = operand.shape[d], result.shape[d]
        if not (size == full and ta == tb) and not (size == 1 and ta == 1):
            return False
    return all(s == r or s == 1 for s, r in zip(operand.shape, result.shape))


def _constant_packed(self: Lowering, node: Node, claimed: dict) -> None:  # (1)
    t = node.outputs[0]
    if t.encoding is None:
        return _constant(self, node, claimed)
    value = node.attrs["value"]
    out = Value(node.name)
    name = self.fresh(f"{node.name}.packed")
    if isinstance(value, Splat):
        self.names[out] = _splat(self, value, TensorType(t.encoding.physical_shape(t.shape), t.dtype), name)
        return
    dequantized = stored_dequantized(node)
    if dequantized is not None:
        logical = self.dequantized(node, dequantized)
        self.names[out] = lower_pack(logical, t.encoding, t.shape, t.dtype, self.emit, self.const, name)
        return
    self.names[out] = self.stored(value, name, node)


def _pack(self: Lowering, node: Node, claimed: dict) -> None:  # (2)
    (source,) = self.graph.inputs_of(node.name)
    t = node.outputs[0]
    self.names[Value(node.name)] = lower_pack(logical_name(self, source), t.encoding, t.shape, t.dtype, self.emit,
                                              self.const, f"{node.name}/pack")


def _unpack(self: Lowering, node: Node, claimed: dict) -> None:  # (2)
    (source,) = self.graph.inputs_of(node.name)
    self.names[Value(node.name)] = logical_name(self, source)


def _compute(self: Lowering, node: Node, claimed: dict) -> None:  # (3, 4)
    graph = self.graph
    inputs = graph.inputs_of(node.name)
    types = [None if v is None else graph.type_of(v) for v in inputs]
    if all(t is None or t.encoding is None for t in types + list(node.outputs)):
        return _standard(self, node, claimed)
    opdef = REGISTRY.get(node.op)
    direct = opdef is not None and opdef.layout == "agnostic" and node.outputs and all(
        t is None or lines_up(t, node.outputs[0]) for t in types) and all(
        (o.encoding or _IDENTITY).same_layout(node.outputs[0].encoding or _IDENTITY) for o in node.outputs)
    if direct:
        return _standard(self, node, {})
    logical_inputs = [logical_name(self, v) if v is not None else "" for v in inputs]
    while logical_inputs and not logical_inputs[-1]:
        logical_inputs.pop()
    outputs = []
    for slot, t in enumerate(node.outputs):
        value = Value(node.name, slot)
        if slot < len(node.out_names) and not node.out_names[slot] and not graph.users(value):
            outputs.append("")
            continue
        outputs.append(self.value_name(node, slot) if t.encoding is not None else
                       claimed.get(value) or self.value_name(node, slot))
    while outputs and not outputs[-1]:
        outputs.pop()
    _standard(self, node, claimed, logical_inputs, outputs)
    for slot, name in enumerate(outputs):
        if not name:
            continue
        t = node.outputs[slot]
        value = Value(node.name, slot)
        self.names[value] = name
        if t.encoding is not None:
            self.logical[value] = name
            self.names[value] = lower_pack(name, t.encoding, t.shape, t.dtype, self.emit, self.const,
                                           f"{node.name}/pack" if slot == 0 else f"{node.name}:{slot}/pack")


def _output(self: Lowering, node: Node, claimed: dict) -> None:  # (5)
    (value,) = self.graph.inputs_of(node.name)
    name = node.attrs["name"]
    source = logical_name(self, value)
    if source != name:
        self.emit("Identity", [source], name, outputs=[name])


def _reference(self: Lowering, node: Node, claimed: dict) -> None:
    if any(v is not None and self.graph.type_of(v).encoding is not None for v in self.graph.inputs_of(node.name)):
        raise TilefoldError(f"{where(node)} reads a packed value: the packed form cannot write it; use form='logical'")
    LOWER["OnnxReference"](self, node, claimed)


PACKED_RULES: dict[str, Rule] = {
    "OnnxReference": _reference,
    "Constant": _constant_packed,
    "Pack": _pack,
    "Unpack": _unpack,
    "Output": _output,
    "*": _compute,
}
