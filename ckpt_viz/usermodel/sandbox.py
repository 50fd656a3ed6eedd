"""Run a user model in a contained child process: `record_in_subprocess`.

The parent side: it validates the limits, starts the child (`ckpt_viz.usermodel.child`) in
bubblewrap and a cgroup where the platform offers them (`ckpt_viz.usermodel.isolation`, whose
NOTE [ What the sandbox guarantees ] says what is and is not contained), waits, ends every
process of the run, reads back a bounded result and turns each failure into an error that
says what happened. Standard library plus ckpt_viz's torch-free modules; never imports the UI.

NOTE [ Sandbox protocol ]
  1. The parent makes a folder `ckpt_viz_sandbox_<parent pid>_*` in the temporary folder,
     writes `request.json` (the reference, the limits, sys.path) and starts
     `python -m ckpt_viz.usermodel.child FOLDER` in a new session, with the environment of
     `isolation.child_env` and the folder as working directory; stdout and stderr go to
     `output.log` there. Under bubblewrap the child sees a tmpfs at that path instead, and
     PID 1 of the sandbox copies the request in and the results out (NOTE [ Run folder ] in
     `ckpt_viz.usermodel.isolation`).
  2. The child applies its hard limits, writes each step it reaches to `stage`, imports
     torch, runs `load_model` and `run_scenario` for each mode of the request (a fresh model
     per mode), and writes mode N's `trace-N.json` with `Trace.save` (JSON; never pickle;
     renamed into place whole). An exception before any mode ran writes `error.json`, one
     in mode N `error-N.json`:
     {"kind": "start" | "load" | "run" | "memory", "type", "message", "traceback", "file", "line"}
     with the message already written for people, and exits 1.
  3. The parent waits at most `timeout_s`; on expiry it sends SIGUSR1 to the child
     (faulthandler prints its Python stack, which locates the model file's line), waits
     until the stack is in the log (at most 3 s), then sends SIGUSR2, on which the child stops its
     run (TimeLimitReached) and saves the trace recorded so far as `trace-N.json`, meta "partial"
     True (at most 5 s; `SandboxTimeoutError.partial_trace`), asks PID 1 to end the run and copy its
     stage out (SIGTERM, at most 3 s), then kills everything: the session,
     the sandbox (its PID namespace), the cgroup. It reads only regular files of
     bounded size from the folder (never through a link), refuses a trace over
     `max_trace_mb` or `max_events`, and removes the folder.
  4. SIGTERM and SIGHUP to the parent (when it is the main thread of a program that left
     them at their default) end the child and remove the folder before the parent dies of
     the same signal. A parent killed outright takes the sandbox with it
     (`--die-with-parent`); its folder is removed by the next run (the sweep).
  5. A child that dies without a report (os._exit, a signal) becomes `SandboxCrashError`
     with the log's tail; on a crash, faulthandler's stack names the model file's line.

NOTE [ Memory limit ]
  RLIMIT_AS caps each process's virtual memory, not resident memory; the cgroup (where
  there is one) caps the resident memory of all the run's processes together. CPU-only
  torch 2.13 maps about 0.8 GB to import and run a small model; each extra thread
  reserves a stack (8 MB) and possibly a malloc arena (64 MB), so the child runs with
  MALLOC_ARENA_MAX=2 unless the caller set it. CUDA maps tens of GB of address space
  when it initialises: pass memory_mb=None (no limit) for a model on a GPU. A failed
  allocation shows up as MemoryError or torch's "can't allocate memory" RuntimeError,
  and a cgroup kill as SIGKILL with the kernel's oom_kill count: all `SandboxMemoryError`.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from ckpt_viz.errors import (  # the Sandbox* errors are re-exported: defined with the whole error tree
    CkptVizError,
    SandboxCrashError,
    SandboxError,
    SandboxMemoryError,
    SandboxRunError,
    SandboxTimeoutError,
)
from ckpt_viz.trace import Trace
from ckpt_viz.usermodel import confine
from ckpt_viz.usermodel.child import MEMORY_MARKERS
from ckpt_viz.usermodel.isolation import (
    DEFAULT_DISK_MB,
    Cgroup,
    Limits,
    SandboxWarning,
    bwrap_problem,
    child_env,
    command,
    not_isolated,
    package_root,
)
from ckpt_viz.usermodel.load import ModelLoadError, parse_ref
from ckpt_viz.usermodel.processes import (
    PREFIX,
    ask_partial,
    dump_stack,
    end_run,
    ending_signals,
    kill_group,
    signals_held,
    sweep,
)
from ckpt_viz.usermodel.readback import load_trace, read, tail

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "DEFAULT_MAX_TRACE_MB",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "SandboxCrashError",
    "SandboxError",
    "SandboxMemoryError",
    "SandboxRunError",
    "SandboxTimeoutError",
    "SandboxWarning",
    "record_in_subprocess",
]

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 4096
DEFAULT_MAX_TRACE_MB = 512
DEFAULT_MAX_EVENTS = 2_000_000
EXTRA_KEYS = ("seed", "microbatches", "schedule", "memory", "graphs", "plan_profile")
_API = "ckpt_viz.record_in_subprocess"
_REPORT_BYTES = 4 * 2**20
_LOG_MEMORY_MARKERS = ("MemoryError", *MEMORY_MARKERS)
_STARTING = ("starting", "importing torch")
_warned: set[str] = set()


# -- the run --


def _check_extra(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = dict(extra or {})
    unknown = [k for k in extra if k not in EXTRA_KEYS]
    if unknown:
        raise SandboxError(f"{_API}: unknown extra key(s) {', '.join(map(repr, unknown))}; allowed: "
                           f"{', '.join(map(repr, EXTRA_KEYS))}.\nTip: they are passed to run_scenario (plan_profile: "
                           "also profile the model for ckpt_viz.plan, in the same child).")
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise SandboxError(f"{_API}: extra must be JSON data (it is sent to the child): {exc}.\n"
                           "Tip: pass ints and strings, e.g. {'seed': 0, 'microbatches': 4}.") from None
    return extra


def record_in_subprocess(ref: str, mode: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         memory_mb: int | None = DEFAULT_MEMORY_MB, extra: Mapping[str, Any] | None = None,
                         max_trace_mb: int = DEFAULT_MAX_TRACE_MB, max_events: int = DEFAULT_MAX_EVENTS,
                         disk_mb: int = DEFAULT_DISK_MB) -> Trace:
    """Load the user model `ref` and run it in `mode` in a contained child process; return its trace.

    See NOTE [ Sandbox protocol ], NOTE [ Memory limit ], and NOTE [ What the sandbox
    guarantees ] in `ckpt_viz.usermodel.isolation`. The caller's process never imports or
    runs the user's code. Without bubblewrap, a `SandboxWarning` says once what is not isolated.

    Args:
        ref: as for `ckpt_viz.usermodel.load.load_model` ("path/to/file.py:factory", "package.module:factory").
        mode: one of `ckpt_viz.run.scenarios.MODES`.
        timeout_s: wall-clock limit for the whole child, Python and torch start-up included (a few
            seconds); positive and finite.
        memory_mb: memory limit of the child in MiB (address space per process; resident memory of all
            its processes together, where a cgroup is available); None for no limit (needed for CUDA).
        extra: keyword arguments of `run_scenario` (and of `load_model` for "seed"): seed, microbatches,
            schedule, memory, graphs; and plan_profile (True: the child also profiles a fresh model for
            the planner, `ckpt_viz.plan.profile_spec`, and attaches the profile to each mode's trace).
        max_trace_mb, max_events: caps on the trace coming back (file size; events plus memory samples).
        disk_mb: under bubblewrap, the size of the run's folder, a tmpfs (NOTE [ Run folder ] in
            `ckpt_viz.usermodel.isolation`); the traces are written there before they are copied out.

    Returns:
        The trace the child recorded, read back from JSON.

    Raises:
        ModelLoadError: the model file is wrong (the child's message, verbatim).
        SandboxError: a limit is not positive and finite, or `extra` is wrong (before any process starts).
        SandboxTimeoutError, SandboxMemoryError, SandboxRunError, SandboxCrashError: see each class.
    """
    parsed = parse_ref(ref)  # a malformed reference fails here, without starting a process
    extra = _check_extra(extra)
    limits = Limits.check(timeout_s=timeout_s, memory_mb=memory_mb, max_trace_mb=max_trace_mb,
                          max_events=max_events, error=SandboxError, disk_mb=disk_mb)
    target = os.path.abspath(parsed.target) if parsed.is_file else parsed.target
    load_ref = f"{target}:{parsed.factory}" if parsed.is_file else ref.strip()
    tmp = tempfile.gettempdir()
    sweep(tmp)
    problem = bwrap_problem()
    with ending_signals():
        workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_", dir=tmp))
        cgroup = None
        try:
            cgroup = Cgroup.create(workdir.name, limits)
            warn_isolation(problem, cgroup, limits.memory_mb, stacklevel=3)
            return _run(ref, load_ref, mode, extra, limits, workdir, cgroup, isolate=problem is None,
                        readable=[os.path.dirname(target) if parsed.is_file else "", *sys.path, package_root(),
                                  sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)])
        finally:
            with signals_held():
                if cgroup is not None:
                    cgroup.kill()
                    cgroup.remove()
                shutil.rmtree(workdir, ignore_errors=True)


def warn_isolation(problem: str | None, cgroup: Cgroup | None, memory_mb: int | None, *, stacklevel: int) -> None:
    """Say once per process what is not contained: no bubblewrap, no seccomp filter, or no memory cgroup."""
    seccomp = confine.problem() if sys.platform.startswith("linux") and not problem else None
    if seccomp and "seccomp" not in _warned:
        _warned.add("seccomp")
        warnings.warn(f"{_API}: {seccomp}, so a model file's processes can ptrace each other and connect to Unix "
                      "sockets outside /run that they can see (PID 1 of the sandbox stays out of reach: it is "
                      "undumpable).\nTip: install libseccomp (Debian: apt-get install libseccomp2) and pyseccomp.",
                      SandboxWarning, stacklevel=stacklevel)
    if problem and problem not in _warned:
        _warned.add(problem)
        warnings.warn(not_isolated(problem, cgroup), SandboxWarning, stacklevel=stacklevel)
    elif not problem and memory_mb and (cgroup is None or cgroup.memory is None) and "cgroup" not in _warned:
        _warned.add("cgroup")
        warnings.warn(f"{_API}: no memory cgroup can be created here (/sys/fs/cgroup is not writable for "
                      "this user), so the memory limit applies to each of the model's processes on its "
                      "own, not to all of them together.\nTip: run under a delegated cgroup, e.g. "
                      "systemd-run --user --scope -p Delegate=yes ...", SandboxWarning, stacklevel=stacklevel)


def _run(ref: str, load_ref: str, mode: str, extra: dict[str, Any], limits: Limits, workdir: Path,
         cgroup: Cgroup | None, *, isolate: bool, readable: list[str]) -> Trace:
    sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    request = {"ref": ref, "load_ref": load_ref, "modes": [mode], "extra": extra, "sys_path": sys_path,
               "parent_pid": os.getpid(),
               "limits": {"memory_mb": limits.memory_mb, "memory_bytes": (limits.memory_mb or 0) * 2**20 or None,
                          "cpu_s": limits.cpu_s, "file_bytes": limits.file_bytes, "max_tasks": limits.max_tasks,
                          "isolated": isolate}}
    (workdir / "request.json").write_text(json.dumps(request))
    host_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)  # See NOTE [ Run folder ] in isolation
    python = [sys.executable, "-m", "ckpt_viz.usermodel.child", str(workdir), *(["--host-fd", str(host_fd)] *
                                                                               isolate)]
    argv = command(python, workdir=workdir, readable=[*readable, *sys_path],
                   cgroup_files=cgroup.procs_files if cgroup else (), isolate=isolate, disk_mb=limits.disk_mb)
    try:
        with open(workdir / "output.log", "wb") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=workdir, env=child_env(workdir), start_new_session=True,
                                    pass_fds=(host_fd,) if isolate else ())
    finally:
        os.close(host_fd)
    try:
        try:
            returncode: int | None = proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
            dump_stack(proc, workdir)
            ask_partial(proc, workdir)  # the trace so far, for SandboxTimeoutError.partial_trace
            if isolate:
                end_run(proc)  # PID 1 ends the run, then copies its stage out
    finally:  # on timeout, success, or the caller's KeyboardInterrupt: no process of the run survives
        with signals_held():
            kill_group(proc.pid)
            if cgroup is not None:
                cgroup.kill()
            proc.wait()
    if isolate and returncode is not None and 128 < returncode < 128 + 65:
        returncode = 128 - returncode  # bubblewrap exits with 128 + n when the child died of signal n
    oom = cgroup.oom_kills() if cgroup is not None else 0
    return _outcome(workdir, ref, mode, proc.pid, returncode, limits, oom)


def _with_output(text: str, output: str) -> str:
    return f"{text}\nOutput (last lines):\n{output}" if output else text


def _stage(workdir: Path) -> str:
    with contextlib.suppress(SandboxError):
        return (read(workdir / "stage", 200, "a stage file") or b"").decode("utf-8", "replace").strip()
    return ""


def _outcome(workdir: Path, ref: str, mode: str, pid: int, returncode: int | None, limits: Limits,
             oom_kills: int, index: int = 0, last: bool = True, cancelled: float | None = None) -> Trace:
    """The trace of the `index`-th mode of the request, or the error that says why there is none.

    A mode's trace is renamed into place whole; it counts when the child succeeded, or when a later
    mode (`last` False) is the one that failed, and no memory limit was hit.
    """
    done = (returncode == 0 or not last) and (workdir / f"trace-{index}.json").exists()
    output = tail(workdir / "output.log")
    where = {"pid": pid, "returncode": returncode, "output": output}
    stage = _stage(workdir) or "starting"
    if cancelled is not None and not done:
        raise SandboxError(f"{_API}: the run of {ref} (mode {mode!r}) was cancelled after {cancelled:.1f} s, "
                           f"while {stage}; the child process (pid {pid}) and every process it started were "
                           "killed.\nTip: run it again when you are ready; a model that loops forever stops at "
                           "its time limit.")
    if returncode is None and not done:
        file, line = _last_user_line(output, ref)
        at = f'\n  File "{file}", line {line} (where the model file was when time ran out)' if line else ""
        error = SandboxTimeoutError(_with_output(
            f"{_API}: {ref} did not finish within {limits.timeout_s:g} s (mode {mode!r}, while {stage}); the "
            f"child process (pid {pid}) and every process it started were killed.{at}", output) +
            "\nTip: look for a loop or a wait that never ends; if the model is just slow, make it smaller or "
            "pass a larger timeout_s (starting Python and importing torch alone takes a few seconds).",
            file=file, line=line, traceback=output, **where)
        error.partial_trace = _partial(workdir, index, limits, mode)
        raise error
    raw = read(workdir / "error.json", _REPORT_BYTES, "an error report")
    if raw is None:
        raw = read(workdir / f"error-{index}.json", _REPORT_BYTES, "an error report")
    report = None
    if raw is not None:
        with contextlib.suppress(ValueError):
            report = json.loads(raw)
    if isinstance(report, dict) and isinstance(report.get("message"), str) and report.get("kind") == "memory":
        _raise_report(report, **where)
    if oom_kills:
        what = (f"the child for {ref} could not start within its memory limit of {limits.memory_mb} MB (a cgroup; "
                f"it was {stage}, the model was not loaded)" if stage in _STARTING else
                f"{ref} went over the memory limit of {limits.memory_mb} MB (all of its processes together, a "
                f"cgroup) while {stage}")
        raise SandboxMemoryError(_with_output(
            f"{_API}: {what}: the kernel ended {oom_kills} of its processes and the child "
            f"{_status(returncode, limits)}.", output) +
            "\nTip: make the model, its inputs or the processes it starts smaller, or pass a larger memory_mb.",
            traceback=output, **where)
    if isinstance(report, dict) and isinstance(report.get("message"), str):
        _raise_report(report, **where)
    if done:
        return load_trace(workdir / f"trace-{index}.json", limits)
    if limits.memory_mb and any(marker in output for marker in _LOG_MEMORY_MARKERS):
        if stage in _STARTING:
            what = f"could not start within its memory limit of {limits.memory_mb} MB (it died while {stage}, " \
                   "before the model was loaded)"
        else:
            what = f"ran out of memory (limit {limits.memory_mb} MB) while {stage} and died"
        raise SandboxMemoryError(_with_output(f"{_API}: the child for {ref} {what} "
                                              f"({_status(returncode, limits)}).", output) +
                                 "\nTip: pass a larger memory_mb (importing torch alone needs about 1024 MB of "
                                 "address space), or make the model or its inputs smaller.", traceback=output, **where)
    file, line = _last_user_line(output, ref)
    at = f'\n  File "{file}", line {line} (the last line of the model file on the crash stack)' if line else ""
    raise SandboxCrashError(_with_output(
        f"{_API}: the child running {ref} (mode {mode!r}) {_status(returncode, limits)} while {stage}, without "
        f"writing a trace or an error report.{at}", output) +
        "\nTip: the model's code ended the process (os._exit, a signal, a crash in C code); any output above "
        "shows its last words, and a crash prints the Python stack.", traceback=output, file=file, line=line,
        **where)


def _partial(workdir: Path, index: int, limits: Limits, mode: str) -> Trace | None:
    """The trace a timed-out child saved when asked (NOTE [ Sandbox protocol ], rule 3), marked with why; or None."""
    path = workdir / f"trace-{index}.json"
    if not path.exists():
        return None
    try:
        trace = load_trace(path, limits)
    except CkptVizError:  # over a cap, or cut short: the timeout error stands alone
        return None
    trace.meta["partial"] = True
    trace.meta["partial_reason"] = (f"the run of mode {mode!r} was stopped at its time limit of {limits.timeout_s:g} "
                                    "s; what came after is missing")
    return trace


def _raise_report(report: dict[str, Any], *, pid: int, returncode: int | None, output: str) -> NoReturn:
    kind = report.get("kind")
    cls = {"load": ModelLoadError, "memory": SandboxMemoryError, "start": SandboxCrashError}.get(kind, SandboxRunError)
    common = {"file": report.get("file"), "line": report.get("line"), "traceback": str(report.get("traceback", ""))}
    if not isinstance(common["line"], int) or not isinstance(common["file"], str):
        common["file"], common["line"] = None, None
    if cls is ModelLoadError:
        raise ModelLoadError(report["message"], **common)  # verbatim: see NOTE [ Sandbox protocol ], rule 2
    raise cls(report["message"], pid=pid, returncode=returncode, output=output, **common)


def _last_user_line(output: str, ref: str) -> tuple[str | None, int | None]:
    """The innermost frame in the model file on a faulthandler stack ("most recent call first")."""
    parsed = parse_ref(ref)
    if not parsed.is_file:
        return None, None
    user_file = os.path.realpath(parsed.target)
    for match in re.finditer(r'File "([^"]+)", line (\d+) in ', output):
        if os.path.realpath(match.group(1)) == user_file:
            return match.group(1), int(match.group(2))
    return None, None


def _status(returncode: int | None, limits: Limits) -> str:
    if returncode is None:
        return "was killed"
    if returncode == 126:
        return "could not join its cgroup (exit code 126)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = {"SIGKILL": f" (its CPU time limit of {limits.cpu_s} s, the kernel's out-of-memory killer, or "
                          "another process)", "SIGXCPU": f" (its CPU time limit of {limits.cpu_s} s)",
               "SIGXFSZ": f" (it wrote a file over {limits.file_bytes // 2**20} MiB)"}.get(name, "")
        return f"was killed by {name}{why}"
    return f"exited with code {returncode}"
