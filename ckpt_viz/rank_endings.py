"""How a recorded rank's run ends: normally, by an exception, or by a signal (issue 28).

Owns `RankEnding` (the state a rank keeps to write its file once, however it ends),
`partial_meta` (its `meta["partial"]`) and `catch_endings` (the excepthook and the SIGTERM
handler and watcher thread); `ckpt_viz.distributed`'s recording of a rank is one. Standard
library only; never the UI.

NOTE [ Partial runs ]
  1. A rank whose run does not end normally still writes its file, marked partial:
     `meta["partial"] = {"reason", "signal", "error", "step"}` (reason "signal" or
     "exception"; step: the one running, or the one that raised; error: the exception,
     also when a signal ended the rank after a step raised; None where they do not
     apply). Where it is written:
     - SIGTERM (what torchrun sends the ranks when one fails): a handler saves, then
       passes the signal on (the previous handler, or the default action: the process
       dies of it). Python runs a handler only between bytecodes of the main thread,
       and a rank waiting in a gloo receive is inside C; so the signal also wakes a
       watcher thread (`signal.set_wakeup_fd`), which saves when the main thread has
       not within `SIGNAL_GRACE_S` and then ends the process (exit 128 + signal).
     - An exception: one raised by a schedule's `step` is noted (the file is written
       at exit: the runs of torch.multiprocessing.spawn end through `sys.exit(1)`),
       one that reaches `sys.excepthook` saves at once. The recording gets it as an
       `error` event.
     - SIGKILL cannot be caught: that rank leaves no file (the merge's
       `--partial` names it missing).
  2. After a failure, `destroy_process_group` saves without its end-of-run collectives
     (barrier, clock ping-pong): the other ranks may be gone.
  3. Written once (a lock): the first of the ways above wins. A SIGTERM that arrives while
     a save runs (at exit, in the excepthook) waits for it: the main thread's handler
     notes the signal and the save passes it on when done; the watcher waits too.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

__all__ = ["SIGNAL_GRACE_S", "RankEnding", "catch_endings", "partial_meta"]

SIGNAL_GRACE_S = 2.0  # NOTE [ Partial runs ], rule 1: how long the watcher leaves the save to the main thread


class RankEnding:
    """A rank's file, written once however the run ends; subclasses write it in `_save`."""

    steps = 0  # the schedule steps done (the subclass counts them)

    def __init__(self) -> None:
        self.failure: dict[str, Any] | None = None  # a step that raised (NOTE rule 1)
        self.failed: BaseException | None = None
        self.in_step: int | None = None  # the step running now, if any
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.saving = False  # a save runs: a signal meanwhile waits for it (NOTE rule 3)
        self.deferred_signal: int | None = None
        self.pass_on: Any = None  # (signum, frame) -> what SIGTERM did before (set by catch_endings)

    def ending(self, reason: str, **facts: Any) -> dict[str, Any]:
        """`meta["partial"]` for an end by `reason` now: the step in progress, and an exception a step raised
        before (a rank that gloo failed, then was terminated, says both)."""
        noted = self.failure or {}
        step = self.in_step if self.in_step is not None else noted.get("step", self.steps)
        return {**partial_meta(reason, **facts), "step": step, **({"error": noted["error"]} if noted else {})}

    def note_failure(self, exc: BaseException, step: int | None) -> None:
        """A step raised `exc`: a save that follows marks the file partial (NOTE [ Partial runs ], rule 1)."""
        if self.failure is None:
            self.failure = partial_meta("exception", error=exc, step=step)
            self.failed = exc

    def save(self, end_clock: bool, partial: dict[str, Any] | None = None, exc: BaseException | None = None
             ) -> str | None:
        with self.lock:  # NOTE [ Partial runs ], rule 3
            self.saving = True
            try:
                return self._save(end_clock, partial, exc)
            finally:
                self.saving = False
                self.done.set()
                main = threading.current_thread() is threading.main_thread()  # else the watcher ends the process
                deferred, self.deferred_signal = (self.deferred_signal, None) if main else (None, self.deferred_signal)
                if deferred is not None and self.pass_on is not None:
                    self.pass_on(deferred, None)

    def _save(self, end_clock: bool, partial: dict[str, Any] | None, exc: BaseException | None) -> str | None:
        raise NotImplementedError


def partial_meta(reason: str, *, signal_name: str | None = None, error: BaseException | None = None,
                 step: int | None = None) -> dict[str, Any]:
    """`meta["partial"]` of a rank file (NOTE [ Partial runs ], rule 1)."""
    return {"reason": reason, "signal": signal_name,
            "error": f"{type(error).__name__}: {error}"[:2000] if error is not None else None, "step": step}


def catch_endings(rank: RankEnding) -> None:
    """Save on an uncaught exception and on SIGTERM; see NOTE [ Partial runs ], rule 1."""
    hook = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        try:
            partial = {**rank.ending("exception"), "error": partial_meta("exception", error=value)["error"]}
            rank.save(end_clock=False, partial=partial, exc=value)
        finally:
            hook(kind, value, tb)

    sys.excepthook = excepthook
    if threading.current_thread() is not threading.main_thread():  # handlers are set in the main thread only
        return
    previous = signal.getsignal(signal.SIGTERM)

    def pass_on(signum: int, frame: Any) -> None:
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default action: die of the signal, as without ckpt_viz
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def on_sigterm(signum: int, frame: Any) -> None:
        if rank.saving:  # this thread is inside a save (at exit, in the excepthook): it passes the signal on after
            rank.deferred_signal = signum
            return
        rank.save(end_clock=False, partial=rank.ending("signal", signal_name="SIGTERM"))
        pass_on(signum, frame)

    rank.pass_on = pass_on
    signal.signal(signal.SIGTERM, on_sigterm)
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        taken = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:
        taken = 0
    if taken != -1:  # another wakeup fd (an asyncio loop) is in use: keep it; the handler alone saves
        if taken:
            signal.set_wakeup_fd(taken)
        os.close(read)
        os.close(write)
        return

    def watch() -> None:
        while True:
            got = os.read(read, 64)
            if signal.SIGTERM not in got:
                continue
            if not rank.done.wait(SIGNAL_GRACE_S):
                if rank.saving:  # a save at exit or in the excepthook runs: let it finish
                    rank.done.wait(SIGNAL_GRACE_S * 10)
                else:  # the main thread is inside C (a gloo wait): save from here
                    rank.save(end_clock=False, partial=rank.ending("signal", signal_name="SIGTERM"))
            if not callable(previous) and previous != signal.SIG_IGN:
                os._exit(128 + signal.SIGTERM)
            return

    threading.Thread(target=watch, name="ckpt_viz-sigterm", daemon=True).start()
