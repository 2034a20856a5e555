"""The "aten" kernel set: PyTorch's one-pass kernels for Gelu, Erf, Sigmoid, Softmax,
LogSoftmax and LayerNormalization compute what onnxruntime does; nodes they do not cover run the NumPy
kernels; torch's thread setting is the caller's again after a run."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilefold
from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.numpy.kernels.aten import ATEN
from tilefold.frontends.onnx import load_onnx
from tilefold.graph import TilefoldError

from .conftest import node_model, reference_outputs


def _aten_outputs(model, feeds) -> list[np.ndarray]:
    """The model's outputs from the NumPy backend with the aten set (read-only inputs, aliasing
    checked), with no warning raised."""
    exe = NumpyExecutable(load_onnx(model), allow_fallback=False, debug=True, kernels="aten")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = exe(feeds)
    return [got[o.name] for o in model.graph.output]


def _check(op, args, attrs, *, consts=(), n_outputs=1, rtol=1e-5, atol=1e-6, reference="onnxruntime"):
    model, feeds = node_model(op, args, attrs, n_outputs, consts)
    want = reference_outputs(model, feeds, reference)
    got = _aten_outputs(model, feeds)
    for have, expected in zip(got, want):
        assert have.dtype == expected.dtype and have.shape == expected.shape
        np.testing.assert_allclose(have, expected, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(rng, dtype, approximate):
    x = (rng.standard_normal((3, 37, 16)) * 3).astype(dtype)
    # onnxruntime has no float64 Erf
    _check("Gelu", [x], {"approximate": approximate}, reference="onnx" if dtype == np.float64 else "onnxruntime")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["Erf", "Sigmoid"])
def test_erf_and_sigmoid(rng, dtype, op):
    x = (rng.standard_normal((5, 33)) * 4).astype(dtype)
    _check(op, [x], {}, reference="onnx" if dtype == np.float64 else "onnxruntime")


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis", [((4, 9), -1), ((2, 3, 5), 1), ((2, 3, 5), 0), ((1, 2, 7, 7), -1)])
def test_softmax(rng, op, shape, axis):
    _check(op, [(rng.standard_normal(shape) * 4).astype(np.float32)], {"axis": axis})


@pytest.mark.parametrize("shape, axis", [((4, 7), -1), ((2, 5, 6), -1), ((2, 5, 6), 1)])
@pytest.mark.parametrize("consts", [(1, 2), ()])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_normalization(rng, shape, axis, consts, bias):
    norm = shape[axis:]
    args = [(rng.standard_normal(shape) * 3 + 2).astype(np.float32), rng.standard_normal(norm).astype(np.float32)]
    args += [rng.standard_normal(norm).astype(np.float32)] if bias else []
    _check("LayerNormalization", args, {"axis": axis, "epsilon": 1e-4}, consts=consts, rtol=1e-4, atol=1e-5)


def test_nodes_aten_does_not_cover_run_the_numpy_kernels(rng):
    """LayerNormalization with its statistics or a broadcast scale, float16 data."""
    x = rng.standard_normal((3, 4, 6)).astype(np.float32)
    cases = [
        ("LayerNormalization", [x, rng.standard_normal((4, 6)).astype(np.float32)], {"axis": 1}, 3),
        ("LayerNormalization", [x, rng.standard_normal((1, 6)).astype(np.float32)], {"axis": 1}, 1),
        ("Gelu", [x.astype(np.float16)], {}, 1),
        ("Softmax", [x.astype(np.float16)], {}, 1),
    ]
    for op, args, attrs, n in cases:
        model, feeds = node_model(op, args, attrs, n)
        want = NumpyExecutable(load_onnx(model), allow_fallback=False)(feeds)
        got = _aten_outputs(model, feeds)
        for have, name in zip(got, [o.name for o in model.graph.output]):
            np.testing.assert_array_equal(have, want[name])


def test_torch_threads_are_the_callers_again_after_a_run(rng):
    model, feeds = node_model("Gelu", [rng.standard_normal((8, 64)).astype(np.float32)], {}, 1)
    exe = NumpyExecutable(load_onnx(model), kernels="aten")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        exe(feeds)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_set_covers_what_it_says(rng):
    assert sorted(ATEN) == ["Erf", "Gelu", "LayerNormalization", "LogSoftmax", "Sigmoid", "Softmax"]
    for dtype, module in ((np.float32, "aten"), (np.float16, "elementwise")):
        model, _ = node_model("Gelu", [rng.standard_normal((2, 3)).astype(dtype)], {}, 1)
        (step,) = NumpyExecutable(load_onnx(model), kernels="aten").steps
        assert step.run.__module__.rsplit(".", 1)[1] == module


class _Block(torch.nn.Module):
    """Attention scores' softmax, then a feed-forward block with Gelu and a layer norm."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = torch.softmax(x @ x.transpose(1, 2) / 8, dim=-1) @ x
        return self.norm(mixed + self.down(torch.nn.functional.gelu(self.up(mixed))))


def test_a_transformer_block_matches_the_numpy_set_on_every_target(rng):
    """Optimized for gpu, the block's Gelu runs on a packed buffer as it is."""
    torch.manual_seed(0)
    x = rng.standard_normal((2, 16, 32)).astype(np.float32)
    graph = tilefold.from_torch(_Block().eval(), (torch.from_numpy(x),))
    (name,) = graph.input_types()
    want = tilefold.compile(graph)({name: x})
    for target in ("cpu", "gpu"):
        opt = tilefold.optimize(graph, target).graph
        got = tilefold.compile(opt, kernels="aten")({name: x})
        for out in want:
            np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-5)


def test_unknown_or_misplaced_kernel_sets_are_refused(rng):
    model, _ = node_model("Gelu", [rng.standard_normal((2, 3)).astype(np.float32)], {}, 1)
    graph = load_onnx(model)
    with pytest.raises(TilefoldError, match="unknown kernel set 'mkl'"):
        tilefold.compile(graph, kernels="mkl")
    with pytest.raises(TilefoldError, match="NumPy backend alone"):
        tilefold.compile(graph, device="interp,cpu", kernels="aten")


def test_a_reversed_view_reaches_aten_as_a_copy(rng):
    """A Slice with a negative step hands Gelu a view with a negative stride."""
    from onnx import TensorProto, helper, numpy_helper

    x = rng.standard_normal((4, 6)).astype(np.float32)
    steps = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("starts", [-1]), ("ends", [-7]), ("axes", [1]), ("steps", [-1]))}
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["r"]),
         helper.make_node("Gelu", ["r"], ["y"])],
        "reversed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])], list(steps.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    (got,) = _aten_outputs(model, {"x": x})
    (want,) = reference_outputs(model, {"x": x}, "onnxruntime")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
