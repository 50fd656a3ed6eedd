"""How a sandboxed child is contained: limits, environment, bubblewrap, cgroups.

The parent side (`ckpt_viz.usermodel.sandbox`) builds a `Limits`, asks `bwrap_problem` whether
bubblewrap can run here, and starts the child through `command` inside a `Cgroup` (where the
platform offers one); the child (`ckpt_viz.usermodel.child`) applies the limits first thing.
Standard library only; never torch, never the UI.

NOTE [ What the sandbox guarantees ]
  With bubblewrap (Linux, `bwrap` installed, namespaces allowed):
    - new user, PID, network, IPC, UTS and cgroup namespaces: the model sees only its own
      processes (it cannot signal the caller), has no network (loopback only, its own), and
      no capabilities (`--cap-drop ALL`), so it cannot raise its hard limits; no user
      namespace can be made inside (`--disable-userns`);
    - `--as-pid-1`: PID 1 of the sandbox is ckpt_viz's own process (the warm process, or a
      cold child's collector: NOTE [ Run folder ]), never bubblewrap's init. It is
      undumpable before any run exists, so no process of a run can ptrace it, write its
      memory (/proc/1/mem) or take its descriptors; the kernel ignores signals from inside
      the namespace that it has no handler for, SIGKILL included; and when it ends, the
      kernel kills every process of its namespace, new sessions and daemons included;
    - `--die-with-parent`: when the caller dies (SIGKILL included) the whole sandbox dies;
    - a read-only view of the system (`--ro-bind / /`), fresh /proc and /dev, the model's
      folder read-only; the only writable places are size-limited tmpfs: the run's folder
      (`Limits.disk_mb`), and /tmp, /var/tmp and /dev/shm (`MASK_MB` each). Their pages
      also count in the run's memory cgroup. No host folder is writable: results leave
      through PID 1 (NOTE [ Run folder ]). /run is an empty read-only tmpfs: the usual host
      sockets (Docker, D-Bus, databases) are not in view, and the seccomp filter refuses
      Unix sockets anywhere;
    - an environment rebuilt from `ENV_ALLOWLIST` (the caller's secrets never reach it).
  Always (with or without bubblewrap):
    - hard resource limits, soft = hard, set before torch is imported: address space
      (RLIMIT_AS), CPU seconds (RLIMIT_CPU), file size (RLIMIT_FSIZE), tasks
      (RLIMIT_NPROC; the kernel does not apply it to root, so a cgroup does) and no core
      files; as root, all capabilities are dropped so those limits stay;
    - a seccomp filter (NOTE [ Seccomp filter ] in ckpt_viz.usermodel.confine, where
      libseccomp is installed): no ptrace, process_vm_readv/writev, pidfd_getfd, io_uring,
      and no Unix sockets (socketpair aside), for every process of the run;
    - a cgroup (v2 or v1, where /sys/fs/cgroup lets this user create one): one memory
      limit for all the model's processes together, a task limit, and a kill that reaches
      every process in it (forks, new sessions) when the run ends;
    - the cleared environment, a working directory and HOME inside its own folder.
  Not guaranteed: without bubblewrap the model can read what the caller can read, use the
  network, write where the caller can write (a full disk included), signal the caller's
  processes and open their /proc/PID/mem; a warning says so once per process. The sandbox
  does not hide the file system from reading (secrets in files the caller can read are
  readable), limit disk I/O bandwidth, or stop a kernel exploit.

NOTE [ Run folder ]
  1. The parent makes the run's folder on the host and writes `request.json` there; in the
     sandbox the same path is a new tmpfs of `Limits.disk_mb` (a disk-fill ends in ENOSPC
     there, never on the host). The host folder is not in the sandbox's view at all: PID 1
     gets it as an open directory descriptor (`--host-fd N`, inherited through bubblewrap).
  2. PID 1 copies `request.json` in, forks the run (which closes the descriptor before any
     code of the model runs), waits for it and copies the results out (`stage`, reports,
     traces): regular files only, never through a link, each at most its cap.
  3. The run's stdout and stderr are `output.log` on the host (the parent reads the stack
     dump there live): the one host file a run writes, capped by RLIMIT_FSIZE.
  4. So a run's writes are bounded: `disk_mb` plus 3 x `MASK_MB` of tmpfs (also counted
     in its memory cgroup) and one log of `file_bytes`; on the host, that log and copies of
     at most `2 + modes` result files, each within its cap.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["DEFAULT_DISK_MB", "ENV_ALLOWLIST", "MASK_MB", "Cgroup", "Limits", "SandboxWarning", "binds",
           "bwrap_problem", "child_env", "command", "not_isolated"]

_API = "ckpt_viz.record_in_subprocess"
# Passed through from the caller when set: locale and thread counts, never credentials.
ENV_ALLOWLIST = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "MALLOC_ARENA_MAX")
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_MASKED = ("/tmp", "/var/tmp", "/dev/shm")  # replaced by empty tmpfs in the sandbox
_HIDDEN = ("/run",)  # replaced by an empty read-only tmpfs: where the system's sockets live (Docker, D-Bus)
_NAMESPACES = ("--unshare-user", "--disable-userns", "--unshare-pid", "--as-pid-1", "--unshare-net",
               "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
DEFAULT_DISK_MB = 1024  # the run's folder (a tmpfs): See NOTE [ Run folder ]
MASK_MB = 64  # each of /tmp, /var/tmp and /dev/shm in the sandbox
_CGROUP_ROOT = Path("/sys/fs/cgroup")


class SandboxWarning(UserWarning):
    """The model file runs with less isolation than the full sandbox (see NOTE [ What the sandbox guarantees ])."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """The child's resource limits, validated: see `Limits.check`."""

    timeout_s: float
    memory_mb: int | None
    max_trace_mb: int
    max_events: int
    max_tasks: int = dataclasses.field(default_factory=lambda: max(512, 16 * (os.cpu_count() or 1)))  # threads too
    disk_mb: int = DEFAULT_DISK_MB  # the run's folder under bubblewrap: See NOTE [ Run folder ]

    @property
    def cpu_s(self) -> int:
        """CPU seconds, all threads together: the wall limit on every core, plus start-up slack."""
        return math.ceil(self.timeout_s * (os.cpu_count() or 1)) + 10

    @property
    def file_bytes(self) -> int:
        """Largest file the child may write: the trace cap plus room for the JSON around it."""
        return (self.max_trace_mb + 16) * 2**20

    @classmethod
    def check(cls, *, timeout_s: object, memory_mb: object, max_trace_mb: object, max_events: object,
              error: type[Exception], disk_mb: object = DEFAULT_DISK_MB) -> Limits:
        """Refuse limits that are not positive and finite (nan, inf, 0, -5 used to disable them silently)."""
        def number(name: str, value: object, integer: bool, tip: str) -> None:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
                and value > 0 and (not integer or float(value).is_integer())
            if not ok:
                kind = "a positive whole number" if integer else "a positive, finite number of seconds"
                raise error(f"{_API}: {name} must be {kind}, got {value!r}.\nTip: {tip}")

        number("timeout_s", timeout_s, False, "the default is 60 s; the CLI flag is --timeout.")
        if memory_mb is not None:
            number("memory_mb", memory_mb, True, "pass the limit in MiB (torch alone needs about 1024), "
                   "or memory_mb=None for no address-space limit (a model on a GPU needs that).")
        number("max_trace_mb", max_trace_mb, True, "the default is 512 MiB of trace file.")
        number("max_events", max_events, True, "the default is 2,000,000 events.")
        number("disk_mb", disk_mb, True, f"the default is {DEFAULT_DISK_MB} MiB for the run's folder (a tmpfs).")
        return cls(float(timeout_s), None if memory_mb is None else int(memory_mb),  # type: ignore[arg-type]
                   int(max_trace_mb), int(max_events), disk_mb=int(disk_mb))  # type: ignore[arg-type]


# -- environment and command --


def package_root() -> str:
    return str(Path(__file__).resolve().parent.parent.parent)


def child_env(workdir: Path) -> dict[str, str]:
    """The child's whole environment: the allowlist, plus HOME and TMPDIR inside its folder."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.setdefault("MALLOC_ARENA_MAX", "2")  # See NOTE [ Memory limit ] in the sandbox
    env.update({"PATH": _SAFE_PATH, "HOME": str(workdir / "home"), "TMPDIR": str(workdir / "tmp"),
                "PYTHONPATH": package_root(), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    return env


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None when bubblewrap can create the sandbox's namespaces here; else why not, in words."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run([exe, *_NAMESPACES, "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                               "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--size", str(MASK_MB << 20),
                               "--tmpfs", "/tmp", "true"],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=20)  # the flags `command` uses
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run ({exc})"
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return "bwrap cannot create namespaces here" + (f" ({said[-1]})" if said else "")
    return None


def binds(paths: Sequence[str]) -> list[str]:
    """--ro-bind for the given paths that the masked folders would hide (the model's folder, sys.path entries)."""
    out: list[str] = []
    for path in dict.fromkeys(os.path.realpath(p) for p in paths if p):
        if os.path.exists(path) and any(path == m or path.startswith(m + "/") for m in (*_MASKED, *_HIDDEN)):
            out += ["--ro-bind", path, path]
    return out


def command(python_argv: list[str], *, workdir: Path, readable: Sequence[str], cgroup_files: Sequence[str],
            isolate: bool, disk_mb: int = DEFAULT_DISK_MB) -> list[str]:
    """The argv that starts the child: in bubblewrap when `isolate`, joined to the cgroup first.

    Under bubblewrap `workdir` is a new tmpfs of `disk_mb` in the sandbox, not the host folder (NOTE [ Run
    folder ]): pass the host folder to the child as an inherited descriptor.
    """
    argv = list(python_argv)
    if isolate:
        devices = [a for d in sorted(Path("/dev").glob("nvidia*")) for a in ("--dev-bind", str(d), str(d))]
        argv = [shutil.which("bwrap") or "bwrap", *_NAMESPACES, "--die-with-parent", "--new-session",
                "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *devices,
                *[a for m in _MASKED if os.path.isdir(m) for a in ("--size", str(MASK_MB << 20), "--tmpfs", m)],
                *[a for m in _HIDDEN if os.path.isdir(m) and not os.path.islink(m)
                  for a in ("--size", "65536", "--tmpfs", m, "--remount-ro", m)],
                *binds(readable), "--size", str(disk_mb << 20), "--tmpfs", str(workdir), "--chdir", str(workdir),
                "--", *argv]
    if cgroup_files:  # the shell joins the cgroup, then becomes the child: nothing runs outside it
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
        argv = ["/bin/sh", "-c", script, "sh", *cgroup_files, "--", *argv]
    return argv


def not_isolated(problem: str, cgroup: Cgroup | None) -> str:
    """The warning for a run without bubblewrap: what is, and what is not, contained."""
    group = ("a cgroup holds its memory and task count and ends its processes" if cgroup is not None and
             cgroup.memory else "no cgroup could be created, so its own subprocesses are limited one by one "
             "and one started in a new session can outlive the run")
    return (f"{_API}: {problem}, so model files run without isolation: they can read any file you can, "
            "write where you can (until the disk is full), use the network and signal your processes (the app's "
            "included). Only the "
            f"hard limits apply (time, address space, CPU time, file size, tasks), its environment is cleared, "
            f"and {group}.\nTip: install bubblewrap (Debian: apt-get install bubblewrap) and allow user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1) to isolate them.")


# -- cgroups --


@dataclasses.dataclass
class Cgroup:
    """The child's cgroup(s): v2 (memory.max, pids.max, cgroup.kill) or v1 (memory and pids hierarchies)."""

    dirs: list[Path]
    memory: Path | None  # the folder holding the memory files, when a memory limit is set
    version: int

    @classmethod
    def create(cls, name: str, limits: Limits) -> Cgroup | None:
        """A new cgroup under this process's own, with the limits written; None where none can be made."""
        try:
            own = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None
        v1 = {ctl: path for line in own for _, ctls, path in [line.split(":", 2)] for ctl in ctls.split(",") if ctl}
        unified = next((line.split(":", 2)[2] for line in own if line.startswith("0::")), None)
        for attempt in (cls._v2, cls._v1):
            group = attempt(name, limits, v1, unified)
            if group is not None and group._joinable():
                return group
            if group is not None:
                group.remove()
        return None

    def _joinable(self) -> bool:
        """Whether a process of ours may move into the group (a delegated cgroup v2 may refuse it)."""
        probe = 'for f; do echo $$ > "$f" 2>/dev/null || exit 1; done'
        try:
            return subprocess.run(["/bin/sh", "-c", probe, "sh", *self.procs_files], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    @staticmethod
    def sweep(prefix: str, dead: Callable[[str], bool]) -> None:
        """Remove empty groups `prefix<pid>_*` beside ours whose parent `dead(name)` says is gone."""
        try:
            own = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return
        bases = {_CGROUP_ROOT / ctl / path.lstrip("/") for line in own for _, ctls, path in [line.split(":", 2)]
                 for ctl in ctls.split(",") if ctl in ("memory", "pids")}
        unified = next((line.split(":", 2)[2] for line in own if line.startswith("0::")), None)
        if unified is not None:
            root = _CGROUP_ROOT if (_CGROUP_ROOT / "cgroup.controllers").exists() else _CGROUP_ROOT / "unified"
            bases.add(root / unified.lstrip("/"))
        for base in bases:
            with contextlib.suppress(OSError):
                for folder in base.iterdir():
                    if folder.name.startswith(prefix) and dead(folder.name):
                        _rmdir_when_empty(folder)

    @classmethod
    def _v2(cls, name: str, limits: Limits, v1: dict[str, str], unified: str | None) -> Cgroup | None:
        base = _CGROUP_ROOT if (_CGROUP_ROOT / "cgroup.controllers").exists() else _CGROUP_ROOT / "unified"
        if unified is None or not (base / "cgroup.controllers").exists():
            return None
        folder = base / unified.lstrip("/") / name
        try:
            folder.mkdir()
        except OSError:
            return None
        group = cls([folder], None, 2)
        try:
            controllers = (folder / "cgroup.controllers").read_text().split()
            if "pids" in controllers:
                (folder / "pids.max").write_text(str(limits.max_tasks))
            if limits.memory_mb and "memory" in controllers:
                (folder / "memory.max").write_text(str(limits.memory_mb * 2**20))
                if (folder / "memory.swap.max").exists():
                    (folder / "memory.swap.max").write_text("0")
                group.memory = folder
        except OSError:
            group.remove()
            return None
        if limits.memory_mb and group.memory is None and "memory" in v1:
            group.remove()
            return None  # a hybrid system: the v1 memory hierarchy does the work
        return group

    @classmethod
    def _v1(cls, name: str, limits: Limits, v1: dict[str, str], unified: str | None) -> Cgroup | None:
        group = cls([], None, 1)
        try:
            for ctl in ("memory", "pids"):
                if ctl not in v1 or not (_CGROUP_ROOT / ctl).is_dir():
                    continue
                folder = _CGROUP_ROOT / ctl / v1[ctl].lstrip("/") / name
                folder.mkdir()
                group.dirs.append(folder)
                if ctl == "pids":
                    (folder / "pids.max").write_text(str(limits.max_tasks))
                elif limits.memory_mb:
                    (folder / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 2**20))
                    if (folder / "memory.memsw.limit_in_bytes").exists():
                        (folder / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb * 2**20))
                    group.memory = folder
        except OSError:
            group.remove()
            return None
        return group if group.dirs else None

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _pids(self) -> set[int]:
        pids: set[int] = set()
        for d in self.dirs:
            try:
                pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return pids

    def kill(self, timeout_s: float = 2.0) -> None:
        """SIGKILL every process in the group, until none is left (or `timeout_s` passes)."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        while (pids := self._pids()) and time.monotonic() < deadline:
            for pid in pids:  # a fork between two reads is caught by the next round
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def oom_kills(self) -> int:
        """How many processes the memory limit ended (the kernel's count)."""
        if self.memory is None:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_bytes(self) -> int | None:
        if self.memory is None:
            return None
        try:
            return int((self.memory / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"))
                       .read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self) -> None:
        """Remove the group's folders (a cgroup folder can go once its last process has exited)."""
        for d in self.dirs:
            _rmdir_when_empty(d)


def _rmdir_when_empty(folder: Path, wait_s: float = 1.0) -> None:
    """Remove a cgroup folder; the kernel refuses (EBUSY) until its last process has fully exited, which can
    lag the process's disappearance from /proc by a few milliseconds: retry for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
