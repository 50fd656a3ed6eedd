"""`WarmSandbox`: one warm process imports torch once and forks each run, with the run's own limits.

One warm sandbox is shared by the module (its start pays the torch import once); each test
asserts what happened to the run and that the next run still works. Cold-child containment
is in test_hostile_models.py and test_sandbox.py.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from ckpt_viz.errors import SandboxCrashError, SandboxError, SandboxMemoryError, SandboxTimeoutError
from ckpt_viz.events import EventBase
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.trace import Trace
from ckpt_viz.usermodel.load import ModelLoadError, load_model
from ckpt_viz.usermodel.sandbox import record_in_subprocess
from ckpt_viz.usermodel.warm import WarmSandbox
from procs import live_processes

ROOT = Path(__file__).resolve().parent.parent.parent
BAD = ROOT / "tests" / "data" / "bad_models"
HOSTILE = ROOT / "tests" / "data" / "hostile"
EXAMPLE = f"{ROOT / 'examples' / 'user_model.py'}:make_model"
pytestmark = pytest.mark.slow

PROBE = '''import os, sys
def make_model():
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\\0", b" ").decode()
    raise RuntimeError(f"pid={os.getpid()} ppid={os.getppid()} torch_loaded={'torch' in sys.modules} "
                       f"parent=[{parent.strip()}]")
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder under /tmp (hidden in the sandbox unless bound) that the shared warm sandbox binds at start."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def warm(models: Path) -> Iterator[WarmSandbox]:
    box = WarmSandbox(readable=[str(models)])
    box.start()
    yield box
    box.close()


def _one(box: WarmSandbox, ref: str, mode: str = "reentrant", **kw: object) -> Trace:
    (out,) = box.record(ref, [mode], **kw)
    if isinstance(out, BaseException):
        raise out
    return out


def _kinds(trace: Trace) -> list[str]:
    return [e.kind for e in trace.events]


def _own_fields(event: object) -> dict:
    """The fields of the event's kind (not the ones every event has)."""
    return {f: getattr(event, f) for f in event.__struct_fields__ if f not in EventBase.__struct_fields__}


def test_each_run_is_a_fresh_fork_of_one_warm_process_that_imported_torch(warm: WarmSandbox,
                                                                         models: Path) -> None:
    probe = models / "probe.py"
    probe.write_text(PROBE)
    seen = []
    for _ in range(2):
        with pytest.raises(ModelLoadError) as info:
            _one(warm, f"{probe}:make_model")
        found = re.search(r"pid=(\d+) ppid=(\d+) torch_loaded=(True|False)", str(info.value))
        assert found, str(info.value)
        seen.append(dict(zip(("pid", "ppid", "torch_loaded"), found.groups(), strict=True)))
    assert [s["torch_loaded"] for s in seen] == ["True", "True"]  # imported before the model file was
    assert "-m ckpt_viz.usermodel.forked " in str(info.value)  # its parent: the warm process
    assert seen[0]["ppid"] == seen[1]["ppid"] and seen[0]["pid"] != seen[1]["pid"]  # one parent, two children
    trace = _one(warm, EXAMPLE)
    expected = run_scenario(load_model(EXAMPLE), "reentrant")
    assert _kinds(trace) == _kinds(expected) and trace.count("handle_created") == 3
    assert warm.starts == 1  # three runs, one torch import


def test_a_warm_run_records_the_same_trace_as_a_cold_child(warm: WarmSandbox) -> None:
    def facts(trace: Trace) -> list[tuple]:
        return [msgspec.structs.replace(e, t_ns=0, thread_id=0, site=None) for e in trace]

    extra = {"memory": True, "graphs": True}
    (hot,) = warm.record(EXAMPLE, ["split-reentrant"], extra=extra)
    cold = record_in_subprocess(EXAMPLE, "split-reentrant", extra=extra)
    assert isinstance(hot, Trace) and facts(hot) == facts(cold)  # the warm-up left nothing in the recording
    assert [m.bytes_by_category for m in hot.memory] == [m.bytes_by_category for m in cold.memory]
    status = Path(f"/proc/{warm._pid}/status").read_text()
    assert "Threads:\t1\n" in status  # no thread pool to break the next fork


@pytest.mark.serial  # the time limit of 3 s ends the run in under 8 s (wall clock)
def test_limits_apply_to_each_run_and_a_failed_run_does_not_break_the_next(warm: WarmSandbox) -> None:
    with pytest.raises(SandboxMemoryError) as info:
        _one(warm, f"{BAD / 'allocates_too_much.py'}:make_model", memory_mb=2048)
    assert "ran out of memory under the limit of 2048 MB (RLIMIT_AS, address space)" in str(info.value)
    start = time.monotonic()
    with pytest.raises(SandboxTimeoutError) as timed_out:
        _one(warm, f"{BAD / 'sleeps_forever.py'}:make_model", timeout_s=3)
    assert 3 <= time.monotonic() - start < 8
    assert "did not finish within 3 s" in str(timed_out.value)
    assert timed_out.value.file == str(BAD / "sleeps_forever.py")  # the stack dump named the model's line
    with pytest.raises(SandboxCrashError, match="was killed by SIGSEGV"):
        _one(warm, f"{BAD / 'segfaults.py'}:make_model")
    assert _one(warm, EXAMPLE).count("handle_created") == 3  # the warm process outlived all three
    assert warm.starts == 1


def test_a_run_cannot_kill_the_warm_process_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    box = WarmSandbox(readable=[str(tmp_path)])
    try:
        model = Path(shutil.copy(HOSTILE / "kills_parent.py", tmp_path / "kills_parent.py"))
        assert _one(box, EXAMPLE).count("handle_created") == 3
        warm = box._pid
        with pytest.raises(ModelLoadError) as info:
            _one(box, f"{model}:make_model")
        message = str(info.value)  # SIGKILL to its parent, its group and every process: sent, and no effect,
        assert "still running as pid" in message and "parent 1;" in message  # the warm process is PID 1 of
        assert "parent: sent" in message and "everyone: " in message  # the sandbox (NOTE [ What the sandbox
        assert _one(box, EXAMPLE).count("handle_created") == 3  # guarantees ]): the kernel ignores them
        assert box.starts == 1 and box._pid == warm
        os.kill(warm, signal.SIGKILL)  # a warm process that died all the same (from outside): the next run starts
        deadline = time.monotonic() + 10
        while box.alive and time.monotonic() < deadline:  # its sandbox ends with it (PID 1)
            time.sleep(0.01)
        assert _one(box, EXAMPLE).count("handle_created") == 3  # a fresh one (tmp_path was bound from the start)
        assert box.starts == 2 and box._pid != warm
    finally:
        box.close()


def test_processes_a_run_leaves_end_with_it(warm: WarmSandbox, models: Path) -> None:
    model = Path(shutil.copy(HOSTILE / "new_session.py", models / "new_session.py"))
    assert _one(warm, f"{model}:make_model").count("handle_created") > 0
    assert live_processes(str(model)) == []


@pytest.mark.serial  # the run ends within 1 s of the cancel (wall clock)
def test_cancel_kills_a_looping_run_at_once(warm: WarmSandbox, models: Path) -> None:
    model = Path(shutil.copy(HOSTILE / "sleeps_with_helper.py", models / "sleeps_with_helper.py"))
    cancel = threading.Event()
    threading.Timer(1.5, cancel.set).start()
    start = time.monotonic()
    (out,) = warm.record(f"{model}:make_model", ["reentrant"], timeout_s=60, cancel=cancel)
    assert time.monotonic() - start < 1.5 + 1.0
    assert isinstance(out, SandboxError) and "was cancelled after" in str(out)
    assert live_processes(str(model)) == []  # the helper it started is gone too
    assert _one(warm, EXAMPLE).count("handle_created") == 3


def test_compare_runs_every_mode_in_one_child(warm: WarmSandbox) -> None:
    modes = ["none", "nonreentrant", "reentrant", "split-reentrant"]
    out = warm.record(EXAMPLE, modes, extra={"memory": True, "graphs": True})
    for mode, trace in zip(modes, out, strict=True):
        assert isinstance(trace, Trace), trace
        (alone,) = warm.record(EXAMPLE, [mode], extra={"memory": True, "graphs": True})  # a child of its own
        assert isinstance(alone, Trace) and _kinds(trace) == _kinds(alone), mode
        assert [_own_fields(e) for e in trace] == [_own_fields(e) for e in alone], mode
        assert trace.meta["mode"] == mode


@pytest.mark.serial  # the wait ends within 1 s of the cancel (wall clock)
def test_a_start_shows_its_stages_and_cancel_ends_the_wait_for_it_at_once() -> None:
    box = WarmSandbox()
    try:
        box.start()
        assert box.stage in ("starting", "importing torch") and not box.wait_started(0)
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        start = time.monotonic()
        (out,) = box.record(EXAMPLE, ["reentrant"], cancel=cancel)
        assert time.monotonic() - start < 0.3 + 1.0  # not the whole start
        assert isinstance(out, SandboxError) and "was cancelled after" in str(out), out
        assert "while the sandbox was starting" in str(out) and "no code of the model file ran" in str(out)
        seen = {box.stage}
        while not box.wait_started(0.01):  # the start went on without anyone waiting for it
            seen.add(box.stage)
        assert seen <= {"starting", "importing torch", "importing torch._dynamo", "warming up", "ready"}, seen
        assert box.stage == "ready" and box.start_s > 0.5
        assert _one(box, EXAMPLE).count("handle_created") == 3 and box.starts == 1  # that start, not a new one
        folder = str(box._folder)
    finally:
        box.close()
    assert box.stage == "" and live_processes(folder) == []  # the warm process and bubblewrap are gone
