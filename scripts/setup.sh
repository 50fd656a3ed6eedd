#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with ckpt_viz and the tested versions
# (constraints.txt), plus the system packages the app and the browser tests use, where this
# platform allows it (Debian/Ubuntu as root). Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi

# System packages: graphviz (server-side SVG), Debian's chromium (browser tests) and
# bubblewrap and libseccomp (the sandbox for model files: namespaces, read-only system, a seccomp filter) and
# valgrind (the counted cache profile, benchmarks/profile_cache.py, and its smoke test). No compiler: ckpt_viz
# builds no C.
want=()
command -v dot >/dev/null 2>&1 || want+=(graphviz)
[ -x /usr/bin/chromium ] || want+=(chromium)
command -v bwrap >/dev/null 2>&1 || want+=(bubblewrap)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || want+=(libseccomp2)  # the sandbox's seccomp filter
command -v callgrind_control >/dev/null 2>&1 || want+=(valgrind)
if [ ${#want[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] apt-get install ${want[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
  else
    echo "[setup] note: missing system packages (${want[*]}); install them with your package manager." >&2
  fi
fi

echo "[setup] installing ckpt_viz and its tested dependencies into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev,hf,plan]" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
.venv/bin/python -c "import torch, ckpt_viz; print('[setup] ok: torch', torch.__version__)"
