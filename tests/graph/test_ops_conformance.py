"""Op registry inference against the ONNX node conformance cases shipped with `onnx`.

Every case whose nodes are all tilefold ops is replayed node by node through
`registry.infer`, and each inferred output type must equal the shape and dtype of the
array that ONNX's reference produced (the case's expected outputs, or onnx.reference's
intermediate values inside multi-node cases). Models below opset 21 are first upgraded
with onnx.version_converter, as the frontend does. Four ways of feeding constants:

- `const`:    every input's array is passed as a constant;
- `shape`:    only the shape-tensor inputs (shape, axes, pads, ...) are constants;
- `symbolic`: as `shape`, and every data dim > 1 becomes a symbol `S<size>`; inferred
              dims must evaluate to the true size (fresh dims may be anything);
- `opaque`:   no constants at all; a dim may come back fresh, but every known dim and
              the rank must be right.
"""
from __future__ import annotations

import collections
import inspect
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest

from tilefold.graph import registry
from tilefold.graph.errors import UnsupportedOpError
from tilefold.graph.ops import ONNX_OPS, SHAPE_INPUTS
from tilefold.graph.ops.shapes import is_fresh
from tilefold.graph.signature import Signature
from tilefold.graph.types import TensorType

onnx = pytest.importorskip("onnx")
from onnx import defs, helper, numpy_helper, version_converter  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

CLAIMED = sorted(ONNX_OPS)

MODES = ("const", "shape", "symbolic", "opaque")
_SYMBOL = re.compile(r"S(\d+)")


def onnx_attrs(node) -> dict:
    """Node attributes as the frontend hands them over: schema defaults filled in."""
    schema = defs.get_schema(node.op_type, registry.CANONICAL_OPSET)
    attrs = {name: a.default_value for name, a in schema.attributes.items() if a.default_value.name}
    attrs.update({a.name: a for a in node.attribute})

    def convert(value):
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, onnx.TensorProto):
            return numpy_helper.to_array(value)
        if isinstance(value, list):
            return tuple(convert(v) for v in value)
        return value

    return {k: convert(helper.get_attribute_value(a)) for k, a in attrs.items()}


def as_array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def symbolize(shape: tuple) -> tuple:
    return tuple(f"S{d}" if d > 1 else d for d in shape)


def dim_matches(inferred, actual: int, mode: str) -> bool:
    if isinstance(inferred, int):
        return inferred == actual
    if is_fresh(inferred):
        return mode in ("symbolic", "opaque")
    if mode != "symbolic":
        return False
    expr = _SYMBOL.sub(lambda m: m.group(1), inferred)
    if not re.fullmatch(r"[\d+\-*() ]+", expr):
        return False
    return eval(expr, {"__builtins__": {}}) == actual  # noqa: S307 (digits and + - * only)


@dataclass
class Outcome:
    checked: collections.Counter = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    dims: collections.Counter = field(default_factory=collections.Counter)
    signatures: collections.Counter = field(default_factory=collections.Counter)


RESIZED = {"Concat", "Split", "Slice", "Pad"}  # a letter may have several sizes (documented)
EINSUM = {"MatMul", "Transpose", "ReduceSum", "Gemm"}  # signatures that are plain contractions


def call_signature(op: str, attrs: dict, types, outs, consts):
    opdef = registry.get(op)
    full = {**opdef.defaults, **attrs}
    params = inspect.signature(opdef.signature).parameters
    if len(params) >= 4:
        return opdef.signature(full, list(types), list(outs), list(consts))
    return opdef.signature(full, list(types), list(outs))


def contract(sig: Signature, operands: list[np.ndarray], result_shape: tuple) -> np.ndarray:
    """Evaluate a signature as an einsum (singleton operand dims squeezed away)."""
    specs, arrays = [], []
    for idx, array in zip(sig.operands, operands):
        if idx is None or array is None:
            continue
        keep = [i for i, d in enumerate(idx) if d is not None]
        arrays.append(array.reshape([array.shape[i] for i in keep]))
        specs.append("".join(idx[i] for i in keep))
    out = "".join(d for d in sig.results[0] if d is not None)
    return np.einsum(",".join(specs) + "->" + out, *arrays).reshape(result_shape)


def check_signature(op, attrs, types, outs, consts, in_arrays, out_arrays, counts) -> list[str]:
    """The signature's indexing fits the operand and result shapes, letters agree on
    sizes (except resized and window dims), and contractions compute the op."""
    if registry.get(op).signature is None:
        counts["no signature"] += 1
        return []
    sig = call_signature(op, attrs, types, outs, consts)
    if sig is None:
        counts["None"] += 1
        return []
    counts[op] += 1
    problems = []
    if len(sig.operands) != len(types) or len(sig.results) != len(outs):
        return [f"{sig} has {len(sig.operands)} operands / {len(sig.results)} results for "
                f"{len(types)} inputs / {len(outs)} outputs"]
    if any(sig.operands[i] is not None for i in SHAPE_INPUTS.get(op, ()) if i < len(types)):
        problems.append(f"{sig}: a shape-tensor input is indexed")
    sizes: dict[str, set] = collections.defaultdict(set)
    for idx, t in zip((*sig.operands, *sig.results), (*types, *outs)):
        if idx is None:
            continue
        if t is None or len(idx) != t.rank:
            problems.append(f"{sig}: indexing {idx} does not fit {t}")
            continue
        for d, size in zip(idx, t.shape):
            if d is None and size != 1:
                problems.append(f"{sig}: a broadcast singleton of {t} has size {size}")
            elif d is not None:
                sizes[d].add(size)
    for d, seen in sizes.items():
        grouped = op == "Conv" and d == "c"  # X has C channels, W has C/group
        if len(seen) > 1 and op not in RESIZED and sig.kind(d) != "window" and not grouped:
            problems.append(f"{sig}: dim {d} has sizes {sorted(seen)}")
    if op in EINSUM and not problems:
        value = contract(sig, in_arrays[:2], out_arrays[0].shape)
        bias = in_arrays[2] if op == "Gemm" and len(in_arrays) > 2 else None
        if op == "Gemm":
            value = attrs["alpha"] * value + (0 if bias is None else attrs["beta"] * bias)
        if not np.allclose(value, out_arrays[0], rtol=1e-4, atol=1e-4):
            problems.append(f"{sig} evaluated as an einsum differs from the expected output")
    return problems


def load_cases() -> list[tuple[str, object, list[np.ndarray], list[np.ndarray]]]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    out = []
    for case in cases:
        nodes = case.model.graph.node
        if any(n.domain not in ("", "ai.onnx") for n in nodes):
            continue
        if not all(n.op_type in CLAIMED for n in nodes) or not case.data_sets:
            continue
        inputs, outputs = case.data_sets[0]
        out.append((case.name, case.model, [as_array(a) for a in inputs], [as_array(a) for a in outputs]))
    return out


def upgrade(model):
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= registry.CANONICAL_OPSET:
        return model
    return version_converter.convert_version(model, registry.CANONICAL_OPSET)


def replay(name: str, model, inputs, outputs, outcome: dict[str, Outcome]) -> None:
    """Infer every node of one case in every mode and record mismatches."""
    try:
        model = upgrade(model)
    except Exception as exc:  # the converter has no adapter for some old forms
        for mode in MODES:
            outcome[mode].skipped.append(f"{name}: version conversion failed ({type(exc).__name__})")
        return
    graph = model.graph
    arrays = {i.name: a for i, a in zip(graph.input, inputs)}
    arrays.update({i.name: numpy_helper.to_array(i) for i in graph.initializer})
    if len(graph.node) > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arrays.update(ReferenceEvaluator(model).run(None, dict(arrays), intermediate=True))
    else:
        arrays.update({o.name: a for o, a in zip(graph.output, outputs)})

    for mode in MODES:
        types = {
            k: TensorType(symbolize(a.shape) if mode == "symbolic" else a.shape, a.dtype)
            for k, a in arrays.items() if k in {i.name for i in graph.input}
        }
        for node in graph.node:
            attrs = onnx_attrs(node)
            shape_inputs = SHAPE_INPUTS.get(node.op_type, set())
            in_types, consts = [], []
            for slot, value in enumerate(node.input):
                if not value:
                    in_types.append(None)
                    consts.append(None)
                    continue
                known = arrays[value]
                t = types.get(value, TensorType(known.shape, known.dtype))
                if mode == "symbolic" and slot in shape_inputs:
                    t = TensorType(known.shape, known.dtype)
                in_types.append(t)
                keep = mode == "const" or (mode in ("shape", "symbolic") and slot in shape_inputs)
                consts.append(known if keep else None)
            try:
                result = registry.infer(node.op_type, attrs, in_types, consts)
            except UnsupportedOpError as exc:
                outcome[mode].unsupported.append(f"{name}: {exc}")
                break
            except Exception as exc:
                outcome[mode].failures.append(f"{name} {node.op_type}: raised {type(exc).__name__}: {exc}")
                break
            ok = len(result) >= len(node.output)
            for out_name, t in zip(node.output, result):
                if not out_name:
                    continue
                actual = arrays[out_name]
                good = (t.dtype == actual.dtype and len(t.shape) == actual.ndim
                        and all(dim_matches(d, a, mode) for d, a in zip(t.shape, actual.shape)))
                if not good:
                    ok = False
                    outcome[mode].failures.append(
                        f"{name} {node.op_type} output {out_name}: inferred {t}, actual "
                        f"{actual.dtype}{list(actual.shape)}"
                    )
                types[out_name] = t
                outcome[mode].dims.update(
                    "int" if isinstance(d, int) else "fresh" if is_fresh(d)
                    else "symbol" if _SYMBOL.fullmatch(d) else "expression" for d in t.shape
                )
            if not ok:
                break
            outcome[mode].checked[node.op_type] += 1
            static_value = registry.get(node.op_type).static_value
            if static_value is not None and mode == "const":
                value = static_value({**registry.get(node.op_type).defaults, **attrs}, in_types)
                if value is None or not np.array_equal(value, arrays[node.output[0]]):
                    outcome[mode].failures.append(f"{name} {node.op_type}: static value {value}")
                outcome[mode].signatures["static values"] += 1
            if mode == "const":
                outs = [arrays[o] for o in node.output if o]
                ins = [arrays[v] if v else None for v in node.input]
                outcome[mode].failures.extend(
                    f"{name} {node.op_type} signature: {problem}"
                    for problem in check_signature(node.op_type, attrs, in_types, result[: len(node.output)],
                                                   consts, ins, outs, outcome[mode].signatures)
                )


@pytest.fixture(scope="module")
def outcome() -> dict[str, Outcome]:
    result = {mode: Outcome() for mode in MODES}
    for name, model, inputs, outputs in load_cases():
        replay(name, model, inputs, outputs, result)
    return result


@pytest.mark.parametrize("mode", MODES)
def test_inference_matches_onnx_reference_outputs(outcome, mode):
    out = outcome[mode]
    assert not out.failures, f"{len(out.failures)} mismatches:\n" + "\n".join(out.failures[:40])


def test_signatures_checked_on_conformance_cases(outcome):
    counts = outcome["const"].signatures
    print(f"\nsignatures checked: {dict(counts)}")
    assert all(counts[op] > 0 for op in EINSUM)
    assert sum(v for k, v in counts.items() if k not in ("None", "no signature")) > 500


def test_every_claimed_op_is_covered(outcome):
    counts = outcome["const"].checked
    print("\nnodes checked per op (const mode):")
    print(", ".join(f"{op} {counts[op]}" for op in sorted(CLAIMED)))
    print(f"total {sum(counts.values())} nodes; unsupported: {len(outcome['const'].unsupported)}; "
          f"skipped: {len(outcome['const'].skipped)}")
    uncovered = [op for op in CLAIMED if counts[op] == 0 and op not in NO_CONFORMANCE_CASES]
    assert not uncovered, f"ops without a conformance case: {uncovered}"
    assert sum(counts.values()) > 600


NO_CONFORMANCE_CASES: set[str] = set()


def test_unsupported_cases_are_only_exotic_element_types(outcome):
    """Everything tilefold refuses in these cases is an 8-bit/4-bit float or int, or strings
    (and, with symbolic dims, GatherND and ScatterND, whose shapes need indices' last dim)."""
    exotic = re.compile(r"element type (bfloat16|float8\w*|u?int[24]|float4\w*|string) is not supported")
    last_dim = re.compile(r"(Gather|Scatter)ND: the last dim of indices")
    for mode in MODES:
        bad = [u for u in outcome[mode].unsupported if not exotic.search(u)
               and not (mode == "symbolic" and last_dim.search(u))]
        assert not bad, "\n".join(bad[:20])


def test_symbolic_dims_flow_through(outcome):
    """With symbolic inputs most result dims stay symbols or expressions of them."""
    dims = outcome["symbolic"].dims
    print(f"\nsymbolic mode result dims: {dict(dims)}")
    assert dims["symbol"] + dims["expression"] > 10 * dims["fresh"]
    assert dims["expression"] > 0
