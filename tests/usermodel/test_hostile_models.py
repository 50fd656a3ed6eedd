"""Containment: hostile model files (tests/data/hostile) against `record_in_subprocess`.

Each test asserts what actually happened: the parent alive, no process of the run left,
nothing written or sent outside the sandbox, no secret inside it. Tests that need a
bubblewrap namespace or a memory cgroup skip with the missing capability named (CI runs
as root with bubblewrap installed by scripts/setup.sh, where none of them skip).
Each spawns a child (Python start plus a torch import: 3-7 s).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from ckpt_viz.usermodel import sandbox
from ckpt_viz.usermodel.isolation import ENV_ALLOWLIST, Cgroup, Limits, bwrap_problem
from ckpt_viz.usermodel.load import ModelLoadError
from ckpt_viz.usermodel.processes import sweep
from ckpt_viz.usermodel.sandbox import SandboxMemoryError, SandboxWarning, record_in_subprocess

ROOT = Path(__file__).resolve().parent.parent.parent
HOSTILE = ROOT / "tests" / "data" / "hostile"
EXAMPLE = f"{ROOT / 'examples' / 'user_model.py'}:make_model"
BWRAP = bwrap_problem()
pytestmark = pytest.mark.slow  # every test here starts sandboxed children (2-10 s each)


def _memory_cgroup() -> str | None:
    group = Cgroup.create(f"ckpt_viz_probe_{os.getpid()}", Limits(10.0, 1024, 1, 1))
    if group is None or group.memory is None:
        return "no writable memory cgroup under /sys/fs/cgroup"
    group.remove()
    return None


CGROUP = _memory_cgroup()
needs_bwrap = pytest.mark.skipif(BWRAP is not None, reason=f"needs bubblewrap's namespaces: {BWRAP}")
needs_cgroup = pytest.mark.skipif(CGROUP is not None, reason=f"needs a memory cgroup: {CGROUP}")
needs_either = pytest.mark.skipif(BWRAP is not None and CGROUP is not None,
                                  reason=f"needs bubblewrap ({BWRAP}) or a cgroup ({CGROUP})")

PARENT = """import os
from ckpt_viz.usermodel.sandbox import record_in_subprocess
try:
    record_in_subprocess(os.environ["CKPT_VIZ_TEST_REF"], "reentrant", timeout_s=60)
    print("returned a trace")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def _copy(tmp_path: Path, name: str) -> Path:
    """The hostile model in a folder of its own: its path marks the processes it starts."""
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    return Path(shutil.copy(HOSTILE / name, folder / name))


def _processes(*markers: str) -> list[int]:
    """Live (not zombie) processes whose command line contains every one of `markers`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if all(m.encode() in cmdline for m in markers) and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def _wait_for(predicate, timeout: float) -> float:
    """Seconds until `predicate()` held (polled every 10 ms); fails the test after `timeout`."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"not within {timeout} s"
        time.sleep(0.01)
    return time.monotonic() - start


def _own_tmp(tmp_path: Path) -> Path:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp


def _env(tmp: Path, model: Path) -> dict[str, str]:
    """The parent's environment: its own temporary folder, and the model (not in its command line)."""
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), "CKPT_VIZ_TEST_REF": f"{model}:make_model"}


def _helper(model: Path) -> list[int]:
    """The sleeping helper that sleeps_with_helper.py starts."""
    return _processes("time.sleep(3600)", str(model))


@needs_bwrap
def test_model_cannot_kill_its_parent(tmp_path: Path) -> None:
    model, tmp = _copy(tmp_path, "kills_parent.py"), _own_tmp(tmp_path)
    done = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=120,
                          env=_env(tmp, model))
    assert done.returncode == 0, done.stderr  # the parent lived to print the outcome
    out = done.stdout
    assert out.startswith("ModelLoadError ") and "still running as pid" in out
    assert "parent: sent" in out and "everyone: " in out  # sent, but inside the sandbox's PID namespace
    assert _processes(str(tmp)) == [] and os.listdir(tmp) == []


@pytest.mark.serial  # the child gone within 1 s of its parent (wall clock)
@needs_bwrap
def test_killing_the_parent_ends_the_child_within_a_second(tmp_path: Path) -> None:
    model, tmp = _copy(tmp_path, "sleeps_with_helper.py"), _own_tmp(tmp_path)
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=_env(tmp, model),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _helper(model), 60)  # the model's helper runs
        parent.kill()
        parent.wait()
        assert _wait_for(lambda: not _helper(model) and not _processes(str(tmp)), 5) < 1.0
    finally:
        parent.kill()
    (left,) = os.listdir(tmp)  # a parent killed outright cannot clean up: the next run's sweep does
    sweep(str(tmp))
    assert os.listdir(tmp) == [], left
    assert [str(p) for p in Path("/sys/fs/cgroup").rglob(left)] == []  # its cgroups too


@pytest.mark.serial  # the child gone within 1 s of the CLI (wall clock)
def test_sigterm_to_the_cli_ends_the_child_and_removes_its_folder(tmp_path: Path) -> None:
    model, tmp = _copy(tmp_path, "sleeps_with_helper.py"), _own_tmp(tmp_path)
    cli = subprocess.Popen([sys.executable, "-m", "ckpt_viz", "record", f"{model}:make_model", "--mode", "reentrant",
                            "-o", str(tmp_path / "out.json"), "--timeout", "60"], env=_env(tmp, model),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: _helper(model), 60)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=10) == -signal.SIGTERM  # it still dies of the signal, after cleaning up
        assert _wait_for(lambda: not _helper(model) and not _processes(str(tmp)), 5) < 1.0
        assert os.listdir(tmp) == []
        assert not (tmp_path / "out.json").exists()
    finally:
        cli.kill()
        cli.wait()


def test_hard_limits_cannot_be_raised() -> None:
    with pytest.raises(ModelLoadError) as info:
        record_in_subprocess(f"{HOSTILE / 'raises_limits.py'}:make_model", "reentrant", timeout_s=30, memory_mb=2048)
    message = str(info.value)
    for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC"):
        assert f"{name} refused" in message
    assert "raised;" not in message and f"RLIMIT_AS refused (hard limit {2048 << 20}, soft {2048 << 20})" in message
    assert "RLIMIT_CPU refused (hard limit " in message  # soft = hard: nothing left to raise


class _Watch:
    """Samples, every 10 ms while a run lasts, the processes marked with `model`: their most at once, and
    the most anonymous memory they held together."""

    def __init__(self, model: Path) -> None:
        self.model, self.most, self.peak_bytes = str(model), 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            pids, total = _processes(self.model), 0
            for pid in pids:
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                total += 1024 * next((int(line.split()[1]) for line in status.splitlines()
                                      if line.startswith("RssAnon:")), 0)
            self.most, self.peak_bytes = max(self.most, len(pids)), max(self.peak_bytes, total)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.serial  # the run's processes and memory sampled every 10 ms
@needs_cgroup
def test_forked_processes_share_one_memory_limit(tmp_path: Path) -> None:
    model = _copy(tmp_path, "forks_allocating.py")
    with _Watch(model) as watch, pytest.raises(SandboxMemoryError) as info:
        record_in_subprocess(f"{model}:make_model", "reentrant", timeout_s=60, memory_mb=2048)
    assert "went over the memory limit of 2048 MB (all of its processes together, a cgroup)" in str(info.value)
    assert watch.most == 4  # four processes of 700 MB each: 2800 MB wanted
    assert 1000 << 20 < watch.peak_bytes < 2048 << 20  # they did allocate, and never held more than the limit
    assert _processes(str(model)) == []


@pytest.mark.serial  # the processes gone within 1 s of the run (wall clock)
@needs_either
def test_processes_in_new_sessions_end_with_the_run(tmp_path: Path) -> None:
    model = _copy(tmp_path, "new_session.py")
    with _Watch(model) as watch:
        trace = record_in_subprocess(f"{model}:make_model", "reentrant", timeout_s=60)
    assert trace.count("handle_created") > 0  # the run itself succeeded
    assert watch.most == 2  # the new session and the daemon both ran during it
    assert _wait_for(lambda: not _processes(str(model)), 5) < 1.0


@needs_bwrap
def test_writes_outside_its_folder_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _copy(tmp_path, "writes_outside.py")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        record_in_subprocess(f"{model}:make_model", "reentrant", timeout_s=30)
    assert "Read-only file system" in str(info.value) and "escaped.txt" in str(info.value)
    assert not (model.parent / "escaped.txt").exists()
    assert not (tmp_path / "relative.txt").exists()  # the relative write went to the sandbox's own folder


def test_secrets_in_the_environment_do_not_reach_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hunter2-not-a-real-token"
    monkeypatch.setenv("CKPT_VIZ_FAKE_SECRET", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(ModelLoadError) as info:
        record_in_subprocess(f"{HOSTILE / 'reads_secret.py'}:make_model", "reentrant", timeout_s=30)
    err = info.value
    assert "CKPT_VIZ_FAKE_SECRET=None" in str(err)
    assert secret not in str(err) and secret not in err.traceback
    keys = str(err).split("environment keys [", 1)[1].split("]", 1)[0].replace("'", "").split(", ")
    assert set(keys) <= {*ENV_ALLOWLIST, "PATH", "HOME", "TMPDIR", "PYTHONPATH", "PYTHONUNBUFFERED",
                         "PYTHONDONTWRITEBYTECODE", "PWD"}


@needs_bwrap
def test_network_connections_are_refused(tmp_path: Path) -> None:
    model = _copy(tmp_path, "opens_network.py")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        (model.parent / "port.txt").write_text(str(listener.getsockname()[1]))
        with pytest.raises(ModelLoadError) as info:
            record_in_subprocess(f"{model}:make_model", "reentrant", timeout_s=30)
        listener.settimeout(0.2)
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing ever connected
    assert "Connection refused" in str(info.value) or "Network is unreachable" in str(info.value)


def test_without_bubblewrap_a_warning_says_once_what_is_not_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    monkeypatch.setattr(sandbox, "_warned", set())
    with pytest.warns(SandboxWarning) as caught:
        trace = record_in_subprocess(EXAMPLE, "reentrant", timeout_s=60)
    assert trace.count("handle_created") == 3
    (warning,) = caught
    text = str(warning.message)
    assert text.startswith("ckpt_viz.record_in_subprocess: bubblewrap (bwrap) is not installed, so model files "
                           "run without isolation: they can read any file you can")
    assert "signal your processes" in text and text.splitlines()[-1].startswith("Tip: install bubblewrap")
    with warnings.catch_warnings():  # a second run: no second warning
        warnings.simplefilter("error", SandboxWarning)
        with pytest.raises(ModelLoadError):
            record_in_subprocess(f"{HOSTILE / 'raises_limits.py'}:make_model", "reentrant", timeout_s=30)


@needs_bwrap
def test_without_a_cgroup_a_warning_says_the_memory_limit_is_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.Cgroup, "create", classmethod(lambda cls, name, limits: None))
    monkeypatch.setattr(sandbox, "_warned", set())
    with pytest.warns(SandboxWarning, match="the memory limit applies to each of the model's processes on its own"):
        trace = record_in_subprocess(EXAMPLE, "reentrant", timeout_s=60)
    assert trace.meta["sandbox"]["isolation"] == "bubblewrap"
