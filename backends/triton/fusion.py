"""Grouping nodes into kernels: an anchor (matmul, conv, a row op such as softmax, layer norm
or a float reduction; its template says which take one) with the elementwise ops that follow
it as its epilogue, and runs of elementwise ops as one chain kernel.

A node joins the group of the producer of one of its operands when that producer is the
group's last node and the producer's result is read inside a closed region: the elementwise
nodes from its readers up to the first node that every path from the producer passes
through (its post-dominator), all of the producer's shape (an epilogue or a chain iterates
one index space; other operands may broadcast into it), each result but the last read inside
the region alone (so it never needs a buffer). Most regions are one node, the producer's
only reader; a diamond is more: the safe softmax's Where(IsNaN(s), 0, s), SiLU's
x * sigmoid(x), GPT-2's tanh GELU, which reads x three times. The region's other nodes then
join the same group when their turn comes (`owed`). After a group that writes several results
(a Split's parts), a region starts from all of them, where the template pairs them
(templates.epilogue_shapes: LLaMA's SiLU(gate) * up after its gate and up projections), or
from one of them whose region reads nothing else but constants, where the template runs an
epilogue on one part (`Rules.part_epilogue`: the GELU of a parallel block's MLP part, whose
projection is merged with the attention's); the other parts are then the group's `writes`,
and it runs at the place of the Split (`at`), where its operands are ready and before any
reader of its results. A
template may let an epilogue widen to another shape (templates.epilogue_shapes): a reduction
that keeps its dims goes on from its one value per row to the row (RMSNorm's
x * rsqrt(mean(x * x) + eps)).

A row op whose template takes a prologue (a float or bool reduction, softmax, a norm: see
templates.takes_prologue) joins the chain group that computes its operand, when it is that
value's only reader: the chain is then computed on the row in registers before the reduction
(the sdpa guard's Not(x == -inf) before its any, RMSNorm's square before its mean); the
group's `head` counts the nodes before its anchor. A matmul computes the norm that gives
its first operand likewise (a LayerNormalization, or RMSNorm's row group), where that norm's
result is read by nothing else (pre-norm layers: the norm's kernel and its buffer go), or
where its other readers all come after the matmul (descend from it) and the template can
write the norm's result too (`Rules.shares`: a post-norm layer's LayerNorm, which the next
residual Add reads: the norm's kernel goes, its buffer stays; the group's `writes`). A node
of another kind that alone reads a group's result may end the group instead, writing its
results (`Rules.ends`: the Split of GPT-2's query, key and value in their matmul's kernel).

When a node joins a group and reads the result of another group that every reader of that
result joins too, the other group merges into it where the template allows (`Rules.merges`:
two row ops over one row, the sdpa guard's any with the softmax whose Where reads it; a chain
or movement group read at the reader's own index, LLaMA's rotary Concat with the Mul and Add
after it; a chain of a row op's row read at each element, a half-precision RMSNorm's upcast,
which both its square and its scaling read); the merged nodes keep their topological order,
and the anchor is the first node of the group's kind.

Last, a run of groups each read by the next alone (the next group's anchor reads the result
of the one before, and nothing else does) becomes one group where a template runs the run as
one kernel (`Rules.spans`): attention's scores matmul, softmax and product with V
(attention.py), whose (sequence x sequence) scores then never reach memory. The new group
also takes the groups of the nodes its kernel computes as it reads its operands, where they
hold nothing else (`Rules.absorbs`: GQA's Expand of the keys and values, and the views between;
the Casts and scales of a half-precision model's queries, keys and values).

A group runs at the place of its last node in the topological order (or `at`, see above):
every operand of every member is ready by then, and every result a group does not write is
read inside it alone (checked). A shared prologue's other readers descend from the matmul,
so from the group's last node (the only one whose result leaves the group that way): they
run after it.

Prologues (shared or not), spans and paired parts are bets on a GPU's costs; `Fusion` turns
each off, for bench/ablate.py to measure.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import networkx as nx

from ...graph.graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from ...graph.types import Value

HOST_DEVICE = "cpu"

REGION_LIMIT = 64
"""The most nodes one region may hold: the search for a region's end stops there."""

SPAN_LIMIT = 3
"""The most groups one run may hold (`Rules.spans`; attention's three)."""


@dataclass(frozen=True)
class Rules:
    """What the templates say about fusing (launch.kernel_groups gives templates.py's):
    `classify` a node's kind; `epilogue_shapes` the shapes of the elementwise nodes a group's
    kernel may compute after its last one (none: it takes no epilogue); `takes_prologue`
    whether an anchor of a kind computes the group that gives its operand; `merges` whether a
    group whose result a node of another group reads can run inside that group's kernel;
    `ends` whether a node of another kind that alone reads a group's result ends the group;
    `spans` the kind of a kernel that runs a run of groups of the given kinds, each read by the
    next alone, whose nodes are given (None: none does); `absorbs` the nodes outside a group
    that its kernel computes as it reads its operands (their groups then join it); `shares`
    whether an anchor of a kind whose kernel computes the group that gives its operand
    (`takes_prologue`) can also write that group's result, for its readers elsewhere;
    `part_epilogue` whether elementwise nodes that read one of the several results of a
    group's kernel may run in it, the other results stored as they are."""

    classify: Callable[[Graph, Node], str]
    epilogue_shapes: Callable[[Graph, "Group"], list[tuple[int, ...]]]
    takes_prologue: Callable[[Graph, str, Node, "Group"], bool]
    merges: Callable[[Graph, "Group", "Group", Value, Node], bool]
    ends: Callable[[Graph, "Group", Node], bool]
    spans: Callable[[Graph, list[str], list[Node]], "str | None"] = lambda graph, kinds, nodes: None
    absorbs: Callable[[Graph, "Group", Callable[[Node], "Group | None"]], list[Node]] = \
        lambda graph, group, group_of: []
    shares: Callable[[Graph, str, Node, "Group"], bool] = lambda graph, kind, node, before: False
    part_epilogue: Callable[[Graph, "Group"], bool] = lambda graph, group: False


@dataclass(frozen=True)
class Fusion:
    """The fusions beyond epilogues and chains, all on by default. Each is a bet on a GPU's
    costs (work repeated inside a kernel against a launch and a buffer's trip through memory)
    that bench/ablate.py measures by turning it off:
    - `prologues`: an anchor computes the group that gives its operand (a matmul its operand's
      LayerNorm or RMSNorm; a row op the chain before it, a residual Add before a LayerNorm).
      True: every kind of anchor whose template takes one; a set of kinds: those only; False:
      none.
    - `spans`: a run of groups as one kernel (flash attention).
    - `pairs`: the elementwise nodes that read several results of one kernel, as its epilogue
      (SwiGLU after LLaMA's merged gate and up projections).
    - `shared`: a prologue whose result others read too, the kernel writing it as well (BERT's
      post-norm LayerNorms, each also the next residual); only where `prologues` allows it."""

    prologues: bool | frozenset[str] = True
    spans: bool = True
    pairs: bool = True
    shared: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.prologues, bool):
            object.__setattr__(self, "prologues", frozenset(self.prologues))

    def rules(self, rules: Rules) -> Rules:
        """`rules` with the fusions that are off refused."""
        prologue, shapes, kinds = rules.takes_prologue, rules.epilogue_shapes, self.prologues
        return replace(
            rules,
            takes_prologue=lambda graph, kind, node, before: (
                (kinds is True or (kinds is not False and kind in kinds)) and prologue(graph, kind, node, before)),
            spans=rules.spans if self.spans else lambda graph, kinds, nodes: None,
            epilogue_shapes=shapes if self.pairs else
            lambda graph, group: shapes(graph, group) if len(group.nodes[-1].outputs) == 1 else [],
            shares=rules.shares if self.shared else lambda graph, kind, node, before: False)


@dataclass
class Group:
    """Nodes run by one kernel: `kind` names the template ("numpy": the NumPy backend);
    `head` how many of them (a prologue) come before its anchor; `writes` the results of
    nodes before its last that its kernel writes too (a shared prologue's, the parts of a
    Split beside the one its epilogue reads); `at` the node at whose place in the
    topological order it runs, where not its last (that Split)."""

    kind: str
    nodes: list[Node]
    head: int = 0
    writes: list[Value] = field(default_factory=list)
    at: str | None = None

    @property
    def anchor(self) -> Node:
        return self.nodes[self.head]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def output(self) -> Value:
        return Value(self.nodes[-1].name)


def _first_result_only(graph: Graph, producer: Node, value: Value) -> bool:
    """`value` is slot 0 of `producer`, whose other results nobody reads."""
    return value.slot == 0 and not any(graph.users(Value(producer.name, k)) for k in range(1, len(producer.outputs)))


def _readers(graph: Graph, value: Value) -> set[str]:
    return {user for user, _ in graph.users(value)}


def _region(graph: Graph, producer: Node, values: list[Value], shape: tuple[int, ...], is_free: Callable[[Node], bool],
            position: dict[str, int], part: bool = False) -> list[Node] | None:
    """The nodes from `value`'s readers to the first one every path from `producer` passes
    through, in topological order, where all are free chain nodes (`is_free`) of `shape`
    and each but the last is read inside the region alone; None otherwise (a reader that is a
    graph output, an anchor, another shape, or more than REGION_LIMIT nodes). One value is
    the producer's only result read, unless it is a `part` (the others are written).

    Walked in topological order: `pending` holds the readers of the region's results not yet
    in it; the node whose turn leaves nothing pending closes the region."""
    if len(values) == 1 and not part and not _first_result_only(graph, producer, values[0]):
        return None
    region: list[Node] = []
    pending = set().union(*(_readers(graph, value) for value in values))
    while pending and len(region) < REGION_LIMIT:
        if not pending <= position.keys():
            return None  # a graph output
        name = min(pending, key=position.__getitem__)
        pending.discard(name)
        node = graph.node(name)
        if not (is_free(node) and tuple(node.outputs[0].shape) == shape and _first_result_only(graph, node, Value(name))):
            return None
        region.append(node)
        if not pending:
            return region
        pending |= _readers(graph, Value(name))
    return None


def _operand_group(graph: Graph, node: Node, owner: dict[str, Group], readers: set[str] | None = None
                   ) -> Group | None:
    """The group (not `node`'s own) whose last node computes `node`'s first operand, read only
    by `readers` (by default by `node` alone, and only there); None where none: its result can
    stay in registers in one kernel with `node`."""
    values = graph.inputs_of(node.name)
    value = values[0] if values else None
    group = owner.get(value.node) if value is not None else None
    if group is None or group is owner.get(node.name) or group.nodes[-1].name != value.node:  # type: ignore[union-attr]
        return None
    if readers is None:
        alone = _readers(graph, value) == {node.name} and values.count(value) == 1  # type: ignore[arg-type]
    else:
        alone = _readers(graph, value) <= readers  # type: ignore[arg-type]
    return group if alone and _first_result_only(graph, group.nodes[-1], value) else None  # type: ignore[arg-type]


def _shared_operand_group(graph: Graph, node: Node, owner: dict[str, Group]) -> Group | None:
    """The group (not `node`'s own, writing nothing else) whose last node computes `node`'s
    first operand, read once by `node` and also by nodes that all descend from `node` (so
    they run after any kernel that holds `node` and writes that operand); None otherwise."""
    values = graph.inputs_of(node.name)
    value = values[0] if values else None
    if value is None or values.count(value) != 1:
        return None
    others = _readers(graph, value) - {node.name}
    group = _operand_group(graph, node, owner, others | {node.name})
    if group is None or group.writes or not others:
        return None
    return group if all(nx.has_path(graph.nx, node.name, r) for r in others) else None


def _reads(graph: Graph, nodes: list[Node], values: list[Value]) -> bool:
    return any(v in values for n in nodes for v in graph.inputs_of(n.name))


def _closed(graph: Graph, region: list[Node], value: Value) -> bool:
    """Whether the region's nodes read nothing but `value`, each other's results and constants."""
    inside = {n.name for n in region}
    return all(v is None or v == value or v.node in inside or graph.node(v.node).op == CONSTANT
               for n in region for v in graph.inputs_of(n.name))


def _parts_read(graph: Graph, region: list[Node], producer: Node) -> set[int]:
    return {v.slot for n in region for v in graph.inputs_of(n.name) if v is not None and v.node == producer.name}


def _merge(graph: Graph, node: Node, group: Group, rules: Rules, owner: dict[str, Group], owed: dict[str, Group]
           ) -> list[Group]:
    """The groups whose result `node`, about to join `group`, reads and that `rules.merges`
    lets run inside `group`'s kernel, for each reader of that result: every reader is in
    `group`, is `node`, or is owed to `group` (the result then stays in registers), and no
    node of the merged group reads one of `group`'s."""
    found: list[Group] = []
    for value in graph.inputs_of(node.name):
        inner = owner.get(value.node) if value is not None else None
        if inner is None or inner is group or inner in found or inner.nodes[-1].name != value.node:
            continue
        readers = _readers(graph, value)  # type: ignore[arg-type]
        reads_group = any(v is not None and owner.get(v.node) is group for n in inner.nodes
                          for v in graph.inputs_of(n.name))
        if all(owner.get(r) is group or owed.get(r) is group or r == node.name for r in readers) and \
                not reads_group and _first_result_only(graph, inner.nodes[-1], value) and \
                all(rules.merges(graph, inner, group, value, graph.node(r)) for r in readers):  # type: ignore[arg-type]
            found.append(inner)
    return found


def group_nodes(graph: Graph, rules: Rules, fuse: bool | Fusion = True) -> list[Group]:
    """The graph's compute nodes grouped into kernels, in a valid launch order (see the module
    docstring; `rules` are the templates'); `fuse` False gives every node its own kernel, a
    `Fusion` turns some fusions off."""
    if isinstance(fuse, Fusion):
        rules = fuse.rules(rules)
    order = [n for n in graph.nodes() if n.op not in (INPUT, OUTPUT, CONSTANT)]
    position = {n.name: i for i, n in enumerate(order)}
    kinds = {n.name: rules.classify(graph, n) for n in order}  # once: a view's check packs indices
    owner: dict[str, Group] = {}
    owed: dict[str, Group] = {}  # a region's later nodes -> the group they must join

    def is_free(node: Node) -> bool:
        return node.name not in owner and node.name not in owed and kinds[node.name] == "chain"

    groups: list[Group] = []
    for node in order:
        kind = kinds[node.name]
        joined = owed.pop(node.name, None)
        if fuse and kind == "chain" and joined is None:
            for value in graph.inputs_of(node.name):
                group = owner.get(value.node) if value is not None else None
                if group is None or group.nodes[-1].name != value.node:
                    continue
                last = group.nodes[-1]
                starts = [Value(last.name, k) for k in range(len(last.outputs))] if len(last.outputs) > 1 else [value]
                region = next(filter(None, (_region(graph, last, starts, shape, is_free, position)  # type: ignore[list-item]
                                            for shape in rules.epilogue_shapes(graph, group))), None)
                paired = region is not None and len(last.outputs) > 1
                one_part = len(last.outputs) > 1 and rules.part_epilogue(graph, group)
                if region is None and one_part:
                    region = _region(graph, last, [value], tuple(last.outputs[value.slot].shape), is_free, position,
                                     part=True)
                if region is not None and _reads(graph, region, group.writes):
                    region = None  # the kernel writes that result as it goes: no program may read it back
                if region is not None and group.at is not None and not _closed(graph, region, value):
                    region = None  # it runs at its Split's place, where only that much is ready
                if region is not None and one_part:
                    alone = _parts_read(graph, region, last) == {value.slot}
                    if alone and _closed(graph, region, value):  # the other parts written, run at the Split's place
                        group.writes += [Value(last.name, k) for k in range(len(last.outputs)) if k != value.slot]
                        group.at = last.name
                    elif alone or not paired:
                        region = None  # one part's needs only it ready; several parts' the template's pairing
                if region is not None:
                    assert region[0] is node, (region[0].name, node.name)
                    owed.update((later.name, group) for later in region[1:])
                    joined = group
                    break
        if fuse and joined is not None:
            for inner in _merge(graph, node, joined, rules, owner, owed):
                groups.remove(inner)
                joined.nodes = sorted(inner.nodes + joined.nodes, key=lambda n: position[n.name])
                joined.head = next(i for i, n in enumerate(joined.nodes) if kinds[n.name] == joined.kind)
                owner.update((n.name, joined) for n in inner.nodes)
        if fuse and joined is None and kind != "chain":
            before = _operand_group(graph, node, owner)
            if before is not None and rules.ends(graph, before, node):
                joined = before
            elif before is not None and rules.takes_prologue(graph, kind, node, before):
                joined, before.kind, before.head = before, kind, len(before.nodes)
            elif before is None:
                shared = _shared_operand_group(graph, node, owner)
                if shared is not None and rules.takes_prologue(graph, kind, node, shared) and \
                        rules.shares(graph, kind, node, shared):
                    joined, shared.kind, shared.head = shared, kind, len(shared.nodes)
                    shared.writes = [graph.inputs_of(node.name)[0]]  # type: ignore[list-item]
        if joined is None:
            joined = Group(kind, [])
            groups.append(joined)
        joined.nodes.append(node)
        owner[node.name] = joined
    if fuse:
        _span(graph, groups, rules, owner, position)
    _check_groups(graph, groups)
    return sorted(groups, key=lambda g: position[g.at or g.nodes[-1].name])


def _span(graph: Graph, groups: list[Group], rules: Rules, owner: dict[str, Group], position: dict[str, int]) -> None:
    """Replace, in place, each run of up to SPAN_LIMIT groups (each the `_operand_group` of
    the next one's anchor, its result read inside the next one alone) that one kernel runs
    (`rules.spans`) by one group of that kind: the longest run ending at each group, in launch
    order, with the groups of the nodes it absorbs (`rules.absorbs`) where those groups hold
    nothing else. The run's first anchor stays the anchor."""
    for last in list(groups):
        if last not in groups:
            continue
        run = [last]
        while len(run) < SPAN_LIMIT:
            before = _operand_group(graph, run[0].anchor, owner, set(run[0].names))
            if before is None:
                break
            run.insert(0, before)
        for start in range(len(run) - 1):
            if any(g.writes for g in run[start:]):
                continue
            nodes = sorted((n for g in run[start:] for n in g.nodes), key=lambda n: position[n.name])
            kind = rules.spans(graph, [g.kind for g in run[start:]], nodes)
            if kind is None:
                continue
            merged = Group(kind, nodes, nodes.index(run[start].anchor))
            groups[groups.index(last)] = merged
            for g in run[start:-1]:
                groups.remove(g)
            owner.update((n.name, merged) for n in nodes)
            _absorb(graph, merged, rules.absorbs(graph, merged, lambda n: owner.get(n.name)), groups, owner, position)
            break


def _absorb(graph: Graph, group: Group, taken: list[Node], groups: list[Group], owner: dict[str, Group],
            position: dict[str, int]) -> None:
    """`taken`'s groups join `group` (its anchor kept), where they hold nothing but `taken`."""
    names = {n.name for n in taken}
    joining = {id(owner[name]): owner[name] for name in names}.values()
    if not taken or any(not set(g.names) <= names for g in joining):
        return
    anchor = group.anchor
    for g in joining:
        groups.remove(g)
    group.nodes = sorted(group.nodes + taken, key=lambda n: position[n.name])
    group.head = group.nodes.index(anchor)
    owner.update((name, group) for name in names)


def _check_groups(graph: Graph, groups: list[Group]) -> None:
    """Every result a group computes but does not write (all but its last node's slot 0 and
    its `writes`) is read inside the group alone: it never gets a buffer."""
    for group in groups:
        inside = set(group.names)
        for node in group.nodes[:-1]:
            for k in range(len(node.outputs)):
                if Value(node.name, k) in group.writes:
                    continue
                outside = {user for user, _ in graph.users(Value(node.name, k))} - inside
                assert not outside, f"fusion: {node.name} of a {group.kind} group is read by {sorted(outside)}"
