"""Every notebook in notebooks/ runs from top to bottom without a cell raising.

The notebooks assert their own results (outputs against onnxruntime, layout counts), so a
notebook that runs is a notebook that still shows the truth. Each one runs in a fresh kernel
of this interpreter (a kernelspec written to a temporary folder, so the test does not depend
on which `python` is first on PATH), in a temporary working folder that also holds its
temporary files. Notebooks are committed without outputs; a test checks that too.
"""
import json
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
KERNEL = "tilefold-test-python"
CELL_TIMEOUT_S = 180


def kernel_manager(folder: Path) -> KernelManager:
    """A kernel manager that starts ipykernel with `sys.executable` (the venv's python), talking
    over unix sockets (no TCP ports to race for with other test processes) unless the socket
    path would pass the 107-byte limit of unix socket names."""
    spec = folder / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(folder)])
    sockets = str(folder / "ipc")
    if len(sockets.encode()) + 8 > 107:
        return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs, transport="ipc", ip=sockets)


def test_there_are_notebooks():
    assert {p.name for p in PATHS} >= {"01_optimize_onnx.ipynb", "02_torch_compile.ipynb", "03_custom_target.ipynb",
                                       "04_devices.ipynb", "05_triton_kernels.ipynb"}


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary files go with the test's
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, km=kernel_manager(tmp_path / "kernels"), timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the cell and its traceback
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} shows no drawing or plot"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for k, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: cell {k} has outputs"
