#!/usr/bin/env bash
# Set up (venv, pip install) and run the whole test suite on 8 simulated CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest tests -q -p no:cacheprovider "$@"
