"""Shared by the packed-kernel tests: run one kernel through `build_kernel` on packed
buffers (the reference `pack` of fresh random inputs) and compare the reference `unpack` of
its results with the plain kernel on the logical inputs."""
from __future__ import annotations

from typing import Any, Collection, Sequence

import numpy as np
import pytest

from tilefold.backends.numpy.packed import build_kernel, path
from tilefold.backends.numpy.registry import KERNELS, KernelSpec
from tilefold.graph.graph import Node
from tilefold.graph.registry import infer, with_defaults
from tilefold.graph.types import TensorType
from tilefold.layout.encoding import pack, unpack

def _spec(op: str, attrs: dict[str, Any], args: Sequence[np.ndarray | None], in_encs: Sequence[Any],
          out_encs: Sequence[Any], consts: Collection[int]) -> tuple[KernelSpec, KernelSpec]:
    attrs = with_defaults(op, attrs)
    types = [None if a is None else TensorType(a.shape, a.dtype) for a in args]
    logical_consts = [a if i in consts else None for i, a in enumerate(args)]
    outs = infer(op, attrs, types, logical_consts)
    plain = KernelSpec(Node("n", op, attrs, outs, len(args)), types, logical_consts)
    packed_types = [None if t is None else TensorType(t.shape, t.dtype, e) for t, e in zip(types, in_encs)]
    packed_outs = [TensorType(o.shape, o.dtype, e) for o, e in zip(outs, out_encs)]
    packed_consts = [None if c is None or e is None else pack(c, e) if c is not None else None
                     for c, e in zip(logical_consts, in_encs)]
    packed_consts = [p if p is not None else c for p, c in zip(packed_consts, logical_consts)]
    return KernelSpec(Node("n", op, attrs, packed_outs, len(args)), packed_types, packed_consts), plain


def run_packed(op: str, args: Sequence[np.ndarray | None], in_encs: Sequence[Any], out_encs: Sequence[Any],
               attrs: dict[str, Any] | None = None, consts: Collection[int] = ()) -> dict[str, Any]:
    """`op` on `pack(arg, enc)` buffers through `build_kernel`: the unpacked results, the
    physical results, the path taken, and the plain kernel's results on the logical arrays."""
    spec, plain = _spec(op, attrs or {}, args, in_encs, out_encs, consts)
    kdef = KERNELS[op]
    buffers = [a if a is None or e is None else pack(a, e) for a, e in zip(args, in_encs)]
    for b in buffers:
        if b is not None:
            b.flags.writeable = False  # a kernel must never write into its inputs
    with np.errstate(all="ignore"):  # as the executor runs kernels: padding may hold inf or nan
        result = build_kernel(kdef, spec)(*buffers)
    physical = list(result) if isinstance(result, tuple) else [result]
    logical = [r if e is None else unpack(r, e, t.shape)
               for r, e, t in zip(physical, out_encs, spec.out_types)]
    with np.errstate(all="ignore"):
        expected = kdef.build(plain)(*args)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    for r, t in zip(physical, spec.out_types):
        want = t.shape if t.encoding is None else t.encoding.physical_shape(t.shape)
        assert r.shape == tuple(want), f"{op}: buffer shape {r.shape}, expected {want}"
        assert r.dtype == t.dtype
    return {"got": logical, "expected": [np.asarray(e) for e in expected], "physical": physical,
            "buffers": buffers, "path": path(kdef, spec)}


def check_packed(op: str, args: Sequence[np.ndarray | None], in_encs: Sequence[Any], out_encs: Sequence[Any],
                 attrs: dict[str, Any] | None = None, consts: Collection[int] = (), rtol: float = 1e-5,
                 atol: float = 1e-5, expect_path: str | None = None) -> dict[str, Any]:
    """`run_packed`, asserting that the unpacked results equal the plain kernel's."""
    out = run_packed(op, args, in_encs, out_encs, attrs, consts)
    if expect_path is not None:
        assert out["path"] == expect_path, f"{op}: took the {out['path']} path, expected {expect_path}"
    for got, want in zip(out["got"], out["expected"]):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{op} via {out['path']}")
    return out


@pytest.fixture
def packed_run():
    return run_packed


@pytest.fixture
def packed_check():
    return check_packed
