"""ONNX attributes and constant tensors as the plain Python and NumPy values of the IR contract."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import defs, numpy_helper

from ..graph.errors import ModelError, UnsupportedOpError
from ..graph.registry import CANONICAL_OPSET
from ..graph.types import freeze

DEFAULT_DOMAINS = ("", "ai.onnx")


def onnx_attributes(node: onnx.NodeProto, subject: str) -> dict[str, Any]:
    """The node's attributes over its opset-21 schema defaults, as plain Python values."""
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    attrs: dict[str, Any] = {}
    try:
        schema = defs.get_schema(node.op_type, CANONICAL_OPSET, domain)
    except defs.SchemaError:
        schema = None
    if schema is not None:
        for attr_name, attr in schema.attributes.items():
            if attr.default_value.type != onnx.AttributeProto.UNDEFINED:
                attrs[attr_name] = attribute_value(attr.default_value, subject)
    for attr in node.attribute:
        attrs[attr.name] = attribute_value(attr, subject)
    return attrs


def attribute_value(attr: onnx.AttributeProto, subject: str) -> Any:
    """int, float, str, tuple or read-only ndarray, per the IR contract."""
    kind = attr.type
    A = onnx.AttributeProto
    if kind == A.INT:
        return int(attr.i)
    if kind == A.FLOAT:
        return float(attr.f)
    if kind == A.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if kind == A.INTS:
        return tuple(int(v) for v in attr.ints)
    if kind == A.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if kind == A.STRINGS:
        return tuple(v.decode("utf-8", errors="replace") for v in attr.strings)
    if kind == A.TENSOR:
        return freeze(to_array(attr.t))
    if kind == A.TENSORS:
        return tuple(freeze(to_array(t)) for t in attr.tensors)
    if kind == A.SPARSE_TENSOR:
        return freeze(to_array(attr.sparse_tensor))
    raise UnsupportedOpError(f"{subject}: attribute {attr.name!r} of kind {A.AttributeType.Name(kind)} is not supported")


def constant_node_value(node: onnx.NodeProto, subject: str) -> np.ndarray:
    """The tensor an ONNX `Constant` node holds, whichever `value*` attribute carries it."""
    if len(node.attribute) != 1:
        raise ModelError(f"{subject}: a Constant node needs exactly one value attribute, got {len(node.attribute)}")
    attr = node.attribute[0]
    value = attribute_value(attr, subject)
    if attr.name in ("value", "sparse_value"):
        return value
    dtypes = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
              "value_ints": np.int64, "value_string": np.object_, "value_strings": np.object_}
    if attr.name not in dtypes:
        raise ModelError(f"{subject}: unknown Constant attribute {attr.name!r}")
    return freeze(np.array(value, dtype=dtypes[attr.name]))


def to_array(tensor: onnx.TensorProto | onnx.SparseTensorProto) -> np.ndarray:
    """A dense array of a tensor (sparse ones densified, as onnxruntime does when loading)."""
    if isinstance(tensor, onnx.SparseTensorProto):
        values = numpy_helper.to_array(tensor.values)
        indices = numpy_helper.to_array(tensor.indices).astype(np.int64)
        shape = tuple(int(d) for d in tensor.dims)
        dense = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=values.dtype)
        flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), shape)
        dense[flat] = values
        return dense.reshape(shape)
    return numpy_helper.to_array(tensor)
