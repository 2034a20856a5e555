"""Ahead-of-time compilation of a graph's kernels for a CUDA GPU, on a machine without one.

Triton's whole pipeline (TTIR, TTGIR, LLVM IR, PTX and a cubin through its bundled ptxas)
runs from the generated sources, so what the interpreter accepts and the compiler refuses
(a mask whose shape the pointer lacks, a dtype the dot does not take) shows up without a GPU.
"""
from __future__ import annotations

from ...graph.graph import Graph
from . import codegen
from .executor import plan_group
from .launch import kernel_groups
from .templates import TEMPLATES

POINTER_TYPES = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64", "bool": "*i1",
                 **{f"{sign}int{bits}": f"*{sign[:1] or 'i'}{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}}


def compile_for_cuda(graph: Graph, capability: int) -> int:
    """Compile every templated kernel of `graph` for compute capability `capability` (90 is
    sm_90); the number compiled. Raises what Triton raises for a kernel it cannot compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    count = 0
    for group in kernel_groups(graph):
        if group.kind not in TEMPLATES:
            continue
        plan = plan_group(graph, group)
        fn = codegen.build(plan.source, plan.name, "cuda")
        consts = plan.constexprs(plan.config)
        dtypes = [p.array.dtype.name if isinstance(p, codegen.Table) else "int32" if isinstance(p, codegen.Flag)
                  else graph.type_of(p).dtype.name for p in plan.params]
        dtypes += [graph.type_of(v).dtype.name for v in plan.outputs]
        pointers = [name for name in fn.arg_names if name not in consts]
        signature = {name: POINTER_TYPES[dtype] for name, dtype in zip(pointers, dtypes)}
        signature.update({name: "constexpr" for name in consts})
        options = {"num_warps": plan.config.get("num_warps", 4), "num_stages": plan.config.get("num_stages", 2)}
        triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", capability, 32), options=options)
        count += 1
    return count
