"""What tilefold keeps in an ONNX file it wrote, and reading it back.

An optimized graph is written (backends/onnx) as a standard ONNX model that onnxruntime
runs, plus model-level `metadata_props`:
- `tilefold.version`, `tilefold.target`, `tilefold.tiles` (the encodings of every anchor's
  operands and result, JSON): what the file was optimized for, readable by anyone;
- `tilefold.graph`: the exact tilefold graph as JSON (nodes, attrs, typed outputs with their
  encodings, devices, launch configurations, origins); a constant refers to the initializer
  that holds its (physical) buffer, so weights are stored once; a constant folded from
  DequantizeLinear refers to its integers instead (`$dequantized`, `$derived`: the file
  stores the int8 weights, not the floats), and its buffer is computed again when read;
- `tilefold.fingerprint`: a hash of the ONNX graph's structure when it was written. A file
  edited since (another tool rewrote its nodes) no longer matches, and its annotations are
  ignored: it is then read as the plain ONNX model it is.

The JSON codec tags what JSON lacks: tuples, arrays, bytes, tensor types and encodings. An
encoding is stored as its class path and dataclass fields and rebuilt by importing that
class, so this frontend needs no import of layout/ (a later stage); only classes inside the
tilefold package that satisfy the IR's `Encoding` protocol are accepted.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import onnx

from ..graph.errors import ModelError, TilefoldError
from ..graph.graph import CONSTANT, DEQUANTIZED, Graph, Node
from ..graph.ops.quantize import dequantized_buffer
from ..graph.types import Dequantized, Encoding, Splat, TensorType, Value, freeze

FORMAT = 1
KEY_GRAPH = "tilefold.graph"
KEY_FINGERPRINT = "tilefold.fingerprint"
KEY_TARGET = "tilefold.target"
KEY_VERSION = "tilefold.version"
KEY_TILES = "tilefold.tiles"
KEY_FORMAT = "tilefold.format"
_PACKAGE = __name__.split(".")[0]


# ---- the codec -------------------------------------------------------------------------------
DERIVED = object()
"""What a constant's value decodes to when the file stores how to compute it instead
(`$derived`: its `Dequantized` integers); `rebuild_graph` computes it."""


def encode(value: Any, constant: Callable[[np.ndarray], str | None] | None = None) -> Any:
    """A JSON-ready form of an IR value; `constant(array)` names the initializer of a large
    array, or None for a constant's value that the file holds as its `Dequantized` integers."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return {"$scalar": value.item(), "dtype": value.dtype.str}
    if isinstance(value, (tuple, list)):
        items = [encode(v, constant) for v in value]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, dict):
        return {"$dict": [[encode(k, constant), encode(v, constant)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.dtype):
        return {"$dtype": value.str}
    if isinstance(value, Splat):
        return {"$splat": value.value, "shape": list(value.shape),
                "dtype": value.dtype.str}
    if isinstance(value, np.ndarray):
        if constant is not None and value.dtype != object:
            name = constant(value)
            return {"$init": name} if name is not None else {"$derived": True}
        if value.dtype == object:
            return {"$objects": [encode(v) for v in value.ravel().tolist()], "shape": list(value.shape)}
        return {"$array": base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii"),
                "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, Dequantized):
        return {"$dequantized": {f.name: encode(getattr(value, f.name), constant)
                                 for f in dataclasses.fields(value)}}
    if isinstance(value, TensorType):
        return {"$type": [encode(value.shape), value.dtype.str, encode(value.encoding)]}
    if dataclasses.is_dataclass(value) and isinstance(value, Encoding):
        cls = type(value)
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"$encoding": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    raise TilefoldError(f"cannot store a value of type {type(value).__name__} in an ONNX file's annotations")


def decode(data: Any, initializer: Callable[[str], np.ndarray] | None = None) -> Any:
    """The IR value `encode` stored; `initializer(name)` reads a constant's buffer."""
    if isinstance(data, list):
        return [decode(v, initializer) for v in data]
    if not isinstance(data, dict):
        return data
    if "$tuple" in data:
        return tuple(decode(v, initializer) for v in data["$tuple"])
    if "$dict" in data:
        return {decode(k, initializer): decode(v, initializer) for k, v in data["$dict"]}
    if "$scalar" in data:
        return np.dtype(data["dtype"]).type(data["$scalar"])
    if "$bytes" in data:
        return base64.b64decode(data["$bytes"])
    if "$dtype" in data:
        return np.dtype(data["$dtype"])
    if "$splat" in data:
        return Splat(data["$splat"], tuple(data["shape"]), np.dtype(data["dtype"]))
    if "$init" in data:
        if initializer is None:
            raise ModelError(f"annotation refers to initializer {data['$init']!r} where none can be read")
        return freeze(initializer(data["$init"]))
    if "$derived" in data:
        return DERIVED
    if "$dequantized" in data:
        return Dequantized(**{k: decode(v, initializer) for k, v in data["$dequantized"].items()})
    if "$array" in data:
        raw = base64.b64decode(data["$array"])
        return freeze(np.frombuffer(raw, dtype=np.dtype(data["dtype"])).reshape(data["shape"]).copy())
    if "$objects" in data:
        return freeze(np.array([decode(v) for v in data["$objects"]], dtype=object).reshape(data["shape"]))
    if "$type" in data:
        shape, dtype, enc = data["$type"]
        return TensorType(tuple(decode(shape)), np.dtype(dtype), decode(enc))
    if "$encoding" in data:
        return _encoding(data["$encoding"], {k: decode(v) for k, v in data["fields"].items()})
    raise ModelError(f"unknown annotation value {sorted(data)[:3]}")


def _encoding(path: str, fields: dict[str, Any]) -> Any:
    module, _, qualname = path.partition(":")
    if module.split(".")[0] != _PACKAGE:
        raise ModelError(f"annotation names encoding class {path!r}, which is not part of {_PACKAGE}")
    try:
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        enc = cls(**fields)
    except (ImportError, AttributeError, TypeError) as exc:
        raise ModelError(f"annotation names encoding class {path!r}, which cannot be rebuilt: {exc}") from None
    if not isinstance(enc, Encoding):
        raise ModelError(f"annotation names class {path!r}, which is not an encoding")
    return enc


# ---- the graph --------------------------------------------------------------------------------
def graph_record(graph: Graph, constant: Callable[[Node, np.ndarray], str | None]) -> dict[str, Any]:
    """The whole graph as JSON-ready data; `constant(node, array)` names the initializer of a
    constant's value or of its `Dequantized` arrays (None: the value is derived from those)."""
    nodes = []
    for node in sorted(graph.nodes(), key=lambda n: n.order):
        name_array = (lambda a, node=node: constant(node, a)) if node.op == CONSTANT else None
        attrs = {k: encode(v, name_array if k in ("value", DEQUANTIZED) else None) for k, v in node.attrs.items()}
        nodes.append({
            "name": node.name,
            "op": node.op,
            "inputs": [None if v is None else [v.node, v.slot] for v in graph.inputs_of(node.name)],
            "attrs": attrs,
            "outputs": [encode(t) for t in node.outputs],
            "origin": node.origin,
            "out_names": list(node.out_names),
            "device": node.device,
            "launch": encode(node.launch),
        })
    return {"format": FORMAT, "name": graph.name, "inputs": list(graph.inputs), "outputs": list(graph.outputs),
            "meta": encode(_plain(graph.meta)), "nodes": nodes}


def _plain(meta: dict[str, Any]) -> dict[str, Any]:
    """The entries of `graph.meta` that the codec can store (others are dropped)."""
    kept = {}
    for key, value in meta.items():
        try:
            encode(value)
        except TilefoldError:
            continue
        kept[key] = value
    return kept


def rebuild_graph(record: dict[str, Any], initializer: Callable[[str], np.ndarray]) -> Graph:
    """The Graph `graph_record` described, its nodes in their original relative order."""
    graph = Graph(record["name"])
    nodes = record["nodes"]
    for entry in nodes:
        outputs = [decode(t) for t in entry["outputs"]]
        attrs = {k: decode(v, initializer) for k, v in entry["attrs"].items()}
        if attrs.get("value") is DERIVED:
            attrs["value"] = freeze(dequantized_buffer(attrs[DEQUANTIZED], outputs[0]))
        node = graph.add_node(
            entry["op"], [None] * len(entry["inputs"]), outputs, attrs,
            name=entry["name"], origin=entry["origin"], out_names=entry["out_names"],
        )
        if node.name != entry["name"]:
            raise ModelError(f"annotated node name {entry['name']!r} is used twice")
        node.device = entry["device"]
        node.launch = decode(entry["launch"])
    for entry in nodes:
        for slot, src in enumerate(entry["inputs"]):
            if src is not None:
                graph.set_input(entry["name"], slot, Value(src[0], int(src[1])))
    graph.inputs = list(record["inputs"])
    graph.outputs = list(record["outputs"])
    graph.meta = decode(record["meta"])
    return graph


# ---- fingerprint and reading --------------------------------------------------------------------
def fingerprint(graph: onnx.GraphProto) -> str:
    """A hash of the ONNX graph's structure: nodes (op, attributes, inputs, outputs), initializers
    (name, type, dims), graph inputs and outputs. Weight values are not part of it."""
    h = hashlib.sha256()
    for node in graph.node:
        h.update(node.SerializeToString(deterministic=True))
    for t in graph.initializer:
        h.update(f"{t.name}:{t.data_type}:{list(t.dims)};".encode())
    h.update(f"in:{[i.name for i in graph.input]};out:{[o.name for o in graph.output]}".encode())
    return h.hexdigest()[:32]


@dataclass
class Annotations:
    """The tilefold metadata of a file it wrote."""

    target: str | None
    version: str | None
    record: dict[str, Any]


def read_annotations(model: onnx.ModelProto) -> Annotations | None:
    """The file's tilefold annotations, or None when it has none or was edited since."""
    props = {p.key: p.value for p in model.metadata_props}
    if KEY_GRAPH not in props:
        return None
    if props.get(KEY_FINGERPRINT) != fingerprint(model.graph):
        return None
    try:
        record = json.loads(props[KEY_GRAPH])
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    return Annotations(props.get(KEY_TARGET) or None, props.get(KEY_VERSION), record)


def annotated_graph(model: onnx.ModelProto, annotations: Annotations, label: str,
                    arrays: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The exact tilefold graph recorded in `model` (its external data already loaded);
    `arrays` holds initializers already read into arrays (onnx_read.Source.arrays)."""
    from ..graph.verify import verify_graph
    from .onnx_values import to_array

    tensors = {t.name: t for t in model.graph.initializer}
    arrays = arrays or {}

    def initializer(name: str) -> np.ndarray:
        if name not in tensors:
            raise ModelError(f"{label}: tilefold annotations name initializer {name!r}, which the model lacks")
        return arrays[name] if name in arrays else to_array(tensors[name])

    try:
        graph = rebuild_graph(annotations.record, initializer)
        verify_graph(graph)
    except TilefoldError as exc:
        raise ModelError(f"{label}: its tilefold annotations do not describe a valid graph: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelError(f"{label}: its tilefold annotations are malformed ({type(exc).__name__}: {exc})") from None
    return graph


__all__ = [
    "Annotations", "KEY_FINGERPRINT", "KEY_FORMAT", "KEY_GRAPH", "KEY_TARGET", "KEY_TILES", "KEY_VERSION",
    "annotated_graph", "decode", "encode", "fingerprint", "graph_record", "read_annotations", "rebuild_graph",
]
