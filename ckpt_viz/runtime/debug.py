"""Debug stories: what `debug=True` / `set_checkpoint_debug_enabled(True)` adds to errors.

Owns a bus listener that keeps, for each checkpoint created with debug on, the
short story of its events, and `annotate()`, which puts that story into an error
raised while the checkpoint replays. Torch's debug mode logs every operator of the
forward and of the recompute; ours tells the handle's life in a few lines from
the runtime's own events. Imports no torch; never the UI.

NOTE [ Debug stories ]
  1. A handle is a debug handle when it is created inside a `checkpoint()` call
     whose debug setting is on (`collecting()`): a global bus listener catches its
     `handle_created` event, finds the new object among the live handles (by id,
     among those that were not alive when the call began: ids are per recording
     and may repeat), and gives it a story of its own.
  2. From then on the handle's own `_emit` also writes each of its events into its
     story (`handle._story`, set here); nothing else does, so a story never mixes
     two handles.
  3. The listener stays subscribed (so the bus is on and events are built) only
     while a debug handle is alive; otherwise spec D8 holds.
  4. A story keeps the first 8 and the last 24 lines; runs of `tensor_packed` /
     `tensor_unpacked` fold into one line.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ckpt_viz import bus
from ckpt_viz.events import (
    EarlyStopped,
    Error,
    EventBase,
    ForwardFailed,
    ForwardFinished,
    HandleCreated,
    PhaseSet,
    Prefired,
    Released,
    ReplayFailed,
    ReplayFinished,
    ReplayRefused,
    ReplayStarted,
    SessionBound,
)

__all__ = ["annotate", "collecting", "is_debug_handle", "story", "unpack_hook"]

_HEAD, _TAIL = 8, 24
_FOLDED = ("tensor_packed", "tensor_unpacked")

_pending: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("ckpt_viz_debug_pending", default=None)
_lock = threading.Lock()
_live = 0  # debug handles alive
_unsubscribe: Callable[[], None] | None = None


class _Story:
    __slots__ = ("count", "head", "tail")

    def __init__(self) -> None:
        self.head: list[tuple] = []
        self.tail: deque[tuple] = deque(maxlen=_TAIL)
        self.count = 0

    def add(self, event: EventBase) -> None:
        line = (event.seq, event.kind, _details(event), event.phase, event.site)
        self.count += 1
        (self.head.append if len(self.head) < _HEAD else self.tail.append)(line)


def _details(event: EventBase) -> str:
    if isinstance(event, HandleCreated):
        return f"{event.mode} {event.function or '?'}" + (f" split={event.split}" if event.mode == "reentrant" else "")
    if isinstance(event, (ReplayStarted, ReplayFinished)):
        extra = f" key={event.key_source}" if event.key_source is not None else ""
        return f"trigger={event.trigger}{extra}"
    if isinstance(event, (ReplayFailed, ForwardFailed)):
        first = event.message.splitlines()
        return f"{event.type}: {first[0][:100] if first else ''}"
    if isinstance(event, Error):
        return f"{event.type} in {event.where}"
    if isinstance(event, (Released, ReplayRefused)):
        return f"reason={event.reason}"
    if isinstance(event, PhaseSet):
        return f"{event.old} -> {event.new}"
    if isinstance(event, (SessionBound, Prefired)):
        return f"session={event.session_id!r}"
    if isinstance(event, EarlyStopped):
        return f"after {event.saved_count} saved tensors"
    if isinstance(event, ForwardFinished) and event.saved_count is not None:
        return f"saved {event.saved_count} tensors"
    return ""


def _on_event(event: EventBase) -> None:
    pending = _pending.get()
    if pending is None or not isinstance(event, HandleCreated) or event.handle_id is None:
        return
    before, live_handles = pending
    for handle in list(live_handles):
        if (getattr(handle, "handle_id", None) == event.handle_id and id(handle) not in before
                and getattr(handle, "_story", None) is None):
            _adopt(handle, event)
            return


def _adopt(handle: Any, created: EventBase) -> None:
    """Give `handle` a story; its own `_emit` writes into it from now on (see NOTE rule 2)."""
    global _live
    handle._story = _Story()  # `created` goes in when the handle's own `_emit` that emitted it returns (rule 2)
    with _lock:
        _live += 1
    weakref.finalize(handle, _forget)


def _forget() -> None:
    global _live, _unsubscribe
    with _lock:
        _live -= 1
        if _live == 0 and _unsubscribe is not None and _pending.get() is None:
            _unsubscribe()
            _unsubscribe = None


@contextlib.contextmanager
def collecting(live_handles: Any) -> Iterator[None]:
    """Make the checkpoints created in the block debug handles (see NOTE rule 1).

    Args:
        live_handles: the runtime's set of every live handle and frame.
    """
    global _unsubscribe
    with _lock:
        if _unsubscribe is None:
            _unsubscribe = bus.subscribe(_on_event)
    token = _pending.set(({id(h) for h in list(live_handles)}, live_handles))
    try:
        yield
    finally:
        _pending.reset(token)
        with _lock:
            if _live == 0 and _unsubscribe is not None:
                _unsubscribe()
                _unsubscribe = None


def is_debug_handle(handle: Any) -> bool:
    return getattr(handle, "_story", None) is not None


def _render(line: tuple) -> str:
    seq, kind, details, phase, site = line
    parts = [f"#{seq}", kind]
    if phase not in (None, "ordinary"):
        parts.append(f"[{phase}]")
    if details:
        parts.append(details)
    if site:
        parts.append(f"at {site}")
    return "  " + " ".join(parts)


def _fold(lines: list) -> list[str]:
    out: list[str] = []
    run: list = []

    def flush() -> None:
        if len(run) == 1:
            out.append(_render(run[0]))
        elif run:
            out.append(f"  #{run[0][0]}-#{run[-1][0]} {run[0][1]} x{len(run)}")
        run.clear()

    for line in lines:
        if line[1] in _FOLDED and (not run or run[0][1] == line[1]):
            run.append(line)
            continue
        flush()
        if line[1] in _FOLDED:
            run.append(line)
        else:
            out.append(_render(line))
    flush()
    return out


def story(handle: Any) -> str | None:
    """The story of one debug handle, or None when it is not one."""
    told = getattr(handle, "_story", None)
    if told is None:
        return None
    lines = _fold(told.head)
    skipped = told.count - len(told.head) - len(told.tail)
    if skipped > 0:
        lines.append(f"  ... {skipped} more events ...")
    lines += _fold(list(told.tail))
    return f"Debug story of h{handle.handle_id} ({told.count} events):\n" + "\n".join(lines)


def annotate(exc: BaseException, handle: Any) -> BaseException:
    """Put the debug story of `handle` into `exc`'s message (before its Tip); once per exception."""
    text = story(handle) if handle is not None else None
    if text is None or getattr(exc, "_ckpt_viz_story", False):
        return exc
    try:
        exc._ckpt_viz_story = True  # type: ignore[attr-defined]
    except AttributeError:
        return exc
    if len(exc.args) == 1 and isinstance(exc.args[0], str) and str(exc) == exc.args[0]:
        message = exc.args[0]
        cut = message.rfind("\nTip: ")
        exc.args = ((f"{message[:cut]}\n{text}{message[cut:]}" if cut >= 0 else f"{message}\n{text}"),)
    elif hasattr(exc, "add_note"):
        exc.add_note(text)
    return exc


def unpack_hook(frame: Any) -> Callable[[Any], Any]:
    """A debug frame's unpack hook: its errors carry the frame's story."""
    unpack = frame._unpack

    def unpack_with_story(holder: Any) -> Any:
        try:
            return unpack(holder)
        except BaseException as exc:
            annotate(exc, frame)
            raise
    return unpack_with_story
