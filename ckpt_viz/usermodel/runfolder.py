"""PID 1 of a sandbox, between the host's run folder and the run's tmpfs (NOTE [ Run folder ] in
`ckpt_viz.usermodel.isolation`).

Inside bubblewrap, PID 1 is ckpt_viz's own process: the warm process (`ckpt_viz.usermodel.forked`)
or a cold child's collector (`ckpt_viz.usermodel.child`, run as `python -m ckpt_viz.usermodel.child
WORKDIR --host-fd N`). It holds the host folder as a descriptor, which the run never gets; it copies the
request in, forks the run, and copies the run's results out, bounded and never through a link.
Standard library only; never torch, never the UI.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import stat
import sys
from pathlib import Path

__all__ = ["REQUEST_BYTES", "collect", "copy_in", "empty_masks", "end_namespace", "guard_pid1", "open_log",
           "read_host", "reap", "result_names", "unguard_run"]

REQUEST_BYTES = 1 << 20  # request.json, written by the parent: paths, limits and a few options
_REPORT_BYTES = 4 << 20  # as ckpt_viz.usermodel.sandbox reads them
_STAGE_BYTES = 200
_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def guard_pid1() -> None:
    """Make this process (PID 1 of the sandbox) undumpable before any run exists: no run can ptrace it, write
    its memory or take its descriptors. SIGINT back at its default, which PID 1 ignores from inside its
    namespace (Python's handler would let a run end it with KeyboardInterrupt)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with bubblewrap's outer process
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def unguard_run(host_fd: int | None) -> None:
    """In the forked run, before any code of the model: no host folder, Python's own SIGINT handling."""
    if host_fd is not None:
        os.close(host_fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def read_host(host_fd: int, name: str, cap: int) -> bytes:
    """A regular file under the host folder (never through a link), of at most `cap` bytes."""
    fd = os.open(name, os.O_RDONLY | _FLAGS | os.O_NONBLOCK, dir_fd=host_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{name} is not a regular file")
        data = f.read(cap + 1)
    if len(data) > cap:
        raise OSError(f"{name} is over {cap} bytes")
    return data


def copy_in(host_fd: int, name: str, scratch: Path) -> dict:
    """The parent's `name` (a path under the host folder) copied to `scratch`/request.json, and parsed."""
    data = read_host(host_fd, name, REQUEST_BYTES)
    (scratch / "request.json").write_bytes(data)
    return json.loads(data)


def open_log(host_fd: int, name: str) -> int:
    """The run's output.log on the host (NOTE [ Run folder ], rule 3), opened for appending."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _FLAGS, 0o600, dir_fd=host_fd)


def result_names(modes: int) -> list[tuple[str, str]]:
    """(file name, kind) of every result a run of `modes` modes may leave: NOTE [ Sandbox protocol ], rule 2."""
    names = [("stage", "stage"), ("error.json", "report")]
    for i in range(modes):
        names += [(f"error-{i}.json", "report"), (f"trace-{i}.json", "trace")]
    return names


def collect(scratch: Path, host_dir_fd: int, modes: int, file_bytes: int) -> None:
    """Copy the run's results from its tmpfs folder to the host folder: regular files only, each at most its cap
    (a bigger one is copied one byte over its cap, so the parent refuses it as it would the original). A link
    or any other kind of file becomes a dangling link on the host, which the parent refuses by name."""
    caps = {"stage": _STAGE_BYTES + 1, "report": _REPORT_BYTES + 1, "trace": file_bytes}
    try:
        src = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY | _FLAGS)
    except OSError:
        return  # the run replaced its own folder: no results
    try:
        for name, kind in result_names(modes):
            _copy(src, host_dir_fd, name, caps[kind])
    finally:
        os.close(src)


def _copy(src_dir: int, dst_dir: int, name: str, cap: int) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _FLAGS, dir_fd=src_dir)
    except FileNotFoundError:
        return
    except OSError:  # a link (ELOOP) or worse
        fd = -1
    try:
        info = os.fstat(fd) if fd >= 0 else None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dst_dir)
        if info is None or not stat.S_ISREG(info.st_mode):
            os.symlink("(not a regular file in the sandbox)", name, dir_fd=dst_dir)
            return
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o600, dir_fd=dst_dir)
        try:
            offset, left = 0, min(info.st_size, cap)
            while left > 0:
                sent = os.sendfile(out, fd, offset, min(left, 1 << 24))
                if sent == 0:
                    break
                offset, left = offset + sent, left - sent
        finally:
            os.close(out)
    finally:
        if fd >= 0:
            os.close(fd)


def empty_masks(masks: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")) -> None:
    """Remove what the last run left in the sandbox's own tmpfs folders (a warm sandbox's runs share them), but
    no mount: the warm process's folder and the read-only folders bound under /tmp stay."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = {line.split()[4] for line in f if len(line.split()) > 4}
    except OSError:
        return
    for mask in masks:
        if mask in mounts:
            _empty(mask, mounts)


def _empty(folder: str, mounts: set[str]) -> None:
    try:
        device, entries = os.lstat(folder).st_dev, list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if info.st_dev != device or entry.path in mounts:
                continue  # a mount point: not the run's
            if stat.S_ISDIR(info.st_mode) and any(m.startswith(entry.path + "/") for m in mounts):
                _empty(entry.path, mounts)  # the way to a mount point: kept, the rest of it emptied
            elif stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)


def reap() -> None:
    """Wait for every child that has ended (PID 1 adopts the run's orphans), without blocking."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def end_namespace() -> None:
    """SIGKILL every other process of the sandbox: kill(-1) from PID 1 reaches all of them, never PID 1."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(-1, signal.SIGKILL)
    reap()
