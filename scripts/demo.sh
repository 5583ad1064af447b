#!/usr/bin/env bash
# Set up (venv, pip install) and run the demo: a small GPT train step auto-sharded on 8 CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python examples/demo.py "$@"
