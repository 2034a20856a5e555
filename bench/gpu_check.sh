#!/usr/bin/env bash
# Every GPU check of issue 7 in one call, sized for a 15-minute device lease (a machine's start
# takes 1-2 of them): one small model (stops the run if the backend cannot launch), the cuda
# cases of the Triton tests and of the torch.compile backend's Triton tests (not the sm_80/sm_90
# compile tests, which CI runs without a GPU), then `python -m tilefold.bench.gpu`, then
# `python -m tilefold.bench.ablate`, each under its own time limit (the benchmark gets what the
# tests leave of TOTAL_S but ABLATE_S; the ablation what is left after it).
# Logs go to $OUT (the device tool's folder) or ./gpu-check; bench/RESULTS.md says what to record.
#
#   bash bench/gpu_check.sh                      # on the lent machine: run(command="bash bench/gpu_check.sh", timeout_s=580)
#   TESTS_S=120 TOTAL_S=300 BENCH_ARGS="--skip-templates --skip-inductor" bash bench/gpu_check.sh
#   ABLATE_ARGS="--models llama" ABLATE_S=200 bash bench/gpu_check.sh
set -uo pipefail
start=$SECONDS
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-check}
mkdir -p "$out"
pkg=$(mktemp -d)
ln -s "$root" "$pkg/tilefold"  # the repository root is the package
export PYTHONPATH=$pkg PYTHONUNBUFFERED=1
cd "$root"
{ nvidia-smi -L; python3 -c "import sys, torch, triton, numpy, onnx; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'onnx', onnx.__version__)"; nproc; date -u; } | tee "$out/device.txt"
# One small model on the GPU first: if the backend cannot launch at all, stop here, with the
# traceback, and leave the lease's time for another try.
python3 - <<'PY' 2>&1 | tee "$out/preflight.log"
import numpy as np, tilefold
from tilefold.backends.numpy import NumpyExecutable
from tilefold.backends.triton import TritonExecutable
from tilefold.bench.models import mlp_model
from tilefold.frontends.onnx import load_onnx
graph = tilefold.optimize(load_onnx(mlp_model(batch=5, sizes=(40, 72, 24))), "gpu").graph
exe = TritonExecutable(graph, device="cuda")
for seed in range(3):  # recorded, then replayed (a captured CUDA graph) on fresh inputs
    x = {"x": np.random.default_rng(seed).standard_normal((5, 40)).astype(np.float32)}
    got, want = exe(x)["y"], NumpyExecutable(graph)(x)["y"]
    print("preflight: MLP on cuda, fallback nodes", exe.fallback_nodes, "max abs error",
          float(np.abs(got - want).max()), "launches:", exe.launch_path)
PY
[ "${PIPESTATUS[0]}" = 0 ] || { echo "preflight failed: the backend does not run on this GPU"; exit 1; }
per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 120")  # a hung kernel fails its test alone
# SIGINT at the limit: pytest then still prints its summary; failures.txt gets each traceback at once.
# -v: one line per test as it ends, so a run stopped early still says what passed and failed.
FAILURE_LOG="$out/failures.txt" timeout -s INT -k 20 "${TESTS_S:-270}" python3 -m pytest -p tilefold.bench.failure_log --rootdir=tests tests/backends/triton tests/frontends/fx/test_fx_backend_triton.py -v -n "${WORKERS:-12}" \
    -p no:cacheprovider $per_test --tb=short -rfE -k "cuda and not cuda_compile" --junitxml="$out/tests.xml" > "$out/tests.log" 2>&1
echo "tests exit $? after $((SECONDS - start)) s (124 or 130: stopped at ${TESTS_S:-270} s)"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/tests.log" | tail -40
left=$(( ${TOTAL_S:-540} - ${ABLATE_S:-120} - (SECONDS - start) ))
timeout -s INT -k 20 "$left" python3 -m tilefold.bench.gpu --repeat 10 ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
echo "bench exit ${PIPESTATUS[0]} after $((SECONDS - start)) s (124 or 130: stopped at $left s)"
# Last, which of the gpu target's bets pay (bench/ablate.py), LLaMA first, in what is left: each row is
# printed as it is measured, so a run stopped at the limit keeps the rows it made.
left=$(( ${TOTAL_S:-540} - (SECONDS - start) ))
timeout -s INT -k 20 "$left" python3 -m tilefold.bench.ablate --repeat 10 ${ABLATE_ARGS:-} 2>&1 | tee "$out/ablate.log"
echo "ablation exit ${PIPESTATUS[0]} after $((SECONDS - start)) s (124 or 130: stopped at $left s)"
