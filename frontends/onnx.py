"""ONNX -> Graph: read a model file safely, bring it to opset 21, build the dataflow graph.

    graph = load_onnx("model.onnx")

The stages live in their own modules: onnx_read (the file, external data, the graph's
wiring), onnx_prepare (checker, function inlining, version conversion, shape inference)
and onnx_build (the Graph itself).
"""
from __future__ import annotations

import os

import onnx

from ..graph.graph import Graph
from .onnx_annotations import annotated_graph, read_annotations
from .onnx_build import build_graph
from .onnx_prepare import STRIP_BYTES, default_opset, prepare
from .onnx_read import check_wiring, load_external_data, read_model

__all__ = ["load_onnx"]


def load_onnx(
    model: str | os.PathLike | bytes | onnx.ModelProto, *, progress: bool = False, target: str | None = None
) -> Graph:
    """Read an ONNX model (path, serialized bytes or ModelProto) into a Graph at opset 21.

    Raises a one-line ModelError for anything that is not a valid ONNX model (including
    external data that is missing or points outside the model's folder) and an
    UnsupportedOpError for control flow (If, Loop, Scan). `progress` shows a bar over the
    nodes on stderr. `graph.meta` records the source, producer, original opset and IR version.

    A file tilefold optimized and wrote gives back the optimized graph when it was optimized
    for `target` (or no target is asked); for another target it is read as the plain ONNX
    model it also is (`graph.meta["optimized_for"]` then names the file's target), to be
    planned again.
    """
    source = read_model(model, hold_out_bytes=STRIP_BYTES)
    proto = source.model
    load_external_data(source)
    check_wiring(proto.graph, source.label)
    meta = {
        "source": source.path or source.label,
        "producer": " ".join(p for p in (proto.producer_name, proto.producer_version) if p),
        "opset": default_opset(proto),
        "ir_version": int(proto.ir_version),
        "opset_imports": {e.domain: int(e.version) for e in proto.opset_import},
    }
    annotations = read_annotations(proto)
    if annotations is not None and (target is None or annotations.target == target):
        graph = annotated_graph(proto, annotations, source.label, source.arrays)
        graph.meta.update({"source": meta["source"], "file_producer": meta["producer"]})
        return graph
    if annotations is not None:
        meta["optimized_for"] = annotations.target
    prepared, large = prepare(proto, source.label, held=source.arrays.keys())
    name = proto.graph.name or (os.path.splitext(os.path.basename(source.path))[0] if source.path else "graph")
    graph = build_graph(prepared, large, source.label, name, progress=progress, arrays=source.arrays)
    graph.meta.update(meta)
    return graph
