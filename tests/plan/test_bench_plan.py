"""Smoke test: `benchmarks/bench_plan.py --quick` runs and writes its rows (no timing asserted here)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_viz.plan.schema import KINDS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_plan_quick(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_plan.py"), "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert {r["model"] for r in data["recompute"]} == {"mlp", "transformer"}
    assert all(r["predicted_ms"] > 0 and r["measured_ms"] > 0 for r in data["recompute"])
    assert [r["kind"] for r in data["planning"]] == list(KINDS)
    assert all(r["points"] >= 2 for r in data["planning"])
    assert "within 20 %" in proc.stdout and "slowest curve" in proc.stdout
