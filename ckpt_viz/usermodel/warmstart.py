"""The warm process's pipe, and its start watched in the background (NOTE [ Warm child ], rule 7, in
`ckpt_viz.usermodel.warm`).

`Lines` reads the warm process's stdout line by line, each line awaited with a deadline. `Start`
reads its start-up lines on a thread of its own from the moment it is started: `stage ...` lines
(how far it got: importing torch, warming up) and then `ready PID`, so a caller sees the progress
of a start it did not wait for and can wait for it with a Cancel. Standard library only.
"""
from __future__ import annotations

import os
import select
import threading
import time

__all__ = ["Lines", "Start"]


class Lines:
    """Lines from a pipe, each awaited with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.why = fd, b"", ""

    def next(self, deadline: float, cancel: threading.Event | None = None) -> str | None:
        """The next line; None at EOF, on the deadline, or when `cancel` is set (see `self.why`)."""
        self.why = ""
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                self.why = "cancel" if cancel is not None and cancel.is_set() else "time"
                return None
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.05))
            if ready:
                chunk = os.read(self.fd, 4096)
                if not chunk:
                    self.why = "eof"
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", "replace")


class Start:
    """One warm process's start, read on a daemon thread until `ready PID`, another line, EOF or `limit_s`.

    `stage` is the last stage it named ("starting" before its first line, "ready" at the end);
    `done` is set when the start is over, with `line` the line that ended it (None at EOF or on the
    limit, `why` says which) and `seconds` how long it took. Only this thread reads the pipe until
    `done` is set; after that the runs do, one at a time.
    """

    def __init__(self, lines: Lines, limit_s: float) -> None:
        self.lines = lines
        self.stage, self.line, self.why, self.seconds = "starting", None, "", 0.0
        self.began = time.monotonic()
        self.times: dict[str, float] = {}  # stage -> seconds from the start to its line (a benchmark's breakdown)
        self.done = threading.Event()
        self.deadline = self.began + limit_s
        self.thread = threading.Thread(target=self._watch, daemon=True, name="ckpt_viz-warm-start")
        self.thread.start()

    @property
    def ready(self) -> bool:
        return self.done.is_set() and self.line is not None and self.line.startswith("ready ")

    def _watch(self) -> None:
        try:
            while True:
                line = self.lines.next(self.deadline)
                if line is None or not line.startswith("stage "):
                    break
                self.stage = line[len("stage "):].strip()
                self.times[self.stage] = time.monotonic() - self.began
        except (OSError, ValueError):  # the pipe was closed under us: the process was ended
            line, self.lines.why = None, "eof"
        self.line, self.why = line, self.lines.why
        self.seconds = time.monotonic() - self.began
        if line is not None and line.startswith("ready "):
            self.stage, self.times["ready"] = "ready", self.seconds
        self.done.set()

    def wait(self, cancel: threading.Event | None = None, timeout_s: float | None = None) -> bool:
        """Wait until the start is over (True), `cancel` is set or `timeout_s` passes (False)."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done.is_set():
            left = 0.05 if end is None else min(0.05, end - time.monotonic())
            if (cancel is not None and cancel.is_set()) or left <= 0:
                return False
            self.done.wait(left)
        return True
