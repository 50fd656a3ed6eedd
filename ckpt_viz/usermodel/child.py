"""The sandboxed child: `python -m ckpt_viz.usermodel.child WORKDIR`.

Reads `request.json` from its folder, applies its limits (`apply_limits`, before anything else), imports
torch, loads and runs the model in each mode asked, and writes `trace-N.json` or `error(-N).json` (see
NOTE [ Sandbox protocol ] in `ckpt_viz.usermodel.sandbox`). Only this process imports torch or runs the
user's code. The warm process (`python -m ckpt_viz.usermodel.forked`, for `ckpt_viz.usermodel.warm`)
forks one such run per request, torch already imported, and calls `run_child` in the fork.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import linecache
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckpt_viz.errors import CkptVizError, ModelLoadError
from ckpt_viz.usermodel import runfolder
from ckpt_viz.usermodel.load import user_frame

__all__ = ["MEMORY_MARKERS", "TimeLimitReached", "apply_limits", "main", "run_child"]

_API = "ckpt_viz.record_in_subprocess"
# Text of a failed allocation: in torch's RuntimeError, or in the log of a child that died of one.
MEMORY_MARKERS = ("can't allocate memory", "Cannot allocate memory", "std::bad_alloc", "out of memory",
                  "Memory allocation still failed")  # the last: OpenBLAS, when the limit is below torch's needs


_RESERVE, _RESERVE_BYTES = ".reserve", 1 << 20

# -- limits: the first thing the child does --


def _drop_capabilities() -> None:
    """As root (outside bubblewrap), drop every capability, so the hard limits cannot be raised again."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (fails harmlessly past the last capability)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3, all sets empty
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed: cannot drop root's capabilities")


def _user_tasks(uid: int) -> int:
    """Threads the user already runs: RLIMIT_NPROC counts them all, not only the child's."""
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields.get("Uid", "-1 ").split()[0]) == uid:
                total += int(fields.get("Threads", "1").strip())
    return total


def apply_limits(limits: dict[str, int | None], parent_pid: int) -> None:
    """The child's first act: die with the parent, hard limits (soft = hard), no capabilities, the seccomp filter."""
    import ctypes
    import resource

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent_pid and not limits.get("isolated"):
            os._exit(125)  # the parent died before the line above: do not run orphaned
    wanted = {resource.RLIMIT_CORE: 0, resource.RLIMIT_CPU: limits["cpu_s"],
              resource.RLIMIT_FSIZE: limits["file_bytes"]}
    if limits.get("memory_bytes"):
        wanted[resource.RLIMIT_AS] = limits["memory_bytes"]
    if hasattr(resource, "RLIMIT_NPROC"):  # not applied by the kernel to root: the cgroup's pids.max is
        wanted[resource.RLIMIT_NPROC] = _user_tasks(os.getuid()) + int(limits["max_tasks"] or 512)
    for which, value in wanted.items():
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(int(value), hard)  # type: ignore[arg-type]
        resource.setrlimit(which, (int(value), int(value)))  # type: ignore[arg-type]
    if os.getuid() == 0 and sys.platform.startswith("linux"):
        _drop_capabilities()
    if sys.platform.startswith("linux"):
        from ckpt_viz.usermodel import confine

        if confine.problem() is None:  # (the parent warned once where it cannot be applied)
            confine.confine()  # See NOTE [ Seccomp filter ] in ckpt_viz.usermodel.confine


# -- reports --


def _memory_error(exc: BaseException | None) -> BaseException | None:
    """The MemoryError, or torch's failed-allocation RuntimeError, in `exc` or its causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or (isinstance(exc, (RuntimeError, ImportError, OSError)) and any(
                marker in str(exc) for marker in MEMORY_MARKERS)):  # ImportError: a library that cannot map
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _report(exc: BaseException, *, stage: str, ref: str, mode: str, memory_mb: int | None,
            user_file: str | None) -> dict[str, Any]:
    """The error report of NOTE [ Sandbox protocol ], rule 2, with a message written for people.

    `stage` says how far the child got ("starting", "importing torch", "loading the model",
    "running mode ..."): the message never claims a step that did not happen.
    """
    tb = getattr(exc, "traceback", "") or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    frame = user_frame(exc.__traceback__, user_file)
    file, line = getattr(exc, "file", None), getattr(exc, "line", None)
    if file is None and frame is not None:
        file, line = frame.filename, frame.lineno
    at = ""
    if file and line:
        code = linecache.getline(file, line).strip()
        at = f'\n  File "{file}", line {line}' + (f"\n    {code}" if code else "")
    memory = _memory_error(exc)
    text = str(memory if memory is not None else exc).strip().splitlines()
    first = f"{type(memory or exc).__name__}: {text[0]}" if text else type(memory or exc).__name__
    if memory is not None:
        if type(memory).__name__ == "OutOfMemoryError":  # torch's, for an accelerator
            limit = "the device's memory"
        elif memory_mb:
            limit = f"the limit of {memory_mb} MB (RLIMIT_AS, address space)"
        else:
            limit = "the machine's memory"
        if stage in ("starting", "importing torch"):
            message = (f"{_API}: the child could not start within its memory limit: it ran out of memory under "
                       f"{limit} while {stage}, before the model was loaded.\n{first}\n"
                       "Tip: pass a larger memory_mb (--memory-mb): importing torch alone needs about 1024 MB "
                       "of address space.")
        else:
            message = (f"{_API}: {ref} ran out of memory under {limit} while {stage}.{at}\n{first}\n"
                       "Tip: make the model or its inputs smaller, or pass a larger memory_mb "
                       "(torch itself needs about 1 GB of address space).")
        kind = "memory"
    elif isinstance(exc, ModelLoadError):
        message, kind = str(exc), "load"
    elif isinstance(exc, CkptVizError):
        message, kind = str(exc), "run"  # already written for people (spec D7)
    elif stage in ("starting", "importing torch"):
        message = (f"{_API}: the child could not start: {stage} raised {first}; the model was not loaded.\n"
                   "Tip: check that torch imports in this Python (python -c 'import torch'); if the message "
                   "is about memory, pass a larger memory_mb.")
        kind = "start"
    else:
        message = (f"{_API}: running {ref} in mode {mode!r} raised {type(exc).__name__}"
                   f"{': ' + text[0] if text else ''}.{at}\n"
                   "Tip: the model loaded and passed its trial forward but failed under checkpointing; "
                   "see the traceback.")
        kind = "run"
    return {"kind": kind, "type": type(exc).__name__, "message": message, "traceback": tb, "file": file,
            "line": line}


def _stack_on_sigusr1() -> None:
    import faulthandler

    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):  # the parent's "time is up: show where you are"
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _reserve(path: Path) -> None:
    """Set `_RESERVE_BYTES` aside in the run's folder (a tmpfs of `disk_mb` under bubblewrap), freed for the error
    report: a model that fills the folder still gets its error said."""
    with contextlib.suppress(OSError), open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, _RESERVE_BYTES)


class TimeLimitReached(BaseException):
    """The parent's SIGUSR2: the run is out of time; stop here and keep the trace recorded so far.

    A BaseException, like KeyboardInterrupt, so a model's `except Exception` does not swallow it.
    """


def _stop_on_sigusr2() -> None:
    def time_is_up(signum: int, frame: Any) -> None:
        raise TimeLimitReached("the parent's time limit was reached")

    if hasattr(signal, "SIGUSR2"):
        with contextlib.suppress(ValueError):  # not the main thread (a fork from another one): no partial trace
            signal.signal(signal.SIGUSR2, time_is_up)


def _save_partial(workdir: Path, index: int, before: Any) -> None:
    """The trace of the record() block that TimeLimitReached closed, marked partial, as trace-N.json."""
    from ckpt_viz.recording import last_trace

    trace = last_trace()
    if trace is None or trace is before:  # time ran out before this mode's recording opened
        return
    trace.meta["partial"] = True
    trace.meta["partial_reason"] = "the run was stopped at its time limit"
    trace.save(workdir / f"partial-{index}.json")
    os.replace(workdir / f"partial-{index}.json", workdir / f"trace-{index}.json")


def run_child(workdir: Path, parent_pid: int | None = None) -> int:
    """One run's whole life: limits, load, run each mode, save. See NOTE [ Sandbox protocol ], rule 2.

    `parent_pid`: the process that started this one, when it is not the caller named in the request
    (a child forked by the warm process, NOTE [ Warm child ] in `ckpt_viz.usermodel.warm`).
    """
    _stack_on_sigusr1()
    _stop_on_sigusr2()
    request = json.loads((workdir / "request.json").read_text())
    ref, modes, extra = request["ref"], request["modes"], request["extra"]
    memory_mb = request["limits"].get("memory_mb")
    stage, user_file, mode = "starting", None, modes[0]

    def reached(step: str) -> str:  # the parent names this step if the child dies without a report
        fd = os.open(workdir / "stage", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, step.encode())
        os.close(fd)
        return step

    def failed(exc: BaseException, name: str) -> None:
        report = _report(exc, stage=stage, ref=ref, mode=mode, memory_mb=memory_mb, user_file=user_file)
        with contextlib.suppress(OSError):
            os.unlink(workdir / _RESERVE)  # room for the report in a folder the model filled
        (workdir / name).write_text(json.dumps(report, default=str))

    _reserve(workdir / _RESERVE)
    try:
        reached(stage)
        apply_limits(request["limits"], request["parent_pid"] if parent_pid is None else parent_pid)
        for name in ("home", "tmp"):
            (workdir / name).mkdir(exist_ok=True)
        sys.path[:0] = [p for p in request["sys_path"] if p not in sys.path]
        stage = reached("importing torch")
        import torch  # noqa: F401  (after the limit, so that it counts; already imported in a warm child)

        from ckpt_viz.recording import last_trace
        from ckpt_viz.run.scenarios import run_scenario
        from ckpt_viz.usermodel.load import load_model

        stage = reached("loading the model")
        spec = load_model(request["load_ref"], seed=extra.get("seed", 0))
        spec.name = spec.extra["ref"] = ref  # as the caller wrote it (loaded by its absolute path)
        user_file = spec.extra.get("file")
    except BaseException as exc:
        failed(exc, "error.json")  # nothing ran: the report stands for every mode
        return 1
    code = 0
    for i, mode in enumerate(modes):  # Compare: every mode in this one process, one file each
        try:
            if i:  # a fresh model for each mode: a run leaves state in it (its trace would differ from a run alone)
                gc.collect()  # and the collector as a run alone finds it: when a checkpoint's node is collected
                stage = reached("loading the model")  # (node_collected) depends on it
                spec = load_model(request["load_ref"], seed=extra.get("seed", 0))
                spec.name = spec.extra["ref"] = ref
            stage = reached(f"running mode {mode!r}")
            before = last_trace()
            try:
                trace = run_scenario(spec, mode, **{k: v for k, v in extra.items() if k != "plan_profile"})
                if extra.get("plan_profile"):  # the planner's profile of a fresh model (ckpt_viz.plan.profile)
                    stage = reached(f"profiling the model for the plan (mode {mode!r})")
                    _attach_profile(trace, load_model(request["load_ref"], seed=extra.get("seed", 0)), mode, extra)
            except TimeLimitReached:
                _save_partial(workdir, i, before)
                return 1
            trace.meta["sandbox"] = {"memory_mb": memory_mb, "ref": ref, "isolation": "bubblewrap" if
                                     request["limits"].get("isolated") else "limits only"}
            trace.save(workdir / f"partial-{i}.json")
            os.replace(workdir / f"partial-{i}.json", workdir / f"trace-{i}.json")  # whole, or absent
            del trace
        except BaseException as exc:
            failed(exc, f"error-{i}.json")
            code = 1
            if not isinstance(exc, Exception):
                return code  # KeyboardInterrupt, SystemExit: stop here
    return code


def _attach_profile(trace: Any, spec: Any, mode: str, extra: dict[str, Any]) -> None:
    """Profile `spec` for the planner (a pipeline mode: one of its micro-batches) into `trace.meta`."""
    from ckpt_viz.plan.profile import attach, profile_spec

    microbatch = extra.get("microbatches", 4) if mode == "pipeline" else None
    attach(trace, profile_spec(spec, seed=extra.get("seed", 0), microbatch=microbatch))


def _collect_cold(workdir: Path, host_fd: int) -> int:
    """PID 1 of a cold child's sandbox: fork the run, wait for it, copy its results out, and exit with its code
    (128 + n when signal n ended it, as bubblewrap reports it). SIGTERM from the parent (a timeout) ends the
    run's processes first, so that its stage is still copied out."""
    runfolder.guard_pid1()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the parent's "print your stack" is for the run
    signal.signal(signal.SIGTERM, lambda signum, frame: runfolder.end_namespace())
    request = runfolder.copy_in(host_fd, "request.json", workdir)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            runfolder.unguard_run(host_fd)
            code = run_child(workdir)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)  # (retried after the SIGTERM handler ran: PEP 475)
    runfolder.end_namespace()
    runfolder.collect(workdir, host_fd, len(request.get("modes", [])), int(request["limits"]["file_bytes"]))
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_viz.usermodel.child",
                                     description="Child side of ckpt_viz.usermodel.sandbox.record_in_subprocess.")
    parser.add_argument("workdir", type=Path, help="folder holding request.json; receives trace-N.json or "
                        "error(-N).json")
    parser.add_argument("--host-fd", type=int, help="under bubblewrap: the host's run folder, open; this process is "
                        "then PID 1 of the sandbox and forks the run (NOTE [ Run folder ] in "
                        "ckpt_viz.usermodel.isolation)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    if args.host_fd is not None:
        code = _collect_cold(args.workdir, args.host_fd)
    else:
        code = run_child(args.workdir)
    print(f"ckpt_viz.usermodel.child: finished with code {code} in {time.monotonic() - start:.2f} s "
          f"(pid {os.getpid()})", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
