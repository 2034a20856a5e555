"""The generated Triton kernels of an optimized graph, shown to people: `Optimized.kernels()`
in Python and Jupyter, `tilefold kernels` on the command line. Each kernel comes with the
nodes it runs, its template and the launch configuration it runs with."""
from __future__ import annotations

import html

import onnx
import pytest

import tilefold
from tilefold.backends.triton import set_launch
from tilefold.bench.models import mlp_model
from tilefold.cli import main
from tilefold.graph.errors import VerifyError


def _optimized():
    return tilefold.optimize(tilefold.load(mlp_model(batch=4, sizes=(40, 24, 7), seed=0)), "gpu")


def test_kernels_lists_each_generated_kernel_with_the_nodes_it_runs():
    opt = _optimized()
    listing = opt.kernels()
    names = [n for k in listing.kernels for n in k.nodes]
    anchors = [n.name for n in opt.graph.nodes() if n.op == "MatMul"]
    assert set(anchors) <= set(names)  # every matmul runs in a generated kernel
    assert len(listing) == len(listing.kernels) >= 2
    text = str(listing)
    assert text.count("@triton.jit") == len(listing) and all(f"kernel for {a}" in text for a in anchors)
    page = listing._repr_html_()
    assert page.count("<pre>") == len(listing)
    assert all(html.escape(k.source) in page for k in listing.kernels)  # masks hold "<": escaped


def test_each_kernel_shows_the_launch_configuration_it_runs_with():
    """The defaults come from shapes and the target's tile; a user's override replaces only
    the keys it sets, and the title line says both."""
    opt = _optimized()
    matmul = next(k for k in opt.kernels().kernels if k.template == "matmul")
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"} <= set(matmul.launch)
    set_launch(opt.graph, matmul.nodes[0], BLOCK_N=16, num_warps=2)
    again = next(k for k in opt.kernels().kernels if k.nodes == matmul.nodes)
    assert again.launch == {**matmul.launch, "BLOCK_N": 16, "num_warps": 2}
    assert "matmul: " in again.title and "BLOCK_N=16" in again.title and "num_warps=2" in again.title


def test_a_configuration_the_executor_would_refuse_is_an_error_in_the_listing_too():
    opt = _optimized()
    anchor = next(k for k in opt.kernels().kernels if k.template == "matmul").nodes[0]
    set_launch(opt.graph, anchor, BLOCK_M=24)
    with pytest.raises(VerifyError, match=f"'{anchor}'.*BLOCK_M=24 is not a positive power of two"):
        opt.kernels()


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kernels") / "mlp.onnx"
    model = mlp_model(batch=4, sizes=(40, 24, 7), seed=0)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, path)
    return path


def test_the_kernels_command_prints_every_kernel_of_the_optimized_model(mlp_file, capsys):
    assert main(["kernels", str(mlp_file), "--dim", "batch=32"]) == 0
    text = capsys.readouterr().out
    titles = [line for line in text.splitlines() if line.startswith("# ---- kernel for ")]
    assert len(titles) == text.count("@triton.jit") >= 2
    assert all("[" in t and "BLOCK" in t and "num_warps=" in t for t in titles)
    assert "# x: float32[32x40]" in text  # kernels are generated for the static shapes --dim gives


def test_the_kernels_command_filters_by_node_and_says_when_nothing_matches(mlp_file, capsys):
    assert main(["kernels", str(mlp_file), "--node", "matmul0"]) == 0
    text = capsys.readouterr().out
    assert text.count("@triton.jit") == 1 and "# ---- kernel for matmul0" in text
    assert main(["kernels", str(mlp_file), "--node", "no_such_node*"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no kernel runs a node matching 'no_such_node*'" in err and "\n" not in err
