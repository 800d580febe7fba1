#!/usr/bin/env bash
# The one GPU check. From the repository root on a CUDA machine (no network needed):
#
#   OUT=/path/to/results RMSNORM_COMMIT=<git sha> bash benchmarks/gpu_check.sh
#
# 0. records the GPU, driver, python, torch and triton, and imports the Triton kernels (which refuse
#    a triton older than they support, with the version found);
# 1. installs Liger-Kernel from .whl/ when a wheel is there (pip download liger-kernel --no-deps -d .whl);
# 2. runs the GPU tests (tests/kernels/: test_launchers.py, test_triton_kernels.py, test_overflow.py;
#    and every test marked gpu, among them > 2^31 elements, N up to 2^20, CUDA graphs,
#    torch.compile, bitwise d weight) in $SHARDS parallel pytest processes while $SHARDS more
#    processes compile the benchmark's kernels once each, filling Triton's and inductor's on-disk
#    caches (compiling is most of the wall time);
# 3. runs the split-layout contention test alone (split rows on two streams beside a matmul loop):
#    a deadlock ends at its timeout and is reported as one;
# 4. times eager and CUDA-graph calls at decoding shapes (benchmarks/probes/gpu_decode.py);
# 5. runs the benchmark (time-boxed; VARIANTS=1 adds the forced-layout sweep), replacing the
#    gpu_bench.* of an earlier run in $OUT;
# 6. prints the summary table and the test results last.
# $OUT gets env.txt, contention.txt, decode.txt, summary.txt, gpu_bench.{csv,md,png} and
# logs.tgz (every log). About 5–6 minutes on an H200; each step has its own timeout, so the whole
# check ends within ~7.5 minutes (30 + 170 + 60 + 45 + 150 s) whatever hangs.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-benchmarks/results}
PY=${PYTHON:-python3}
SHARDS=${SHARDS:-6}
TEST_TIMEOUT=${TEST_TIMEOUT:-170}  # per test shard (a deadlocked kernel ends here, not the run)
WARM_TIMEOUT=${WARM_TIMEOUT:-170}
CONTENTION_TIMEOUT=${CONTENTION_TIMEOUT:-60}
DECODE_TIMEOUT=${DECODE_TIMEOUT:-45}
BENCH_BUDGET=${BENCH_BUDGET:-90}  # seconds for the main plan (the step ends 60 s after it)
VARIANTS=${VARIANTS:-0}  # 1: also time forced kernel layouts (up to 90 s more; raise BENCH_BUDGET's slack)
variants=()
[ "$VARIANTS" = 1 ] && variants=(--variants)
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
# Logs go to a scratch folder and come back as one archive (a remote runner may return few files).
LOG=$(mktemp -d)
trap 'tar czf "$OUT/logs.tgz" -C "$LOG" . 2>/dev/null' EXIT
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0))s] $*"; }

# 0. What we run on.
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
  "$PY" -c 'import sys, torch, triton; print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__, "| cuda", torch.version.cuda, "|", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")'
  echo "commit ${RMSNORM_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
  timeout 30 "$PY" -c 'import rmsnorm.kernels.triton as T; print("rmsnorm triton kernels import: ok (minimum triton", ".".join(map(str, T.MIN_TRITON)) + ")")' \
    || echo "rmsnorm triton kernels import FAILED (the message above says why)"
} 2>&1 | tee "$OUT/env.txt"

# 1. Liger-Kernel (pure Python) from a local wheel.
if compgen -G ".whl/liger_kernel-*.whl" >/dev/null; then
  if "$PY" -m pip install --no-index --no-deps --quiet .whl/liger_kernel-*.whl >"$LOG/liger_install.log" 2>&1; then
    stamp "liger-kernel installed from .whl/"
  else
    stamp "liger-kernel install failed (see liger_install.log); benchmarking without it"
  fi
else
  stamp "no .whl/liger_kernel-*.whl: benchmarking without Liger"
fi

# 2. Tests in shards, cache-warming benchmark shards alongside.
{
  "$PY" -m pytest tests/kernels/test_launchers.py tests/kernels/test_triton_kernels.py tests/kernels/test_overflow.py --collect-only -q -p no:cacheprovider 2>/dev/null
  "$PY" -m pytest tests -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null
} | grep '::' | grep -v contention | sort -u >"$LOG/test_ids.txt"
stamp "$(wc -l <"$LOG/test_ids.txt") tests in $SHARDS shards; warming benchmark kernels in $SHARDS more processes"
pids=()
for ((i = 0; i < SHARDS; i++)); do
  awk -v i="$i" -v n="$SHARDS" '(NR - 1) % n == i' "$LOG/test_ids.txt" >"$LOG/tests_shard$i.txt"
  if [ -s "$LOG/tests_shard$i.txt" ]; then  # an empty list would make pytest run everything
    # shellcheck disable=SC2046
    timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -rfE -p no:cacheprovider $(cat "$LOG/tests_shard$i.txt") \
      >"$LOG/tests_$i.log" 2>&1 &
    pids+=($!)
  else
    echo "0 passed (empty shard)" >"$LOG/tests_$i.log"
  fi
  timeout "$WARM_TIMEOUT" "$PY" -m rmsnorm.bench.gpu --warm "$i/$SHARDS" "${variants[@]}" \
    >"$LOG/warm_$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
stamp "tests and warm-up done"

# 3. Split rows under contention, alone on the GPU: a hang is a failure with a name, not a lost run.
timeout "$CONTENTION_TIMEOUT" "$PY" -m pytest -q -rfE -p no:cacheprovider \
  tests/kernels/test_triton_kernels.py::test_gpu_split_rows_under_contention >"$LOG/contention.log" 2>&1
case $? in
  0) contention="passed" ;;
  124 | 137) contention="TIMED OUT after ${CONTENTION_TIMEOUT}s: split rows deadlocked or stalled" ;;
  *) contention="FAILED: $(grep -E '^(E |FAILED)' "$LOG/contention.log" | head -5 | cut -c1-200)" ;;
esac
echo "split rows under contention: $contention" | tee "$OUT/contention.txt"
stamp "contention test: $contention"

# 4. Per-call cost at decoding shapes (eager and CUDA graph).
timeout "$DECODE_TIMEOUT" "$PY" benchmarks/probes/gpu_decode.py --out "$LOG/decode.json" \
  >"$OUT/decode.txt" 2>"$LOG/decode.err" || echo "decode timing failed or timed out (decode.err)" >>"$OUT/decode.txt"
stamp "decode timing done"

# 5. The benchmark (one process; kernels now mostly load from the caches).
timeout $((BENCH_BUDGET + 60)) "$PY" -m rmsnorm bench --device cuda --out "$OUT" --overwrite "${variants[@]}" \
  --budget "$BENCH_BUDGET" >"$LOG/bench.log" 2>&1
bench_rc=$?
stamp "benchmark exit code $bench_rc (log: bench.log)"
grep -E "failed|skipped|liger|copy " "$LOG/bench.log" | cut -c1-200 | tail -15

# 6. Results last: the summary table, then the test results (the tail of the output is what a
#    remote runner shows).
echo
echo "=== Benchmark summary (ours vs the best other provider; time ratio < 1 = ours faster) ==="
if [ -f "$OUT/gpu_bench.csv" ]; then
  "$PY" -c "import sys; from rmsnorm.bench import read_csv, summary; print(summary(read_csv(sys.argv[1])))" \
    "$OUT/gpu_bench.csv" | tee "$OUT/summary.txt"
else
  echo "no gpu_bench.csv (see bench.log)"
  tail -c 1500 "$LOG/bench.log"
fi
echo
echo "=== Decoding shapes (bf16, N = 4096) ==="
cat "$OUT/decode.txt"
echo
echo "=== GPU tests ==="
test_rc=0
for ((i = 0; i < SHARDS; i++)); do
  # pytest -q ends with e.g. "3 failed, 40 passed, 2 skipped in 51.2s"
  last=$(grep -E "^[0-9]+ (passed|failed|skipped|errors?|deselected)" "$LOG/tests_$i.log" | tail -1)
  if [ -z "$last" ]; then
    last="NO RESULT (timed out after ${TEST_TIMEOUT}s or crashed): $(tail -c 300 "$LOG/tests_$i.log")"
    test_rc=1
  elif echo "$last" | grep -qE "failed|error"; then
    test_rc=1
  fi
  echo "shard $i: $last"
done
grep -hE "^(FAILED|ERROR) " "$LOG"/tests_*.log | cut -c1-240 | head -30
grep -h "warm shard" "$LOG"/warm_*.log | tr '\n' ';' || true
echo "split rows under contention: $contention"
[ "$contention" = passed ] || test_rc=1
echo
stamp "done (tests $([ $test_rc = 0 ] && echo passed || echo FAILED), benchmark rc $bench_rc)"
exit $((test_rc | (bench_rc != 0)))
