"""Kernels on packed data: how the NumPy backend runs a node whose operands or results have
packed encodings.

A kernel receives the PHYSICAL buffer of each input (`pack(x, in_types[i].encoding)`) and
returns the physical buffer of each result. `build_kernel` picks, per node, the first way
that applies:

1. no encoding anywhere: the plain kernel;
2. native: a factory registered with `packed_kernel(op)` accepts these encodings (Pack,
   Unpack, channels-last Conv and pooling, reductions, view ops that keep the element
   order, MatMul/Gemm on permuted operands and results, Shape, Size: see `native_ops`);
3. physical: an elementwise kernel (`KernelDef.physical`) whose operand buffers are laid out
   like the result's (after a free reshape: a broadcast dim has size 1 in every buffer axis
   it owns) runs unchanged on the buffers;
4. permuted: every encoding is a pure permutation (no tiles): the plain kernel runs on
   zero-copy transposed views, and each result is transposed into its encoding (one copy,
   none when the kernel's result already has that element order);
5. unpacked: otherwise (tiles, padding) inputs are unpacked, the plain kernel runs, and the
   results are packed: correct but slow, for the gpu target's encodings on the CPU.

`path(kdef, spec)` names the way a node takes (building its kernel), for tests and reports.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...graph.errors import TilefoldError, where
from ...graph.types import Splat, TensorType
from ...layout.encoding import PackedEncoding
from .kernels import (  # noqa: F401
    packed_conv, packed_conv_transpose, packed_layout, packed_linalg, packed_nn, packed_reduce, packed_resample,
    packed_tensor)
from .kernels.packed_layout import as_encoding, logical_shape, pack_buffer, same_buffer, unpack_buffer
from .registry import KERNELS, KernelDef, KernelSpec, Run

_ELEMENTWISE_VIEWS = frozenset({"Identity", "Cast"})
"""Elementwise kernels that are not declared `physical` (they are not in-place kernels)."""

PLAIN, NATIVE, PHYSICAL, PERMUTED, UNPACKED = "plain", "native", "physical", "permuted", "unpacked"


def has_encoding(spec: KernelSpec) -> bool:
    return any(t is not None and t.encoding is not None for t in (*spec.in_types, *spec.out_types))


def build_kernel(kdef: KernelDef, spec: KernelSpec) -> Run:
    """The kernel of one node, on physical buffers (see the module docstring)."""
    return _choose(kdef, spec)[1]


def path(kdef: KernelDef, spec: KernelSpec) -> str:
    """Which way (plain, native, physical, permuted, unpacked) `build_kernel` takes."""
    return _choose(kdef, spec)[0]


def native_ops() -> list[str]:
    """The ops with at least one native packed factory."""
    return sorted(op for op, kdef in KERNELS.items() if kdef.packed)


def _choose(kdef: KernelDef, spec: KernelSpec) -> tuple[str, Run]:
    if not has_encoding(spec):
        return PLAIN, kdef.build(spec)
    for factory in kdef.packed:
        run = factory(spec)
        if run is not None:
            return NATIVE, run
    if kdef.physical or kdef.op in _ELEMENTWISE_VIEWS:
        run = _physical(kdef, spec)
        if run is not None:
            return PHYSICAL, run
    if all(_is_permutation(t) for t in (*spec.in_types, *spec.out_types)):
        return PERMUTED, _permuted(kdef, spec)
    return UNPACKED, _unpacked(kdef, spec)


def _is_permutation(t: TensorType | None) -> bool:
    return t is None or t.encoding is None or not t.encoding.inner_tiles


def _perm(t: TensorType | None) -> tuple[int, ...] | None:
    """The buffer's axis order of a permuted type, None for identity."""
    if t is None or t.encoding is None:
        return None
    perm = t.encoding.outer_perm(t.rank)
    return None if perm == tuple(range(t.rank)) else perm


# ---- logical view of a spec ------------------------------------------------------------------
def _logical_value(value: Any, t: TensorType | None) -> Any:
    """A constant's logical value (a packed splat stays a splat)."""
    if value is None or t is None or t.encoding is None:
        return value
    if isinstance(value, Splat):
        return Splat(value.value, tuple(t.shape), value.dtype)
    return unpack_buffer(np.asarray(value), t.encoding, t.shape)


def logical_spec(spec: KernelSpec) -> KernelSpec:
    """The spec the plain kernel sees: identity types, logical constants."""
    plain = [None if t is None else t.logical() for t in spec.in_types]
    node = dataclasses.replace(spec.node, outputs=[t.logical() for t in spec.out_types])
    consts = [_logical_value(c, t) for c, t in zip(spec.consts, spec.in_types)]
    return KernelSpec(node, plain, consts)


def _results(result: Any) -> tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


def _wrap(results: list[Any], single: bool) -> Any:
    return results[0] if single else tuple(results)


# ---- 3. physical -----------------------------------------------------------------------------------
def _broadcast_encoding(out: TensorType, t: TensorType) -> tuple[PackedEncoding, tuple[int, ...]] | None:
    """For a static operand `t` of the result `out`: the encoding of `t` laid out like the
    result, and the shape its buffer takes to broadcast against the result's buffer (a
    broadcast dim has size 1 in each buffer axis it owns); None when `t` has a higher rank."""
    lead = out.rank - t.rank
    if lead < 0:
        return None
    enc = as_encoding(out.encoding)
    keep = {d for d in range(lead, out.rank) if t.shape[d - lead] != 1}
    tiles = enc.tiles()
    perm = [d - lead for d in enc.outer_perm(out.rank) if d >= lead]
    tiled = [(d - lead, s) for d, s in zip(enc.inner_dims_pos, enc.inner_tiles) if d in keep]
    mine = PackedEncoding(tuple(d for d, _ in tiled), tuple(s for _, s in tiled), tuple(perm), enc.pad)
    size = {d: t.shape[d - lead] for d in keep}
    shape = [(-(-size[d] // tiles[d]) if d in tiles else size[d]) if d in keep else 1
             for d in enc.outer_perm(out.rank)]
    shape += [s if d in keep else 1 for d, s in zip(enc.inner_dims_pos, enc.inner_tiles)]
    return mine, tuple(shape)


def _same_symbolic_layout(out: TensorType, t: TensorType) -> bool:
    """A symbolic operand runs on its buffer as is only when laid out exactly like the result
    (same rank and encoding) and every tiled dim of it is static and not broadcast."""
    if t.rank != out.rank or not as_encoding(t.encoding).same_layout(as_encoding(out.encoding)):
        return False
    return all(isinstance(t.shape[d], int) and t.shape[d] != 1 for d in as_encoding(t.encoding).inner_dims_pos)


def _physical(kdef: KernelDef, spec: KernelSpec) -> Run | None:
    """The plain elementwise kernel on buffers reshaped (for free) to broadcast like the result's."""
    out = spec.out_types[0]
    if len(spec.out_types) != 1:
        return None
    shapes: list[tuple[int, ...] | None] = []
    for t in spec.in_types:
        if t is None:
            shapes.append(None)
        elif not t.is_static:
            if not _same_symbolic_layout(out, t):
                return None
            shapes.append(None)
        else:
            wanted = _broadcast_encoding(out, t)
            if wanted is None or not same_buffer(t.encoding, wanted[0], t.shape):
                return None
            physical = t.encoding.physical_shape(t.shape) if t.encoding is not None else tuple(t.shape)
            shapes.append(None if tuple(physical) == wanted[1] else wanted[1])
    run = kdef.build(logical_spec(spec))
    if all(s is None for s in shapes):
        return run

    def reshaped(*args: Any, **kwargs: Any) -> Any:
        return run(*(a if s is None or a is None else a.reshape(s) for a, s in zip(args, shapes)), **kwargs)

    return reshaped


# ---- 4. permuted -------------------------------------------------------------------------------------
def _permuted(kdef: KernelDef, spec: KernelSpec) -> Run:
    """The plain kernel on transposed views; results transposed into their encodings."""
    run = kdef.build(logical_spec(spec))
    views = [None if p is None else tuple(int(i) for i in np.argsort(p)) for p in map(_perm, spec.in_types)]
    outs = [_perm(t) for t in spec.out_types]
    single = len(spec.out_types) == 1
    out_view = tuple(int(i) for i in np.argsort(outs[0])) if single and outs[0] is not None else None

    def permuted(*args: Any, out: np.ndarray | None = None) -> Any:
        logical = [a if v is None or a is None else a.transpose(v) for a, v in zip(args, views)]
        if out is not None:
            result = run(*logical, out=out if out_view is None else out.transpose(out_view))
        else:
            result = run(*logical)
        return _wrap([r if p is None else np.ascontiguousarray(np.asarray(r).transpose(p))
                      for r, p in zip(_results(result), outs)], single)

    return permuted


# ---- 5. unpacked ------------------------------------------------------------------------------------
def _unpacked(kdef: KernelDef, spec: KernelSpec) -> Run:
    """Unpack the packed inputs, run the plain kernel, pack the results."""
    plain = logical_spec(spec)
    run = kdef.build(plain)
    for t in (*spec.in_types, *spec.out_types):
        if t is not None and t.encoding is not None and any(
                isinstance(n, str) and d in t.encoding.tiles() for d, n in enumerate(t.shape)):
            raise TilefoldError(f"{where(spec.node)}: {t} tiles a symbolic dim; its packed buffer cannot be unpacked")
    ins = [(None if t is None or t.encoding is None else (t.encoding, tuple(t.shape))) for t in spec.in_types]
    outs = [t.encoding for t in spec.out_types]
    single = len(outs) == 1

    def unpacked(*args: Any, out: np.ndarray | None = None) -> Any:
        logical = [a if i is None or a is None else unpack_buffer(a, i[0], logical_shape(a, *i))
                   for a, i in zip(args, ins)]
        result = run(*logical)
        return _wrap([r if e is None else pack_buffer(np.asarray(r), e) for r, e in zip(_results(result), outs)],
                     single)

    return unpacked

