"""The NumPy CPU backend: one kernel per op and an executor; also the reference for the others."""
from .executor import NumpyExecutable, RunStats, evaluate_node
from .registry import KERNELS, KernelSpec, kernel, simple, supports

__all__ = ["KERNELS", "KernelSpec", "NumpyExecutable", "RunStats", "evaluate_node", "kernel", "simple", "supports"]
