"""Pack and unpack as standard ONNX ops (Pad/Reshape/Transpose, Transpose/Reshape/Slice) give,
in onnxruntime, the buffers of the NumPy reference `layout.encoding.pack`/`unpack`."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefold.backends.onnx.layout_ops import lower_pack, lower_unpack
from tilefold.layout.encoding import PackedEncoding, pack, unpack

CASES = [
    ((5, 37), PackedEncoding((0, 1), (16, 16))),                       # mmt4d tiles, both dims padded
    ((2, 35, 7, 9), PackedEncoding((1,), (16,))),                       # NCHWc16, channels padded
    ((35, 20, 3, 3), PackedEncoding((0, 1), (16, 16))),                 # conv weight tiles
    ((2, 6, 5, 4), PackedEncoding((), (), (0, 2, 3, 1))),               # NHWC: a permutation only
    ((6, 5, 3, 3), PackedEncoding((), (), (2, 3, 1, 0))),               # RSCF
    ((9, 10), PackedEncoding((1, 0), (4, 3), (1, 0), pad=-2.5)),        # tiles out of order, outer swap
    ((3, 4, 10), PackedEncoding((2,), (8,), (2, 0, 1), pad=None)),      # unknown padding: filled with 0
    ((7,), PackedEncoding((0,), (16,))),                                # a vector
]


class _Builder:
    def __init__(self) -> None:
        self.nodes, self.inits, self.k = [], [], 0

    def emit(self, op, inputs, hint, outputs=None, **attrs):
        self.k += 1
        out = outputs[0] if outputs else f"t{self.k}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n{self.k}", **attrs))
        return out

    def const(self, array, hint):
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def run(self, ort_run, x: np.ndarray, out: str, out_shape) -> np.ndarray:
        if out == "x":
            out = self.emit("Identity", ["x"], "id")
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(out_shape))], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
        return ort_run(model, {"x": x})[out]


@pytest.mark.parametrize("shape,enc", CASES, ids=[f"{s}-{e}" for s, e in CASES])
def test_pack_matches_reference(shape, enc, ort_run):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    b = _Builder()
    out = lower_pack("x", enc, shape, np.dtype(np.float32), b.emit, b.const, "p")
    got = b.run(ort_run, x, out, enc.physical_shape(shape))
    np.testing.assert_array_equal(got, pack(x, enc))


@pytest.mark.parametrize("shape,enc", CASES, ids=[f"{s}-{e}" for s, e in CASES])
def test_unpack_matches_reference(shape, enc, ort_run):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    buffer = pack(x, enc)
    b = _Builder()
    out = lower_unpack("x", enc, shape, b.emit, b.const, "u")
    got = b.run(ort_run, buffer, out, shape)
    np.testing.assert_array_equal(got, unpack(buffer, enc, shape))
    np.testing.assert_array_equal(got, x)


def test_a_permutation_only_encoding_needs_no_reshape_or_slice():
    b = _Builder()
    lower_unpack("x", PackedEncoding((), (), (0, 2, 3, 1)), (2, 6, 5, 4), b.emit, b.const, "u")
    assert [n.op_type for n in b.nodes] == ["Transpose"]
