#!/usr/bin/env bash
# Set up (idempotent) and start the Streamlit app on http://127.0.0.1:8501 (first page: a real run of the
# built-in default model). Extra arguments go to `streamlit run`, e.g. --server.port 8600.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/streamlit run app "$@"
