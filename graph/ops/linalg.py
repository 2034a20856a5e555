"""Anchor ops, the ones a layout target chooses tiles for: MatMul, Gemm, Conv and
ConvTranspose (which has no signature: layouts reach it only through a target that takes it
as an anchor, the cpu target's channels-last); and Einsum, which has none either (layouts
stop there; `tilefold.load` lowers an Einsum to MatMuls where it can: graph/passes/einsum.py).

Signatures (k, c and the kernel dims are reductions; conv spatial dims are windows):
- MatMul `...mk,...kn->...mn`, batch dims broadcast numpy-style; a 1-D A has no m
  (`k,...kn->...n`), a 1-D B has no n.
- Gemm `mk,kn,mn->mn`, `km` / `nk` under transA / transB; C broadcasts to the result.
- Conv NCHW `nchw,fcrs,f->nfhw` (1-D: `ncw,fcs,f->nfw`, 3-D: `ncdhw,fcqrs,f->nfdhw`).
  With group > 1, X's c has size C while W's c has size C/group: channel c of X meets
  W's c only within its group, so a tiling of c must not cross a group boundary.
  h and w walk the output positions; the input extent along them differs (stride,
  padding, dilation), which is what makes them windows.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..errors import UnsupportedOpError, VerifyError
from ..registry import OpDef, register
from ..signature import LETTERS, Indexing, Signature
from ..types import Dim, TensorType
from .shapes import broadcast, conflict, fmt_shape, transposed_window, window_shape

_BATCH_LETTERS = [ch for ch in LETTERS if ch not in "mnk"]


def _check_dtypes(op: str, types: Sequence[TensorType | None]) -> None:
    present = [t for t in types if t is not None]
    if len({t.dtype for t in present}) > 1:
        raise VerifyError(f"{op}: inputs must share one element type, got {', '.join(map(str, present))}")


def _batch_indexing(shape: Sequence[Dim], out_batch: Sequence[Dim], letters: Sequence[str]) -> Indexing:
    """Right-aligned broadcast indexing of a batch prefix, like signature.elementwise."""
    offset = len(out_batch) - len(shape)
    return tuple(
        None if d == 1 and out_batch[offset + i] != 1 else letters[offset + i]
        for i, d in enumerate(shape)
    )


# ---- MatMul --------------------------------------------------------------------------
def _matmul_parts(a: TensorType, b: TensorType) -> tuple[list[Dim], list[Dim], tuple[Dim, ...]]:
    if a.rank == 0 or b.rank == 0:
        raise VerifyError(f"MatMul: inputs must have rank >= 1, got A {a} and B {b}")
    ash = [1, *a.shape] if a.rank == 1 else list(a.shape)
    bsh = [*b.shape, 1] if b.rank == 1 else list(b.shape)
    if conflict(ash[-1], bsh[-2]):
        raise VerifyError(
            f"MatMul: inner dims differ: A {a} has k={ash[-1]}, B {b} has k={bsh[-2]}"
        )
    try:
        batch = broadcast(ash[:-2], bsh[:-2])
    except VerifyError:
        raise VerifyError(f"MatMul: batch dims of A {a} and B {b} do not broadcast") from None
    return ash, bsh, batch


def _matmul_infer(attrs, types, consts):
    a, b = types
    _check_dtypes("MatMul", types)
    ash, bsh, batch = _matmul_parts(a, b)
    out = list(batch) + ([ash[-2]] if a.rank > 1 else []) + ([bsh[-1]] if b.rank > 1 else [])
    return [TensorType(tuple(out), a.dtype)]


def _matmul_signature(attrs, types, outs, consts=None):
    a, b = types
    ash, bsh, batch = _matmul_parts(a, b)
    letters = _BATCH_LETTERS[: len(batch)]
    a_idx = _batch_indexing(ash[:-2], batch, letters) + (("m", "k") if a.rank > 1 else ("k",))
    b_idx = _batch_indexing(bsh[:-2], batch, letters) + (("k", "n") if b.rank > 1 else ("k",))
    result = tuple(letters) + (("m",) if a.rank > 1 else ()) + (("n",) if b.rank > 1 else ())
    return Signature((a_idx, b_idx), (result,), {"k": "reduction"})


register(OpDef(
    "MatMul", infer=_matmul_infer, signature=_matmul_signature, layout="anchor",
    min_inputs=2, max_inputs=2, doc="numpy.matmul semantics: `...mk,...kn->...mn`, k reduction.",
))


# ---- Gemm ----------------------------------------------------------------------------
def _gemm_infer(attrs, types, consts):
    a, b = types[0], types[1]
    c = types[2] if len(types) > 2 else None
    _check_dtypes("Gemm", types)
    if a.rank != 2 or b.rank != 2:
        raise VerifyError(f"Gemm: A and B must be 2-D, got A {a} and B {b}")
    m, ka = reversed(a.shape) if attrs["transA"] else a.shape
    kb, n = reversed(b.shape) if attrs["transB"] else b.shape
    if conflict(ka, kb):
        raise VerifyError(
            f"Gemm: inner dims differ: A {a} (transA={attrs['transA']}) has k={ka}, "
            f"B {b} (transB={attrs['transB']}) has k={kb}"
        )
    if c is not None:
        try:
            out = broadcast(c.shape, (m, n))
        except VerifyError:
            out = None
        if out is None or len(out) != 2 or any(conflict(o, d) for o, d in zip(out, (m, n))):
            raise VerifyError(f"Gemm: C {c} does not broadcast to the result [{m}x{n}]")
    return [TensorType((m, n), a.dtype)]


def _gemm_signature(attrs, types, outs, consts=None):
    operands: list[Indexing | None] = [
        ("k", "m") if attrs["transA"] else ("m", "k"),
        ("n", "k") if attrs["transB"] else ("k", "n"),
    ]
    c = types[2] if len(types) > 2 else None
    if len(types) > 2:
        operands.append(None if c is None else _batch_indexing(c.shape, outs[0].shape, "mn"))
    return Signature(tuple(operands), (("m", "n"),), {"k": "reduction"})


register(OpDef(
    "Gemm", infer=_gemm_infer, signature=_gemm_signature, layout="anchor",
    min_inputs=2, max_inputs=3,
    defaults={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
    doc="alpha*A'B' + beta*C, A' = A^T under transA, B' = B^T under transB; C optional.",
))


# ---- Conv ----------------------------------------------------------------------------
def spatial_letters(n: int) -> tuple[str, str]:
    """(output/input spatial letters, kernel letters) for n spatial dims."""
    if n <= 3:
        return "dhw"[3 - n:], "qrs"[3 - n:]
    spare = [ch for ch in LETTERS if ch not in "ncf"]
    return "".join(spare[:n]), "".join(spare[n: 2 * n])


def _conv_operands(op: str, types: Sequence[TensorType | None]) -> tuple[TensorType, TensorType, TensorType | None]:
    """X, W and the optional bias of a Conv or ConvTranspose, their dtypes and ranks checked."""
    x, w = types[0], types[1]
    _check_dtypes(op, types)
    if x.rank < 3 or w.rank != x.rank:
        raise VerifyError(f"{op}: X {x} and W {w} must both have rank >= 3 and equal ranks")
    return x, w, types[2] if len(types) > 2 else None


def _conv_infer(attrs, types, consts):
    x, w, bias = _conv_operands("Conv", types)
    group = attrs["group"]
    channels, cg, m = x.shape[1], w.shape[1], w.shape[0]
    if isinstance(channels, int) and isinstance(cg, int) and channels != cg * group:
        raise VerifyError(
            f"Conv: X {x} has {channels} channels but W {w} with group={group} expects {cg * group}"
        )
    if isinstance(m, int) and m % group:
        raise VerifyError(f"Conv: W {w} has {m} filters, not a multiple of group={group}")
    if bias is not None and (bias.rank != 1 or conflict(bias.shape[0], m)):
        raise VerifyError(f"Conv: bias {bias} must be 1-D of length {m} for W {w}")
    kernel = attrs.get("kernel_shape") or w.shape[2:]
    if not all(isinstance(k, int) for k in kernel):
        raise UnsupportedOpError(f"Conv: kernel shape {fmt_shape(kernel)} of W {w} must be static")
    if any(conflict(k, d) for k, d in zip(kernel, w.shape[2:])):
        raise VerifyError(f"Conv: kernel_shape {tuple(kernel)} does not match W {w}")
    spatial = window_shape("Conv", attrs, x.shape[2:], kernel)
    return [TensorType((x.shape[0], m, *spatial), x.dtype)]


def _conv_signature(attrs, types, outs, consts=None):
    n = types[0].rank - 2
    space, kern = spatial_letters(n)
    operands: list[Indexing | None] = [("n", "c", *space), ("f", "c", *kern)]
    if len(types) > 2:
        operands.append(None if types[2] is None else ("f",))
    kinds = {"c": "reduction", **{k: "reduction" for k in kern}, **{s: "window" for s in space}}
    return Signature(tuple(operands), (("n", "f", *space),), kinds)


register(OpDef(
    "Conv", infer=_conv_infer, signature=_conv_signature, layout="anchor",
    min_inputs=2, max_inputs=3, defaults={"auto_pad": "NOTSET", "group": 1},
    doc="NCHW convolution (any number of spatial dims). kernel_shape, strides, pads and "
        "dilations may be absent: W's spatial shape, ones, zeros, ones. See the module "
        "docstring for the signature and groups.",
))


def _conv_transpose_infer(attrs, types, consts):
    x, w, bias = _conv_operands("ConvTranspose", types)
    group = attrs["group"]
    channels, per_group = x.shape[1], w.shape[1]
    if conflict(channels, w.shape[0]):
        raise VerifyError(f"ConvTranspose: X {x} has {channels} channels but W {w} takes {w.shape[0]}")
    if isinstance(channels, int) and channels % group:
        raise VerifyError(f"ConvTranspose: X {x} has {channels} channels, not a multiple of group={group}")
    m: Dim = per_group * group if isinstance(per_group, int) else per_group
    if bias is not None and (bias.rank != 1 or conflict(bias.shape[0], m)):
        raise VerifyError(f"ConvTranspose: bias {bias} must be 1-D of length {m} for W {w} and group={group}")
    kernel = attrs.get("kernel_shape") or w.shape[2:]
    if any(conflict(k, d) for k, d in zip(kernel, w.shape[2:])):
        raise VerifyError(f"ConvTranspose: kernel_shape {tuple(kernel)} does not match W {w}")
    spatial, _ = transposed_window("ConvTranspose", attrs, x.shape[2:], kernel)
    return [TensorType((x.shape[0], m, *spatial), x.dtype)]


register(OpDef(
    "ConvTranspose", infer=_conv_transpose_infer, layout="anchor",
    min_inputs=2, max_inputs=3, defaults={"auto_pad": "NOTSET", "group": 1},
    doc="The gradient of Conv: W is (C, F/group, *kernel). No iteration signature: a layout "
        "never maps through it; a target that lists it as an anchor (cpu) chooses its operands' "
        "and result's encodings.",
))


# ---- Einsum ----------------------------------------------------------------------------------
def einsum_terms(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """The equation's input terms and its output term, spaces removed, the output made
    explicit (implicit mode: the broadcast dims, then the labels used once, sorted) and each
    ellipsis checked against its operand's rank. VerifyError names what does not fit."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise VerifyError(f"Einsum: equation {equation!r} has {len(terms)} inputs, the node {len(ranks)}")
    for term, rank in zip(terms + [rhs], list(ranks) + [None]):
        labels = term.replace("...", "", 1)
        if not all(ch.isascii() and ch.isalpha() for ch in labels):
            raise VerifyError(f"Einsum: term {term!r} of {equation!r} has a character other than letters "
                              "and one '...'")
        if rank is not None and (len(labels) > rank or ("..." not in term and len(labels) != rank)):
            raise VerifyError(f"Einsum: term {term!r} of {equation!r} does not fit an input of rank {rank}")
    if not arrow:
        counts = Counter(ch for term in terms for ch in term.replace("...", ""))
        ellipsis = "..." if any("..." in term for term in terms) else ""
        rhs = ellipsis + "".join(sorted(ch for ch, n in counts.items() if n == 1))
    used = set("".join(terms))
    out = rhs.replace("...", "")
    if len(set(out)) != len(out) or not set(out) <= used:
        raise VerifyError(f"Einsum: output {rhs!r} of {equation!r} repeats a label or has one no input has")
    return terms, rhs


def _einsum_infer(attrs, types, consts):
    _check_dtypes("Einsum", types)
    terms, rhs = einsum_terms(attrs["equation"], [t.rank for t in types])
    sizes: dict[str, list[Dim]] = {}
    ellipses: list[tuple[Dim, ...]] = []
    for term, t in zip(terms, types):
        head, _, tail = term.partition("...")
        if "..." in term:
            ellipses.append(t.shape[len(head):t.rank - len(tail)])
        for ch, d in zip(head + tail, t.shape[:len(head)] + t.shape[t.rank - len(tail):]):
            sizes.setdefault(ch, []).append(d)
    try:
        dims = {ch: broadcast(*[(d,) for d in ds])[0] for ch, ds in sizes.items()}
        batch = broadcast(*ellipses)
    except VerifyError:
        shapes = ", ".join(str(t) for t in types)
        raise VerifyError(f"Einsum: inputs {shapes} do not fit equation {attrs['equation']!r}") from None
    if batch and "..." not in rhs:
        raise VerifyError(f"Einsum: output {rhs!r} of {attrs['equation']!r} drops the ellipsis dims {fmt_shape(batch)}")
    head, _, tail = rhs.partition("...")
    shape = tuple(dims[ch] for ch in head) + (batch if "..." in rhs else ()) + tuple(dims[ch] for ch in tail)
    return [TensorType(shape, types[0].dtype)]


register(OpDef(
    "Einsum", infer=_einsum_infer, min_inputs=1, max_inputs=None,
    doc="Einstein summation over its inputs (one element type) by the equation attr, NumPy's "
        "rules: labels and ellipsis dims broadcast, implicit output = labels used once, sorted.",
))
