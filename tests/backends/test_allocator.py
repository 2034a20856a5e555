"""The NumPy executor keeps freed memory in the process (backends/numpy/allocator.py): a
kernel's large temporaries, freed after each run, come back without fresh page faults."""
import platform
import resource

import numpy as np
import pytest

from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.numpy.allocator import retain_freed_memory
from tilefold.graph import Graph, TensorType, Value

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc tuning is glibc's")


def gelu_graph(shape: tuple[int, ...]) -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType(shape, np.float32))
    y = g.add_node("Gelu", [x], [TensorType(shape, np.float32)], name="gelu")
    g.add_output(Value(y.name), "y")
    return g


@glibc
def test_a_second_run_does_not_page_fault_on_its_temporaries():
    shape = (1, 128, 3072)  # BERT-base's Gelu: 1.5 MB per temporary
    exe = NumpyExecutable(gelu_graph(shape))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    exe({"x": x})
    exe({"x": x})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        exe({"x": x})
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # without the tuning each run re-faults its temporaries: about 1,900 faults per run
    assert faults < 200, faults


@glibc
def test_retain_freed_memory_applies_on_glibc():
    assert retain_freed_memory() is True
