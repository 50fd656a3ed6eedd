#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. CI runs exactly this (see .ci/run), then ruff and mypy.
# Extra arguments go to pytest; the inner loop while editing skips the slow and browser tests:
#   bash scripts/test.sh -m "not slow and not browser"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
