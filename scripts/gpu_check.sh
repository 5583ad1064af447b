#!/usr/bin/env bash
# One prepared GPU check for a one-GPU host with a preinstalled CUDA jax and no network (the device
# machine): installs alpa_pass from this source tree (and highspy etc. from wheels carried in .whl/,
# if any), then writes to OUTDIR:
#   device.json        jax version, devices, device kind, memory
#   suite_*.json       the GPT suite on the local GPU(s): alpa_pass's auto plan vs plain jax.jit
#                      placement and the hand-written plans, median step time, model TFLOP/s, MFU
#                      (benchmarks/run_suite.py --gpu; small size, then --size 1.3B if it fits)
#   zoo.md             the plugin model-zoo table (on 8 simulated CPU devices: the same check as CI)
# Without a GPU it still runs (the suite says "skipped: no GPU"), so the CPU path can be tried here.
# Usage: bash scripts/gpu_check.sh OUTDIR [extra run_suite.py args]
set -euo pipefail
OUT=${1:?usage: bash scripts/gpu_check.sh OUTDIR [run_suite.py args]}
shift
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ "${ALPA_PASS_GPU_CHECK_NO_INSTALL:-0}" != "1" ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  "$PY" -m pip install -q --no-build-isolation --no-deps .
fi
"$PY" - "$OUT" <<'PYEOF'
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
"$PY" benchmarks/run_suite.py gpt --gpu --out "$OUT" "$@"
if "$PY" -c 'import jax, sys; sys.exit(0 if jax.devices()[0].platform == "gpu" else 1)'; then
  "$PY" benchmarks/run_suite.py gpt --gpu --size 1.3B --batch 8 --out "$OUT" "$@" || echo "gpu_check: 1.3B did not run"
fi
"$PY" benchmarks/zoo_table.py > "$OUT/zoo.md"
cat "$OUT/zoo.md"
echo "gpu_check: figures in $OUT"
