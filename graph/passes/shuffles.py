"""compose_shuffles: a chain of Reshapes and Transposes holding two Transposes or more becomes
one Transpose between two Reshapes.

MobileViT unfolds its feature map into patches as view -> transpose -> reshape -> transpose
-> reshape, (B, C, H, W) -> (B*P, N, C). Run as written, each transpose that the next
reshape cannot view is a copy; on a channels-last buffer, propagation left an Unpack before
each such reshape (three per unfold). The chain permutes the elements of its input along a
common refinement of the shapes it passes through: split each dim into the factors the chain
ever separates, and the whole chain is one Transpose of those factors, which moves data at
most once, and not at all where the buffer's layout already holds that order (the patches of
a channels-last map whose patch grid is 1x1).

The factors ("atoms") are tracked as contiguous pieces of the input's row-major order. A
Transpose permutes the dims' atom lists; a Reshape regroups the flat atom sequence into its
dims, splitting an atom where a dim boundary falls inside it (row-major, so the split pieces
stay contiguous in the input). A boundary that no split can express (a 4 cut out of a 6)
leaves the chain alone. Static, non-empty, unencoded values only (layout/ owns encoded ones);
intermediate results read by anything else stay as they are. compose_transposes runs first
in `simplify`, so the chains found here have reshapes between their Transposes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..graph import Graph, Node
from ..ops.tensor import RESHAPES, transpose_perm
from ..types import TensorType, Value
from .pipeline import Pass, PassResult

def _plain(t: TensorType) -> bool:
    return t.is_static and t.encoding is None and 0 not in t.shape


@dataclass
class Atoms:
    """The input's row-major order cut into atoms, and each current dim as a list of them."""

    sizes: list[int]
    order: list[int]  # atom ids in the input's row-major order
    dims: list[list[int]] = field(default_factory=list)

    @classmethod
    def of(cls, shape: Sequence[int]) -> Atoms:
        ids = [d for d in range(len(shape)) if shape[d] != 1]
        return cls(list(shape), ids, [[d] if shape[d] != 1 else [] for d in range(len(shape))])

    def transpose(self, perm: Sequence[int]) -> None:
        self.dims = [self.dims[p] for p in perm]

    def _split(self, atom: int, major: int) -> tuple[int, int]:
        """Cut `atom` into a `major` piece and the rest, in place in the input order."""
        minor = self.sizes[atom] // major
        first, second = len(self.sizes), len(self.sizes) + 1
        self.sizes += [major, minor]
        at = self.order.index(atom)
        self.order[at:at + 1] = [first, second]
        return first, second

    def reshape(self, shape: Sequence[int]) -> bool:
        """Regroup the atoms into `shape`; False where a dim boundary cannot fall on a cut."""
        flat = [a for dim in self.dims for a in dim]
        dims: list[list[int]] = []
        for size in shape:
            group, filled = [], 1
            while filled < size:
                if not flat:
                    return False
                atom = flat.pop(0)
                grown = filled * self.sizes[atom]
                if size % grown == 0:
                    group.append(atom)
                    filled = grown
                elif self.sizes[atom] % (size // filled) == 0:
                    major, rest = self._split(atom, size // filled)
                    group.append(major)
                    flat.insert(0, rest)
                    filled = size
                else:
                    return False
            dims.append(group)
        self.dims = dims
        return not flat

    def refined_shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in self.order)

    def perm(self) -> tuple[int, ...]:
        """The Transpose of the refined input that gives the current dims' element order."""
        position = {a: k for k, a in enumerate(self.order)}
        return tuple(position[a] for dim in self.dims for a in dim)


def _chain(graph: Graph, node: Node) -> tuple[Value, list[Node]] | None:
    """The chain of views and Transposes ending at `node`, back to the first value that is
    not such an op's sole-read result, and that value; None where `node` is no such op."""
    chain: list[Node] = []
    current = node
    while current.op in RESHAPES or current.op == "Transpose":
        x = graph.inputs_of(current.name)[0]
        if x is None or not _plain(current.outputs[0]) or not _plain(graph.type_of(x)):
            break
        chain.insert(0, current)
        producer = graph.node(x.node)
        if len(graph.users(x)) != 1 or len(producer.outputs) != 1:
            return x, chain
        current = producer
    return (graph.inputs_of(chain[0].name)[0], chain) if chain else None


def composed(graph: Graph, x: Value, chain: Sequence[Node]) -> Atoms | None:
    """The atoms after running `chain` on `x`, or None where a reshape cuts inside an atom."""
    atoms = Atoms.of(graph.type_of(x).shape)
    for node in chain:
        if node.op == "Transpose":
            atoms.transpose(transpose_perm(node.attrs, len(atoms.dims)))
        elif not atoms.reshape(node.outputs[0].shape):
            return None
    return atoms


def _shape(graph: Graph, shape: Sequence[int], name: str) -> Value:
    return graph.add_constant(np.array(shape, np.int64), name=name)


def _rewrite(graph: Graph, x: Value, atoms: Atoms, chain: Sequence[Node]) -> None:
    """Replace `chain` (each result but the last read only by the next) by the composed ops;
    the last op made keeps the chain's result name."""
    end, t = chain[-1], graph.type_of(x)
    refined, perm, out = atoms.refined_shape(), atoms.perm(), end.outputs[0]
    steps: list[tuple[str, list[Value], TensorType, dict]] = []
    if refined != t.shape:
        steps.append(("atoms", [_shape(graph, refined, f"{end.name}_atoms_shape")], TensorType(refined, t.dtype), {}))
    if perm != tuple(range(len(perm))):
        steps.append(("shuffle", [], TensorType(tuple(refined[p] for p in perm), t.dtype), {"perm": perm}))
    if (steps[-1][2].shape if steps else t.shape) != out.shape:
        steps.append(("result", [_shape(graph, out.shape, f"{end.name}_shape")], out, {}))
    for k, (role, operands, result, attrs) in enumerate(steps):
        op = "Transpose" if role == "shuffle" else "Reshape"
        x = Value(graph.add_node(op, [x, *operands], [result], attrs, name=f"{end.name}_{role}",
                                 origin=end.origin or end.name,
                                 out_names=end.out_names if k == len(steps) - 1 else None).name)
    graph.replace_all_uses(Value(end.name), x)
    for node in reversed(chain):
        graph.remove_node(node.name)


def _compose(graph: Graph) -> PassResult:
    modified = False
    for node in graph.nodes():
        if node.name not in graph or node.op != "Transpose":
            continue
        found = _chain(graph, node)
        if found is None or sum(n.op == "Transpose" for n in found[1]) < 2:
            continue
        atoms = composed(graph, *found)
        if atoms is not None:
            _rewrite(graph, found[0], atoms, found[1])
            modified = True
    return PassResult(graph, modified)


compose_shuffles = Pass("compose_shuffles", _compose)
