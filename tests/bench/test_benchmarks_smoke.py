"""Smoke test: `benchmarks/bench_runtime.py --quick` runs, prints every row and writes valid JSON.

No timing assertions: speed is measured by the benchmark itself, not by tests. What is
asserted are facts that do not depend on the machine: every row is printed, every case
reproduces the un-checkpointed gradients (the script exits non-zero otherwise), and
the split helpers replay each region exactly once (spec D6).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_runtime.py"

ROWS = (
    "torch_reentrant",
    "ours_reentrant",
    "ours_reentrant+record",
    "torch_nonreentrant",
    "ours_nonreentrant",
    "ours_nonreentrant+record",
    "torch_split_nonreentrant",
    "ours_split_nonreentrant",
    "ours_split_reentrant",
)


def test_bench_runtime_quick(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out_json)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"

    lines = proc.stdout.splitlines()
    timing_rows = {line.split()[0] for line in lines if line.split()}
    for name in ROWS:
        assert name in timing_rows, f"row {name!r} missing from:\n{proc.stdout}"
    assert "gradients: every case matches the un-checkpointed model" in proc.stdout

    results = json.loads(out_json.read_text())
    assert [row["name"] for row in results["rows"]] == list(ROWS)
    replays = {item["name"]: item for item in results["replays"]}
    for name in ("ours_split_nonreentrant", "ours_split_reentrant"):
        item = replays[name]
        assert item["replays_per_block"] == [1] * results["config"]["blocks"], item
        assert item["recorder_replays_per_handle"] == item["replays_per_block"], item
        assert item["passed"] is True, item
    for name in ("ours_reentrant", "ours_nonreentrant"):
        assert replays[name]["agree"] is True, replays[name]


def test_bench_divergence_quick(tmp_path: Path) -> None:
    """The divergence-checking benchmark at tiny sizes: every workload row, unchanged gradients, no divergence."""
    out_json = tmp_path / "divergence.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_divergence.py"), "--quick", "--json",
                           str(out_json)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "gradients: the same with and without the checks; no divergence in these clean runs" in proc.stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["workload"].split(",")[-1].strip() for r in rows] == ["reentrant", "non-reentrant", "reentrant",
                                                                     "split-reentrant"]


# ---------------------------------------------------------------- the other benchmarks, each on a tiny size
# A timing script exits 1 when a target is missed, which a tiny run on a busy CI machine may do; that is
# not a failure here. A crash is (a traceback), and so is a missing row or an error shown by the app (2).

def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def test_bench_overhead_quick(tmp_path: Path) -> None:
    out_json = tmp_path / "overhead.json"
    proc = _run("benchmarks/bench_overhead.py", "--quick", "--json", str(out_json))
    assert proc.returncode == 0, proc.stdout
    rows = json.loads(out_json.read_text())["rows"]
    figures = {(r["group"], r["name"], r["threads"]) for r in rows}
    wanted = (("linear8", "events only / unrecorded", 1), ("linear8", "events only / unrecorded", 2),
              ("gpt2", "events only / unrecorded", 1), ("gpt2", "memory by category / unrecorded", 1),
              ("transformer", "memory by category / unrecorded", 1),
              ("runtime", "our reentrant checkpoint / torch's", 1),
              ("runtime", "our non-reentrant checkpoint / torch's", 1))
    for group, name, threads in wanted:
        assert (group, name, threads) in figures, (group, name, threads, proc.stdout)
    assert all(r["ratio"] > 0 and r["case_ms"] > 0 for r in rows), rows


def test_bench_cli_quick() -> None:
    proc = _run("benchmarks/bench_cli.py", "--quick")
    assert "median wall" in proc.stdout and "torch imported: False" in proc.stdout, proc.stdout


def test_bench_trace_io_tiny() -> None:
    proc = _run("benchmarks/bench_trace_io.py", "--events", "2000", "--repeats", "1")
    assert ".json.gz" in proc.stdout, proc.stdout


def test_bench_record_quick() -> None:
    proc = _run("benchmarks/bench_record.py", "--quick")
    assert "events+memory+graphs" in proc.stdout, proc.stdout


def test_bench_views_quick() -> None:
    proc = _run("benchmarks/bench_views.py", "--quick")
    assert proc.returncode == 0, proc.stdout


def test_bench_app_tiny() -> None:
    proc = _run("benchmarks/bench_app.py", "--events", "2000", timeout=600)
    assert "first page" in proc.stdout and "cursor jump" in proc.stdout, proc.stdout


def test_bench_app_browser_tiny() -> None:
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium is missing (apt-get install chromium)")
    proc = _run("benchmarks/bench_app.py", "--browser", "--events", "2000", "--steps", "1", timeout=600)
    assert "first page (Enter -> Overview drawn)" in proc.stdout and "cursor step" in proc.stdout, proc.stdout


def test_bench_pages_quick() -> None:
    """bench_pages.py opens every sidebar page of a small saved trace in Chromium and sees each one drawn."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium is missing (apt-get install chromium)")
    proc = subprocess.run([sys.executable, "benchmarks/bench_pages.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "every page drawn (11 visits)" in proc.stdout, proc.stdout


def test_bench_usermodel_one_round() -> None:
    """bench_usermodel.py (the sandbox panel's figures) runs one round; exit 1 is a missed target, not a failure."""
    proc = subprocess.run([sys.executable, "benchmarks/bench_usermodel.py", "--rounds", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, f"{proc.stdout}\n{proc.stderr}"
    assert "first page (warm process ready)" in proc.stdout and "change of mode" in proc.stdout, proc.stdout
    assert "paired median ratio" in proc.stdout, proc.stdout


def test_profile_recording_quick() -> None:
    """profile_recording.py prints the Python work by function and, where perf can sample here, CPU by library."""
    proc = _run("benchmarks/profile_recording.py", "--quick", timeout=600)
    totals = re.search(r"unrecorded ([\d,]+) opcodes / [\d,]+ calls; recorded ([\d,]+) /", proc.stdout)
    assert totals is not None, proc.stdout
    unrecorded, recorded = (int(v.replace(",", "")) for v in totals.groups())
    assert recorded > unrecorded, proc.stdout  # a recording's events are Python work the plain step does not do
    assert " ckpt_viz/" in proc.stdout, proc.stdout  # the table names our functions
    assert "CPU by library: not measured (" in proc.stdout or "libpython" in proc.stdout, proc.stdout


def test_profile_cache_reads_callgrinds_format(tmp_path: Path) -> None:
    """profile_cache.self_costs: names given once as `(id) name` and reused as `(id)`; the line after `calls=` is
    the callee's inclusive cost, not the caller's own; missing trailing counts are zero."""
    profile_cache = _profile_cache()
    out = tmp_path / "cg.out"
    out.write_text("# callgrind format\nversion: 1\ncreator: test\npositions: line\n"
                   "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
                   "ob=(1) /lib/libpython3.11.so\nfl=(1) ceval.c\nfn=(1) eval\n"
                   "10 100 40 20 3 2 1 1 1 1\n"
                   "cob=(2) /x/libtorch_cpu.so\ncfi=(2) mm.cpp\n"
                   "cfn=(2) at::mm\ncalls=2 5\n11 999 999 999 999 999 999 999 999 999\n"
                   "+1 7 1\n"
                   "ob=(2)\nfl=(2)\nfn=(2)\n5 50 5 5 1 1 1 1 1 1\n"
                   "ob=(1)\nfl=(1)\nfn=(1)\n12 3\n"
                   "totals: 160 46 25 4 3 2 2 2 2\n")
    costs = profile_cache.self_costs(out)
    assert costs == {("/lib/libpython3.11.so", "eval"): [110, 41, 20, 3, 2, 1, 1, 1, 1],
                     ("/x/libtorch_cpu.so", "at::mm"): [50, 5, 5, 1, 1, 1, 1, 1, 1]}
    assert profile_cache.library(("/x/libtorch_cpu.so", "f")) == "libtorch_cpu.so"


def test_profile_cache_quick(tmp_path: Path) -> None:
    """profile_cache.py counts a recorded and an unrecorded step under callgrind, and each part with --parts."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        pytest.skip("valgrind is missing (apt-get install valgrind; scripts/setup.sh does)")
    out_json = tmp_path / "cache.json"
    proc = _run("benchmarks/profile_cache.py", "--quick", "--parts", "--json", str(out_json), timeout=600)
    assert proc.returncode == 0, proc.stdout
    found = json.loads(out_json.read_text())
    per_step = found["per_step"]
    # a recording's events are work the plain step does not do: more instructions, whatever the machine
    assert per_step["recorded"]["Ir"] > per_step["unrecorded"]["Ir"] > 0, per_step
    assert per_step["added"]["Ir"] == per_step["recorded"]["Ir"] - per_step["unrecorded"]["Ir"]
    assert set(found["parts"]) == {label for label, _, _ in _profile_cache().PARTS}, found["parts"]
    assert found["parts"]["the bus: building and keeping the events"]["Ir"] > 0, found["parts"]
    interpreter = {lib: c["Ir"] for lib, c in found["by_library"].items() if lib.startswith(("libpython", "python"))}
    assert sum(interpreter.values()) > 0, found["by_library"]  # the added work is mostly the interpreter's
    assert "estimate (a model" in proc.stdout and "added by the recording" in proc.stdout, proc.stdout


def _profile_cache() -> Any:
    """benchmarks/profile_cache.py as a module (its parser and its table of parts)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_cache
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return profile_cache
