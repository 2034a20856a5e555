"""The `OnnxReference` kernel: an ONNX op tilefold has no kernel for, run by onnx.reference.

The factory wraps the node (kept serialized in the attrs) in a one-node model typed from
the node's inputs and `output_types`, and builds the ReferenceEvaluator once; each call
only feeds the arrays. Slow, but correct for anything onnx.reference implements.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ....graph.registry import CANONICAL_OPSET
from ....graph.types import TensorType
from ..registry import KernelSpec, Run, kernel
from .common import as_array, unsupported


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(t.dtype)
    return helper.make_tensor_value_info(name, elem, list(t.shape))


def one_node_model(node: onnx.NodeProto, in_types: list[TensorType | None],
                   out_types: list[TensorType], domain: str, opset: int) -> onnx.ModelProto:
    """A model whose graph is `node` alone, its inputs and outputs typed."""
    inputs, seen = [], set()
    for name, t in zip(node.input, in_types):
        if name and name not in seen and t is not None:
            inputs.append(_value_info(name, t))
            seen.add(name)
    outputs = [_value_info(name, t) for name, t in zip(node.output, out_types) if name]
    graph = helper.make_graph([node], f"reference_{node.op_type}", inputs, outputs)
    imports = [helper.make_opsetid("", CANONICAL_OPSET if domain else opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, opset))
    return helper.make_model(graph, opset_imports=imports)


@kernel("OnnxReference")
def _onnx_reference(spec: KernelSpec) -> Run:
    attrs = spec.attrs
    node = onnx.NodeProto()
    node.ParseFromString(attrs["proto"])
    out_types = list(attrs.get("output_types") or spec.out_types)
    try:
        evaluator = ReferenceEvaluator(
            one_node_model(node, spec.in_types, out_types, attrs.get("domain", ""), int(attrs["opset"]))
        )
    except Exception as exc:
        raise unsupported(spec, f"onnx.reference cannot run {attrs.get('onnx_op')}: {' '.join(str(exc).split())}") from exc
    names = list(node.input)
    used_outputs = [i for i, name in enumerate(node.output) if name]
    single = len(spec.out_types) == 1

    def run(*args: Any) -> Any:
        feeds = {name: arg for name, arg in zip(names, args) if name and arg is not None}
        results = evaluator.run(None, feeds)
        fresh = []
        for r in results:
            r = as_array(r)
            if any(isinstance(a, np.ndarray) and np.may_share_memory(r, a) for a in args):
                r = r.copy()
            fresh.append(r)
        full: list[Any] = [None] * len(spec.out_types)
        for slot, r in zip(used_outputs, fresh):
            full[slot] = r
        return full[0] if single else tuple(full)

    return run
