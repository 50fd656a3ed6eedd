"""`record_in_subprocess`: a user model runs in a child with time and memory limits; each failure is reported.

Each test that spawns a child pays for a Python start and a torch import (3-7 s), so
there are few of them; the timeout test takes its 8 s limit. Hostile models (containment)
are in test_hostile_models.py.
"""
from __future__ import annotations

import gzip
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from ckpt_viz.errors import HandleReleasedError
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.trace import Trace
from ckpt_viz.usermodel.child import _report
from ckpt_viz.usermodel.isolation import Limits, bwrap_problem
from ckpt_viz.usermodel.load import ModelLoadError, load_model
from ckpt_viz.usermodel.readback import load_trace, read
from ckpt_viz.usermodel.sandbox import (
    SandboxCrashError,
    SandboxError,
    SandboxMemoryError,
    SandboxRunError,
    SandboxTimeoutError,
    record_in_subprocess,
)
from procs import live_processes

ROOT = Path(__file__).resolve().parent.parent.parent
BAD = ROOT / "tests" / "data" / "bad_models"
HOSTILE = ROOT / "tests" / "data" / "hostile"
EXAMPLE = f"{ROOT / 'examples' / 'user_model.py'}:make_model"


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
    assert [e.kind for e in trace] == [e.kind for e in expected]
    assert _handle_ranks(trace) == _handle_ranks(expected)  # ids are sequential per process (spec D2)
    assert trace.meta["model"] == EXAMPLE and trace.meta["sandbox"] == {
        "memory_mb": 4096, "ref": EXAMPLE, "isolation": "limits only" if bwrap_problem() else "bubblewrap"}
    assert _sandbox_dirs() <= before  # the temporary folder is gone


@pytest.mark.serial  # stopped between 8 and 12 s (wall clock)
def test_timeout_kills_the_child_and_its_subprocesses(tmp_path: Path) -> None:
    model = Path(shutil.copy(HOSTILE / "sleeps_with_helper.py", tmp_path / "sleeps_with_helper.py"))
    start = time.monotonic()
    with pytest.raises(SandboxTimeoutError) as info:
        record_in_subprocess(f"{model}:make_model", "reentrant", timeout_s=8)
    elapsed = time.monotonic() - start
    err = info.value
    assert 8 <= elapsed < 12
    assert str(err).startswith("ckpt_viz.record_in_subprocess: ")
    assert "did not finish within 8 s (mode 'reentrant', while loading the model)" in str(err)
    assert "helper started" in err.output  # the helper ran
    assert err.returncode is None
    assert (err.line, err.file) == (14, str(model)), err.output  # time.sleep(1), from the stack dump
    assert not live_processes(str(model))  # the helper is gone with the child


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
    ("exits_hard.py", 3, "exited with code 3 while loading the model, without writing a trace or an error report",
     None),
    ("segfaults.py", -signal.SIGSEGV, "was killed by SIGSEGV while loading the model, without writing a trace", 8),
])
@pytest.mark.serial  # no process left with the shared tests/data/bad_models path (test_warm.py runs segfaults.py)
def test_hostile_process_exit_is_reported(name: str, returncode: int, expected: str, line: int | None) -> None:
    with pytest.raises(SandboxCrashError) as info:
        record_in_subprocess(f"{BAD / name}:make_model", "reentrant")
    err = info.value
    assert err.returncode == returncode
    assert expected in str(err)
    assert err.line == line  # the segfault's line is read off faulthandler's stack
    assert not live_processes(f"{BAD / name}")


def test_bad_arguments_fail_before_spawning() -> None:
    with pytest.raises(SandboxError, match="unknown extra key"):
        record_in_subprocess(EXAMPLE, "reentrant", extra={"sed": 0})
    with pytest.raises(ModelLoadError, match="it names no factory"):
        record_in_subprocess("some.module", "reentrant")
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(SandboxError, match=r"timeout_s must be a positive, finite number of seconds, got "):
            record_in_subprocess(EXAMPLE, "reentrant", timeout_s=bad)
    for bad in (0, -5, 1.5, float("inf"), True):
        with pytest.raises(SandboxError, match=r"memory_mb must be a positive whole number, got "):
            record_in_subprocess(EXAMPLE, "reentrant", memory_mb=bad)
    with pytest.raises(SandboxError, match=r"max_events must be a positive whole number, got 0"):
        record_in_subprocess(EXAMPLE, "reentrant", max_events=0)


def test_the_cli_refuses_limits_that_would_disable_themselves(tmp_path: Path) -> None:
    from ckpt_viz.cli import main

    for flag, value in (("--timeout", "nan"), ("--timeout", "inf"), ("--memory-mb", "0"), ("--memory-mb", "-5")):
        assert main(["record", EXAMPLE, "--mode", "reentrant", "-o", str(tmp_path / "t.json"), flag, value]) == 2
    assert not (tmp_path / "t.json").exists()


def test_a_memory_limit_too_small_to_start_says_so() -> None:
    with pytest.raises(SandboxMemoryError) as info:
        record_in_subprocess(EXAMPLE, "reentrant", memory_mb=1)
    message = str(info.value)
    assert "could not start within its memory limit of 1 MB" in message or \
        "the child could not start within its memory limit: it ran out of memory under the limit of 1 MB" in message
    assert "the model was not loaded" in message and "passed its trial forward" not in message


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


@pytest.mark.serial  # a FIFO refused in under 1 s (wall clock)
def test_what_the_child_leaves_is_read_bounded(tmp_path: Path) -> None:
    """The parent reads only regular files, never through a link, within a cap (no spawn here)."""
    (tmp_path / "link").symlink_to("/etc/passwd")
    with pytest.raises(SandboxCrashError, match="cannot be opened"):
        read(tmp_path / "link", 2**20, "a trace file")
    os.mkfifo(tmp_path / "fifo")
    start = time.monotonic()
    with pytest.raises(SandboxCrashError, match="is not a regular file"):
        read(tmp_path / "fifo", 2**20, "a trace file")  # no writer: a blocking open would hang here
    assert time.monotonic() - start < 1
    (tmp_path / "big").write_bytes(b" " * (2**20 + 1))
    with pytest.raises(SandboxCrashError, match=r"of 1.0 MiB, over the cap of 1.0 MiB; it was not read"):
        read(tmp_path / "big", 2**20, "a trace file")
    assert read(tmp_path / "absent", 10, "a trace file") is None


def test_a_trace_over_the_event_cap_or_compressed_is_refused(tmp_path: Path) -> None:
    trace = run_scenario(load_model(EXAMPLE), "reentrant", memory=False)
    path = tmp_path / "trace.json"
    trace.save(path)
    limits = Limits(10.0, None, max_trace_mb=1, max_events=len(trace.events) + len(trace.memory))
    assert len(load_trace(path, limits).events) == len(trace.events)
    few = Limits(10.0, None, max_trace_mb=1, max_events=5)
    with pytest.raises(SandboxCrashError, match=rf"holds {len(trace.events)} events, over the cap of 5; it was"):
        load_trace(path, few)  # refused from the count in the file, before parsing it
    path.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(SandboxCrashError, match="gzip-compressed"):
        load_trace(path, limits)


def test_event_cap_applies_to_a_sandboxed_run() -> None:
    with pytest.raises(SandboxCrashError, match=r"over the cap of 10; it was not kept"):
        record_in_subprocess(EXAMPLE, "reentrant", max_events=10)
