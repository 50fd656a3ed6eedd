"""The processes of a sandboxed run, and the parent's signals while it lasts.

Finding the child by its command line (for the stack dump on timeout), killing its session,
turning SIGTERM/SIGHUP into a clean end (NOTE [ Sandbox protocol ], rule 4, in
`ckpt_viz.usermodel.sandbox`), and sweeping folders left by parents killed outright.
Standard library only.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from ckpt_viz.usermodel.isolation import Cgroup

__all__ = ["PREFIX", "child_pids", "dump_stack", "end_run", "ending_signals", "host_pid", "kill_group",
           "namespace_strays", "signal_stack", "signals_held", "sweep"]

PREFIX = "ckpt_viz_sandbox_"
_STACK_GRACE_S = 3.0  # the longest a timed-out child gets to print its stack before the kill
_PARTIAL_GRACE_S = 5.0  # the longest it then gets to close its recording and save the trace so far


class _Ended(BaseException):
    """SIGTERM or SIGHUP reached the parent while a child ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def child_pids(workdir: Path) -> list[int]:
    """Host pids of the Python child (and its forks) for `workdir`, found by the start of their command line.

    From its start: bubblewrap's own processes end with the same words, and SIGUSR1 would kill them. Under
    bubblewrap that is PID 1 (which ignores SIGUSR1) and the run it forked.
    """
    cmdline = f"{sys.executable}\0-m\0ckpt_viz.usermodel.child\0{workdir}\0".encode()
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{entry}/cmdline").read_bytes().startswith(cmdline):
                        found.append(int(entry))
    return found


def dump_stack(proc: subprocess.Popen, workdir: Path) -> None:
    """Ask a child that ran out of time to print its Python stack (faulthandler, SIGUSR1) before it is killed."""
    if not hasattr(signal, "SIGUSR1"):
        return
    log = workdir / "output.log"
    start = log.stat().st_size if log.exists() else 0
    for pid in child_pids(workdir):  # never bwrap itself: SIGUSR1 would end it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + _STACK_GRACE_S
    while time.monotonic() < deadline and proc.poll() is None:  # until the stack is in the log (a busy machine
        with contextlib.suppress(OSError), open(log, "rb") as f:  # can take a while to schedule the child)
            f.seek(start)
            if b"most recent call first" in f.read(1 << 16):
                time.sleep(0.05)  # the rest of the stack, written in the same handler
                return
        time.sleep(0.02)


def end_run(proc: subprocess.Popen, wait_s: float = _STACK_GRACE_S) -> None:
    """Ask PID 1 of a cold child's sandbox to end the run (SIGTERM) and copy its results out; wait for that at
    most `wait_s` (NOTE [ Run folder ] in ckpt_viz.usermodel.isolation). The caller kills what is left."""
    pid1 = host_pid(proc.pid, 1)
    if pid1 <= 0 or pid1 == 1:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid1, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait_s)


def ask_partial(proc: subprocess.Popen, workdir: Path) -> None:
    """Ask a child that ran out of time to stop and save the trace it has (SIGUSR2; NOTE [ Sandbox protocol ],
    rule 3, in sandbox.py); wait until it exits, at most `_PARTIAL_GRACE_S`."""
    if not hasattr(signal, "SIGUSR2"):
        return
    for pid in child_pids(workdir):  # never bwrap itself
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGUSR2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_PARTIAL_GRACE_S)


def _tree() -> dict[int, tuple[int, list[int]]]:
    """pid -> (parent pid, its pids in each PID namespace, outermost first), for every live process."""
    out: dict[int, tuple[int, list[int]]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, ValueError):
                    fields = dict(line.split(":", 1) for line in Path(f"/proc/{entry}/status").read_text()
                                  .splitlines() if ":" in line)
                    if fields.get("State", "").strip()[:1] not in ("Z", "X"):
                        out[int(entry)] = (int(fields["PPid"]), [int(p) for p in fields.get("NSpid", entry).split()])
    return out


def _descendants(tree: dict[int, tuple[int, list[int]]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in tree.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def host_pid(ancestor: int, inner: int) -> int:
    """The host pid of the descendant of `ancestor` whose pid in its own (innermost) namespace is `inner`."""
    tree = _tree()
    for pid in _descendants(tree, ancestor):
        if tree[pid][1][-1] == inner and len(tree[pid][1]) > 1:
            return pid
    return inner if inner in tree else 0


def namespace_strays(warm: int) -> list[int]:
    """Processes left in the sandbox of the warm process `warm`: everything under bubblewrap's own process
    (its parent, pid 1 of the sandbox), except `warm` itself."""
    tree = _tree()
    if warm not in tree or len(tree[warm][1]) < 2:
        return []  # not in a PID namespace of its own: nothing to scan by
    return [pid for pid in _descendants(tree, tree[warm][0]) if pid != warm]


def signal_stack(pid: int, log: Path) -> None:
    """SIGUSR1 to one run's child (faulthandler prints its stack), then wait until the stack is in `log`."""
    if not hasattr(signal, "SIGUSR1") or pid <= 0:
        return
    start = log.stat().st_size if log.exists() else 0
    try:
        os.kill(pid, signal.SIGUSR1)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + _STACK_GRACE_S
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        with contextlib.suppress(OSError), open(log, "rb") as f:
            f.seek(start)
            if b"most recent call first" in f.read(1 << 16):
                time.sleep(0.05)
                return
        time.sleep(0.02)


@contextlib.contextmanager
def ending_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `_Ended` here (if left at their default); then the process dies of them."""
    installed: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        def handler(signum: int, frame: object) -> NoReturn:
            raise _Ended(signum)

        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
                installed[sig] = signal.signal(sig, handler)
    try:
        yield
    except _Ended as ended:
        for sig, old in installed.items():
            signal.signal(sig, old)
        installed.clear()
        os.kill(os.getpid(), ended.signum)  # now at its default: the process ends as it would have
        raise SystemExit(128 + ended.signum) from None
    finally:
        for sig, old in installed.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGTERM/SIGHUP while cleaning up, so a second signal cannot leave the folder behind."""
    sigs = {signal.SIGTERM, signal.SIGHUP} if hasattr(signal, "pthread_sigmask") else set()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs) if sigs else None
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _dead(name: str) -> bool:
    """Whether the parent named in a folder `ckpt_viz_sandbox_<pid>_*` has exited."""
    pid = name[len(PREFIX):].split("_", 1)[0]
    return name.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}")


def sweep(tmp: str) -> None:
    """Remove the folders and cgroups left by parents that were killed outright (their pid is gone)."""
    if not os.path.isdir("/proc"):
        return
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            if _dead(name):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    Cgroup.sweep(PREFIX, _dead)
