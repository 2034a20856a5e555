"""Shape arithmetic shared by op entries: broadcasting and axis handling with symbolic dims."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import VerifyError
from ..types import ConstValue, Dim, Splat, TensorType


def broadcast(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """Numpy broadcasting where a dim may be a symbol (equal symbols match; 1 yields)."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = [d for d in dims if d != 1]
        if not known:
            out.append(1)
            continue
        ints = {d for d in known if isinstance(d, int)}
        if len(ints) > 1:
            raise VerifyError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(ints.pop() if ints else known[0])
    return tuple(out)


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise VerifyError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def const_ints(value: ConstValue | None) -> list[int] | None:
    """A small integer constant (shape, axes, starts) as a list, or None when unknown."""
    if value is None:
        return None
    array = value.to_array() if isinstance(value, Splat) else np.asarray(value)
    return [int(v) for v in array.reshape(-1)]


def same_as(types: Sequence[TensorType | None], index: int = 0) -> list[TensorType]:
    """Result typed like input `index` (unary elementwise ops)."""
    t = types[index]
    assert t is not None
    return [TensorType(t.shape, t.dtype)]
