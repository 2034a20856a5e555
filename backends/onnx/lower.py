"""A tilefold Graph as a standard ONNX model (the logical form).

Ops keep their logical ONNX semantics whatever their operands' encodings, so every node is
written as its ONNX op on logical values:
1. `Input`/`Output` nodes become the graph's inputs and outputs (an Identity names an output
   whose value is an input, a constant, or another output's value).
2. A constant is an initializer; a packed one stores its physical buffer, followed by the
   Transpose/Reshape/Slice that unpack it (onnxruntime folds those when it creates a
   session, so they cost nothing per run, and the buffer is stored once for both readers).
   A constant folded from DequantizeLinear (a quantized model's weight) is written as that
   op on its integers again: int8 weights stay int8 in the file, and tilefold computes the
   packed buffer again when it reads the file.
3. A splat is `ConstantOfShape` (an initializer filled with the value where ConstantOfShape
   cannot hold its dtype).
4. `Pack`/`Unpack` of a computed value, and `Transfer` between devices, write nothing: the
   values here are logical, so they keep their source's name (an output's name goes to the
   source; where each node runs is kept in the annotations).
5. `OnnxReference` is the ONNX node it was read from, rewired.
6. Any other op is its ONNX node, attributes typed by the opset-21 schema; attributes the
   schema does not know (tilefold's own) live only in the annotations.
The packed form (packed.py) replaces a few of these rules; both forms carry the same
annotations (frontends/onnx_annotations.py), so either reads back as the same graph.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper
from tqdm import tqdm

from ...frontends import onnx_annotations as notes
from ...graph.errors import TilefoldError, where
from ...graph.graph import DEQUANTIZED, Graph, Node
from ...graph.ops.quantize import dequantized_buffer
from ...graph.registry import CANONICAL_OPSET
from ...graph.types import Dequantized, Splat, TensorType, Value
from ...layout.encoding import PackedEncoding
from .layout_ops import lower_unpack

IR_VERSION = 10
"""The lowest IR version that opset 21 allows, so that older onnxruntime versions read the file too."""

_SPLAT_DTYPES = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                       np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)}


Rule = Callable[["Lowering", Node, "dict[Value, str]"], None]
"""Writes one tilefold node as ONNX nodes; `claimed` maps values to the graph output names they take."""


@dataclass
class Lowered:
    """The ONNX model of a graph and what it holds."""

    model: onnx.ModelProto
    weight_bytes: int
    onnx_ops: dict[str, int] = field(default_factory=dict)


FORMS = ("logical", "packed")


def lower(graph: Graph, *, form: str = "logical", progress: bool = False) -> Lowered:
    """The ONNX model of `graph`, annotated for `load_onnx`: in the logical form (module
    docstring) or the packed form (`packed.py`: values held in their packed buffers)."""
    if form not in FORMS:
        raise TilefoldError(f"unknown ONNX form {form!r}: choose one of {', '.join(FORMS)}")
    if form == "packed":
        from .packed import PACKED_RULES

        return Lowering(graph, {**LOWER, **PACKED_RULES}).run(progress)
    return Lowering(graph, LOWER).run(progress)


class Lowering:
    """The state of one lowering: ONNX nodes and initializers so far, and value names."""

    def __init__(self, graph: Graph, rules: dict[str, Rule]) -> None:
        self.graph = graph
        self.rules = rules
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.used: set[str] = set()
        self.names: dict[Value, str] = {}
        self.opsets: dict[str, int] = {"": CANONICAL_OPSET}
        self.array_inits: dict[int, str] = {}  # id(constant's array) -> its initializer
        self.weight_bytes = 0
        self.logical: dict[Value, str] = {}

    # ---- names -----------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def emit(self, op: str, inputs: list[str], hint: str, outputs: list[str] | None = None, **attrs: Any) -> str:
        outs = outputs if outputs is not None else [self.fresh(hint)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.fresh(f"{hint}#node"), **attrs))
        return outs[0]

    def const(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def stored(self, array: np.ndarray, name: str, node: Node) -> str:
        """An initializer holding a constant's array (its value, or a `Dequantized` part)."""
        self.inits.append(_tensor(array, name, node))
        self.weight_bytes += int(array.nbytes)
        self.array_inits[id(array)] = name
        return name

    def dequantized(self, node: Node, d: Dequantized) -> str:
        """DequantizeLinear of the constant's stored integers: its logical value."""
        inputs = [self.array_inits.get(id(a)) or self.stored(a, self.fresh(f"{node.name}.{part}"), node)
                  for part, a in (("quantized", d.data), ("scale", d.scale), ("zero_point", d.zero_point))
                  if a is not None]
        name = self.value_name(node, 0)
        return self.emit("DequantizeLinear", inputs, name, outputs=[name], axis=d.axis, block_size=d.block_size)

    def value_name(self, node: Node, slot: int) -> str:
        base = node.out_names[slot] if slot < len(node.out_names) and node.out_names[slot] else (
            node.name if slot == 0 else f"{node.name}:{slot}")
        return self.fresh(base)

    def _inputs(self, node: Node) -> list[str]:
        names = [self.names[v] if v is not None else "" for v in self.graph.inputs_of(node.name)]
        while names and not names[-1]:
            names.pop()
        return names

    def _outputs(self, node: Node, claimed: dict[Value, str]) -> list[str]:
        names = []
        for slot in range(len(node.outputs)):
            value = Value(node.name, slot)
            if slot < len(node.out_names) and not node.out_names[slot] and not self.graph.users(value):
                names.append("")  # an output slot the model leaves empty
                continue
            self.names[value] = claimed.get(value) or self.value_name(node, slot)
            names.append(self.names[value])
        while names and not names[-1]:
            names.pop()
        return names

    # ---- the model ---------------------------------------------------------------------------
    def run(self, progress: bool) -> Lowered:
        graph = self.graph
        order = graph.nodes()
        for name in graph.inputs:
            self.used.add(name)
        claimed = self._claim_output_names()
        steps = tqdm(order, desc=f"writing {graph.name}", unit="node", file=sys.stderr, disable=not progress)
        for node in steps:
            self.rules.get(node.op, self.rules["*"])(self, node, claimed)
        model = helper.make_model(
            helper.make_graph(
                self.nodes, graph.name,
                [_value_info(name, graph.node(name).outputs[0]) for name in graph.inputs],
                [_value_info(graph.node(o).attrs["name"], graph.type_of(v))
                 for o, v in zip(graph.outputs, graph.output_values())],
                self.inits,
            ),
            opset_imports=[helper.make_opsetid(d, v) for d, v in self.opsets.items()],
            ir_version=IR_VERSION,
            producer_name="tilefold",
            producer_version=_version(),
        )
        self._annotate(model)
        counts: dict[str, int] = {}
        for n in model.graph.node:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return Lowered(model, self.weight_bytes, counts)

    def _claim_output_names(self) -> dict[Value, str]:
        """Graph output names given straight to the values they name, where that is safe."""
        graph = self.graph
        claimed: dict[Value, str] = {}
        for out in graph.outputs:
            name = graph.node(out).attrs["name"]
            if name in self.used:
                raise TilefoldError(f"graph output name {name!r} is also an input's name: ONNX cannot write that")
            self.used.add(name)
        for out, value in zip(graph.outputs, graph.output_values()):
            name = graph.node(out).attrs["name"]
            while self.rules.get(graph.node(value.node).op) is _identity:  # the name goes to the source
                source = graph.inputs_of(value.node)[0]
                assert source is not None
                value = source
            if graph.node(value.node).op not in ("Input", "Constant") and value not in claimed:
                claimed[value] = name
        return claimed

    def _annotate(self, model: onnx.ModelProto) -> None:
        graph = self.graph
        record = notes.graph_record(graph, lambda node, array: self.array_inits.get(id(array)))
        props = {
            notes.KEY_VERSION: _version(),
            notes.KEY_FORMAT: str(notes.FORMAT),
            notes.KEY_TARGET: str(graph.meta.get("target") or ""),
            notes.KEY_TILES: json.dumps(anchor_tiles(graph)),
            notes.KEY_FINGERPRINT: notes.fingerprint(model.graph),
            notes.KEY_GRAPH: json.dumps(record, separators=(",", ":")),
        }
        for key, value in props.items():
            model.metadata_props.add(key=key, value=value)


# ---- one rule per kind of node (module docstring numbers) ----------------------------------------


def _input(self: Lowering, node: Node, claimed: dict[Value, str]) -> None:  # (1)
    self.names[Value(node.name)] = node.name


def _output(self: Lowering, node: Node, claimed: dict[Value, str]) -> None:  # (1)
    value = self.graph.inputs_of(node.name)[0]
    name = node.attrs["name"]
    if self.names[value] != name:
        self.emit("Identity", [self.names[value]], name, outputs=[name])


def _constant(self: Lowering, node: Node, claimed: dict[Value, str]) -> None:  # (2, 3)
    value, t = node.attrs["value"], node.outputs[0]
    out = Value(node.name)
    if isinstance(value, Splat):
        self.names[out] = _splat(self, value, t, self.value_name(node, 0))
        return
    dequantized = stored_dequantized(node)
    if dequantized is not None:
        self.names[out] = self.dequantized(node, dequantized)
        return
    enc = t.encoding
    name = self.stored(value, self.value_name(node, 0) if enc is None else self.fresh(f"{node.name}.packed"), node)
    if enc is None:
        self.names[out] = name
        return
    if not isinstance(enc, PackedEncoding):
        raise TilefoldError(f"{where(node)}: cannot write encoding {enc} to ONNX")
    self.names[out] = lower_unpack(name, enc, t.shape, self.emit, self.const, f"{node.name}/unpack")


def stored_dequantized(node: Node) -> Dequantized | None:
    """The `Dequantized` origin of a constant, where it gives the constant's buffer bit for bit
    (a pass that changed the value but kept the origin would otherwise be written wrong)."""
    d = node.attrs.get(DEQUANTIZED)
    if d is None:
        return None
    value = np.asarray(node.attrs["value"])
    try:
        again = dequantized_buffer(d, node.outputs[0])
    except (TilefoldError, ValueError):
        return None
    same = again.shape == value.shape and again.dtype == value.dtype and np.array_equal(
        np.ascontiguousarray(again).view(f"u{value.itemsize}"), np.ascontiguousarray(value).view(f"u{value.itemsize}"))
    return d if same else None


def _splat(self: Lowering, value: Splat, t: TensorType, name: str) -> str:
    fill = np.array(value.value, dtype=value.dtype)
    if value.dtype not in _SPLAT_DTYPES:
        self.inits.append(numpy_helper.from_array(np.full(t.shape, fill), name))
        return name
    shape = self.const(np.array(t.shape, np.int64), f"{name}/shape")
    return self.emit("ConstantOfShape", [shape], name, outputs=[name],
                     value=numpy_helper.from_array(fill.reshape(1)))


def _identity(self: Lowering, node: Node, claimed: dict[Value, str]) -> None:  # (4)
    """The source's own name: no node (onnxruntime 1.32's basic optimizations reject some
    models with an Identity beside a Transpose, and an Identity is no work anyway)."""
    (source,) = self.graph.inputs_of(node.name)
    self.names[Value(node.name)] = self.names[source]


def _reference(self: Lowering, node: Node, claimed: dict[Value, str]) -> None:  # (5)
    proto = onnx.NodeProto.FromString(node.attrs["proto"])
    del proto.input[:]
    proto.input.extend(self._inputs(node))
    del proto.output[:]
    proto.output.extend(self._outputs(node, claimed))
    proto.name = self.fresh(node.name)
    domain = node.attrs.get("domain", "")
    if domain:
        self.opsets[domain] = int(node.attrs.get("opset", 1))
    self.nodes.append(proto)


def _standard(self: Lowering, node: Node, claimed: dict[Value, str], inputs: list[str] | None = None,
              outputs: list[str] | None = None) -> None:  # (6)
    try:
        schema = defs.get_schema(node.op, CANONICAL_OPSET, "")
    except defs.SchemaError:
        raise TilefoldError(f"{where(node)}: op {node.op!r} has no ONNX form to write") from None
    attrs = {}
    for key, value in node.attrs.items():
        spec = schema.attributes.get(key)
        if spec is not None and value is not None:
            attrs[key] = helper.make_attribute(key, _attribute(value), attr_type=spec.type)
    inputs = self._inputs(node) if inputs is None else inputs
    outputs = self._outputs(node, claimed) if outputs is None else outputs
    proto = helper.make_node(node.op, inputs, outputs, name=self.fresh(node.name))
    proto.attribute.extend(attrs.values())
    self.nodes.append(proto)


def _attribute(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(_contiguous(value))
    if isinstance(value, tuple):
        return [v.item() if isinstance(v, np.generic) else v for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


LOWER: dict[str, Rule] = {
    "Input": _input,
    "Output": _output,
    "Constant": _constant,
    "Pack": _identity,
    "Unpack": _identity,
    "Transfer": _identity,
    "OnnxReference": _reference,
    "*": _standard,
}


# ---- helpers --------------------------------------------------------------------------------------
def _tensor(array: np.ndarray, name: str, node: Node) -> onnx.TensorProto:
    try:
        return numpy_helper.from_array(_contiguous(array), name)
    except (TypeError, ValueError, KeyError) as exc:
        raise TilefoldError(f"{where(node)}: cannot store its {array.dtype} value in ONNX: {exc}") from None


def _contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous, rank kept (np.ascontiguousarray turns a 0-d array into a 1-d one)."""
    return array if array.flags.c_contiguous or array.dtype == object else np.array(array, order="C")


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(t.dtype)
    return helper.make_tensor_value_info(name, elem, list(t.shape))


def anchor_tiles(graph: Graph) -> dict[str, Any]:
    """Per anchor (Conv, MatMul, Gemm, ...): the encodings of its operands and its result."""
    from ...graph.registry import REGISTRY

    def fields(t: TensorType | None) -> Any:
        enc = None if t is None else t.encoding
        if not isinstance(enc, PackedEncoding):
            return None
        return {"inner_dims_pos": list(enc.inner_dims_pos), "inner_tiles": list(enc.inner_tiles),
                "outer_dims_perm": None if enc.outer_dims_perm is None else list(enc.outer_dims_perm),
                "pad": enc.pad}

    tiles = {}
    for node in graph.nodes():
        opdef = REGISTRY.get(node.op)
        if opdef is None or opdef.layout != "anchor":
            continue
        operands = [None if v is None else fields(graph.type_of(v)) for v in graph.inputs_of(node.name)]
        result = fields(node.outputs[0]) if node.outputs else None
        if result is not None or any(o is not None for o in operands):
            tiles[node.name] = {"op": node.op, "operands": operands, "result": result}
    return tiles


def _version() -> str:
    from ... import __version__

    return __version__
