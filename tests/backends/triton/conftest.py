"""Shared by the Triton backend tests: the devices to run on (the interpreter always, the GPU
where CUDA is present), small ONNX models built with onnx.helper, and a comparison helper."""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import torch

DEVICES = ["interp"] + (["cuda"] if torch.cuda.is_available() else [])
"""The interpreter on the CPU runs everywhere (CI); the same tests run on a GPU when present."""


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _model(nodes: list, inputs: list, outputs: list, inits: list, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return model


def small_cnn(seed: int = 0, size: int = 9) -> onnx.ModelProto:
    """Conv+bias -> BatchNorm -> Relu -> strided Conv -> Relu + residual-free head:
    GlobalAveragePool -> Flatten -> Gemm (channel counts that do not divide 16)."""
    rng = np.random.default_rng(seed)
    f1, f2 = 8, 20
    inits = [
        _init("w1", rng.standard_normal((f1, 3, 3, 3)) * 0.3), _init("b1", rng.standard_normal(f1) * 0.1),
        _init("scale", rng.uniform(0.5, 1.5, f1)), _init("shift", rng.standard_normal(f1) * 0.1),
        _init("mean", rng.standard_normal(f1) * 0.1), _init("var", rng.uniform(0.5, 1.5, f1)),
        _init("w2", rng.standard_normal((f2, f1, 3, 3)) * 0.2), _init("b2", rng.standard_normal(f2) * 0.1),
        _init("wf", rng.standard_normal((5, f2)) * 0.3), _init("bf", rng.standard_normal(5) * 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    return _model(nodes, [x], [y], inits, "small_cnn")


def residual_cnn(seed: int = 0, size: int = 8) -> onnx.ModelProto:
    """A residual block: Conv+Relu -> Conv -> Add (the skip) -> Relu -> MaxPool -> 1x1 Conv ->
    GlobalAveragePool -> Flatten -> Gemm (channel counts that do not divide 16); every node named."""
    rng = np.random.default_rng(seed)
    c, f, k = 6, 10, 4
    inits = [
        _init("w0", rng.standard_normal((c, 3, 3, 3)) * 0.3), _init("b0", rng.standard_normal(c) * 0.1),
        _init("w1", rng.standard_normal((c, c, 3, 3)) * 0.2), _init("b1", rng.standard_normal(c) * 0.1),
        _init("w2", rng.standard_normal((f, c, 1, 1)) * 0.3), _init("b2", rng.standard_normal(f) * 0.1),
        _init("wf", rng.standard_normal((k, f)) * 0.3), _init("bf", rng.standard_normal(k) * 0.1),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w0", "b0"], ["c0"], name="stem_conv", pads=[1, 1, 1, 1]),
        n("Relu", ["c0"], ["r0"], name="stem_relu"),
        n("Conv", ["r0", "w1", "b1"], ["c1"], name="block_conv", pads=[1, 1, 1, 1]),
        n("Add", ["c1", "r0"], ["s"], name="block_add"),
        n("Relu", ["s"], ["r1"], name="block_relu"),
        n("MaxPool", ["r1"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p", "w2", "b2"], ["c2"], name="head_conv"),
        n("GlobalAveragePool", ["c2"], ["g"], name="head_gap"),
        n("Flatten", ["g"], ["fl"], name="head_flatten"),
        n("Gemm", ["fl", "wf", "bf"], ["y"], name="head_gemm", transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, k])
    return _model(nodes, [x], [y], inits, "residual_cnn")


def tiny_transformer(seed: int = 0, batch: int = 2, seq: int = 5, dim: int = 24, heads: int = 2,
                     ff: int = 40) -> onnx.ModelProto:
    """One post-norm encoder layer: multi-head attention (Reshape/Transpose heads, scaled
    Q.K^T, Softmax, P.V), residual + LayerNorm, Gelu feed-forward, residual + LayerNorm."""
    rng = np.random.default_rng(seed)
    dh = dim // heads
    inits = []
    for name, shape in (("wq", (dim, dim)), ("wk", (dim, dim)), ("wv", (dim, dim)), ("wo", (dim, dim)),
                        ("w1", (dim, ff)), ("w2", (ff, dim))):
        inits.append(_init(name, rng.standard_normal(shape) / np.sqrt(shape[0])))
    for name, n in (("bq", dim), ("bk", dim), ("bv", dim), ("bo", dim), ("b1", ff), ("b2", dim)):
        inits.append(_init(name, rng.standard_normal(n) * 0.1))
    for name in ("g1", "g2"):
        inits.append(_init(name, rng.uniform(0.5, 1.5, dim)))
    for name in ("be1", "be2"):
        inits.append(_init(name, rng.standard_normal(dim) * 0.1))
    inits.append(numpy_helper.from_array(np.array([batch, seq, heads, dh], np.int64), "heads_shape"))
    inits.append(numpy_helper.from_array(np.array([batch, seq, dim], np.int64), "model_shape"))
    inits.append(_init("scale", np.array(1.0 / np.sqrt(dh))))
    n = helper.make_node
    nodes = []
    for p in "qkv":
        nodes += [n("MatMul", ["x", f"w{p}"], [f"{p}0"]), n("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
                  n("Reshape", [f"{p}1", "heads_shape"], [f"{p}2"])]
    nodes += [
        n("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]), n("Transpose", ["k2"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v2"], ["v"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]), n("Softmax", ["s"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["c0"]), n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["c1", "model_shape"], ["c"]),
        n("MatMul", ["c", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["o"]), n("Add", ["x", "o"], ["h0"]),
        n("LayerNormalization", ["h0", "g1", "be1"], ["h"], axis=-1, epsilon=1e-5),
        n("MatMul", ["h", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]), n("Gelu", ["f1"], ["f2"]),
        n("MatMul", ["f2", "w2"], ["f3"]), n("Add", ["f3", "b2"], ["f4"]), n("Add", ["h", "f4"], ["y0"]),
        n("LayerNormalization", ["y0", "g2", "be2"], ["y"], axis=-1, epsilon=1e-5),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, dim])
    return _model(nodes, [x], [y], inits, "tiny_transformer")


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float = 1e-4,
                 atol: float = 1e-5) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs, the model given the lowest IR version its opsets allow: onnx
    1.23 writes IR 14, which the onnxruntime of the GPU machines (1.30) refuses."""
    import onnxruntime as ort

    oldest = onnx.ModelProto()
    oldest.CopyFrom(model)
    oldest.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    session = ort.InferenceSession(oldest.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


# ---- graphs built node by node (packed operands, awkward sizes) ------------------------------------
from tilefold.graph import Graph  # noqa: E402
from tilefold.graph.registry import infer, with_defaults  # noqa: E402
from tilefold.graph.types import TensorType, Value  # noqa: E402
from tilefold.layout.encoding import PackedEncoding, pack  # noqa: E402


def add(g: Graph, op: str, inputs: list, attrs: dict | None = None, encoding: PackedEncoding | None = None,
        name: str | None = None) -> Value:
    """Add `op` on `inputs` with inferred logical types, its result in `encoding`."""
    full = with_defaults(op, attrs or {})
    types = [g.type_of(v) if v is not None else None for v in inputs]
    plain = types if op in ("Pack", "Unpack") else [None if t is None else TensorType(t.shape, t.dtype)
                                                     for t in types]
    outs = infer(op, full, plain, [g.constant_value(v) for v in inputs])
    outs = [TensorType(outs[0].shape, outs[0].dtype, encoding)] + outs[1:]
    return Value(g.add_node(op, inputs, outs, full, name=name).name)


def packed_const(g: Graph, array: np.ndarray, enc: PackedEncoding, name: str) -> Value:
    """A packed constant: the physical buffer, with the logical type carrying `enc`."""
    return g.add_constant(pack(array, enc), name=name, type=TensorType(array.shape, array.dtype, enc))


def run_both(g: Graph, feeds: dict[str, np.ndarray], device: str, **options: Any) -> tuple[dict, dict]:
    """Outputs of the Triton backend on `device` and of the NumPy backend (the reference);
    checks that every node ran in a generated kernel (none fell back to NumPy)."""
    from tilefold.backends.numpy import NumpyExecutable
    from tilefold.backends.triton import TritonExecutable

    exe = TritonExecutable(g, device=device, **options)
    got = exe(feeds)
    assert exe.fallback_nodes == [], f"ran on the NumPy backend: {exe.fallback_nodes}"
    return got, NumpyExecutable(g)(feeds)


@functools.lru_cache(maxsize=1)
def _node_cases() -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # building other ops' cases overflows casts on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        return collect_testcases()  # its op filter does nothing once another test has collected every case


def conformance_cases(keep: Callable[[set[str]], bool]) -> list:
    """The ONNX node conformance cases whose set of node ops `keep` accepts."""
    return [case for case in _node_cases() if keep({n.op_type for n in case.model.graph.node})]


def _array(data: Any) -> np.ndarray:
    """A case's data as an array (CastLike's cases hold TensorProtos, to keep their float16)."""
    return numpy_helper.to_array(data) if isinstance(data, TensorProto) else np.asarray(data)


def _with_constant_operands(model: onnx.ModelProto, inputs: list) -> onnx.ModelProto:
    """`model` with every graph input but the first an initializer holding its data (a Pad's
    pads, a Resize's scales), so that the Triton templates see constant plans."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value_info, data in zip(list(fixed.graph.input)[1:], inputs[1:]):
        fixed.graph.initializer.append(numpy_helper.from_array(_array(data), value_info.name))
    del fixed.graph.input[1:]
    return fixed


def run_conformance_case(case: Any, device: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(Triton's output, the expected one) for each data set of a one-output case, its other
    inputs made constants; checks that no node fell back to the NumPy backend."""
    from tilefold.backends.triton import TritonExecutable
    from tilefold.frontends.onnx import load_onnx

    pairs = []
    for inputs, outputs in case.data_sets:
        model = _with_constant_operands(case.model, inputs)
        exe = TritonExecutable(load_onnx(model), device=device)
        got = exe({model.graph.input[0].name: _array(inputs[0])})
        assert exe.fallback_nodes == [], case.name
        (y,) = got.values()
        pairs.append((y, _array(outputs[0])))
    return pairs


def run_case_by_hand(case: Any, device: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """As run_conformance_case, for a one-node case whose model tilefold's loader cannot read
    (opset 28 alone defines float Mod with fmod=0 and BitShift on signed integers, and the
    loader converts to opset 21): its node and data built into a graph by hand."""
    from tilefold.backends.triton import TritonExecutable

    (node,) = case.model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {name: v.decode() if isinstance(v, bytes) else v for name, v in attrs.items()}
    pairs = []
    for inputs, outputs in case.data_sets:
        x = _array(inputs[0])
        g = Graph(case.name)
        operands = [g.add_input("x", TensorType(x.shape, x.dtype))]
        operands += [g.add_constant(_array(v), name=f"operand{k}") for k, v in enumerate(inputs[1:], 1)]
        g.add_output(add(g, node.op_type, operands, attrs), "y")
        exe = TritonExecutable(g, device=device)
        y = exe({"x": x})["y"]
        assert exe.fallback_nodes == [], case.name
        pairs.append((y, _array(outputs[0])))
    return pairs


def first_input(case: Any) -> np.ndarray:
    """The first input of a conformance case's first data set (what its filters look at)."""
    return _array(case.data_sets[0][0][0])


def check_conformance(op: str, device: str, *, keep: Callable[[Any], bool] = lambda case: True,
                      rtol: float = 0.0, atol: float = 0.0, least: int = 1, by_hand: bool = False) -> None:
    """Runs every ONNX conformance case of `op` alone that `keep` accepts (at least `least`)
    on `device`, its other inputs made constants, against the case's expected outputs, loaded
    as ONNX models or (`by_hand`) built by run_case_by_hand."""
    cases = [case for case in conformance_cases(lambda ops: ops == {op}) if keep(case)]
    assert len(cases) >= least, f"{op}: {len(cases)} conformance cases, expected at least {least}"
    run = run_case_by_hand if by_hand else run_conformance_case
    for case in cases:
        for y, want in run(case, device):
            assert y.dtype == want.dtype, case.name
            np.testing.assert_allclose(y, want, rtol=rtol, atol=atol, err_msg=case.name)


@pytest.fixture
def kit():
    """The helpers above, for test modules (test dirs are not packages: no imports between files)."""
    import types

    return types.SimpleNamespace(add=add, packed_const=packed_const, run_both=run_both, small_cnn=small_cnn,
                                 residual_cnn=residual_cnn, tiny_transformer=tiny_transformer,
                                 assert_close=assert_close, ort_outputs=ort_outputs,
                                 conformance_cases=conformance_cases, run_conformance_case=run_conformance_case,
                                 run_case_by_hand=run_case_by_hand, check_conformance=check_conformance,
                                 first_input=first_input)
