"""bench/gpu.py and bench/ablate.py: one line and status 0 without CUDA; their smoke runs
under the interpreter."""
from __future__ import annotations

import pytest
import torch

from tilefold.bench import ablate, gpu


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark would run for real")
def test_ablation_without_cuda_one_line_and_status_zero(capsys):
    assert ablate.main(["--models", "llama"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA GPU" in out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ablation_runs_each_bet_off_under_the_interpreter(capsys, dtype):
    """bench/ablate.py on a small LLaMA: eager PyTorch is timed, every variant but the
    post-norm one differs from the default there (its norm prologues, attention and SwiGLU
    pair are all fused; its norms are pre-norms), each is timed against the default, and each
    computes what the default computes (to bfloat16's precision in bfloat16)."""
    assert ablate.main(["--device", "interp", "--models", "llama", "--dtype", dtype]) == 0
    out = capsys.readouterr().out
    assert f"; {dtype}," in out and "llama, eager PyTorch" in out
    rows = [line for line in out.splitlines() if line.startswith("llama, ") and "eager PyTorch" not in line]
    post_norm = "no shared norm prologues (post-norm)"
    assert [row.split("  ")[0].removeprefix("llama, ").strip() for row in rows] == [
        label for label, _, _ in ablate.VARIANTS if label != post_norm]
    assert f"llama, {post_norm}: the default's kernels and weights; not run" in out
    tolerance = 1e-5 if dtype == "float32" else 1e-2
    for row in rows:
        assert "ratio" in row and float(row.split("difference from the default ")[1]) < tolerance


def test_ablation_refuses_an_unknown_model():
    with pytest.raises(SystemExit):
        ablate.main(["--models", "llama,t5"])
