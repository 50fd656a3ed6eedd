"""`record()`: capture what the runtime emits while a block runs.

Owns the `Recording` context manager. Standard library only; the memory and graph
probes that need torch plug in later without changing this interface.
"""
from __future__ import annotations

import sys
from types import TracebackType

from ckpt_viz import bus
from ckpt_viz.events import Event
from ckpt_viz.trace import Trace

__all__ = ["Recording", "record"]


class Recording:
    """A context manager whose `.trace.events` holds what was emitted while it was open."""

    def __init__(self) -> None:
        self.trace = Trace()
        self._unsubscribe = None

    def _on_event(self, event: Event) -> None:
        self.trace.events.append(event)

    def __enter__(self) -> "Recording":
        if self._unsubscribe is not None:
            raise RuntimeError("ckpt_viz.record: this recording is already open.\nTip: use a new record() block.")
        self._unsubscribe = bus.subscribe(self._on_event)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None:
                bus.emit("error", data={"where": "record", "type": exc_type.__name__, "message": str(exc)})
        finally:
            self._unsubscribe()
            self._unsubscribe = None


def record() -> Recording:
    """Record the runtime's events while the block runs.

    Example:
        with ckpt_viz.record() as rec:
            loss = model(x).sum(); loss.backward()
        print(rec.trace.kinds())
    """
    return Recording()
