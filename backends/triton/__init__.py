"""The Triton backend: generated kernels on packed layouts, launch configuration as node data.

    exe = TritonExecutable(graph, device="cuda")     # or "interp": Triton's interpreter on the CPU
    outputs = exe({"x": x})                           # dict of named numpy arrays
    for names, source in kernel_sources(graph): print(source)
    kernel_listing(graph)                             # nodes, template, launch config, source
    set_launch(graph, "matmul0", BLOCK_M=64, num_warps=8); verify_launch(graph)
    TritonExecutable(graph, fuse=Fusion(spans=False))  # one of the fusions off, to measure it
    autotune(graph, {"x": x})                         # writes the fastest configs onto the nodes

Templates, one module per family: matmul.py (MatMul/Gemm), conv.py (implicit-GEMM Conv), both
with fused epilogues; elementwise.py (fused chains); reduce.py (softmax, layer norm,
reductions); layout_ops.py (pack, unpack, casts, transpose/reshape/gather heads). indexing.py
addresses packed and plain buffers; fusion.py groups nodes into kernels and templates.py says
which template runs a node; codegen.py builds and caches kernels; launch.py holds the launch
configuration rules; executor.py runs the graph; replay.py records its first run and replays
it (CUDA graphs on a GPU); autotune.py tunes the configurations; aot.py compiles every kernel
of a graph for a CUDA GPU without one.
"""
from .autotune import autotune
from .executor import TritonExecutable, kernel_listing, kernel_sources
from .fusion import Fusion
from .launch import set_launch, verify_launch
from .listing import KernelListing, ListedKernel
from .templates import supported_ops, supports

__all__ = ["Fusion", "KernelListing", "ListedKernel", "TritonExecutable", "autotune", "kernel_listing",
           "kernel_sources", "set_launch", "supported_ops", "supports", "verify_launch"]
