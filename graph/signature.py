"""Iteration signatures: which iteration dim each tensor dim of an op's operands walks.

Like an einsum or a linalg.generic indexing map. `Signature.parse("mk,kn->mn",
reduction="k")` is matmul; a broadcast singleton dim of an operand is written `1`
(`"ab,1b->ab"`); an operand outside the iteration space (a shape tensor) is `None`.
Layout propagation reads only this, never an op's name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

DimKind = Literal["parallel", "reduction", "window"]
Indexing = tuple[str | None, ...]  # one entry per tensor dim; None = broadcast singleton

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _parse_operand(text: str) -> Indexing | None:
    text = text.strip()
    if text == "_":
        return None
    return tuple(None if ch == "1" else ch for ch in text)


@dataclass(frozen=True)
class Signature:
    operands: tuple[Indexing | None, ...]
    results: tuple[Indexing, ...]
    kinds: dict[str, DimKind] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str, reduction: str = "", window: str = "") -> Signature:
        """`"ab,_->ab"`: comma-separated operands and results; `_` = not indexed."""
        lhs, rhs = spec.split("->")
        operands = tuple(_parse_operand(t) for t in lhs.split(",")) if lhs else ()
        results = tuple(_parse_operand(t) or () for t in rhs.split(","))
        kinds: dict[str, DimKind] = {d: "reduction" for d in reduction}
        kinds.update({d: "window" for d in window})
        return cls(operands, results, kinds)

    def kind(self, dim: str) -> DimKind:
        return self.kinds.get(dim, "parallel")

    @property
    def dims(self) -> list[str]:
        seen: list[str] = []
        for idx in (*self.operands, *self.results):
            for d in idx or ():
                if d is not None and d not in seen:
                    seen.append(d)
        return seen

    def letters(self, index: int, is_result: bool) -> list[str | None] | None:
        """The iteration dim of each dim of operand (or result) `index`. A singleton (`None`:
        an operand's broadcast dim, a result's kept reduced dim) is named after the dim it
        lines up with, right-aligned as numpy broadcasts, in the result (or operand 0, for a
        result)."""
        idx = self.results[index] if is_result else self.operands[index]
        if idx is None:
            return None
        letters = list(idx)
        full = self.operands[0] if is_result else self.results[0]
        if None in letters and full is not None and len(full) >= len(letters):
            offset = len(full) - len(letters)
            letters = [full[offset + d] if letter is None else letter for d, letter in enumerate(letters)]
        return letters

    def __str__(self) -> str:
        def fmt(idx: Indexing | None) -> str:
            return "_" if idx is None else "".join(d or "1" for d in idx)

        text = ",".join(fmt(o) for o in self.operands) + "->" + ",".join(fmt(r) for r in self.results)
        special = {k: [d for d in self.dims if self.kind(d) == k] for k in ("reduction", "window")}
        extra = "".join(f" {k}={''.join(v)}" for k, v in special.items() if v)
        return text + extra


def elementwise(shapes: Sequence[tuple | None], out_shape: tuple) -> Signature:
    """Numpy-broadcast elementwise op: inputs right-aligned to the result."""
    out_rank = len(out_shape)
    letters = LETTERS[:out_rank]
    operands: list[Indexing | None] = []
    for shape in shapes:
        if shape is None:
            operands.append(None)
            continue
        offset = out_rank - len(shape)
        operands.append(
            tuple(
                None if shape[i] == 1 and out_shape[offset + i] != 1 else letters[offset + i]
                for i in range(len(shape))
            )
        )
    return Signature(tuple(operands), (tuple(letters),))
