"""Generated source -> a launchable Triton kernel, cached by source hash and device.

Templates emit a small Python module with one `@triton.jit` function, its lines commented
with the graph values they read and write. What is compiled is that source without its
comments (line for line, so tracebacks point at the listed lines): the twelve layers of a BERT
then share one module per kernel, and Triton compiles each once (BERT-base: 21 kernels to
compile instead of 247; 148 s of compiling on an H200 before). It is registered with
`linecache` under a name derived from its hash, so `inspect` (which both Triton's JIT and its
interpreter read) finds the source without a file on disk. For the `cuda` device the module's
`@triton.jit` gives a `JITFunction`; for `interp` every jit'd function of the module is wrapped
in Triton's `InterpretedFunction`, which runs it with NumPy on the host: tilefold sets the
interpreter up per kernel instead of through the process-wide `TRITON_INTERPRET` switch.
Triton's own standard library (`tl.sum`, `tl.max`, ...) and tilefold's helpers (libm.py, which
every module imports) were decorated when imported, so while an interpreted kernel runs those
functions are swapped for interpreted ones, the way the interpreter itself patches
`triton.language` for the duration of a launch.

A kernel's pointer parameters are its operands (graph Values) and its tables, in the order the
template appended them (`in0, in1, ...`), then its results (`out0`; `out0, out1, ...` for a
kernel that writes several, a Split), then its constexprs. A `Table` is a constant array a
template works out at generation time (a Resize's source rows and weights per output
position): it is not a graph Value, so the schedule and the memory plan never see it; the
executor moves it to the kernel's device once, at compile time. A `Flag` is a device word a
kernel writes when an index it looks up is out of range: the executor zeroes the flags before a
run and reads them after it.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import linecache
import tokenize
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

DEVICES = ("cuda", "interp")

_CACHE: dict[tuple[str, str], Any] = {}
"""(source hash and function, device) -> kernel object: a cache (not state that changes
behaviour): equal sources build one kernel, shared by every graph that generates it."""

HEADER = f"import triton\nimport triton.language as tl\nfrom {__package__} import libm\n\n\n"
"""Every kernel module's imports: triton, and the helpers of libm.py (`libm.atan(x)`)."""


TABLE_DTYPES = (np.dtype(np.int32), np.dtype(np.float32))


@dataclass(frozen=True, eq=False)
class Table:
    """A constant int32 (indices) or float32 (weights) array a kernel reads through a pointer
    parameter; `name` says what it holds in the generated source. Compared by identity."""

    name: str
    array: np.ndarray

    def __post_init__(self) -> None:
        array = np.ascontiguousarray(self.array)
        if array.dtype not in TABLE_DTYPES:
            raise ValueError(f"table {self.name!r} is {array.dtype}; tables are int32 or float32")
        array.setflags(write=False)
        object.__setattr__(self, "array", array)


@dataclass(frozen=True, eq=False)
class Flag:
    """An int32 word on the kernel's device that a lookup sets when an index lies outside
    [-size, size): the index is then read as 0, so no load or store leaves its buffer, and the
    executor, which reads every flag after a run, raises the error the NumPy backend raises at
    once. `what` names the node and the index. Compared by identity."""

    what: str
    size: int


@dataclass
class KernelPlan:
    """One generated kernel: its source, the values it reads and writes, and how to launch it.

    `params` are its pointer parameters before the results, in order: graph Values (`inputs`),
    Tables (`tables`) and Flags (`flags`); `outputs` the Values it writes, one per result
    pointer, in order. `grid(config)` gives the launch grid from the launch configuration,
    `constexprs(config)` the block sizes passed as `tl.constexpr` arguments; `config` is the
    group's configuration (launch.config: defaults overridden by the anchor node's `launch`)."""

    name: str
    kind: str
    nodes: list[str]
    source: str
    params: list[Any]
    outputs: list[Any]
    grid: Callable[[dict[str, Any]], tuple[int, ...]]
    constexprs: Callable[[dict[str, Any]], dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:20]

    @property
    def inputs(self) -> list[Any]:
        """The graph Values the kernel reads, in parameter order."""
        return [p for p in self.params if not isinstance(p, (Table, Flag))]

    @property
    def tables(self) -> list[Table]:
        return [p for p in self.params if isinstance(p, Table)]

    @property
    def flags(self) -> list[Flag]:
        return [p for p in self.params if isinstance(p, Flag)]

    def arguments(self, values: list[Any], tables: list[Any], flags: list[Any] = ()) -> list[Any]:
        """The pointer arguments before the results: `values` (one per `inputs`), `tables` (one
        per `tables`) and `flags` (one per `flags`), on the kernel's device, in their slots."""
        left = {Table: iter(tables), Flag: iter(flags)}
        values_left = iter(values)
        return [next(left[type(p)]) if type(p) in left else next(values_left) for p in self.params]


def jit_function(fn_name: str, operands: int, lines: Sequence[str], constexprs: Sequence[str] = ("BLOCK",),
                 results: int = 1) -> str:
    """A template's kernel: `@triton.jit def fn_name(in0.., out0.., NAME: tl.constexpr..)` (the
    pointer order the executor passes) with `lines` as its body."""
    args = [f"in{i}" for i in range(operands)] + [f"out{k}" for k in range(results)]
    args += [f"{name}: tl.constexpr" for name in constexprs]
    return "@triton.jit\ndef {}({}):\n{}\n".format(fn_name, ", ".join(args), "\n".join("    " + x for x in lines))


def module_source(body: str) -> str:
    return HEADER + body.strip("\n") + "\n"


def uncommented(source: str) -> str:
    """`source` with its comments removed and every line kept (tokenize tells a comment from
    a `#` inside a string)."""
    lines = source.splitlines(True)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col].rstrip() + "\n"
    return "".join(lines)


def build(source: str, fn_name: str, device: str) -> Any:
    """The kernel `fn_name` of module `source` for `device` ("cuda" or "interp"), cached by
    the source without its comments."""
    if device not in DEVICES:
        raise ValueError(f"unknown Triton device {device!r}; expected one of {DEVICES}")
    source = uncommented(source)
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    key = (f"{digest}:{fn_name}", device)
    if key in _CACHE:
        return _CACHE[key]
    filename = f"<tilefold-triton-{digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"tilefold_triton_{digest}"}
    exec(compile(source, filename, "exec"), namespace)
    if device == "interp":
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        for name, member in list(namespace.items()):
            if isinstance(member, JITFunction):
                namespace[name] = InterpretedFunction(member.fn)
    _CACHE[key] = namespace[fn_name]
    return _CACHE[key]


def _bfloat16_widened(create_dot: Callable[..., Any]) -> Callable[..., Any]:
    """Triton's interpreter keeps bfloat16 data as its uint16 bits, and its `create_dot`
    multiplies those bits as integers (Triton 3.8: a bfloat16 matmul gave 1e10s): the dot
    with bfloat16 operands widened to float32 (exact), as the GPU's accumulates."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def widen(h: Any) -> Any:
        if h.dtype.scalar != tl.bfloat16:
            return h
        return TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def dot(a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        return create_dot(widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    return dot


def _bfloat16_rounded(cast_impl: Callable[..., Any]) -> Callable[..., Any]:
    """Triton's interpreter casts to bfloat16 wrongly (Triton 3.8's `cast_impl`): float32 by
    truncating the mantissa, where a GPU rounds to nearest even (`cvt.rn`), as ml_dtypes and
    torch do; any other type by putting its values in the uint16 bits. Every cast to bfloat16
    goes through float32 (exact for bool, integers up to 2**24 and float16, as ml_dtypes
    converts), then rounds to nearest even, NaN kept a quiet NaN."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def cast(src: Any, dst_type: Any) -> Any:
        if dst_type.scalar != tl.bfloat16 or src.dtype.scalar == tl.bfloat16:
            return cast_impl(src, dst_type)
        bits = np.ascontiguousarray(src.data).astype(np.float32).view(np.uint32)
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
        nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        return TensorHandle(np.where(nan, ((bits >> 16) | np.uint32(0x40)).astype(np.uint16), rounded), tl.bfloat16)

    return cast


@contextlib.contextmanager
def interpreted_stdlib() -> Iterator[None]:
    """While an interpreted kernel runs: triton.language's jit'd helpers and libm's, interpreted."""
    importlib.import_module("triton.experimental.gluon")  # its import asserts the helpers are JITFunctions
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction, _LangPatchScope, interpreter_builder
    from triton.runtime.jit import JITFunction

    from . import libm

    class Scoped(InterpretedFunction):
        """Triton's nested-call path patches `triton.language` for the callee's module and
        never restores it (a later JIT compile in the process then fails): restore it here."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            from triton.runtime.interpreter import _patch_lang

            patched = _patch_lang(self.fn)
            try:
                return self.rewrite()(*args, **kwargs)
            finally:
                patched.restore()

    scope = _LangPatchScope()
    for module in (tl, tl.standard, tl.math, libm):
        for name, member in list(vars(module).items()):
            if isinstance(member, JITFunction):
                scope.set_attr(module, name, Scoped(member.fn))
    scope.set_attr(interpreter_builder, "create_dot", _bfloat16_widened(interpreter_builder.create_dot))
    scope.set_attr(interpreter_builder, "cast_impl", _bfloat16_rounded(interpreter_builder.cast_impl))
    try:
        yield
    finally:
        scope.restore()


def launch(kernel: Any, device: str, grid: tuple[int, ...], args: list[Any], constexprs: dict[str, Any],
           num_warps: int, num_stages: int) -> None:
    """Launch `kernel` on `grid`; the interpreter takes no warps or stages."""
    if device == "interp":
        # masked-off lanes are computed too (log(0) there): IEEE results, not errors
        with interpreted_stdlib(), np.errstate(all="ignore"):
            kernel[grid](*args, **constexprs)
    else:
        kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
