"""`record_in_subprocess`: a user model runs in a child with time and memory limits; each failure is reported.

Each test that spawns a child pays for a Python start and a torch import (2-4 s), so
there are few of them; the timeout test takes its 8 s limit.
"""
from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from ckpt_viz.errors import HandleReleasedError
from ckpt_viz.usermodel.sandbox import (
    SandboxCrashError,
    SandboxError,
    SandboxMemoryError,
    SandboxRunError,
    SandboxTimeoutError,
    _report,
    record_in_subprocess,
)
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.trace import Trace
from ckpt_viz.usermodel.load import ModelLoadError, load_model

ROOT = Path(__file__).resolve().parent.parent.parent
BAD = ROOT / "tests" / "data" / "bad_models"
EXAMPLE = f"{ROOT / 'examples' / 'user_model.py'}:make_model"


def _alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (killed, not yet reaped by a non-reaping init) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _handle_ranks(trace: Trace) -> list[int | None]:
    """Each event's handle as its rank of first appearance."""
    rank = {h: i for i, h in enumerate(trace.handle_ids())}
    return [None if e.handle_id is None else rank[e.handle_id] for e in trace.events]


def _sandbox_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("ckpt_viz_sandbox_")}


def test_good_model_gives_the_same_trace_as_in_process() -> None:
    before = _sandbox_dirs()
    trace = record_in_subprocess(EXAMPLE, "reentrant", extra={"seed": 0})
    expected = run_scenario(load_model(EXAMPLE), "reentrant")
    assert trace.count("handle_created") == 3
    assert trace.kinds() == expected.kinds()
    assert _handle_ranks(trace) == _handle_ranks(expected)  # ids are sequential per process (spec D2)
    assert trace.meta["model"] == EXAMPLE and trace.meta["sandbox"] == {"memory_mb": 4096, "ref": EXAMPLE}
    assert _sandbox_dirs() == before  # the temporary folder is gone


def test_timeout_kills_the_child_and_its_subprocesses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("CKPT_VIZ_TEST_PIDFILE", str(pidfile))
    start = time.monotonic()
    with pytest.raises(SandboxTimeoutError) as info:
        record_in_subprocess(f"{BAD / 'sleeps_forever.py'}:make_model", "reentrant", timeout_s=8)
    elapsed = time.monotonic() - start
    err = info.value
    assert 8 <= elapsed < 12
    assert str(err).startswith("ckpt_viz.record_in_subprocess: ")
    assert "did not finish within 8 s" in str(err)
    assert err.returncode is None
    assert err.line == 18 and err.file == str(BAD / "sleeps_forever.py")  # time.sleep(1), from the stack dump
    child, grandchild = map(int, pidfile.read_text().split())
    assert child == err.pid
    assert not _alive(child) and not _alive(grandchild)


def test_memory_limit_gives_a_clear_error() -> None:
    with pytest.raises(SandboxMemoryError) as info:
        record_in_subprocess(f"{BAD / 'allocates_too_much.py'}:make_model", "reentrant", memory_mb=2048)
    err = info.value
    assert "ran out of memory under the limit of 2048 MB (RLIMIT_AS, address space)" in str(err)
    assert "you tried to allocate 8589934592 bytes" in str(err)
    assert err.line == 12 and err.file == str(BAD / "allocates_too_much.py")
    assert str(err).splitlines()[-1].startswith("Tip: ")


def test_syntax_error_passes_through_verbatim() -> None:
    ref = f"{BAD / 'syntax_error.py'}:make_model"
    with pytest.raises(ModelLoadError) as in_process:
        load_model(ref)
    with pytest.raises(ModelLoadError) as sandboxed:
        record_in_subprocess(ref, "reentrant")
    assert type(sandboxed.value) is ModelLoadError
    assert str(sandboxed.value) == str(in_process.value)
    assert (sandboxed.value.file, sandboxed.value.line) == (str(BAD / "syntax_error.py"), 6)
    assert "SyntaxError" in sandboxed.value.traceback


@pytest.mark.parametrize(("name", "returncode", "expected", "line"), [
    ("exits_hard.py", 3, "exited with code 3 without writing a trace or an error report", None),
    ("segfaults.py", -signal.SIGSEGV, "was killed by SIGSEGV without writing a trace", 8),
])
def test_hostile_process_exit_is_reported(name: str, returncode: int, expected: str, line: int | None) -> None:
    with pytest.raises(SandboxCrashError) as info:
        record_in_subprocess(f"{BAD / name}:make_model", "reentrant")
    err = info.value
    assert err.returncode == returncode
    assert expected in str(err)
    assert err.line == line  # the segfault's line is read off faulthandler's stack
    assert not _alive(err.pid)


def test_bad_arguments_fail_before_spawning() -> None:
    with pytest.raises(SandboxError, match="unknown extra key"):
        record_in_subprocess(EXAMPLE, "reentrant", extra={"sed": 0})
    with pytest.raises(ModelLoadError, match="it names no factory"):
        record_in_subprocess("some.module", "reentrant")
    with pytest.raises(SandboxError, match="timeout_s must be positive"):
        record_in_subprocess(EXAMPLE, "reentrant", timeout_s=0)


def test_child_report_kinds() -> None:
    """The child's error report (run in-process here: no spawn) picks the kind the parent maps to a class."""
    def raise_in(exc: BaseException) -> BaseException:
        try:
            raise exc
        except BaseException as caught:
            return caught

    run = _report(raise_in(ValueError("shapes differ")), stage="running mode 'reentrant'", ref="m.py:f",
                  mode="reentrant", memory_mb=1024, user_file=__file__)
    assert run["kind"] == "run" and run["line"] is not None and run["file"] == __file__
    assert run["message"].startswith("ckpt_viz.record_in_subprocess: running m.py:f in mode 'reentrant' "
                                     "raised ValueError: shapes differ.")
    ours = _report(raise_in(HandleReleasedError("ckpt_viz.x", "Cannot replay", 3, "dw_complete")),
                   stage="running", ref="m.py:f", mode="reentrant", memory_mb=1024, user_file=None)
    assert ours["kind"] == "run" and ours["message"].startswith("ckpt_viz.x: Cannot replay (handle h3).")
    memory = _report(raise_in(MemoryError()), stage="loading the model", ref="m.py:f", mode="reentrant",
                     memory_mb=1024, user_file=None)
    assert memory["kind"] == "memory" and "under the limit of 1024 MB" in memory["message"]
    assert issubclass(SandboxRunError, ModelLoadError) and issubclass(SandboxCrashError, SandboxError)
