"""Reading an ONNX model safely: the file, its external data, and its graph's wiring.

Every failure is a one-line `ModelError` that names the model (its path, or `<bytes>`)
and what is wrong with it.
"""
from __future__ import annotations

import heapq
import os
import re
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from ..graph.errors import ModelError
from .onnx_wire import attach, read_external, read_split


@dataclass
class Source:
    """A parsed model and where it came from."""

    model: onnx.ModelProto
    label: str  # the path, or a placeholder for in-memory models, for messages
    path: str | None  # the file, when read from one
    base_dir: str | None  # the folder external data is read from
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    """Initializers read straight from the file (onnx_wire), by name: their tensors in `model`
    keep name, type and dims but hold no data."""


def read_model(model: str | os.PathLike | bytes | onnx.ModelProto, hold_out_bytes: int | None = None) -> Source:
    """Parse a path, serialized bytes or a ModelProto (copied: the caller's is never touched).

    With `hold_out_bytes`, a file's initializers of at least that many bytes are read
    straight into `Source.arrays` (one copy instead of three; see onnx_wire).
    """
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        label = f"model {proto.graph.name!r}" if proto.graph.name else "<ModelProto>"
        _require_graph(proto, label)
        return Source(proto, label, None, None)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return Source(_parse(bytes(model), "<bytes>"), "<bytes>", None, None)
    if not isinstance(model, (str, os.PathLike)):
        raise ModelError(
            f"cannot load a model from a {type(model).__name__}: pass a path, bytes or an onnx.ModelProto"
        )
    path = os.fspath(model)
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelError(f"{path}: is a directory, not an ONNX model file")
    base_dir = os.path.dirname(os.path.abspath(path))
    try:
        if hold_out_bytes is not None:
            with open(path, "rb", buffering=0) as f:
                split = read_split(f, hold_out_bytes)
            proto = _parse_or_none(split.light) if split is not None else None
            if proto is not None:
                return Source(proto, path, path, base_dir, attach(proto, split.payloads))
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return Source(_parse(data, path), path, path, base_dir)


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    if not data:
        raise ModelError(f"{label}: is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(
            f"{label}: not an ONNX model (protobuf decoding failed: {first}; the file is truncated or of another kind)"
        ) from None
    _require_graph(proto, label)
    return proto


def _parse_or_none(data: bytes) -> onnx.ModelProto | None:
    """The model, or None where the ordinary read is to say what is wrong with the file."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        return None
    graph = proto.graph
    return proto if proto.HasField("graph") and (graph.node or graph.output) else None


def _require_graph(proto: onnx.ModelProto, label: str) -> None:
    """A ModelProto that parsed but holds no graph is some other protobuf (or a cut file)."""
    graph = proto.graph
    if not proto.HasField("graph") or (not graph.node and not graph.output):
        raise ModelError(f"{label}: not an ONNX model (it holds no graph: no nodes and no outputs)")


# ---- external data ------------------------------------------------------------------------


def model_tensors(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    """Every tensor a model holds (initializers, node attributes, subgraphs, functions), named."""

    def in_graph(graph: onnx.GraphProto) -> Iterator[tuple[onnx.TensorProto, str]]:
        for tensor in graph.initializer:
            yield tensor, tensor.name
        for sparse in graph.sparse_initializer:
            yield sparse.values, sparse.values.name
            yield sparse.indices, sparse.indices.name
        for node in graph.node:
            yield from in_nodes([node])

    def in_nodes(nodes) -> Iterator[tuple[onnx.TensorProto, str]]:
        for node in nodes:
            for attr in node.attribute:
                label = f"{attr.name} of node {node.name or node.op_type!r}"
                if attr.HasField("t"):
                    yield attr.t, attr.t.name or label
                for t in attr.tensors:
                    yield t, t.name or label
                if attr.HasField("sparse_tensor"):
                    yield attr.sparse_tensor.values, attr.sparse_tensor.values.name or label
                if attr.HasField("g"):
                    yield from in_graph(attr.g)
                for g in attr.graphs:
                    yield from in_graph(g)

    yield from in_graph(model.graph)
    for function in model.functions:
        yield from in_nodes(function.node)


def load_external_data(source: Source) -> None:
    """Check every external-data reference, then read the data: an initializer's straight
    into `source.arrays` where it is a plain array (onnx_wire.read_external), the rest into
    the model by onnx's loader.

    A model file must not make tilefold read arbitrary files: a location must be relative
    and resolve (symlinks followed) inside the model's folder, and the file must be long
    enough for the offset and length it names.
    """
    external = [(t, name) for t, name in model_tensors(source.model) if external_data_helper.uses_external_data(t)]
    if not external:
        return
    if source.base_dir is None:
        raise ModelError(
            f"{source.label}: tensor {external[0][1]!r} keeps its data in an external file, which "
            "cannot be found for a model given as bytes or a ModelProto: load it from its path instead"
        )
    base = os.path.realpath(source.base_dir)
    for tensor, name in external:
        _check_location(tensor, name, base, source.label)
    initializers = source.model.graph.initializer
    if len({t.name for t in initializers}) == len(initializers):
        for tensor in initializers:  # plain arrays straight from their files (onnx_wire)
            array = read_external(tensor, source.base_dir) if external_data_helper.uses_external_data(tensor) else None
            if array is not None:
                source.arrays[tensor.name] = array
                del tensor.external_data[:]
                tensor.ClearField("data_location")
    if not any(external_data_helper.uses_external_data(t) for t, _ in external):
        return
    try:
        external_data_helper.load_external_data_for_model(source.model, source.base_dir)
    except Exception as exc:  # onnx also refuses symbolic links, even ones inside the folder
        raise ModelError(f"{source.label}: cannot load external data: {_first_line(exc)}") from None


def _check_location(tensor: onnx.TensorProto, name: str, base: str, label: str) -> None:
    info = external_data_helper.ExternalDataInfo(tensor)
    location = info.location
    where = f"{label}: tensor {name!r} has external data location {location!r}"
    if not location:
        raise ModelError(f"{label}: tensor {name!r} is marked as external data but names no location")
    if os.path.isabs(location) or os.path.splitdrive(location)[0] or location.startswith(("/", "\\")):
        raise ModelError(f"{where}, an absolute path: a model file must not make tilefold read arbitrary files")
    resolved = os.path.realpath(os.path.join(base, location))
    if os.path.commonpath([resolved, base]) != base:
        raise ModelError(
            f"{where}, which resolves outside the model's folder {base}: "
            "a model file must not make tilefold read arbitrary files"
        )
    if not os.path.isfile(resolved):
        raise ModelError(f"{where}, but there is no such file in {base}")
    offset = int(info.offset or 0)
    length = info.length
    size = os.path.getsize(resolved)
    needed = offset + (int(length) if length else _expected_nbytes(tensor))
    if offset > size or needed > size:
        raise ModelError(
            f"{where}, but the file has {size} bytes, fewer than offset {offset} plus the "
            f"{needed - offset} bytes the tensor needs"
        )


def _expected_nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor of fixed-size elements needs; 0 where that is not simple to say."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return 0
    if tensor.data_type in _SUB_BYTE or tensor.data_type == onnx.TensorProto.STRING:
        return 0
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize


_SUB_BYTE = {
    getattr(onnx.TensorProto, n)
    for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, n)
}


# ---- wiring ---------------------------------------------------------------------------------


# `/project/onnx/.../convert.h:96: assertInVersionRange: Assertion `...` failed: ` before onnx's message
_SOURCE_PREFIX = re.compile(r"^(\S+\.(h|cc|cpp):\d+:\s*)?(.*?Assertion `.*` failed:\s*)?")


def checker_message(exc: BaseException) -> str:
    """The first line of an onnx error plus its `==> Context:` line, when it has one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    lines[0] = _SOURCE_PREFIX.sub("", lines[0])
    context = [line.removeprefix("==> Context:").strip() for line in lines[1:] if line.startswith("==> Context:")]
    return lines[0] + (f" ({context[0]})" if context else "")


def node_label(node: onnx.NodeProto, index: int) -> str:
    """`node 'NAME' (op OP)`, with `OP#index` standing in for a missing name."""
    return f"node {node.name or f'{node.op_type}#{index}'!r} (op {node.op_type})"


def check_wiring(graph: onnx.GraphProto, label: str) -> None:
    """Refuse dangling inputs, doubly produced tensors and cycles; sort an unsorted graph.

    onnx.checker reports all three as a multi-line "not topologically sorted" message, which
    does not say which it is; an acyclic graph that is merely out of order is sorted here
    (onnxruntime accepts those too) rather than refused.
    """
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    available |= {t.values.name for t in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in available:
                raise ModelError(
                    f"{label}: tensor {out!r} is produced twice (again by {node_label(node, i)})"
                )
            producer[out] = i
    deps: list[set[int]] = []
    for i, node in enumerate(graph.node):
        needs: set[int] = set()
        for name in node.input:
            if not name or name in available:
                continue
            if name not in producer:
                raise ModelError(
                    f"{label}: {node_label(node, i)} reads tensor {name!r}, which no node, "
                    "graph input or initializer produces"
                )
            needs.add(producer[name])
        deps.append(needs)
    for out in graph.output:
        if out.name not in producer and out.name not in available:
            raise ModelError(
                f"{label}: graph output {out.name!r} is produced by no node, graph input or initializer"
            )
    order = _stable_topological_order(deps)
    if len(order) < len(deps):
        raise ModelError(f"{label}: the graph has a cycle: {_describe_cycle(graph, deps, set(order), producer)}")
    if order != list(range(len(deps))):
        nodes = [graph.node[i] for i in order]
        copies = [onnx.NodeProto() for _ in nodes]
        for copy, node in zip(copies, nodes):
            copy.CopyFrom(node)
        del graph.node[:]
        graph.node.extend(copies)


def _stable_topological_order(deps: list[set[int]]) -> list[int]:
    """Kahn's algorithm, taking the earliest ready node first (a sorted graph is unchanged)."""
    users: list[list[int]] = [[] for _ in deps]
    missing = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [i for i, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    return order


def _describe_cycle(graph: onnx.GraphProto, deps: list[set[int]], done: set[int], producer: dict[str, int]) -> str:
    """`node A reads 'x' from node B, which reads 'y' from node A`, for one cycle."""
    start = min(i for i in range(len(deps)) if i not in done)
    path, seen = [start], {start: 0}
    while True:
        nxt = min(j for j in deps[path[-1]] if j not in done)
        if nxt in seen:
            path = path[seen[nxt]:] + [nxt]
            break
        seen[nxt] = len(path)
        path.append(nxt)
    parts = []
    for k, (consumer, prod) in enumerate(zip(path, path[1:])):
        tensor = next(n for n in graph.node[consumer].input if producer.get(n) == prod)
        head = node_label(graph.node[consumer], consumer) if k == 0 else "which"
        target = node_label(graph.node[prod], prod) if k < len(path) - 2 else f"node {_name(graph, prod)!r}"
        parts.append(f"{head} reads {tensor!r} from {target}")
    return ", ".join(parts)


def _name(graph: onnx.GraphProto, i: int) -> str:
    node = graph.node[i]
    return node.name or f"{node.op_type}#{i}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__
