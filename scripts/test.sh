#!/usr/bin/env bash
# Set up (venv, pip install) and run the whole test suite on 8 simulated CPU devices; then the
# core subset again on the newest supported jax when a Python >= 3.12 exists (scripts/test_compat.sh;
# skip it with ALPA_PASS_SKIP_COMPAT=1). Extra arguments go to the main pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest tests -q -p no:cacheprovider "$@"
deactivate
if [ "${ALPA_PASS_SKIP_COMPAT:-0}" != "1" ]; then
  bash scripts/test_compat.sh
fi
