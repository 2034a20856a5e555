"""`Optimized.kernels()`: the generated Triton source of an optimized graph, for people."""
from __future__ import annotations

import html

import tilefold
from tilefold.bench.models import mlp_model


def test_kernels_lists_each_generated_kernel_with_the_nodes_it_runs():
    opt = tilefold.optimize(tilefold.load(mlp_model(batch=4, sizes=(40, 24, 7), seed=0)), "gpu")
    listing = opt.kernels()
    names = [n for nodes, _ in listing.kernels for n in nodes]
    anchors = [n.name for n in opt.graph.nodes() if n.op == "MatMul"]
    assert set(anchors) <= set(names)  # every matmul runs in a generated kernel
    assert len(listing) == len(listing.kernels) >= 2
    text = str(listing)
    assert text.count("@triton.jit") == len(listing) and all(f"kernel for {a}" in text for a in anchors)
    page = listing._repr_html_()
    assert page.count("<pre>") == len(listing)
    assert all(html.escape(source) in page for _, source in listing.kernels)  # masks hold "<": escaped
