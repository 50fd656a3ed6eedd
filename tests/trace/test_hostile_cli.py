"""Hostile trace files through `ckpt-viz`: the load's TraceError as one paragraph on stderr, exit status 2, no
traceback; save errors before any work; exports written atomically. (What `Trace.load` refuses and why is
tests/trace/test_hostile.py and tests/trace/test_validation.py; these are the CLI's side of the same files.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_viz.events import Error, HandleCreated
from ckpt_viz.trace import Trace
from ckpt_viz.trace import files as trace_files

ROOT = Path(__file__).resolve().parent.parent.parent
HOSTILE = ROOT / "tests" / "data" / "hostile"


def _trace() -> Trace:
    return Trace(events=[HandleCreated(seq=0, t_ns=1, handle_id=0, site="train.py:3"),
                         Error(seq=1, t_ns=2, handle_id=0, where="backward", type="E")], meta={"model": "hand-built"})


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckpt_viz", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=dict(os.environ))


def _assert_clear_error(result: subprocess.CompletedProcess[str], path: str, *phrases: str) -> str:
    message = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr
    assert message.startswith("ckpt_viz.Trace.load: ") and path in message.splitlines()[0], message
    lines = message.splitlines()
    assert len(lines) == 2 and lines[1].startswith("Tip: ") and message.endswith("."), message  # one paragraph
    for phrase in phrases:
        assert phrase in message, message
    return message


@pytest.mark.parametrize("name", sorted(p.name for p in (HOSTILE / "refused").glob("*.json.gz")))
def test_info_on_each_refused_trace_is_one_paragraph_and_exit_2(name: str) -> None:
    path = HOSTILE / "refused" / name
    _assert_clear_error(_cli("info", str(path)), str(path))


@pytest.mark.parametrize("special, phrase", [("/dev/zero", "not a regular file but a character device"),
                                             ("/proc/self/environ", "/proc or /sys")])
def test_info_on_a_special_file(special: str, phrase: str) -> None:
    message = _assert_clear_error(_cli("info", special, timeout=30), special, phrase)
    assert "PATH=" not in message


def test_info_on_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    _assert_clear_error(_cli("info", str(fifo), timeout=30), str(fifo), "not a regular file but a FIFO")


def test_info_shows_nothing_of_a_file_a_site_names(tmp_path: Path) -> None:
    first = Path("/etc/passwd").read_text().splitlines()[0] if Path("/etc/passwd").is_file() else "root:x:0:0"
    trace = _trace()
    trace.events[:] = [HandleCreated(seq=0, t_ns=1, handle_id=0, site="/etc/passwd:1"),
                       Error(seq=1, t_ns=2, handle_id=0, where="backward", type="E", site="/etc/passwd:1")]
    trace.save(tmp_path / "t.json")
    result = _cli("info", str(tmp_path / "t.json"))
    assert result.returncode == 0 and first not in result.stdout + result.stderr, result.stderr


def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*.tmp"))


def test_cli_save_errors_come_before_the_work(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "dir" / "t.json"
    started = time.monotonic()
    result = _cli("record", "mlp", "-o", str(target))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().startswith(f"ckpt-viz record: cannot write '{target}': the folder "), result.stderr
    assert "recording" not in result.stderr and time.monotonic() - started < 60

    _trace().save(tmp_path / "t.json")
    out = tmp_path / "missing" / "x.json"
    result = _cli("export", str(tmp_path / "t.json"), "--perfetto", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().startswith(f"ckpt-viz export: cannot write '{out}': the folder "), result.stderr
    assert _temp_files(tmp_path) == []


def test_export_fsyncs_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_viz.cli import main

    _trace().save(tmp_path / "t.json")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(trace_files.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(trace_files.os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    assert main(["export", str(tmp_path / "t.json"), "--perfetto", str(tmp_path / "out.json")]) == 0
    assert calls[:2] == ["fsync", "replace"], calls
    assert json.loads((tmp_path / "out.json").read_text())["traceEvents"]
    assert _temp_files(tmp_path) == []
