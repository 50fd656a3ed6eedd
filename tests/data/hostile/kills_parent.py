"""Hostile model: signals its parent, its parent's process group and every process it can, then reports.

Each attempt's outcome goes into the error it raises, so the test can read what happened.
The test copies this file into a fresh folder first; kill(-1) only runs inside a PID
namespace (pid <= 10), where it can reach nothing outside the sandbox.
"""
import os
import signal


def make_model():
    tried = []
    for name, attempt in [("parent", lambda: os.kill(os.getppid(), signal.SIGKILL)),
                          ("parent's group", lambda: os.killpg(os.getpgid(os.getppid()), signal.SIGKILL))]:
        try:
            attempt()
            tried.append(f"{name}: sent")
        except OSError as exc:
            tried.append(f"{name}: {exc.strerror}")
    if os.getpid() <= 10:
        try:
            os.kill(-1, signal.SIGKILL)
            tried.append("everyone: sent")
        except OSError as exc:
            tried.append(f"everyone: {exc.strerror}")
    raise RuntimeError(f"still running as pid {os.getpid()}, parent {os.getppid()}; " + "; ".join(tried))
