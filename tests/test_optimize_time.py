"""bench/optimize_time.py's pieces: the generated chains are valid graphs that compute what
plain numpy computes, and the tables name every row (no timing is asserted)."""
import numpy as np
import pytest

import tilefold
from tilefold.bench import optimize_time
from tilefold.graph.verify import verify_graph


@pytest.mark.parametrize("kind", ["conv", "matmul"])
@pytest.mark.parametrize("residual", [False, True])
def test_chains_have_the_asked_op_count_and_verify(kind, residual):
    graph = optimize_time.chain(kind, 40, residual=residual)
    verify_graph(graph)
    counts = graph.op_counts()
    compute = sum(n for op, n in counts.items() if op not in ("Input", "Output", "Constant"))
    assert compute == 40
    assert counts["Conv" if kind == "conv" else "MatMul"] == 10


def test_matmul_chain_computes_its_definition():
    graph = optimize_time.chain("matmul", 12, residual=True, seed=3)
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    rng = np.random.default_rng(3)
    w0, shift = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((1, 64)).astype(np.float32)
    want = (np.maximum(x @ w0, 0) + shift) * np.float32(0.5)  # the first block: no residual
    for w in rng.standard_normal((2, 64, 64)).astype(np.float32):
        want = (np.maximum(want @ w, 0) + want) * np.float32(0.5)
    got = tilefold.compile(graph)({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_chain_rows_and_table():
    rows = [optimize_time.bench_chain("conv-cpu", n, repeat=1) for n in (40, 80)]
    assert [r.ops_before for r in rows] == [20, 40]  # each conv: its activation packed, its result unpacked
    assert all(r.ops_after <= r.ops_before and r.seconds > 0 for r in rows)
    table = optimize_time.format_chains(rows)
    assert table.count("conv-cpu") == 2 and "1.00x" in table


def test_model_rows_time_both_sides_run_by_run(tmp_path):
    from tilefold.bench import models

    path = models.mlp(tmp_path / "mlp.onnx")
    row = optimize_time.bench_model("mlp", path, repeat=2)
    assert len(row.ratios) == 2 and all(r > 0 for r in row.ratios)
    assert min(row.load, row.optimize, row.onnxruntime, row.first_tilefold, row.first_onnxruntime) > 0
    assert row.ops_after <= row.ops_before
    table = optimize_time.format_models([row])
    assert table.splitlines()[2].startswith("mlp")
    assert "-" in table.splitlines()[2].split("x")[1]  # the spread of the per-run ratios
    for said in ("no file written", "optimized_model_filepath", "warm-up", "imports excluded"):
        assert said in table


def test_gc_clock_counts_collections_only_inside_its_block():
    import gc

    with optimize_time.GcClock() as clock:
        gc.collect()
    seconds = clock.seconds
    gc.collect()
    assert seconds > 0 and clock.seconds == seconds
