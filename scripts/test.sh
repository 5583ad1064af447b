#!/usr/bin/env bash
# Set up (venv, pip install) and run the whole test suite on 8 simulated CPU devices; then the
# core subset again on the newest supported jax when a Python >= 3.12 exists (scripts/test_compat.sh;
# skip it with ALPA_PASS_SKIP_COMPAT=1). Extra arguments go to the main pytest run. Tests run in
# ALPA_PASS_TEST_WORKERS pytest-xdist processes (default 2: CI has 2 cores; 0 = in this process),
# one test file per worker at a time (--dist loadfile: a file's module-level references are built
# once); the 25 slowest tests are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
WORKERS="${ALPA_PASS_TEST_WORKERS:-2}"
python -m pytest tests -q -p no:cacheprovider -n "$WORKERS" --dist loadfile --durations=25 "$@"
deactivate
if [ "${ALPA_PASS_SKIP_COMPAT:-0}" != "1" ]; then
  bash scripts/test_compat.sh
fi
