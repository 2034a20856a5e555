"""Building a tilefold `Graph` from a prepared (opset-21, shape-inferred) ONNX model.

1. Initializers (and the large ones held out by onnx_prepare) become constants; a graph
   input that is also an initializer is a constant too (IR < 4 lists weights as inputs).
2. The other graph inputs become `Input` nodes typed from their declarations; a dim
   that declares neither a size nor a name gets a deterministic fresh name.
3. `Constant` nodes become constants.
4. A default-domain op in tilefold's registry becomes a node of that op, its attributes
   filled with the opset-21 schema defaults; any other op becomes an `OnnxReference` node.
5. Output types come from onnx shape inference; what it leaves unknown comes from the
   registry's inference, then (dims only) fresh names; a type still unknown is an error.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import helper
from tqdm import tqdm

from ..graph import registry
from ..graph.errors import ModelError, UnsupportedOpError
from ..graph.graph import Graph
from ..graph.registry import CANONICAL_OPSET
from ..graph.types import Dim, TensorType, Value
from .onnx_prepare import FreshDims
from .onnx_read import node_label
from .onnx_values import DEFAULT_DOMAINS, constant_node_value, onnx_attributes, to_array

REFERENCE_OP = "OnnxReference"
_NOT_ONNX_OPS = {"Input", "Output", "Constant", REFERENCE_OP}


@dataclass
class _Partial:
    """What ONNX knows of a value's type: dtype and dims, None where unknown."""

    dtype: np.dtype | None
    dims: list[Dim | None] | None

    @property
    def complete(self) -> bool:
        return self.dtype is not None and self.dims is not None and all(d is not None for d in self.dims)


def build_graph(
    model: onnx.ModelProto,
    large: dict[str, onnx.TensorProto],
    label: str,
    name: str,
    progress: bool = False,
    arrays: Mapping[str, np.ndarray] | None = None,
) -> Graph:
    """The Graph of a prepared model (see module docstring for the cases). `arrays` holds
    initializers already read into arrays (onnx_read.Source.arrays), by name."""
    return _Builder(model, label, name).build(large, progress, arrays or {})


class _Builder:
    def __init__(self, model: onnx.ModelProto, label: str, name: str) -> None:
        self.model = model
        self.label = label
        self.graph = Graph(name)
        self.symbols = FreshDims(model)
        g = model.graph
        self.known = {info.name: info.type for info in (*g.input, *g.value_info, *g.output)}
        self.opsets = {e.domain: int(e.version) for e in model.opset_import}
        self.values: dict[str, Value] = {}

    def build(self, large: dict[str, onnx.TensorProto], progress: bool, arrays: Mapping[str, np.ndarray]) -> Graph:
        g, graph = self.model.graph, self.graph
        initializers: dict[str, Any] = {t.name: t for t in g.initializer}
        initializers.update(large)
        for sparse in g.sparse_initializer:
            initializers[sparse.values.name] = sparse
        for info in g.input:  # (2)
            if info.name not in initializers:
                self.values[info.name] = graph.add_input(info.name, self._input_type(info))
        for tensor_name, tensor in initializers.items():  # (1)
            value = arrays[tensor_name] if tensor_name in arrays else to_array(tensor)
            self.values[tensor_name] = graph.add_constant(value, name=tensor_name)
        nodes = tqdm(g.node, desc=f"loading {graph.name}", unit="node", file=sys.stderr, disable=not progress)
        for index, node in enumerate(nodes):
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:  # (3)
                value = constant_node_value(node, f"{self.label}: {node_label(node, index)}")
                self.values[node.output[0]] = graph.add_constant(value, name=node.output[0])
            else:
                self._add_node(node, index)
        for out in g.output:
            graph.add_output(self.values[out.name], out.name)
        return graph

    def _input_type(self, info: onnx.ValueInfoProto) -> TensorType:
        subject = f"{self.label}: graph input {info.name!r}"
        partial = _partial(info.type, subject)
        if partial.dtype is None:
            raise ModelError(f"{subject} declares no element type")
        if partial.dims is None:
            raise ModelError(f"{subject} declares no shape: tilefold needs at least its rank")
        dims = [self.symbols.fresh(info.name, k) if d is None else d for k, d in enumerate(partial.dims)]
        return TensorType(tuple(dims), partial.dtype)

    def _add_node(self, node: onnx.NodeProto, index: int) -> None:
        graph = self.graph
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        op = node.op_type
        subject = f"{self.label}: {node_label(node, index)}"
        inputs: list[Value | None] = [self.values[n] if n else None for n in node.input]
        while inputs and inputs[-1] is None:
            inputs.pop()
        out_names = list(node.output)
        while out_names and not out_names[-1]:
            out_names.pop()
        registered = domain == "" and op not in _NOT_ONNX_OPS and registry.is_registered(op)  # (4)
        attrs = onnx_attributes(node, subject) if registered else {}
        types = self._output_types(op if registered else None, attrs, inputs, out_names, subject)  # (5)
        name = node.name or op.lower()
        origin = node.name or f"{op}#{index}"
        if registered:
            added = graph.add_node(op, inputs, types, attrs, name=name, origin=origin, out_names=out_names)
        else:
            reference = {
                "onnx_op": op,
                "domain": domain,
                "proto": node.SerializeToString(),
                "opset": CANONICAL_OPSET if domain == "" else self.opsets.get(domain, 1),
                "output_types": tuple(types),
            }
            added = graph.add_node(REFERENCE_OP, inputs, types, reference, name=name, origin=origin, out_names=out_names)
        for slot, out in enumerate(out_names):
            if out:
                self.values[out] = Value(added.name, slot)

    def _output_types(
        self,
        op: str | None,
        attrs: dict[str, Any],
        inputs: list[Value | None],
        out_names: list[str],
        subject: str,
    ) -> list[TensorType]:
        """ONNX's inferred types, completed by the registry's inference, then fresh dim names."""
        partial = [
            _partial(self.known[out], f"{subject}: output {out!r}") if out in self.known else _Partial(None, None)
            for out in out_names
        ]
        inferred: list[TensorType] | None = None
        failure: Exception | None = None
        if op is not None and not all(p.complete for p in partial):
            graph = self.graph
            in_types = [graph.type_of(v) if v is not None else None for v in inputs]
            consts = [graph.constant_value(v) for v in inputs]
            try:
                inferred = registry.infer(op, attrs, in_types, consts)
            except Exception as exc:  # an entry still being written, or a malformed node
                failure = exc
        types: list[TensorType] = []
        for slot, (out, p) in enumerate(zip(out_names, partial)):
            guess = inferred[slot] if inferred is not None and slot < len(inferred) else None
            types.append(self._complete(p, guess, out, slot, subject, failure, op is not None))
        return types

    def _complete(
        self,
        partial: _Partial,
        guess: TensorType | None,
        out: str,
        slot: int,
        subject: str,
        failure: Exception | None,
        registered: bool,
    ) -> TensorType:
        if partial.complete:
            return TensorType(tuple(partial.dims), partial.dtype)  # type: ignore[arg-type]
        dtype, dims = partial.dtype, partial.dims
        if guess is not None:
            dtype = dtype if dtype is not None else guess.dtype
            if dims is None:
                dims = list(guess.shape)
            elif len(dims) == guess.rank:
                dims = [g if d is None else d for d, g in zip(dims, guess.shape)]
        if not out:
            # An output slot the model leaves empty (LSTM's Y when only Y_h is read): nothing
            # reads it, so any type stands in for what is not known.
            dtype = dtype if dtype is not None else np.dtype(np.float32)
            dims = [1 if d is None else d for d in dims or []]
        if dtype is None or dims is None:
            missing = "type" if dtype is None and dims is None else "element type" if dtype is None else "rank"
            if failure is not None:
                why = f"tilefold's inference failed: {' '.join(str(failure).split())}"
            elif registered:
                why = "neither onnx shape inference nor tilefold's inference could tell"
            else:
                why = "onnx shape inference cannot tell and tilefold does not know the op; add the type to the model's value_info"
            raise ModelError(f"{subject}: the {missing} of output {out!r} (slot {slot}) is unknown: {why}")
        return TensorType(tuple(self.symbols.fresh(out, k) if d is None else d for k, d in enumerate(dims)), dtype)


def _partial(type_proto: onnx.TypeProto, subject: str) -> _Partial:
    kind = type_proto.WhichOneof("value")
    if kind is None:
        return _Partial(None, None)
    if kind != "tensor_type":
        kind_name = kind.removesuffix("_type")
        raise UnsupportedOpError(f"{subject} is a {kind_name}: tilefold supports tensors only")
    tensor = type_proto.tensor_type
    dtype = _np_dtype(tensor.elem_type, subject) if tensor.elem_type else None
    if not tensor.HasField("shape"):
        return _Partial(dtype, None)
    dims: list[Dim | None] = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return _Partial(dtype, dims)


def _np_dtype(elem_type: int, subject: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise UnsupportedOpError(f"{subject} has ONNX element type {elem_type}, which numpy cannot hold") from None
