"""Shared ONNX model builders for the frontend tests."""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def build_conv_block(opset: int) -> onnx.ModelProto:
    """Conv -> Clip -> ReduceMean -> Unsqueeze -> Split, in the form each opset spells it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    if opset < 11:
        nodes.append(helper.make_node("Clip", ["c"], ["r"], name="clip", min=0.0, max=6.0))
    else:
        inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["r"], name="clip"))
    if opset < 18:
        nodes.append(helper.make_node("ReduceMean", ["r"], ["m"], name="mean", axes=[2, 3], keepdims=0))
    else:
        inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
        nodes.append(helper.make_node("ReduceMean", ["r", "axes"], ["m"], name="mean", keepdims=0))
    if opset < 13:
        nodes.append(helper.make_node("Unsqueeze", ["m"], ["u"], name="unsq", axes=[2]))
        nodes.append(helper.make_node("Split", ["u"], ["s0", "s1"], name="split", axis=1, split=[3, 5]))
    else:
        inits += [numpy_helper.from_array(np.array([2], np.int64), "uaxes"),
                  numpy_helper.from_array(np.array([3, 5], np.int64), "sizes")]
        nodes.append(helper.make_node("Unsqueeze", ["m", "uaxes"], ["u"], name="unsq"))
        nodes.append(helper.make_node("Split", ["u", "sizes"], ["s0", "s1"], name="split", axis=1))
    graph = helper.make_graph(
        nodes, "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("s0", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("s1", TensorProto.FLOAT, None)],
        inits,
    )
    ir = 7 if opset < 15 else 8 if opset < 19 else 10
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


@pytest.fixture
def conv_block() -> Callable[[int], onnx.ModelProto]:
    """`conv_block(opset)`: one small conv model written in the form of that opset."""
    return build_conv_block
