#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the built-in default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m ckpt_viz demo "$@"
