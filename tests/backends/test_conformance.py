"""The NumPy backend against ONNX's own node conformance cases (the data shipped in `onnx`).

Every case built only from ops tilefold claims (plus ONNX `Constant` nodes, and the ops newer
than opset 21 that the frontend expands into their function bodies) is loaded with
the ONNX frontend, compiled without the onnx.reference fallback and in debug mode (which
checks each kernel's aliasing declarations), run on each of the case's data sets, and
compared with the expected outputs: same dtype, same shape, values within the case's
rtol/atol (NaNs equal). A case is left out only through `EXCLUDED`, with a reason, and an
excluded case must then fail with a one-line TilefoldError rather than run with a wrong
answer. Finally every claimed op must pass at least one case: tilefold claims nothing it
does not pass.
"""
from __future__ import annotations

import functools
import re
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tilefold.backends.numpy import KERNELS, NumpyExecutable
from tilefold.frontends.onnx import load_onnx
from tilefold.graph.errors import ModelError, TilefoldError, UnsupportedOpError

CLAIMED = frozenset("""
    Relu LeakyRelu Sigmoid HardSigmoid HardSwish Tanh Erf Gelu Softplus Elu Sqrt Exp Log Neg Abs
    Reciprocal Floor Ceil Round Sin Cos Sign Not IsNaN IsInf
    Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Softsign Mish Selu Celu ThresholdedRelu Shrink
    Add Sub Mul Div Pow Mod Max Min Sum Mean Equal Less LessOrEqual Greater GreaterOrEqual And Or
    Xor BitwiseAnd BitwiseOr BitwiseXor BitwiseNot BitShift PRelu
    Where Clip Cast CastLike Identity Dropout
    MatMul Gemm Conv ConvTranspose BatchNormalization InstanceNormalization LayerNormalization LRN Softmax LogSoftmax MaxPool
    AveragePool GlobalAveragePool GlobalMaxPool
    ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp
    ReduceSumSquare ArgMax ArgMin TopK
    Reshape Flatten Transpose Squeeze Unsqueeze Expand Concat Split Slice Gather GatherElements
    GatherND Tile Pad Shape Size ConstantOfShape Range Trilu CumSum Resize
    ScatterElements ScatterND DepthToSpace SpaceToDepth OneHot Einsum EyeLike NonZero
    QuantizeLinear DequantizeLinear
""".split())

EXPANDED = frozenset("Attention RMSNormalization RotaryEmbedding Swish SwiGLU CausalConvWithState".split())
"""Ops newer than opset 21 that the frontend expands into the ONNX functions defining them
(frontends/onnx_functions.py); their cases then run on the claimed ops' kernels.
LinearAttention is left out: its function body is a Scan (control flow)."""

_DTYPE_ERRORS = (UnsupportedOpError, ModelError)
EXCLUDED: list[tuple[str, str, tuple[type[TilefoldError], ...]]] = [
    # (case-name pattern, reason, the errors the case must fail with)
    # Dtypes the NumPy backend does not compute with: kernels refuse them at build time
    # (UnsupportedOpError); in opset-22+ models onnx's version converter already refuses
    # to bring them to opset 21 (ModelError).
    (r"(?i)FLOAT8|E4M3|E5M2|E8M0", "float8 dtypes", _DTYPE_ERRORS),
    (r"BFLOAT16|bf16|bfloat16", "bfloat16", _DTYPE_ERRORS),
    (r"(?i)INT4|UINT4|INT2|UINT2|FLOAT4E2M1", "4-bit and 2-bit dtypes", _DTYPE_ERRORS),
    (r"^test_equal_string", "string tensors", (UnsupportedOpError,)),
    (r"^test_identity_(sequence|opt)$", "sequence and optional values: tilefold runs tensors only",
     (UnsupportedOpError,)),
    # Training-only semantics: tilefold is an inference engine.
    (r"^test_batchnorm_\w+_training_mode$", "BatchNormalization training_mode=1", (UnsupportedOpError,)),
    (r"^test_training_dropout(_default)?(_mask)?$", "Dropout in training mode with a nonzero ratio is random",
     (UnsupportedOpError,)),
    # Variants that exist only after opset 21, which the canonical opset cannot express.
    (r"^test_mod_\w*fmod_0", "Mod on floats with fmod=0 (opset 28)", (ModelError,)),
    (r"^test_range_float16", "Range on float16 (opset 27)", (ModelError,)),
    (r"^test_bitshift_\w+_int(8|16|32|64)", "BitShift on signed integers (opset 28)", (ModelError,)),
    (r"^test_celu_float16$", "Celu on float16 (opset 28)", (ModelError,)),
    (r"^test_spacetodepth_crd_mode_example$", "SpaceToDepth's mode attribute (opset 28)", (ModelError,)),
]

RELABEL_TO_21 = {
    # GlobalMaxPool-22 only added bfloat16 to GlobalMaxPool-1, but onnx's version converter
    # has no 22 -> 21 adapter for it; these cases use float32, so opset 21 means the same.
    "test_globalmaxpool", "test_globalmaxpool_precomputed",
}


CONVERTED = {"Upsample": "Resize"}
"""Ops of older opsets that onnx's version converter turns into claimed ops on the way to
opset 21 (the cases then run as the op they become)."""


def _ops(case) -> set[str]:
    return {CONVERTED.get(n.op_type, n.op_type) for n in case.model.graph.node} - {"Constant"}


@functools.lru_cache(maxsize=1)
def _cases() -> dict[str, object]:
    """The node cases built from claimed ops only, by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return {
        c.name: c
        for c in cases
        if _ops(c) and _ops(c) <= CLAIMED | EXPANDED and all(n.domain in ("", "ai.onnx") for n in c.model.graph.node)
    }


def exclusion(name: str) -> tuple[str, tuple[type[TilefoldError], ...]] | None:
    for pattern, reason, errors in EXCLUDED:
        if re.search(pattern, name):
            return reason, errors
    return None


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def _model(case) -> onnx.ModelProto:
    if case.name not in RELABEL_TO_21:
        return case.model
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = 21
    return model


def run_case(case) -> None:
    """Load, compile and run one case on all its data sets; AssertionError on a mismatch."""
    model = _model(case)
    exe = NumpyExecutable(load_onnx(model), allow_fallback=False, debug=True)
    weights = {t.name for t in model.graph.initializer}
    in_names = [v.name for v in model.graph.input if v.name not in weights]
    out_names = [v.name for v in model.graph.output]
    for inputs, expected in case.data_sets:
        with np.errstate(all="ignore"):
            got = exe({name: _array(v) for name, v in zip(in_names, inputs)})
        for name, want in zip(out_names, expected):
            want, have = _array(want), got[name]
            where = f"{case.name}: output {name!r}"
            assert have.dtype == want.dtype, f"{where}: dtype {have.dtype}, expected {want.dtype}"
            assert have.shape == want.shape, f"{where}: shape {have.shape}, expected {want.shape}"
            np.testing.assert_allclose(have, want, rtol=case.rtol, atol=case.atol, equal_nan=True, err_msg=where)


@functools.lru_cache(maxsize=None)
def outcome(name: str) -> BaseException | None:
    """What running case `name` raised (None when it passed), computed once per process."""
    try:
        run_case(_cases()[name])
    except (AssertionError, Exception) as exc:  # noqa: B014 - both are results to report
        return exc
    return None


def test_the_claimed_ops_are_exactly_the_kernels_registered():
    assert set(KERNELS) - {"OnnxReference", "Pack", "Unpack", "Transfer"} == CLAIMED  # tilefold's own ops aside


@pytest.mark.parametrize("name", sorted(_cases()))
def test_conformance_case(name: str):
    failure = outcome(name)
    excluded = exclusion(name)
    if excluded is None:
        if failure is not None:
            raise failure
        return
    reason, errors = excluded
    assert failure is not None, f"{name} is excluded ({reason}) but passes: remove its exclusion"
    assert isinstance(failure, errors), f"{name} ({reason}) failed with {type(failure).__name__}: {failure}"
    assert "\n" not in str(failure)


def test_every_claimed_op_passes_at_least_one_case():
    cases = _cases()
    passed, failed, excluded = Counter(), Counter(), Counter()
    for name, case in cases.items():
        tally = excluded if exclusion(name) else (passed if outcome(name) is None else failed)
        tally.update(_ops(case))
    ops = CLAIMED | EXPANDED
    width = max(len(op) for op in ops)
    print(f"\n{'op':<{width}}  passed  failed  excluded")
    for op in sorted(ops):
        print(f"{op:<{width}}  {passed[op]:>6}  {failed[op]:>6}  {excluded[op]:>8}")
    assert not sorted(ops - set(passed)), f"claimed ops with no passing case: {sorted(ops - set(passed))}"
