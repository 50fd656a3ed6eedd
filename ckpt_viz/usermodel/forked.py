"""The warm process, inside the sandbox: `python -m ckpt_viz.usermodel.forked FOLDER [--host-fd N]`.

It imports torch and ckpt_viz's runner once, records one of ckpt_viz's own built-in models
with a single thread (the warm-up: never the user's code), and forks one child per run that
the parent names on stdin (see NOTE [ Warm child ] in
`ckpt_viz.usermodel.warm`, the parent side). Each forked child is a whole run of
`ckpt_viz.usermodel.child.run_child`: its own session, its own folder, log, limits and
report, as a child started from scratch. Under bubblewrap it is PID 1 of its sandbox, FOLDER is a
tmpfs there, and it holds the host's folder as descriptor N: it copies each run's request in and
its results out (NOTE [ Run folder ] in `ckpt_viz.usermodel.isolation`). Never imports the UI.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from ckpt_viz.usermodel import runfolder

__all__ = ["serve"]

_RUN_NAME = re.compile(r"run-\d+")


def _forked(rundir: Path, parent: int, log: int) -> int:
    """The forked child: a new session, the run's folder, log and environment, then the run itself."""
    from ckpt_viz.usermodel.child import run_child

    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir(rundir)
    os.environ.update({"HOME": str(rundir / "home"), "TMPDIR": str(rundir / "tmp")})
    tempfile.tempdir = None  # computed again from TMPDIR
    start = time.monotonic()
    code = run_child(rundir, parent_pid=parent)
    print(f"ckpt_viz.usermodel.child: finished with code {code} in {time.monotonic() - start:.2f} s "
          f"(pid {os.getpid()}, forked from the warm process)", file=sys.stderr)
    return code


def _warm_up(folder: Path) -> None:
    """Record a built-in model once in each common mode and save it: a process's first recording pays for
    torch's and ckpt_viz's lazy set-up (0.3 s runs took 10 s on a loaded machine); the forks inherit it done.
    Only ckpt_viz's own model runs here, never the user's code."""
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    _say("stage importing torch._dynamo")  # most of a first recording's set-up: its first dispatch imports it
    loader = threading.Thread(target=importlib.import_module, args=("torch._dynamo",))  # on a bare stack, as
    loader.start()  # the memory probe does (NOTE [ Memory categories ], rule 8, in ckpt_viz.probe.memory)
    loader.join()
    _say("stage warming up")
    from ckpt_viz.probe.stream import no_profiler

    with no_profiler():  # torch's profiler would leave its thread here, in the process every run forks from
        for mode in ("none", "nonreentrant", "reentrant", "split-reentrant"):
            run_scenario(build_builtin("mlp"), mode, memory=True, graphs=True).save(folder / "tmp" / "warm-up.json")
    os.unlink(folder / "tmp" / "warm-up.json")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve(folder: Path, host_fd: int | None = None) -> int:
    """Import once, then for each line `run NAME` fork a child for FOLDER/NAME; answer `forked PID`, then
    `exited CODE` (negative: the signal that ended it) when it ends. Ends when stdin closes.

    `host_fd`: the host's FOLDER, open, when FOLDER here is the sandbox's tmpfs (NOTE [ Run folder ])."""
    runfolder.guard_pid1()  # undumpable: a run cannot ptrace this process, read or write its memory
    raw = runfolder.read_host(host_fd, "warm.json", runfolder.REQUEST_BYTES) if host_fd is not None else \
        (folder / "warm.json").read_bytes()
    setup = json.loads(raw)
    if sys.platform.startswith("linux") and os.getppid() != setup["parent_pid"] and not setup["isolated"]:
        return 125
    for name in ("home", "tmp"):
        (folder / name).mkdir(exist_ok=True)
    sys.path[:0] = [p for p in setup["sys_path"] if p not in sys.path]
    os.environ.update({"HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp")})
    _say("stage importing torch")  # the parent shows how far the start got (the app's panel)
    import torch  # the point of this process: imported once, before any fork

    import ckpt_viz.usermodel.child  # what each fork runs, imported once
    import ckpt_viz.usermodel.load  # noqa: F401
    from ckpt_viz.usermodel import confine

    confine.problem()  # libseccomp loaded and the filter built once (each fork loads it: apply_limits)

    threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    torch.set_num_threads(1)  # no intra-op thread pool before a fork (a forked pool would hang)
    _warm_up(folder)
    gc.collect()
    gc.freeze()  # what is imported stays shared with the forks (no copy-on-write from the collector)
    _say(f"ready {os.getpid()}")
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2 or words[0] != "run" or not _RUN_NAME.fullmatch(words[1]):
            _say("refused")
            continue
        rundir = folder / words[1]
        try:
            request, log = _prepare(folder, words[1], host_fd)
        except OSError as exc:
            _say(f"refused {exc}")
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                runfolder.unguard_run(host_fd)
                torch.set_num_threads(threads)  # See NOTE [ Warm child ], rule 2: the run's own pool, made here
                code = _forked(rundir, os.getppid(), log)
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(log)
        _say(f"forked {pid}")
        _, status = os.waitpid(pid, 0)
        if host_fd is not None:
            _collect(rundir, words[1], host_fd, request)
        runfolder.reap()
        _say(f"exited {os.waitstatus_to_exitcode(status)}")
    return 0


def _prepare(folder: Path, name: str, host_fd: int | None) -> tuple[dict, int]:
    """The run's folder and request (copied in from the host under bubblewrap) and its log, open."""
    if host_fd is None:
        rundir = folder / name
        log = os.open(rundir / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        return json.loads((rundir / "request.json").read_bytes()), log
    for old in folder.glob("run-*"):  # the last run's folder, and anything a run put there: the tmpfs is shared
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() and not old.is_symlink() else old.unlink()
    runfolder.empty_masks()  # and /tmp, /var/tmp, /dev/shm: each run gets the whole of its space
    (folder / name).mkdir()
    request = runfolder.copy_in(host_fd, f"{name}/request.json", folder / name)
    return request, runfolder.open_log(host_fd, f"{name}/output.log")


def _collect(rundir: Path, name: str, host_fd: int, request: dict) -> None:
    """The run's results copied out to the host's FOLDER/NAME; its tmpfs folder emptied for the next run."""
    try:
        out = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=host_fd)
    except OSError:
        return  # the parent removed it (a run cancelled and cleaned up already)
    try:
        runfolder.collect(rundir, out, len(request["modes"]), int(request["limits"]["file_bytes"]))
    finally:
        os.close(out)
    shutil.rmtree(rundir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_viz.usermodel.forked")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--host-fd", type=int, default=None)
    args = parser.parse_args(argv)
    return serve(args.folder, args.host_fd)


if __name__ == "__main__":
    raise SystemExit(main())
