#!/usr/bin/env bash
# Every GPU check of issue 7 in one call, sized for a 15-minute device lease (a machine's start
# takes 1-2 of them): the Triton tests' cuda cases, then `python -m tilefold.bench.gpu`.
# Logs go to $OUT (the device tool's folder) or ./gpu-check; bench/RESULTS.md says what to record.
#
#   bash bench/gpu_check.sh                      # on the lent machine: run(command="bash bench/gpu_check.sh", timeout_s=560)
#   TESTS_S=200 BENCH_S=300 bash bench/gpu_check.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-check}
mkdir -p "$out"
pkg=$(mktemp -d)
ln -s "$root" "$pkg/tilefold"  # the repository root is the package
export PYTHONPATH=$pkg PYTHONUNBUFFERED=1
cd "$root"
{ nvidia-smi -L; python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$out/device.txt"
# -v: one line per test as it ends, so a run stopped by the timeout still says what passed and failed
timeout "${TESTS_S:-270}" python3 -m pytest --rootdir=tests tests/backends/triton -v -n 8 -p no:cacheprovider \
    -k cuda --junitxml="$out/tests.xml" 2>&1 | tee "$out/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -30
echo "tests exit ${PIPESTATUS[0]} (124: stopped at ${TESTS_S:-270} s)"
timeout "${BENCH_S:-240}" python3 -m tilefold.bench.gpu --repeat 10 2>&1 | tee "$out/bench.log"
echo "bench exit ${PIPESTATUS[0]} (124: stopped at ${BENCH_S:-240} s)"
