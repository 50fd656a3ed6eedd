"""A warm sandbox: one contained process that has imported torch, forking one child per run.

`WarmSandbox.record(ref, modes, ...)` gives the same traces and the same errors as
`record_in_subprocess`, without paying Python's start and torch's import for each run (3-5 s),
and runs several modes in one child (the app's Compare). The app keeps one per session.
Standard library plus ckpt_viz's torch-free modules; never imports the UI.

NOTE [ Warm child ]
  1. `start()` makes a folder `ckpt_viz_sandbox_<parent pid>_*` (the sweep of
     NOTE [ Sandbox protocol ], rule 4, removes it if the parent is killed outright) and
     starts `python -m ckpt_viz.usermodel.forked FOLDER` in bubblewrap (where it
     runs), exactly as a cold child is started: same namespaces, read-only system, the
     folder a tmpfs (NOTE [ Run folder ]), the cleared environment, `--die-with-parent`,
     in a cgroup of its own (no memory limit: it runs none of the user's code). It
     imports torch and the runner, then torch._dynamo (most of a first recording's
     lazy set-up: its first dispatch imports it), records a built-in model once in each
     common mode with one torch thread (a process's first recording took 10 s against
     0.3 s on a loaded machine; a thread pool made before a fork would hang the
     children, so each child makes its own), and says `ready` (rule 7).
  2. Each run gets a folder `run-N` in it with its `request.json`, and a cgroup of its
     own with the run's memory and task limits. The parent moves the warm process into
     that cgroup, asks it to fork (`run run-N`), and moves it back: the child and every
     process it starts are in the run's cgroup, and nothing else is. The forked child
     starts a new session and applies the run's hard limits (time, address space, CPU,
     file size, tasks, no capabilities) before it loads the model: every run is its own
     process with its own limits (`ckpt_viz.usermodel.child.run_child`). It runs torch with
     one intra-op thread unless OMP_NUM_THREADS (passed through) says more: the app runs
     one child per session, often several at once, and on a busy 2-core machine a small
     model's run took 2.2-2.6 s with 2 threads against 0.6-0.7 s with one.
  3. The parent waits at most the time limit (per mode), or `cancel`; then it asks for the
     stack (SIGUSR1, on a timeout) and kills the run's cgroup, session and every process
     of the sandbox but the warm process; it reads the run's folder as a cold run's.
  4. Memory: pages the warm process touched before the fork (torch's libraries) stay
     charged to its own cgroup, so the run's cgroup counts only what the run allocates;
     RLIMIT_AS still counts the whole address space, torch's included.
  5. The warm process is started from one thread that lasts as long as the parent:
     `--die-with-parent` (PR_SET_PDEATHSIG) fires when the *thread* that started it
     ends, and a Streamlit script run's thread ends with the run.
  6. The warm process is PID 1 of its sandbox, undumpable: a run cannot ptrace, write or
     kill it (NOTE [ What the sandbox guarantees ]); one that dies all the same is replaced
     by the next `record`. It empties the tmpfs folders the last run wrote before each run.
  7. The start is read on a thread of its own (`warmstart.Start`) from the moment the
     process is started: `stage importing torch`, `stage warming up`, then `ready PID`.
     `stage` and `start_s` show its progress to a caller that did not wait for it (the
     app's panel), `wait_started` waits for it without taking a run's turn, and a run's
     `cancel` ends the wait at once (the start goes on, for the next run).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_viz.errors import CkptVizError, SandboxCrashError, SandboxError
from ckpt_viz.trace import Trace
from ckpt_viz.usermodel.isolation import (
    DEFAULT_DISK_MB,
    Cgroup,
    Limits,
    binds,
    bwrap_problem,
    child_env,
    command,
    package_root,
)
from ckpt_viz.usermodel.load import parse_ref
from ckpt_viz.usermodel.processes import PREFIX, host_pid, kill_group, namespace_strays, signal_stack, sweep
from ckpt_viz.usermodel.readback import tail
from ckpt_viz.usermodel.sandbox import (
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_TRACE_MB,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    _check_extra,
    _outcome,
    warn_isolation,
)
from ckpt_viz.usermodel.warmstart import Lines, Start

__all__ = ["WarmSandbox"]

_API = "ckpt_viz.WarmSandbox"
_START_S = 120.0  # the longest the warm process may take to import torch
_ALL: weakref.WeakSet[WarmSandbox] = weakref.WeakSet()
_LAUNCHER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ckpt_viz-warm-launcher")
_CLEANER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ckpt_viz-warm-cleaner")


class WarmSandbox:
    """A contained process that has imported torch and forks one contained child per run.

    See NOTE [ Warm child ]. Thread-safe: runs of one sandbox take turns. `close()` (or the
    parent's exit) ends it and removes its folder.
    """

    def __init__(self, readable: Sequence[str] = (), *, disk_mb: int = DEFAULT_DISK_MB) -> None:
        self._readable = [os.path.abspath(p) for p in readable]
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._folder: Path | None = None
        self._group: Cgroup | None = None
        self._lines: Lines | None = None
        self._starting: Start | None = None  # the running warm process's start, read in the background
        self._pid = 0  # the warm process's pid as the host sees it
        self._runs, self._dead = 0, False
        self.starts = 0  # how many warm processes this sandbox started (a test reads it)
        self._bound: list[str] = []  # the folders the running warm process was started with in view
        self.disk_mb = disk_mb  # its folder's size, a tmpfs under bubblewrap (NOTE [ Run folder ] in isolation)
        _ALL.add(self)

    # -- the warm process --

    def start(self) -> None:
        """Start the warm process now (in the background); `record` waits until it is ready. Never waits
        for a run in progress (then the process is there already)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
        finally:
            self._lock.release()

    def _start(self) -> None:
        self._end()
        tmp = tempfile.gettempdir()
        sweep(tmp)
        problem = bwrap_problem()
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_warm_", dir=tmp))
        for name in ("home", "tmp"):
            (folder / name).mkdir()
        self._folder, self.starts = folder, self.starts + 1
        self._group = Cgroup.create(folder.name, Limits(_START_S, None, 1, 1))
        warn_isolation(problem, None, None, stacklevel=4)
        sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        (folder / "warm.json").write_text(json.dumps({"sys_path": sys_path, "parent_pid": os.getpid(),
                                                      "isolated": problem is None}))
        self._bound = [*self._readable, *sys_path, package_root(), sys.prefix, sys.base_prefix,  # the package
                       os.path.dirname(sys.executable)]  # root too: an editable install is not on sys.path
        self._isolated = isolate = problem is None
        host_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # See NOTE [ Run folder ] in isolation
        python = [sys.executable, "-m", "ckpt_viz.usermodel.forked", str(folder),
                  *(["--host-fd", str(host_fd)] if isolate else [])]
        argv = command(python, workdir=folder, readable=self._bound, disk_mb=self.disk_mb,
                       cgroup_files=self._group.procs_files if self._group else (), isolate=isolate)
        try:
            with open(folder / "warm.log", "wb") as log:  # started by a thread that lives as long as the process:
                self._proc = _LAUNCHER.submit(  # --die-with-parent follows the thread that started it, and a
                    subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,  # Streamlit
                    cwd=folder, env=child_env(folder), start_new_session=True,  # run's thread soon ends
                    pass_fds=(host_fd,) if isolate else ()).result()
        finally:
            os.close(host_fd)
        assert self._proc.stdout is not None
        self._lines = Lines(self._proc.stdout.fileno())
        self._pid = 0
        self._starting = Start(self._lines, _START_S)  # See NOTE [ Warm child ], rule 7

    def wait_ready(self) -> None:
        """Start the warm process if needed and wait until it has imported torch."""
        with self._lock:
            self._ready()

    def wait_started(self, timeout_s: float | None = None) -> bool:
        """Wait, without starting one or taking turns with runs, until the start of the warm process under
        way is over; True when it is ready (False: none started, it failed, or `timeout_s` passed)."""
        starting = self._starting
        return starting is not None and starting.wait(timeout_s=timeout_s) and starting.ready

    @property
    def stage(self) -> str:
        """How far the warm process's start got: "starting", "importing torch", "warming up", "ready";
        "" when none is running."""
        starting = self._starting
        return starting.stage if starting is not None and self._proc is not None else ""

    @property
    def start_s(self) -> float:
        """Seconds the warm process's start took, or has taken so far; 0 when none is running."""
        starting = self._starting
        if starting is None or self._proc is None:
            return 0.0
        return starting.seconds if starting.done.is_set() else time.monotonic() - starting.began

    def _ready(self, cancel: threading.Event | None = None) -> bool:
        """Wait for the warm process's `ready`; start one if there is none (or it died). False: `cancel` was
        set first (the start goes on, for the next run)."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        if self._pid:
            return True
        assert self._starting is not None and self._proc is not None and self._folder is not None
        if not self._starting.wait(cancel):
            return False
        line = self._starting.line
        if line is None or not line.startswith("ready "):
            log = tail(self._folder / "warm.log")
            said = (f"said {line!r}" if line is not None else "ended" if self._starting.why == "eof" else
                    f"took over {_START_S:g} s")
            self._end()
            raise SandboxCrashError(f"{_API}: the warm sandbox process did not start (it {said})."
                                    + (f"\nOutput (last lines):\n{log}" if log else "") +
                                    "\nTip: check that torch imports in this Python (python -c 'import torch'); "
                                    "record_in_subprocess runs a model without the warm process.")
        inner = int(line.split()[1])
        self._pid = host_pid(self._proc.pid, inner) if self._isolated else inner
        return True

    def _end(self) -> None:
        proc, folder, group, starting = self._proc, self._folder, self._group, self._starting
        self._proc, self._folder, self._group, self._lines, self._pid = None, None, None, None, 0
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            kill_group(proc.pid)
            if group is not None:
                group.kill()
            proc.wait()
            if starting is not None:
                starting.thread.join(5)  # it reads the pipe until EOF: never a closed (reused) descriptor
            with contextlib.suppress(OSError):
                proc.stdout.close()  # type: ignore[union-attr]
        if group is not None:
            group.remove()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """End the warm process and remove its folder (a later `record` starts a new one)."""
        with self._lock:
            self._end()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- runs --

    def record(self, ref: str, modes: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
               memory_mb: int | None = DEFAULT_MEMORY_MB, extra: Mapping[str, Any] | None = None,
               max_trace_mb: int = DEFAULT_MAX_TRACE_MB, max_events: int = DEFAULT_MAX_EVENTS,
               cancel: threading.Event | None = None) -> list[Trace | BaseException]:
        """Run the model file `ref` in each of `modes`, in one forked child; one trace or error per mode.

        Arguments as for `record_in_subprocess` (`timeout_s` is per mode); `cancel`, when set, ends
        the run at once (its modes get a `SandboxError` that says so). Bad arguments raise.
        """
        parsed = parse_ref(ref)
        extra = _check_extra(extra)
        limits = Limits.check(timeout_s=timeout_s, memory_mb=memory_mb, max_trace_mb=max_trace_mb,
                              max_events=max_events, error=SandboxError)
        if not modes:
            raise SandboxError(f"{_API}.record: no mode given.\nTip: pass modes such as ['reentrant'].")
        target = os.path.abspath(parsed.target) if parsed.is_file else parsed.target
        load_ref = f"{target}:{parsed.factory}" if parsed.is_file else ref.strip()
        began = time.monotonic()
        while not self._lock.acquire(timeout=0.05):  # another run of this sandbox (the app cancels it first)
            if cancel is not None and cancel.is_set():
                return [_cancelled(ref, mode, began, "waiting for this sandbox's previous run") for mode in modes]
        try:
            folder_needed = os.path.dirname(target) if parsed.is_file else ""
            if folder_needed and binds([folder_needed]) and not any(  # bound at start (the checkout's own
                    folder_needed == r or folder_needed.startswith(r + "/")  # folders, from sys.path, included)
                    for r in (*self._readable, *(self._bound if self._proc is not None else ()))):
                self._readable.append(folder_needed)
                self._end()  # started without that folder in view (bubblewrap binds at start)
            if not self._ready(cancel):
                return [_cancelled(ref, mode, began, f"the sandbox was starting ({self.stage})") for mode in modes]
            return self._run(ref, load_ref, list(modes), extra, limits, cancel)
        finally:
            self._lock.release()

    def _run(self, ref: str, load_ref: str, modes: list[str], extra: dict[str, Any], limits: Limits,
             cancel: threading.Event | None) -> list[Trace | BaseException]:
        assert self._folder is not None and self._proc is not None and self._lines is not None
        self._runs, self._dead = self._runs + 1, False
        rundir = self._folder / f"run-{self._runs}"
        rundir.mkdir()
        group = None
        try:
            sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
            request = {"ref": ref, "load_ref": load_ref, "modes": modes, "extra": extra, "sys_path": sys_path,
                       "parent_pid": 0, "limits": {
                           "memory_mb": limits.memory_mb, "memory_bytes": (limits.memory_mb or 0) * 2**20 or None,
                           "cpu_s": limits.cpu_s * len(modes), "file_bytes": limits.file_bytes,
                           "max_tasks": limits.max_tasks, "isolated": self._isolated}}
            (rundir / "request.json").write_text(json.dumps(request))
            group = Cgroup.create(f"{self._folder.name}_{rundir.name}", limits)
            if self._isolated:  # (without bubblewrap, the start said what is not contained)
                warn_isolation(None, group, limits.memory_mb, stacklevel=4)
            pid, returncode, waited = self._fork(rundir, group, limits.timeout_s * len(modes), cancel)
            oom = group.oom_kills() if group is not None else 0
            out: list[Trace | BaseException] = []
            for i, mode in enumerate(modes):
                try:
                    out.append(_outcome(rundir, ref, mode, pid, returncode, limits, oom, index=i,
                                        last=i == len(modes) - 1,
                                        cancelled=waited if cancel is not None and cancel.is_set() else None))
                except CkptVizError as err:  # ModelLoadError, and the Sandbox* errors
                    out.append(err)
            return out
        finally:
            if group is not None:
                group.kill()  # every process of the run is gone before this returns
            _CLEANER.submit(_remove, group, rundir)  # the kernel frees an emptied cgroup a little later
            if self._dead:
                self._end()

    def _move(self, group: Cgroup | None, back: bool = False) -> None:
        """Move the warm process into the run's `group`, or `back` out of it: into its own group where that
        is in the same hierarchy, else into the one the run's group was made in (a v1 hierarchy that its
        own group, a v2 one, does not cover)."""
        if group is None:
            return
        own = {d.parent: d for d in (self._group.dirs if self._group else [])}
        for folder in group.dirs:
            target = own.get(folder.parent, folder.parent) if back else folder
            (target / "cgroup.procs").write_text(str(self._pid))

    def _fork(self, rundir: Path, group: Cgroup | None, wait_s: float,
              cancel: threading.Event | None) -> tuple[int, int | None, float]:
        """Fork the run's child inside `group`; wait for its end. Returns (host pid, exit code or None, seconds)."""
        assert self._proc is not None and self._proc.stdin is not None and self._lines is not None
        try:
            self._move(group)  # See NOTE [ Warm child ], rule 2
            self._proc.stdin.write(f"run {rundir.name}\n".encode())
            self._proc.stdin.flush()
            line = self._lines.next(time.monotonic() + 30)
        except OSError:
            line = None
        finally:
            with contextlib.suppress(OSError):
                self._move(group, back=True)
        if line is None or not line.startswith("forked "):
            self._end()
            raise SandboxCrashError(f"{_API}: the warm sandbox process did not fork the run (it said {line!r}); "
                                    "it was ended and the next run starts a new one.\nTip: run it again.")
        inner = int(line.split()[1])
        pid = host_pid(self._pid, inner) if self._isolated else inner
        start = time.monotonic()
        line = self._lines.next(start + wait_s, cancel)
        waited = time.monotonic() - start
        if line is None and self._lines.why == "time":
            signal_stack(pid, rundir / "output.log")
        if line is None:
            self._kill_run(pid, group)
            if self._lines.why != "eof":
                line = self._lines.next(time.monotonic() + 5)  # the warm process reports the kill
        else:
            self._kill_run(pid, group)  # what the run started and left running
        if line is None or not line.startswith("exited "):
            if self._lines.why == "eof" or line is not None:
                self._dead = True  # the run ended the warm process: ended after the run is read, then restarted
                return pid, -signal.SIGKILL, waited
            return pid, None, waited
        code = int(line.split()[1])
        return pid, (None if waited >= wait_s or (cancel is not None and cancel.is_set()) else code), waited

    def _kill_run(self, pid: int, group: Cgroup | None) -> None:
        kill_group(pid)
        if group is not None:
            group.kill()
        if self._isolated and self._proc is not None:
            for stray in namespace_strays(self._pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(stray, signal.SIGKILL)


def _cancelled(ref: str, mode: str, began: float, while_: str) -> SandboxError:
    return SandboxError(f"{_API}.record: the run of {ref} (mode {mode!r}) was cancelled after "
                        f"{time.monotonic() - began:.1f} s, while {while_}; no code of the model file ran.\n"
                        "Tip: run it again when you are ready.")


def _remove(group: Cgroup | None, rundir: Path) -> None:
    if group is not None:
        group.remove()
    shutil.rmtree(rundir, ignore_errors=True)


def _close_all() -> None:
    _CLEANER.shutdown(wait=True)
    for sandbox in list(_ALL):
        sandbox.close()


atexit.register(_close_all)
