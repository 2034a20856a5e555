"""Runs a Graph with the NumPy kernels, node by node in a fixed schedule.

Compiling a graph builds one kernel per node and decides, once, where each value lives:
- every buffer is dropped right after its last use;
- an elementwise kernel writes into an input buffer that dies at that node (in place),
  unless that buffer shares storage with a constant, a graph input, a graph output or a
  value still to be read (storage groups follow the kernels that return views);
- constants are read-only arrays (splats are one-element broadcast views), so no kernel
  can write into one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from ...graph.errors import InputError, TilefoldError, UnsupportedOpError, where
from ...graph.graph import CONSTANT, INPUT, OUTPUT, Graph, Node
from ...graph.types import Splat, TensorType, Value, as_array
from .allocator import retain_freed_memory
from .packed import build_kernel
from .registry import KERNELS, KernelDef, KernelSpec, Run, kernel_set
from . import kernels as _kernels  # noqa: F401  (registers the kernels)

FALLBACK_OP = "OnnxReference"


@dataclass
class Step:
    node: Node
    run: Run
    ins: tuple[int, ...]  # buffer index per input slot, -1 for a missing optional input
    outs: tuple[int, ...]  # buffer index per output, -1 for an unused output
    frees: tuple[int, ...]  # buffers whose last use is this step
    inplace: int = -1  # input position whose buffer the kernel may overwrite
    check_shape: bool = False  # the in-place candidate's shape is only known at run time


@dataclass
class RunStats:
    seconds: float = 0.0
    per_op: dict[str, float] = field(default_factory=dict)


class _Groups:
    """Union-find over buffer indices: buffers that may share storage."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, i: int) -> int:
        self.parent.setdefault(i, i)
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
        return ra


class NumpyExecutable:
    """A graph compiled for the NumPy backend; call it with a dict of named inputs."""

    def __init__(self, graph: Graph, *, allow_fallback: bool = True, debug: bool = False,
                 kernels: str = "numpy") -> None:
        self.graph = graph
        self.debug = debug
        self.kernels = kernels
        self._table = kernel_set(kernels)
        self.fallback_nodes: list[str] = []
        self._input_types = graph.input_types()
        self._slots: dict[Value, int] = {}
        self._consts: dict[int, np.ndarray] = {}
        self._inputs: dict[str, int] = {}
        self._outputs: list[tuple[str, int]] = []
        self.steps: list[Step] = []
        self._compile(allow_fallback)
        retain_freed_memory()  # the kernels' temporaries would page-fault on every run otherwise

    # ---- compile ----------------------------------------------------------------------
    def _slot(self, value: Value) -> int:
        return self._slots.setdefault(value, len(self._slots))

    def _compile(self, allow_fallback: bool) -> None:
        g = self.graph
        order = g.nodes()
        compute: list[Node] = []
        for node in order:
            if node.op == CONSTANT:
                value = node.attrs["value"]
                self._consts[self._slot(Value(node.name))] = (
                    as_array(value)
                )
            elif node.op == INPUT:
                self._inputs[node.name] = self._slot(Value(node.name))
            elif node.op != OUTPUT:
                compute.append(node)
        self._outputs = [(name, self._slot(value)) for name, value in zip(g.output_names(), g.output_values())]

        end = len(compute)
        last_use: dict[int, int] = {}
        for step_index, node in enumerate(compute):
            for value in g.inputs_of(node.name):
                if value is not None:
                    last_use[self._slot(value)] = step_index
        for _, index in self._outputs:
            last_use[index] = end

        pinned = set(self._consts) | set(self._inputs.values()) | {i for _, i in self._outputs}
        groups = _Groups()
        group_last: dict[int, int] = {}
        for index in pinned:
            group_last[groups.find(index)] = end + 1

        freed: set[int] = set()
        for step_index, node in enumerate(compute):
            inputs = g.inputs_of(node.name)
            kdef, spec, run = node_kernel(g, node, inputs, allow_fallback=allow_fallback, kernels=self._table)
            if node.op == FALLBACK_OP:
                self.fallback_nodes.append(node.name)
            ins = tuple(self._slot(v) if v is not None else -1 for v in inputs)
            outs = tuple(
                self._slot(Value(node.name, k)) if g.users(Value(node.name, k)) else -1
                for k in range(len(node.outputs))
            )
            for o in outs:
                if o >= 0:
                    group_last[groups.find(o)] = max(
                        group_last.get(groups.find(o), -1), last_use.get(o, -1)
                    )
            step = Step(node, run, ins, outs, ())
            if kdef.views and ins and ins[0] >= 0:
                for o in outs:
                    if o >= 0:
                        self._join(groups, group_last, ins[0], o)
            elif kdef.inplace and len(outs) == 1 and outs[0] >= 0:
                self._choose_inplace(step, spec, groups, group_last, step_index)
            dying = [i for i in set(ins) if i >= 0 and last_use.get(i) == step_index and i not in pinned]
            dying += [o for o in outs if o >= 0 and o not in last_use]
            step.frees = tuple(i for i in dying if i not in freed)
            freed.update(step.frees)
            self.steps.append(step)

    @staticmethod
    def _join(groups: _Groups, group_last: dict[int, int], a: int, b: int) -> None:
        la, lb = group_last.get(groups.find(a), -1), group_last.get(groups.find(b), -1)
        group_last[groups.union(a, b)] = max(la, lb)

    def _choose_inplace(self, step: Step, spec: KernelSpec, groups: _Groups,
                        group_last: dict[int, int], step_index: int) -> None:
        out_type = step.node.outputs[0]
        for pos, index in enumerate(step.ins):
            in_type = spec.in_types[pos]
            if index < 0 or in_type is None or spec.consts[pos] is not None:
                continue
            if in_type.dtype != out_type.dtype or in_type.encoding != out_type.encoding:
                continue
            if group_last.get(groups.find(index), -1) != step_index:
                continue  # the storage is still read later (or pinned)
            static = in_type.is_static and out_type.is_static
            if static and tuple(in_type.shape) != tuple(out_type.shape):
                continue
            step.inplace, step.check_shape = pos, not static
            self._join(groups, group_last, index, step.outs[0])
            return

    # ---- run --------------------------------------------------------------------------
    def _bind(self, feeds: Mapping[str, Any]) -> list[Any]:
        unknown = sorted(set(feeds) - set(self._inputs))
        if unknown:
            raise InputError(
                f"unknown input name {unknown[0]!r}; the model's inputs are {sorted(self._inputs)}"
            )
        missing = [name for name in self._inputs if name not in feeds]
        if missing:
            raise InputError(f"missing input {missing[0]!r}; the model's inputs are {sorted(self._inputs)}")
        buffers: list[Any] = [None] * len(self._slots)
        for index, array in self._consts.items():
            buffers[index] = array
        symbols: dict[str, int] = {}
        for name, index in self._inputs.items():
            array = np.asarray(feeds[name])
            check_input(name, array, self._input_types[name], symbols)
            view = array.view()
            view.flags.writeable = False
            buffers[index] = view
        return buffers

    def __call__(self, feeds: Mapping[str, Any] | None = None, /, **kwargs: Any) -> dict[str, np.ndarray]:
        return self.run({**(feeds or {}), **kwargs})

    def run(self, feeds: Mapping[str, Any], stats: RunStats | None = None) -> dict[str, np.ndarray]:
        buffers = self._bind(feeds)
        start = time.perf_counter()
        with np.errstate(all="ignore"):  # IEEE results (inf, nan) are the op's answer, not an error
            self._loop(buffers, stats)
        if stats is not None:
            stats.seconds = time.perf_counter() - start
        return {name: _owned(buffers[index]) for name, index in self._outputs}

    def _loop(self, buffers: list[Any], stats: RunStats | None) -> None:
        for step in self.steps:
            args = [buffers[i] if i >= 0 else None for i in step.ins]
            t0 = time.perf_counter() if stats is not None else 0.0
            try:
                result = self._call(step, args)
            except TilefoldError:
                raise
            except Exception as exc:
                raise TilefoldError(f"{where(step.node)} failed at run time: {type(exc).__name__}: {exc}") from exc
            if stats is not None:
                op = step.node.op
                stats.per_op[op] = stats.per_op.get(op, 0.0) + time.perf_counter() - t0
            if len(step.outs) == 1 or not isinstance(result, (tuple, list)):
                result = (result,)  # a node with optional results a kernel does not compute (BatchNormalization's)
            if len(result) < len(step.outs) and any(index >= 0 for index in step.outs[len(result):]):
                raise TilefoldError(f"{where(step.node)}: its kernel computes {len(result)} of the "
                                    f"{len(step.outs)} results, and a later one is read")
            for index, array in zip(step.outs, result):
                if index >= 0:
                    buffers[index] = array
            for index in step.frees:
                buffers[index] = None

    def _call(self, step: Step, args: list[Any]) -> Any:
        if step.inplace >= 0:
            candidate = args[step.inplace]
            if candidate.flags.writeable and (not step.check_shape or _holds_result(candidate, args)):
                return step.run(*args, out=candidate)
        result = step.run(*args)
        if self.debug:
            self._check_aliasing(step, args, result)
        return result

    def _check_aliasing(self, step: Step, args: list[Any], result: Any) -> None:
        kdef = self._table[step.node.op]
        outs = result if isinstance(result, tuple) else (result,)
        for pos, arg in enumerate(args):
            if not isinstance(arg, np.ndarray) or (kdef.views and pos == 0):
                continue
            for out in outs:
                if isinstance(out, np.ndarray) and np.may_share_memory(out, arg):
                    raise TilefoldError(
                        f"{where(step.node)}: kernel returned a view of input {pos} but does not declare views=True"
                    )


def _holds_result(candidate: np.ndarray, args: list[Any]) -> bool:
    """Whether an elementwise result has `candidate`'s shape (symbolic shapes, checked at run
    time). Packed operands may be buffers that numpy does not broadcast as they are (the
    kernel reshapes them first): then the answer is no, and the kernel allocates."""
    try:
        return candidate.shape == np.broadcast_shapes(*(a.shape for a in args if a is not None))
    except ValueError:
        return False


def _owned(array: Any) -> np.ndarray:
    """An output the caller may keep and modify: never a view of a constant or an input."""
    array = np.asarray(array)
    if not array.flags.writeable or not array.flags.owndata:
        return np.array(array)
    return array


def node_kernel(graph: Graph, node: Node, inputs: list[Value | None], *, allow_fallback: bool,
                kernels: Mapping[str, KernelDef] = KERNELS) -> tuple[KernelDef, KernelSpec, Run]:
    """The NumPy kernel of one node reading `inputs` (constants among them seen at build
    time), from the kernel table `kernels`: its table entry, spec and `run`. One-line errors
    for an op without a kernel, an onnx.reference fallback that is disabled, and a kernel
    that cannot be built."""
    kdef = kernels.get(node.op)
    if kdef is None:
        raise UnsupportedOpError(f"{where(node)}: the NumPy backend has no kernel for {node.op}")
    if node.op == FALLBACK_OP and not allow_fallback:
        raise UnsupportedOpError(f"{where(node)}: op {node.attrs.get('onnx_op')} has no tilefold kernel "
                                 "(fallback to onnx.reference is disabled)")
    spec = KernelSpec(node, [graph.type_of(v) if v is not None else None for v in inputs],
                      [graph.constant_value(v) for v in inputs])
    try:
        run = build_kernel(kdef, spec)
    except TilefoldError:
        raise
    except Exception as exc:
        raise UnsupportedOpError(f"{where(node)}: cannot build its NumPy kernel: {exc}") from exc
    return kdef, spec, run


def check_input(name: str, array: np.ndarray, expected: TensorType, symbols: dict[str, int]) -> None:
    """One-line errors for an input of the wrong dtype, rank or size."""
    if array.dtype != expected.dtype:
        raise InputError(f"input {name!r} has dtype {array.dtype}, expected {expected.dtype}")
    if array.ndim != expected.rank:
        raise InputError(
            f"input {name!r} has shape {tuple(array.shape)}, expected rank {expected.rank} {_fmt(expected.shape)}"
        )
    for axis, (got, want) in enumerate(zip(array.shape, expected.shape)):
        if isinstance(want, int) and got != want:
            raise InputError(
                f"input {name!r} has shape {tuple(array.shape)}, expected {_fmt(expected.shape)} (dim {axis})"
            )
        if isinstance(want, str):
            bound = symbols.setdefault(want, got)
            if bound != got:
                raise InputError(
                    f"input {name!r} dim {axis} ({want}) is {got}, but {want} = {bound} in another input"
                )


def _fmt(shape: tuple) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def evaluate_node(node: Node, consts: list[Any]) -> list[np.ndarray]:
    """Run one node on constant inputs (for constant folding): fresh, owned results.

    The NumPy kernels have no bfloat16: bfloat16 operands are widened to float32 (exact) and
    bfloat16 results rounded once from the float32 ones, as the Triton kernels compute them."""
    from ...graph.types import type_of_constant

    kdef = KERNELS.get(node.op)
    if kdef is None:
        raise UnsupportedOpError(f"{where(node)}: the NumPy backend has no kernel for {node.op}")
    consts = [_widened(c) for c in consts]
    types = [type_of_constant(c) if c is not None else None for c in consts]
    wide = [TensorType(t.shape, np.float32, t.encoding) if t.dtype.name == "bfloat16" else t for t in node.outputs]
    run = build_kernel(kdef, KernelSpec(replace(node, outputs=wide), types, list(consts)))
    args = [as_array(c) if c is not None else None for c in consts]
    with np.errstate(all="ignore"):  # as at run time: IEEE results (log 0 = -inf) are the op's answer
        result = run(*args)
    results = [np.array(r) for r in (result if isinstance(result, tuple) else (result,))]
    return [r.astype(t.dtype) if t.dtype.name == "bfloat16" and r.dtype != t.dtype else r
            for r, t in zip(results, node.outputs)]


def _widened(const: Any) -> Any:
    """A bfloat16 constant as float32; any other as it is."""
    if isinstance(const, Splat):
        return Splat(float(const.value), const.shape, np.float32) if const.dtype.name == "bfloat16" else const
    if const is not None and np.asarray(const).dtype.name == "bfloat16":
        return np.asarray(const).astype(np.float32)
    return const
