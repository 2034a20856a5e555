"""The CPU benchmark's pieces on a small MLP: FLOP counting, timing rows and the table."""
from __future__ import annotations

from pathlib import Path

import numpy as np

import tilefold
from tilefold.bench import cpu_models, models


def mlp_case(tmp_path: Path) -> cpu_models.Case:
    path = models.mlp(tmp_path / "mlp.onnx", batch=4, sizes=(32, 64, 16), seed=1)
    feeds = {"x": np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)}
    return cpu_models.Case("mlp", path, feeds, eager=lambda: None, torch_call=lambda m, f: None)


def test_matmul_flops_counts_two_flops_per_multiply_add(tmp_path: Path) -> None:
    graph = tilefold.load(mlp_case(tmp_path).path)
    assert cpu_models.matmul_flops(graph) == 2 * 4 * (32 * 64 + 64 * 16)


def test_bench_model_times_every_runner_and_checks_its_outputs(tmp_path: Path) -> None:
    rows = cpu_models.bench_model(mlp_case(tmp_path), repeat=3, warmup=1, peers=("onnxruntime",))
    assert [r.runner for r in rows] == [f"tilefold {v}" for v in cpu_models.graph_variants()] + ["onnxruntime"]
    for row in rows:
        assert len(row.seconds) == 3 and all(s > 0 for s in row.seconds)
        assert row.error is not None and row.error < 1e-5
    assert set(rows[0].per_op) & {"MatMul", "Gemm"}  # passes may fuse MatMul + Add into Gemm

    table = cpu_models.format_table(rows)
    assert "tilefold plain" in table and "1.00x" in table  # onnxruntime against itself
    assert "ms in kernels" in cpu_models.format_top_ops(rows)


def test_per_node_profile_times_every_step_and_counts_each_products_flops(tmp_path: Path) -> None:
    from tilefold.backends.numpy import NumpyExecutable
    from tilefold.bench import nodes

    case = mlp_case(tmp_path)
    exe = NumpyExecutable(tilefold.load(case.path))
    times = nodes.best_times(exe, case.feeds, runs=2)
    names = {step.node.name for step in exe.steps}
    assert set(times.best) == names and all(t > 0 for t in times.best.values())
    assert set(times.faults) == names and all(f >= 0 for f in times.faults.values())
    graph = exe.graph
    per_node = [cpu_models.node_flops(graph, n) for n in graph.nodes()]
    assert sum(per_node) == cpu_models.matmul_flops(graph) and sorted(f for f in per_node if f) == [
        2 * 4 * 64 * 16, 2 * 4 * 32 * 64]


def test_bench_model_times_each_kernel_set(tmp_path: Path) -> None:
    rows = cpu_models.bench_model(mlp_case(tmp_path), repeat=2, warmup=1, peers=(), kernel_sets=("numpy", "aten"),
                                  variants={"plain": lambda g: g})
    assert [r.runner for r in rows] == ["tilefold plain", "tilefold plain (aten)"]
    assert all(r.error is not None and r.error < 1e-5 for r in rows)
