"""Errors tilefold raises on bad input: each renders as one line naming what is wrong.

The CLI prints `str(error)` and exits non-zero; nothing else is shown to the user.
"""
from __future__ import annotations


class TilefoldError(Exception):
    """Base class: a user-facing failure with a one-line message."""

    def __str__(self) -> str:
        return " ".join(super().__str__().split())


class ModelError(TilefoldError):
    """The model file cannot be read or is not a valid model."""


class UnsupportedOpError(TilefoldError):
    """An op (or an op variant: dtype, attribute) that tilefold cannot run."""


class VerifyError(TilefoldError):
    """The IR broke one of its invariants (a bug in a pass, or a malformed model)."""


class InputError(TilefoldError):
    """A runtime input does not match the graph (unknown name, shape, dtype)."""


def where(node: object) -> str:
    """`node NAME (op OP, from ORIGIN)` for error messages."""
    name = getattr(node, "name", node)
    op = getattr(node, "op", None)
    origin = getattr(node, "origin", None)
    text = f"node {name!r}"
    details = [f"op {op}"] if op else []
    if origin and origin != name:
        details.append(f"from {origin}")
    return text + (f" ({', '.join(details)})" if details else "")
