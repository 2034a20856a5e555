"""Bringing a parsed ONNX model to tilefold's canonical form with onnx's own tools.

onnx.checker validates it, onnx.inliner expands model-local functions (and ops newer than
opset 21 into their schemas' function bodies, onnx_functions.py), onnx.version_converter
upgrades (or downgrades) it to opset `CANONICAL_OPSET`, and onnx
shape inference (with data propagation) types every value it can.

Those tools are C++ behind a serialized protobuf, which cannot exceed 2 GB. So they run
on a light copy: every initializer of at least `STRIP_BYTES` becomes a typed graph input
for the duration and is handed to the builder beside the prepared model (a weight that
large is never a shape that inference needs to read, and skipping the copies is faster).
Large tensors held in `Constant` node attributes are not stripped: a model that keeps
more than 2 GB there fails with a one-line ModelError from the checker.
"""
from __future__ import annotations

from typing import Collection

import onnx
from onnx import helper, inliner, shape_inference, version_converter

from ..graph.errors import ModelError, UnsupportedOpError
from ..graph.registry import CANONICAL_OPSET
from .onnx_fold import folded_values, static_shapes, without_folded_nodes
from .onnx_functions import expand_newer_ops
from .onnx_read import checker_message, node_label
from .onnx_values import DEFAULT_DOMAINS

MIN_OPSET = 9
STRIP_BYTES = 1 << 12
"""Initializers this large are held out of the model while it is checked, converted and
shape-inferred: those steps serialize the whole model, never need a weight's values (only
small shape, axes and index constants, kept), and took a third of ResNet-50's load time
with its weights in (0.16 s against 0.14 s without)."""
FOLD_ROUNDS = 4


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's version of the default ONNX domain, or None when it imports none."""
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return int(entry.version)
    return None


def prepare(
    model: onnx.ModelProto, label: str, held: Collection[str] = ()
) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """Check, inline, convert to the canonical opset and infer shapes.

    Returns the prepared model and the large initializers held out of it (by name); the
    graph inputs that stood in for them keep their names, so the builder makes them
    constants again like any initializer listed as an input. `held` names initializers
    whose data was read apart (onnx_wire): they are held out whatever their size.
    """
    light, large = _strip(model, held)
    check(light, label)
    if light.functions:
        light = _inline(light, label)
    version = default_opset(light)
    if version is not None and version > CANONICAL_OPSET:
        light = expand_newer_ops(light, version, label)
    reject_subgraphs(light.graph, label)  # after the expansion: a function body may hold a Scan
    light = convert(light, label)
    name_unknown_input_dims(light)
    return infer_shapes(light, label), large


class FreshDims:
    """Fresh dim names, deterministic, that collide with no dim name the model already uses."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.used: set[str] = set()
        graph = model.graph
        for info in (*graph.input, *graph.output, *graph.value_info):
            if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
                self.used.update(d.dim_param for d in info.type.tensor_type.shape.dim if d.dim_param)

    def fresh(self, tensor: str, axis: int) -> str:
        base = name = f"{tensor}_dim{axis}"
        k = 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name


def name_unknown_input_dims(model: onnx.ModelProto) -> None:
    """Give each graph-input dim that has neither a size nor a name a fresh name.

    Done before shape inference, so that the types inferred downstream use the same name.
    """
    symbols = FreshDims(model)
    for info in model.graph.input:
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if not dim.HasField("dim_value") and not dim.dim_param:
                    dim.dim_param = symbols.fresh(info.name, axis)


def check(model: onnx.ModelProto, label: str) -> None:
    """onnx.checker, its message cut to one line that still names the node.

    The checker wants a shape on every graph output; onnxruntime does not, and tilefold
    types outputs by inference, so a shapeless output is given an empty shape for the
    duration of the check only.
    """
    check_declarations(model.graph, label)
    shapeless = [o.type.tensor_type for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    for tensor_type in shapeless:
        tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # ValidationError, or ValueError past the 2 GB protobuf limit
        raise ModelError(f"{label}: invalid ONNX model: {checker_message(exc)}") from None
    finally:
        for tensor_type in shapeless:
            tensor_type.ClearField("shape")


def check_declarations(graph: onnx.GraphProto, label: str) -> None:
    """Graph inputs must be tensors of a known element type and rank; outputs, tensors of a known type.

    (The checker says "Field 'shape' of 'type' is required" without naming the value.)
    """
    weights = {t.name for t in graph.initializer}
    for kind, infos in (("input", graph.input), ("output", graph.output)):
        for info in infos:
            if kind == "input" and info.name in weights:
                continue
            subject = f"{label}: graph {kind} {info.name!r}"
            value = info.type.WhichOneof("value")
            if value is None:
                raise ModelError(f"{subject} declares no type")
            if value != "tensor_type":
                raise UnsupportedOpError(f"{subject} is a {value.removesuffix('_type')}: tilefold supports tensors only")
            if not info.type.tensor_type.elem_type:
                raise ModelError(f"{subject} declares no element type")
            if kind == "input" and not info.type.tensor_type.HasField("shape"):
                raise ModelError(f"{subject} declares no shape: tilefold needs at least its rank")


def reject_subgraphs(graph: onnx.GraphProto, label: str) -> None:
    """Control flow (If, Loop, Scan: ops with graph attributes) is out of tilefold's scope."""
    for i, node in enumerate(graph.node):
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise UnsupportedOpError(
                f"{label}: {node_label(node, i)}: ops with subgraphs (control flow such as If, Loop, "
                "Scan) are not supported by tilefold"
            )


def _inline(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    try:
        return inliner.inline_local_functions(model)
    except Exception as exc:
        raise ModelError(f"{label}: cannot inline its model-local functions: {checker_message(exc)}") from None


def convert(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """Upgrade (or downgrade) the default domain to opset CANONICAL_OPSET."""
    version = default_opset(model)
    if version is None or version == CANONICAL_OPSET:
        return model
    newest = onnx.defs.onnx_opset_version()
    if version > newest:
        raise ModelError(
            f"{label}: its opset {version} is newer than any the installed onnx {onnx.__version__} "
            f"knows (up to {newest}), so it cannot be converted to opset {CANONICAL_OPSET}"
        )
    try:
        converted = version_converter.convert_version(model, CANONICAL_OPSET)
    except Exception as exc:
        hint = f" (tilefold reads opsets {MIN_OPSET} to {CANONICAL_OPSET} and newer ones onnx can convert)"
        raise ModelError(
            f"{label}: cannot convert it from opset {version} to opset {CANONICAL_OPSET}: "
            f"{checker_message(exc)}{hint}"
        ) from None
    return _asymmetric_resizes(converted, _pre_11_resizes(model, version))


def _pre_11_resizes(model: onnx.ModelProto, version: int) -> set[str]:
    """The first outputs of Upsample (opset < 10) and Resize-10 nodes: both map output
    positions to input ones asymmetrically (x / scale, nearest rounding down)."""
    if version >= 11:
        return set()
    return {n.output[0] for n in model.graph.node
            if n.domain in DEFAULT_DOMAINS and n.op_type in ("Upsample", "Resize")}


def _asymmetric_resizes(model: onnx.ModelProto, outputs: set[str]) -> onnx.ModelProto:
    """onnx's version converter turns Upsample and Resize-10 into a Resize-11+ that keeps
    only `mode`, so they would take Resize-11's half_pixel default: this gives them back
    their asymmetric mapping, with floor for nearest (onnxruntime's rounding when upsampling;
    it rounds up when a Resize-10 downsamples, which opset 21 cannot express)."""
    for node in model.graph.node:
        if node.op_type == "Resize" and node.output[0] in outputs:
            kept = [a for a in node.attribute if a.name not in ("coordinate_transformation_mode", "nearest_mode")]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("coordinate_transformation_mode", "asymmetric"),
                                   helper.make_attribute("nearest_mode", "floor")])
    return model


def infer_shapes(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """onnx shape inference with data propagation, through folded constant arithmetic.

    Inference alternates with folding (onnx_fold) until no new value folds, at most
    `FOLD_ROUNDS` times: each round may make more shapes static, and so more Shape nodes
    constant. The types found are written into the model's value_info and graph outputs.
    """
    inferred = _infer(model, label)
    folded: dict = {}
    for _ in range(FOLD_ROUNDS):
        more = folded_values(model, static_shapes(inferred), folded)
        if more.keys() <= folded.keys():
            break
        folded = more
        inferred = _infer(without_folded_nodes(model, folded), label)
    if not folded:
        return inferred
    graph = model.graph
    del graph.value_info[:]
    graph.value_info.extend(inferred.graph.value_info)
    outputs = {o.name for o in graph.output}
    for name, value in folded.items():
        if name not in outputs and value.dtype != object:
            graph.value_info.append(
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            )
    del graph.output[:]
    graph.output.extend(inferred.graph.output)
    return model


def _infer(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """onnx shape inference with data propagation (symbolic shapes through Shape/Gather/Concat).

    When the model's own value_info or declared output shapes contradict inference, it is
    run again without them: inference is what the graph is built from.
    """
    try:
        return shape_inference.infer_shapes(model, data_prop=True)
    except Exception as first:
        bare = onnx.ModelProto()
        bare.CopyFrom(model)
        del bare.graph.value_info[:]
        for out in bare.graph.output:
            if out.type.HasField("tensor_type"):
                out.type.tensor_type.ClearField("shape")
        try:
            return shape_inference.infer_shapes(bare, data_prop=True)
        except Exception:
            raise ModelError(f"{label}: onnx shape inference failed: {checker_message(first)}") from None


# ---- the 2 GB limit ----------------------------------------------------------------------


def _strip(
    model: onnx.ModelProto, held: Collection[str] = ()
) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """The model without its large initializers and those named in `held` (now typed
    inputs), and those initializers.

    The light copy is assembled field by field, so the large tensors are never copied.
    """
    graph = model.graph
    large = {t.name: t for t in graph.initializer if t.name in held or _nbytes(t) >= STRIP_BYTES}
    if not large:
        return model, {}
    light = onnx.ModelProto()
    _copy_fields(model, light, skip={"graph"})
    _copy_fields(graph, light.graph, skip={"initializer"})
    light.graph.initializer.extend(t for t in graph.initializer if t.name not in large)
    declared = {v.name for v in graph.input}
    light.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in large.values()
        if t.name not in declared
    )
    return light, large


def _copy_fields(src, dst, skip: set[str]) -> None:
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _nbytes(tensor: onnx.TensorProto) -> int:
    """Size from dims and element type (reading raw_data would copy it; ByteSize serializes)."""
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        itemsize = 1
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize
