"""Keep freed heap memory in the process, so that a kernel's temporaries do not page-fault.

NumPy allocates every result and temporary with malloc. glibc's malloc hands blocks above a
(dynamic) threshold back to the kernel when they are freed, either unmapped or trimmed off
the top of the heap, and the next run touches fresh pages again. A page fault costs about
2 us on this project's VMs: BERT-base's twelve Gelu layers alone made 22.6k faults per run,
48 ms of system time in a 250 ms run. Fixed thresholds switch glibc's dynamic ones off: blocks
up to `MMAP_THRESHOLD` come from the heap and the heap keeps up to `TRIM_THRESHOLD` of free
memory at its top, as onnxruntime's arena and PyTorch's caching allocators keep theirs.

This is process-wide malloc tuning, done by ctypes because NumPy has no allocator hook
reachable from Python; elsewhere than glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20
"""Blocks from this size up are still mapped on their own: glibc's largest dynamic threshold."""
TRIM_THRESHOLD = 512 << 20
"""Free memory the heap keeps at its top before giving any back."""


def retain_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse; False where that is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
