"""lower_einsum: an Einsum as the ReduceSums, Transposes, Reshapes and MatMuls it computes.

Einsum has no iteration signature, so layouts stopped at it and the Triton backend ran it on
the host; as MatMuls it gets the anchors' packed layouts and both backends' matmul kernels.
Operands are contracted pairwise, left to right, each pair as one batched MatMul: the labels
both operands have that a later operand or the output needs are its batch dims, those nothing
later needs its k, the first operand's other labels its m and the second's its n (each group
flattened into one dim). A label that one operand alone has and nothing later needs is summed
out first. An ellipsis is a run of internal labels. A label repeated within one term (a
diagonal, a trace) is read first: its two axes moved last and merged, then sliced with a step
of n + 1. Operands broadcast as NumPy's do: ellipses of different lengths are right-aligned,
and a dim of one element whose label is larger in another operand is squeezed away (the label
is then absent from that operand).

Left an Einsum (np.einsum runs it): a type other than float, or a dynamic shape.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import registry
from ..graph import Graph, Node
from ..ops.linalg import einsum_terms
from ..types import Value
from .pipeline import Pass, PassResult

_ELLIPSIS_LABELS = "0123456789"
"""Internal labels of ellipsis dims: characters no equation may use."""


def _terms(graph: Graph, node: Node) -> tuple[list[tuple[Value, str]], str, dict[str, int]] | None:
    """The operands with their labels (ellipses expanded), the output's labels and every
    label's size; None when the Einsum is left as it is (see the module docstring)."""
    values = graph.inputs_of(node.name)
    types = [graph.type_of(v) for v in values]
    if any(v is None for v in values) or not all(t.is_static and t.dtype.kind == "f" for t in types):
        return None
    terms, rhs = einsum_terms(node.attrs["equation"], [t.rank for t in types])
    spans = [len(t.shape) - len(term.replace("...", "")) for term, t in zip(terms, types)]
    if max(spans, default=0) > len(_ELLIPSIS_LABELS):
        return None
    dots = _ELLIPSIS_LABELS[:max(spans, default=0)]
    sizes: dict[str, int] = {}
    operands = []
    for value, term, t, span in zip(values, terms, types, spans):
        labels = term.replace("...", dots[len(dots) - span:])  # ellipsis dims right-aligned, as NumPy's
        for label in set(labels):
            here = {int(d) for c, d in zip(labels, t.shape) if c == label}
            known = sizes.get(label, 1)
            if len(here) > 1 or (here != {1} and known != 1 and here != {known}):
                return None  # a diagonal of unequal dims, or sizes that do not broadcast
            sizes[label] = max(known, *here)
        operands.append((value, labels))
    return operands, rhs.replace("...", dots), sizes


class _Builder:
    """Adds the lowered nodes of one Einsum, their types from the op registry."""

    def __init__(self, graph: Graph, node: Node, sizes: dict[str, int]) -> None:
        self.graph, self.node, self.sizes = graph, node, sizes

    def add(self, op: str, inputs: Sequence[Value], attrs: dict[str, Any] | None = None) -> Value:
        g = self.graph
        full = registry.with_defaults(op, attrs or {})
        types = registry.infer(op, full, [g.type_of(v) for v in inputs], [g.constant_value(v) for v in inputs])
        added = g.add_node(op, list(inputs), types, full, name=f"{self.node.name}_{op.lower()}",
                           origin=self.node.origin or self.node.name)
        return Value(added.name)

    def ints(self, values: Sequence[int]) -> Value:
        return self.graph.add_constant(np.array(values, np.int64), name=f"{self.node.name}_ints")

    def transpose(self, x: Value, labels: str, order: str) -> Value:
        if labels == order:
            return x
        return self.add("Transpose", [x], {"perm": tuple(labels.index(c) for c in order)})

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        if tuple(self.graph.type_of(x).shape) == tuple(shape):
            return x
        return self.add("Reshape", [x, self.ints(shape)])

    def squeeze(self, x: Value, labels: str) -> tuple[Value, str]:
        """x without its axes of one element whose label is larger in another operand: NumPy
        broadcasts them, which here means the label is absent from x."""
        shape = [int(d) for d in self.graph.type_of(x).shape]
        keep = [k for k, c in enumerate(labels) if shape[k] != 1 or self.sizes[c] == 1]
        if len(keep) == len(labels):
            return x, labels
        return self.reshape(x, [shape[k] for k in keep]), "".join(labels[k] for k in keep)

    def diagonal(self, x: Value, labels: str) -> tuple[Value, str]:
        """x's diagonal over every label that `labels` repeats: for each repeat, its two axes
        moved last and merged, then every (n + 1)-th element of the merged axis."""
        while len(set(labels)) != len(labels):
            label = next(c for c in labels if labels.count(c) > 1)
            first = labels.index(label)
            second = labels.index(label, first + 1)
            others = [k for k in range(len(labels)) if k not in (first, second)]
            if others + [first, second] != list(range(len(labels))):
                x = self.add("Transpose", [x], {"perm": (*others, first, second)})
            rest = "".join(labels[k] for k in others)
            n = self.sizes[label]
            x = self.reshape(x, [self.sizes[c] for c in rest] + [n * n])
            x = self.add("Slice", [x, self.ints([0]), self.ints([n * n]), self.ints([len(rest)]), self.ints([n + 1])])
            labels = rest + label
        return x, labels

    def sum_out(self, x: Value, labels: str, keep: set[str]) -> tuple[Value, str]:
        """x with the labels not in `keep` summed out."""
        gone = [k for k, c in enumerate(labels) if c not in keep]
        if not gone:
            return x, labels
        return self.add("ReduceSum", [x, self.ints(gone)], {"keepdims": 0}), "".join(c for c in labels if c in keep)

    def contract(self, a: Value, la: str, b: Value, lb: str, keep: set[str]) -> tuple[Value, str]:
        """a and b as one batched MatMul: batch dims, then a's free labels, then b's."""
        batch = "".join(c for c in la if c in lb and c in keep)
        k = "".join(c for c in la if c in lb and c not in keep)
        m = "".join(c for c in la if c not in lb)
        n = "".join(c for c in lb if c not in la)
        size = self.sizes
        flat = [size[c] for c in batch]
        left = self.reshape(self.transpose(a, la, batch + m + k), flat + [_prod(size, m), _prod(size, k)])
        right = self.reshape(self.transpose(b, lb, batch + k + n), flat + [_prod(size, k), _prod(size, n)])
        product = self.add("MatMul", [left, right])
        return self.reshape(product, flat + [size[c] for c in m + n]), batch + m + n


def _prod(sizes: dict[str, int], labels: str) -> int:
    return int(np.prod([sizes[c] for c in labels], dtype=np.int64))


def _lower(graph: Graph) -> PassResult:
    modified = False
    for node in graph.nodes():
        if node.op != "Einsum" or node.name not in graph:
            continue
        plan = _terms(graph, node)
        if plan is None:
            continue
        operands, rhs, sizes = plan
        build = _Builder(graph, node, sizes)
        operands = [build.diagonal(*build.squeeze(value, labels)) for value, labels in operands]
        x, labels = operands[0]
        for index in range(1, len(operands)):
            y, other = operands[index]
            later = set(rhs).union(*(set(lab) for _, lab in operands[index + 1:]))
            x, labels = build.sum_out(x, labels, later | set(other))
            y, other = build.sum_out(y, other, later | set(labels))
            x, labels = build.contract(x, labels, y, other, later)
        x, labels = build.sum_out(x, labels, set(rhs))
        graph.replace_all_uses(Value(node.name), build.transpose(x, labels, rhs))
        graph.remove_node(node.name)
        modified = True
    return PassResult(graph, modified)


lower_einsum = Pass("lower_einsum", _lower)
