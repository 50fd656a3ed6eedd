#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
