"""bench/gpu.py: one line and status 0 without CUDA; its template part runs under the interpreter."""
from __future__ import annotations

import pytest
import torch

from tilefold.bench import gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark would run for real")
def test_without_cuda_one_line_and_status_zero(capsys):
    assert gpu.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA GPU" in out


@pytest.mark.parametrize("dtype", gpu.DTYPES)
def test_template_benchmarks_run_under_the_interpreter(capsys, dtype):
    assert gpu.main(["--device", "interp", "--dtype", dtype]) == 0
    out = capsys.readouterr().out
    for row in ("packed 16x16 weight", "row-major (K, N) weight", "row-major transposed (N, K) weight",
                "conv", "softmax", "layer norm", "attention"):
        assert row in out
    assert out.count("   ratio ") == 7


def test_tf32_goes_on_each_kernel_with_a_product(capsys):
    """--tf32 sets the products' precision on the anchors of the kernels that run them: the
    attention's second MatMul, inside the first one's kernel, takes none (a configuration on
    it would be refused)."""
    assert gpu.main(["--device", "interp", "--tf32"]) == 0
    out = capsys.readouterr().out
    assert out.count("   ratio ") == 7 and "FAILED" not in out


def test_tuned_rows_say_what_autotuning_chose(capsys):
    assert gpu.main(["--device", "interp", "--tune", "2"]) == 0
    out = capsys.readouterr().out
    tuned = [line for line in out.splitlines() if "tuned (" in line]
    assert len(tuned) == 2 and all("BLOCK" in line and "num_warps=" in line for line in tuned)
    assert tuned[0].startswith("matmul") and "conv" in tuned[1]
