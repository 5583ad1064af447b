#!/usr/bin/env bash
# One prepared GPU check for a one-GPU host with a preinstalled CUDA jax and no network (the device
# machine): installs alpa_pass from this source tree (and highspy, nanobind from wheels carried in
# .whl/, if any), then writes to OUTDIR, most important first, each step under its own time limit
# and all of them within GPU_CHECK_BUDGET_S seconds (default 480) so the figures come back even
# when a step runs long:
#   device.json          jax version, devices, device kind, memory
#   profile_gpu.json     `alpa-pass profile` of the local devices (matmul per dtype, memory
#                        bandwidth; collectives per mesh axis where there are 2+ devices)
#   probe/               how the platform's profiler trace names the compiled module's work
#                        (benchmarks/step_trace.py --probe: summary, HLO, perfetto trace)
#   suite_gpt_small_*    the GPT suite on the local GPU(s), planned with that profile: auto vs the
#                        hand-written plans, median step time, kernel time per step (--trace),
#                        TFLOP/s, MFU (run_suite.py --gpu); copy to benchmarks/report/data/ for the
#                        report's GPU section (benchmarks/report.py)
#   gpu_memory_*.json    memory by default (benchmarks/gpu_memory.py): the budget a plan gets from
#                        the device, predicted vs compiled vs measured peak of GPT 1.3B, and the
#                        error a GPT too large for the device ends in
#   suite_gpt_1.3B_*     GPT 1.3B (batch GPU_CHECK_BATCH, default 4): auto vs DP (plain placement)
#   zoo.md               the plugin model-zoo table (on 8 simulated CPU devices: the same check as CI;
#                        GPU_CHECK_ZOO=0 skips it)
#   steps.txt            each step's exit status and seconds
# Without a GPU it still runs (the suites say "skipped: no GPU"), so the CPU path can be tried here.
# Usage: bash scripts/gpu_check.sh OUTDIR [extra run_suite.py args]
set -uo pipefail
OUT=${1:?usage: bash scripts/gpu_check.sh OUTDIR [run_suite.py args]}
shift
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_BUDGET_S:-480}))
BATCH=${GPU_CHECK_BATCH:-4}

# step NAME LIMIT_S CMD...: run CMD under min(LIMIT_S, time left before the deadline); log its status.
step() {
  local name=$1 limit=$2 left rc t0
  shift 2
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 20 ]; then
    echo "gpu_check: $name skipped (deadline)" | tee -a "$OUT/steps.txt"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== gpu_check: $name (limit ${limit}s)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@"
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
  return 0
}

# (timeout runs programs, not shell functions: the install is a bash -c of its own)
INSTALL='if ls .whl/*.whl >/dev/null 2>&1; then
    "$0" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  fi
  "$0" -m pip install -q --no-build-isolation --no-deps .'
if ls .whl/*.whl >/dev/null 2>&1; then
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "${ALPA_PASS_GPU_CHECK_NO_INSTALL:-0}" != "1" ]; then
  step install 300 bash -c "$INSTALL" "$PY"
fi

step device 60 "$PY" - "$OUT" <<'PYEOF'
import json, sys
import jax
devices = jax.devices()
info = {"jax": jax.__version__, "platform": devices[0].platform, "device_kind": devices[0].device_kind,
        "devices": len(devices)}
try:
    info["memory_stats"] = devices[0].memory_stats()
except Exception as e:  # CPU devices have none
    info["memory_stats"] = repr(e)
json.dump(info, open(f"{sys.argv[1]}/device.json", "w"), indent=1, default=str)
print(json.dumps({k: v for k, v in info.items() if k != "memory_stats"}))
PYEOF

GPU=0
"$PY" -c 'import jax, sys; sys.exit(0 if jax.devices()[0].platform == "gpu" else 1)' 2>/dev/null && GPU=1
PROFILE=()
if [ "$GPU" = 1 ]; then
  step profile 120 "$PY" -m alpa_pass.launch.cli profile --out "$OUT/profile_gpu.json"
  [ -f "$OUT/profile_gpu.json" ] && PROFILE=(--profile "$OUT/profile_gpu.json")
  step trace-probe 120 "$PY" benchmarks/step_trace.py --probe "$OUT/probe"
fi
TRACE=()
[ "$GPU" = 1 ] && TRACE=(--trace --repeats 15)  # (GPU kernel time per step; CPU traces are the suites' own)
step gpt-small 200 "$PY" benchmarks/run_suite.py gpt --gpu "${PROFILE[@]}" "${TRACE[@]}" --out "$OUT" "$@"
if [ "$GPU" = 1 ]; then
  step gpu-memory 240 "$PY" benchmarks/gpu_memory.py --size 1.3B --batch "$BATCH" --out "$OUT"
  step gpt-1.3B 300 "$PY" benchmarks/run_suite.py gpt --gpu --size 1.3B --batch "$BATCH" --methods dp \
    "${PROFILE[@]}" "${TRACE[@]}" --out "$OUT" "$@"
fi
[ "${GPU_CHECK_ZOO:-1}" = 1 ] && step zoo 300 sh -c "\"$PY\" benchmarks/zoo_table.py > \"$OUT/zoo.md\""
if [ -f "$OUT/zoo.md" ]; then cat "$OUT/zoo.md"; fi
echo "gpu_check: figures in $OUT ($(( $(date +%s) - START ))s)"
cat "$OUT/steps.txt"
