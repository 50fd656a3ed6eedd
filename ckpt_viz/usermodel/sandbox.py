"""Run a user model in a child process, with a time limit and a memory limit.

Owns `record_in_subprocess`, the child's entry point (`python -m ckpt_viz.usermodel.sandbox`) and
the `SandboxError` family. The parent side is standard library plus ckpt_viz's torch-free
modules: only the child imports torch, after its memory limit is set. Never imports the UI.

NOTE [ Sandbox protocol ]
  1. The parent makes a temporary folder and starts `sys.executable -m ckpt_viz.usermodel.sandbox`
     in a new session (its own process group), with the caller's working directory,
     sys.path (sent in the request) and environment; stdout and stderr go to
     `output.log` in that folder.
  2. The child sets RLIMIT_AS (address space) to `memory_mb` and RLIMIT_CORE to 0,
     enables faulthandler (a crash prints the Python stack to the log), then imports
     torch, runs `load_model` and `run_scenario`, and writes `trace.json` with
     `Trace.save` (JSON; never pickle). On an exception it writes `error.json`:
     {"kind": "load" | "run" | "memory", "type", "message", "traceback", "file", "line"}
     with the message already written for people, and exits 1.
  3. The parent waits at most `timeout_s`; on expiry it sends SIGUSR1 (faulthandler
     prints the child's Python stack, which locates the model file's line), waits
     0.5 s, and kills the whole process group (the model's own subprocesses too).
     It always kills the group once the child is done, then reads `error.json` or
     `trace.json` (`Trace.load` validates it), and removes the folder.
  4. A child that dies without a report (os._exit, a signal) becomes
     `SandboxCrashError` with the log's tail; on a crash, faulthandler's stack names
     the model file's line.

NOTE [ Memory limit ]
  RLIMIT_AS caps virtual memory, not resident memory. CPU-only torch 2.13 maps about
  0.8 GB to import and run a small model (measured: imports and runs the built-in
  transformer under a 1024 MB limit); each extra thread reserves a stack (8 MB) and
  possibly a malloc arena (64 MB), so the child runs with MALLOC_ARENA_MAX=2 unless the
  caller set it. The default 4096 MB leaves room for many threads and a model of a
  few GB. CUDA maps tens of GB of address space when it initialises: pass
  memory_mb=None (no limit) for a model on a GPU. A failed allocation shows up as
  MemoryError or torch's "can't allocate memory" RuntimeError, both reported as
  `SandboxMemoryError`.
"""
from __future__ import annotations

import argparse
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, NoReturn, Sequence

from ckpt_viz.errors import (  # the Sandbox* errors are re-exported: defined with the whole error tree
    CkptVizError,
    SandboxCrashError,
    SandboxError,
    SandboxMemoryError,
    SandboxRunError,
    SandboxTimeoutError,
    TraceError,
)
from ckpt_viz.trace import Trace
from ckpt_viz.usermodel.load import ModelLoadError, parse_ref, user_frame

__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "SandboxCrashError",
    "SandboxError",
    "SandboxMemoryError",
    "SandboxRunError",
    "SandboxTimeoutError",
    "record_in_subprocess",
]

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 4096
EXTRA_KEYS = ("seed", "microbatches", "schedule", "memory", "graphs")
_API = "ckpt_viz.record_in_subprocess"
_TAIL_CHARS = 2000
_STACK_GRACE_S = 0.5  # how long a timed-out child gets to print its stack before the kill
# Text of a failed allocation: in torch's RuntimeError, or in the log of a child that died of one.
_MEMORY_MARKERS = ("can't allocate memory", "Cannot allocate memory", "std::bad_alloc", "out of memory",
                   "Memory allocation still failed")  # the last: OpenBLAS, when the limit is below torch's needs
_LOG_MEMORY_MARKERS = ("MemoryError", *_MEMORY_MARKERS)


# -- parent --


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_CHARS))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _with_output(text: str, output: str) -> str:
    return f"{text}\nOutput (last lines):\n{output}" if output else text


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _check_extra(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = dict(extra or {})
    unknown = [k for k in extra if k not in EXTRA_KEYS]
    if unknown:
        raise SandboxError(f"{_API}: unknown extra key(s) {', '.join(map(repr, unknown))}; allowed: "
                           f"{', '.join(map(repr, EXTRA_KEYS))}.\nTip: they are passed to run_scenario.")
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise SandboxError(f"{_API}: extra must be JSON data (it is sent to the child): {exc}.\n"
                           "Tip: pass ints and strings, e.g. {'seed': 0, 'microbatches': 4}.") from None
    return extra


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _dump_stack(proc: subprocess.Popen) -> None:
    """Ask a child that ran out of time to print its Python stack (faulthandler, SIGUSR1) before it is killed."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        os.kill(proc.pid, signal.SIGUSR1)
        proc.wait(timeout=_STACK_GRACE_S)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        pass


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("MALLOC_ARENA_MAX", "2")  # See NOTE [ Memory limit ]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _raise_report(report: dict[str, Any], *, pid: int, returncode: int, output: str) -> NoReturn:
    cls = {"load": ModelLoadError, "memory": SandboxMemoryError}.get(report.get("kind"), SandboxRunError)
    common = {"file": report.get("file"), "line": report.get("line"), "traceback": report.get("traceback", "")}
    if cls is ModelLoadError:
        raise ModelLoadError(report["message"], **common)  # verbatim: see NOTE [ Sandbox protocol ], rule 2
    raise cls(report["message"], pid=pid, returncode=returncode, output=output, **common)


def record_in_subprocess(ref: str, mode: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         memory_mb: int | None = DEFAULT_MEMORY_MB,
                         extra: Mapping[str, Any] | None = None) -> Trace:
    """Load the user model `ref` and run it in `mode` in a child process; return its trace.

    See NOTE [ Sandbox protocol ] and NOTE [ Memory limit ]. The caller's process never
    imports or runs the user's code.

    Args:
        ref: as for `ckpt_viz.usermodel.load.load_model` ("path/to/file.py:factory", "package.module:factory").
        mode: one of `ckpt_viz.run.scenarios.MODES`.
        timeout_s: wall-clock limit for the whole child, Python and torch start-up included (a few seconds).
        memory_mb: address-space limit (RLIMIT_AS) of the child in MiB; None for no limit (needed for CUDA).
        extra: keyword arguments of `run_scenario` (and of `load_model` for "seed"): seed, microbatches,
            schedule, memory, graphs.

    Returns:
        The trace the child recorded, read back from JSON.

    Raises:
        ModelLoadError: the model file is wrong (the child's message, verbatim).
        SandboxTimeoutError, SandboxMemoryError, SandboxRunError, SandboxCrashError: see each class.
    """
    parse_ref(ref)  # a malformed reference fails here, without starting a process
    extra = _check_extra(extra)
    if not timeout_s or timeout_s <= 0:
        raise SandboxError(f"{_API}: timeout_s must be positive, got {timeout_s!r}.\nTip: the default is "
                           f"{DEFAULT_TIMEOUT_S:g} s.")
    workdir = Path(tempfile.mkdtemp(prefix="ckpt_viz_sandbox_"))
    request = {"ref": ref, "mode": mode, "memory_mb": memory_mb, "extra": extra, "sys_path": list(sys.path)}
    (workdir / "request.json").write_text(json.dumps(request))
    log = workdir / "output.log"
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "ckpt_viz.usermodel.sandbox", str(workdir)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=os.getcwd(), env=_child_env(), start_new_session=True)
        try:
            try:
                returncode: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
                _dump_stack(proc)
        finally:  # on timeout, success, or the caller's KeyboardInterrupt: no process of the group survives
            _kill_group(proc.pid)
            proc.wait()
        return _outcome(workdir, ref, mode, proc.pid, returncode, timeout_s, memory_mb)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _outcome(workdir: Path, ref: str, mode: str, pid: int, returncode: int | None, timeout_s: float,
             memory_mb: int | None) -> Trace:
    output = _tail(workdir / "output.log")
    where = {"pid": pid, "returncode": returncode, "output": output}
    if returncode is None:
        file, line = _last_user_line(output, ref)
        at = f'\n  File "{file}", line {line} (where the model file was when time ran out)' if line else ""
        raise SandboxTimeoutError(_with_output(
            f"{_API}: {ref} did not finish within {timeout_s:g} s (mode {mode!r}); the child process "
            f"(pid {pid}) and its process group were killed.{at}", output) +
            "\nTip: look for a loop or a wait that never ends; if the model is just slow, make it smaller or "
            "pass a larger timeout_s (starting Python and importing torch alone takes a few seconds).",
            file=file, line=line, traceback=output, **where)
    report_path = workdir / "error.json"
    if report_path.exists():
        try:
            report = json.loads(report_path.read_text())
        except (OSError, ValueError):
            report = None
        if isinstance(report, dict) and isinstance(report.get("message"), str):
            _raise_report(report, pid=pid, returncode=returncode, output=output)
    limit = f"{memory_mb} MB" if memory_mb else "no limit"
    if returncode == 0 and (workdir / "trace.json").exists():
        try:
            return Trace.load(workdir / "trace.json")
        except TraceError as exc:
            raise SandboxCrashError(f"{_API}: the child wrote a trace that does not load: {exc}", **where) from None
    if memory_mb and any(marker in output for marker in _LOG_MEMORY_MARKERS):
        raise SandboxMemoryError(_with_output(
            f"{_API}: {ref} ran out of memory (limit {limit}) and the child died "
            f"({_status(returncode)}).", output) +
            "\nTip: make the model or its inputs smaller, or pass a larger memory_mb (importing torch alone "
            "needs about 1 GB of address space).", traceback=output, **where)
    file, line = _last_user_line(output, ref)
    at = f'\n  File "{file}", line {line} (the last line of the model file on the crash stack)' if line else ""
    raise SandboxCrashError(_with_output(
        f"{_API}: the child running {ref} (mode {mode!r}) {_status(returncode)} without writing a trace "
        f"or an error report.{at}", output) +
        "\nTip: the model's code ended the process (os._exit, a signal, a crash in C code); any output above "
        "shows its last words, and a crash prints the Python stack.", traceback=output, file=file, line=line,
        **where)


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


def _status(returncode: int) -> str:
    if returncode < 0:
        name = _signal_name(returncode)
        why = " (the kernel's out-of-memory killer, or another process)" if name == "SIGKILL" else ""
        return f"was killed by {name}{why}"
    return f"exited with code {returncode}"


# -- child --


def _memory_error(exc: BaseException | None) -> BaseException | None:
    """The MemoryError, or torch's failed-allocation RuntimeError, in `exc` or its causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and any(
                marker in str(exc) for marker in _MEMORY_MARKERS)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _report(exc: BaseException, *, stage: str, ref: str, mode: str, memory_mb: int | None,
            user_file: str | None) -> dict[str, Any]:
    """The error report of NOTE [ Sandbox protocol ], rule 2, with a message written for people."""
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
    if memory is not None:
        if type(memory).__name__ == "OutOfMemoryError":  # torch's, for an accelerator
            limit = "the device's memory"
        elif memory_mb:
            limit = f"the limit of {memory_mb} MB (RLIMIT_AS, address space)"
        else:
            limit = "the machine's memory"
        text = str(memory).strip().splitlines()
        first = f"{type(memory).__name__}: {text[0]}" if text else type(memory).__name__
        message = (f"{_API}: {ref} ran out of memory under {limit} while {stage}.{at}\n{first}\n"
                   "Tip: make the model or its inputs smaller, or pass a larger memory_mb "
                   "(torch itself needs about 1 GB of address space).")
        kind = "memory"
    elif isinstance(exc, ModelLoadError):
        message, kind = str(exc), "load"
    elif isinstance(exc, CkptVizError):
        message, kind = str(exc), "run"  # already written for people (spec D7)
    else:
        text = str(exc).strip().splitlines()
        message = (f"{_API}: running {ref} in mode {mode!r} raised {type(exc).__name__}"
                   f"{': ' + text[0] if text else ''}.{at}\n"
                   "Tip: the model loaded and passed its trial forward but failed under checkpointing; "
                   "see the traceback.")
        kind = "run"
    return {"kind": kind, "type": type(exc).__name__, "message": message, "traceback": tb, "file": file,
            "line": line}


def _set_limits(memory_mb: int | None) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_mb:
        limit = int(memory_mb) * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _child(workdir: Path) -> int:
    """The child's whole life: limits, load, run, save. See NOTE [ Sandbox protocol ], rule 2."""
    import faulthandler

    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):  # the parent's "time is up: show where you are"
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    request = json.loads((workdir / "request.json").read_text())
    ref, mode, memory_mb, extra = request["ref"], request["mode"], request["memory_mb"], request["extra"]
    sys.path[:0] = [p for p in request["sys_path"] if p not in sys.path]
    stage, user_file = "importing torch", None
    try:
        _set_limits(memory_mb)
        import torch  # noqa: F401  (after the limit, so that it counts)

        from ckpt_viz.run.scenarios import run_scenario
        from ckpt_viz.usermodel.load import load_model

        stage = "loading the model"
        spec = load_model(ref, seed=extra.get("seed", 0))
        user_file = spec.extra.get("file")
        stage = f"running mode {mode!r}"
        trace = run_scenario(spec, mode, **extra)
        trace.meta["sandbox"] = {"memory_mb": memory_mb, "ref": ref}
        trace.save(workdir / "trace.json")
        return 0
    except BaseException as exc:  # noqa: BLE001  everything goes to the parent as a report
        report = _report(exc, stage=stage, ref=ref, mode=mode, memory_mb=memory_mb, user_file=user_file)
        (workdir / "error.json").write_text(json.dumps(report, default=str))
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_viz.usermodel.sandbox",
                                     description="Child side of ckpt_viz.usermodel.sandbox.record_in_subprocess.")
    parser.add_argument("workdir", type=Path, help="folder holding request.json; receives trace.json or error.json")
    start = time.monotonic()
    code = _child(parser.parse_args(argv).workdir)
    print(f"ckpt_viz.usermodel.sandbox: child finished with code {code} in {time.monotonic() - start:.2f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
