"""The event bus: where the runtime's facts go, and which recordings they reach.

Owns `subscribe`, `emit`, the recording scopes (channels), user tags and call-site
capture. Standard library only; it never imports torch or any UI.

NOTE [ Cost with nobody listening ]
  1. Every hook point in the runtime is written `if bus.enabled: bus.emit(...)` (or `emit_row`). `enabled` is a
     plain module attribute that is True only while at least one subscriber is attached or one channel (a
     recording) is open anywhere in the process, so with nobody listening a hook point costs one attribute read
     and a branch: no Event object, no string formatting, no stack walk (spec D8).
  2. While a recording is open on another thread but none here, a hook point does reach `emit`, which finds no
     listener for this context and returns None before building anything (a ContextVar read and the
     launch-context check of NOTE [ Recording scopes ], rule 5).
  3. Call sites (`file:line` of the user's code) are captured only inside `emit`: only while somebody listens here.
  4. A subscriber that raises propagates into the runtime; it is not swallowed.
  5. With somebody listening, emitting is the hot path (a training step emits tens of events). The runtime calls
     `emit_row` (`emit` with the fields positional) or `emit_for(handle, ...)` (the handle's id, mode, phase and
     session id, and its debug story). The usual case, this context's scope being one open recording's channel
     (`Scope.sole`, found when the scope is made) and no global subscriber, takes a path of its own: the fields
     become one tuple that the recording keeps in its flat list with one atomic `list.extend` (NOTE [ Lazy
     events ] in ckpt_viz/trace/rows.py): no lock, no counter. The event comes back as a `KeptRow` (every
     attribute of the Event; its `.seq`, the position, is looked up when read). Otherwise the scope is read once
     and every channel shares the tuple; a channel with a memory reading (`after`) keeps under its lock, so
     readings come in seq order; channels opened with `fn` and global subscribers get Events, numbered by
     counters. Call sites are cached per (file, line) (ckpt_viz/sites.py); tags are read once a `tag()` opened.
  6. That usual case, `current_scope` while this context's innermost channel is open, and the call-site walk over
     files seen before are also in C (ckpt_viz/csrc/busfast.c, NOTE [ C speed-ups ] in ckpt_viz/cext.py), loaded
     when the first channel opens (`use_native`); they hand every other case unchanged to the Python ones
     (`_emit_row_py`, ..., `sites.call_site`: the reference; tests/core/test_bus_native.py runs both).

NOTE [ Recording scopes ]
  1. A *channel* is one scoped listener with its own seq from 0 (a recording owns one). `open_channel(fn)` adds
     it to the scope of the current context, a ContextVar holding the open channels innermost last;
     `Channel.close()` removes exactly that channel again. Removal is by identity, never a ContextVar token
     reset, so closing out of order, or with an exception escaping, leaves every other channel as it was (the
     outer sees both, the inner its own events).
  2. `emit` hands one event to each channel, numbered by that channel from seq 0, and returns what the innermost
     channel got (so a seq the runtime quotes back, such as `last_release_seq`, is in the numbering of the
     innermost recording). Global subscribers (`subscribe`) share one process-wide counter and see every event
     of every context (the CLI's progress bar uses one).
  3. Nested channels share the outermost one's `Scope.shared` dict: per-recording state that must be the same
     for all of them (the runtime's handle numbering).
  4. Threads do not inherit a scope: a `threading.Thread` starts with an empty context (Python's default), so a
     thread started inside a recording reaches it only when handed over explicitly: `scope =
     bus.current_scope()` on the recording's thread, then `with bus.enter_scope(scope):` on the other thread
     (`Recording.attach()` does both). Inheriting would make two app sessions on Streamlit threads, or any
     helper thread, leak into each other's traces.
  5. Autograd worker threads: on CUDA the engine runs backward nodes on device threads whose context is not the
     caller's. The runtime installs `set_launch_context(fn)`, where `fn` returns the context of the code that
     launched the running backward (torch carries a copy of it to the worker with the graph task);
     `context_value` (and so `current_scope`, the tags, the memory holders) falls back to it when this context
     has no value of its own. The runtime's nodes that run a nested backward run in a copy of that context
     (`ckpt_viz.runtime.handover`), so the nested pass carries it on.
  6. `emit(..., scope=s)` sends to `s` instead of this context's scope when `s` has an open channel (a handle's
     `node_collected`, which garbage collection may run on any thread, goes to the recordings that saw the
     handle created).
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ckpt_viz.events import Event, EventRow, KeptRow, make_event
from ckpt_viz.launch import context_value, launch_context, set_launch_context
from ckpt_viz.sites import call_site, skip_frames_in

__all__ = ["Channel", "Scope", "Subscriber", "call_site", "context_value", "current_scope", "current_tags", "emit",
           "emit_error", "emit_for", "emit_row", "enabled", "enter_scope", "name_of", "open_channel",
           "set_launch_context", "skip_frames_in", "subscribe", "tag", "use_native"]


class Subscriber(Protocol):
    def __call__(self, event: Event) -> None: ...


enabled: bool = False  # See NOTE [ Cost with nobody listening ], rule 1.

_subscribers: tuple[Subscriber, ...] = ()
_open_channels = 0
_lock = threading.RLock()
_seq = itertools.count()
_NO_TAGS: Mapping[str, Any] = {}  # one shared object: traces intern tags by identity
_TAGS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("ckpt_viz_tags", default=None)
_tagged = False  # True once any `tag()` block opened in this process: until then no context has tags
_new_row, _monotonic_ns, _get_ident = tuple.__new__, time.monotonic_ns, threading.get_ident


def _update_enabled() -> None:
    global enabled
    enabled = bool(_subscribers) or _open_channels > 0


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Attach `fn(event)` to every event emitted from now on, in every context; returns a function that detaches
    `fn` again (calling it twice is harmless)."""
    global _subscribers, _seq
    if not callable(fn):
        raise TypeError(f"ckpt_viz.subscribe: expected a callable taking one Event, got {fn!r}.")
    with _lock:
        if not _subscribers:
            _seq = itertools.count()  # a fresh listener sees seq 0, 1, 2, ...
        _subscribers = (*_subscribers, fn)
        _update_enabled()

    def unsubscribe() -> None:
        global _subscribers
        with _lock:
            remaining = list(_subscribers)
            if fn in remaining:
                remaining.remove(fn)
            _subscribers = tuple(remaining)
            _update_enabled()

    return unsubscribe


# ---------------------------------------------------------------- scopes

class Channel:
    """One scoped listener, its own seq from 0 (NOTE [ Recording scopes ]): it hands each event as an `Event`
    to `fn`, or (a recording's) as its fields after seq to `rows`, then as an `EventRow` to `after`."""

    __slots__ = ("__weakref__", "_after", "_keep", "_lock", "_only_rows", "_seq", "_seq_of", "fn", "is_open", "names")

    def __init__(self, fn: Subscriber | None, names: Mapping[int, str] | None,
                 rows: Callable[[tuple[Any, ...]], None] | None = None, after: Callable[[EventRow], None] | None = None,
                 seq_of: Callable[[tuple[Any, ...]], int | None] | None = None) -> None:
        self.fn: Subscriber | None = fn
        self._keep = rows
        self._after = after
        self._seq_of = seq_of  # numbered by position (NOTE [ Cost ... ], rule 5); None: by self._seq
        self._only_rows = (rows, seq_of) if after is None and seq_of is not None else None  # emit_row's fast path
        self.names = names or {}
        self.is_open = True
        self._seq = 0
        self._lock = threading.RLock()

    def _deliver(self, values: tuple[Any, ...]) -> Event | EventRow | None:
        with self._lock:  # seq order is delivery order, also when two threads emit into one channel
            keep = self._keep
            if keep is not None:
                keep(values)
                seq_of = self._seq_of
                if seq_of is None:
                    row = _new_row(EventRow, (self._seq, values))
                    self._seq += 1
                elif self._after is None:
                    return _new_row(KeptRow, (seq_of, values))
                else:
                    row = _new_row(EventRow, (seq_of(values), values))
                after = self._after
                if after is not None:
                    after(row)
                return row
            fn = self.fn
            if fn is None:
                return None
            event = make_event(self._seq, *values)
            self._seq += 1
            fn(event)
            return event

    def close(self) -> None:
        """Stop receiving; remove this channel from the current context's scope (harmless twice)."""
        global _open_channels
        with _lock:
            if not self.is_open:
                return
            self.is_open = False
            self.fn = self._keep = self._after = self._only_rows = self._seq_of = None  # it keeps nothing alive
            _open_channels -= 1
            _update_enabled()
        own = _SCOPE.get()
        if own is not None and self in own.channels:
            rest = tuple(c for c in own.channels if c is not self)
            _SCOPE.set(Scope(channels=rest, shared=own.shared) if rest else None)


_NOT_SOLE = Channel(None, None)  # Scope.sole when the fast path does not apply: it keeps nothing
_NOT_SOLE.is_open = False


@dataclass(frozen=True, slots=True)
class Scope:
    """The channels code running here belongs to (innermost last), and the state they share."""

    channels: tuple[Channel, ...] = ()
    shared: dict[str, Any] = field(default_factory=dict)
    # the one channel, when it is a recording's without `after`: emit_row's fast path (NOTE [ Cost ... ], 5)
    sole: Channel = field(default=_NOT_SOLE, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.channels) == 1 and self.channels[0]._only_rows is not None:
            object.__setattr__(self, "sole", self.channels[0])

    def is_open(self) -> bool:
        for channel in self.channels:  # a plain loop: this runs on every event (NOTE [ Cost ... ], 5)
            if channel.is_open:
                return True
        return False


_EMPTY = Scope()
_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("ckpt_viz_scope", default=None)


def _current_scope_py() -> Scope:
    """The recordings code running here belongs to (see NOTE [ Recording scopes ]); empty if none."""
    own = _SCOPE.get()
    if own is not None and (own.channels[-1].is_open or own.is_open()):  # innermost open: no loop
        return own
    launched = launch_context()
    if launched is not None:
        carried = launched.get(_SCOPE)
        if carried is not None and carried.is_open():
            return carried
    return _EMPTY


current_scope = _current_scope_py


def open_channel(fn: Subscriber | None = None, *, names: Mapping[int, str] | None = None,
                 rows: Callable[[tuple[Any, ...]], None] | None = None, after: Callable[[EventRow], None] | None = None,
                 seq_of: Callable[[tuple[Any, ...]], int | None] | None = None) -> Channel:
    """Open a channel in the current context, inside the channels already open here; `close()` it when done.

    `fn` gets each Event the code of this context emits, numbered from seq 0; or, instead, `rows` gets each event's
    fields after seq as a tuple (a recording's `RecordedEvents.keep`, NOTE [ Cost with nobody listening ], rule 5)
    and `after` (only with `rows`, a memory reading) then gets it as an `EventRow`; `seq_of` (with `rows`:
    `RecordedEvents.seq_of`) numbers them by position instead of a counter. `names`: id(object) -> name.
    """
    global _open_channels
    if (fn is None) == (rows is None) or (after is not None and rows is None):
        raise TypeError("ckpt_viz.bus.open_channel: pass either fn or rows (after only with rows).\n"
                        "Tip: open_channel(listener) for Events, open_channel(rows=events.keep) for a recording.")
    if not _native_tried:
        use_native()  # the C twins, built or loaded once, when the first recording opens (NOTE [ Cost ... ], 6)
    channel = Channel(fn, names, rows, after, seq_of if rows is not None else None)
    base = current_scope()
    channels = tuple(c for c in base.channels if c.is_open)
    _SCOPE.set(Scope(channels=(*channels, channel), shared=base.shared if channels else {}))
    with _lock:
        _open_channels += 1
        _update_enabled()
    return channel


@contextlib.contextmanager
def enter_scope(scope: Scope) -> Iterator[Scope]:
    """Make code in the block belong to `scope`'s recordings, e.g. on a thread handed a recording."""
    token = _SCOPE.set(scope if scope.channels else None)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def name_of(obj: Any) -> str | None:
    """The name the innermost recording of this context gives `obj` (a parameter's qualified name), or None."""
    key = id(obj)
    for channel in reversed(current_scope().channels):
        name = channel.names.get(key)
        if name is not None:
            return name
    return None


# ---------------------------------------------------------------- emitting

def emit(kind: str, *, handle_id: int | None = None, mode: str | None = None, phase: str | None = None,
         session_id: Any = None, site: str | None = None, capture_site: bool = True,
         data: Mapping[str, Any] | None = None, scope: Scope | None = None) -> Event | EventRow | None:
    """Hand this event to every listener of this context; see NOTE [ Recording scopes ].

    Returns what the innermost recording got: an `EventRow` for a `record()` block (every attribute of the Event,
    `.seq` and `.site` included), the Event for a channel opened with `fn`; a global subscriber's Event if no
    channel listens here; None if nobody listens.
    """
    return emit_row(kind, handle_id, mode, phase, session_id, site, capture_site, data or {}, scope)


def _emit_row_py(kind: str, handle_id: int | None, mode: str | None, phase: str | None, session_id: Any,
                 site: str | None, capture_site: bool, data: dict[str, Any], scope: Scope | None = None
                 ) -> Event | EventRow | None:
    """`emit` with the fields positional (`data` a dict made for this event): the runtime's hot path, `emit_row`
    (the reference of its C twin, NOTE [ Cost with nobody listening ], rule 6)."""
    own = _SCOPE.get()
    if own is not None and not _subscribers and (scope is None or scope is own):
        # the usual case: one open recording here and nobody else (NOTE [ Cost ... ], 5)
        positional = own.sole._only_rows  # (keep, seq_of); None once the channel closed, or no sole one
        if positional is not None:
            if site is None and capture_site:
                site = call_site()
            if session_id is not None and not isinstance(session_id, (str, int, float, bool)):
                session_id = repr(session_id)
            values = (_monotonic_ns(), kind, handle_id, mode, phase, session_id,
                      (_TAGS.get() or _NO_TAGS) if _tagged else _NO_TAGS, site, _get_ident(), data)
            positional[0](values)  # one atomic extend: seq = position, no lock (rows.py NOTE rule 4)
            return _new_row(KeptRow, (positional[1], values))
    if scope is None and own is not None and (own.channels[-1].is_open or own.is_open()):
        scope = own  # the common case: no launch-context fallback (rule 5 of the NOTE), this context's tags
        tags = (_TAGS.get() or _NO_TAGS) if _tagged else _NO_TAGS
    else:
        if scope is None or not scope.is_open():
            scope = current_scope()
        tags = context_value(_TAGS, _NO_TAGS) if _tagged else _NO_TAGS  # no tag() yet: no context has tags
    channels = scope.channels
    subscribers = _subscribers
    if not channels and not subscribers:
        return None
    if site is None and capture_site:
        site = call_site()
    if session_id is not None and not isinstance(session_id, (str, int, float, bool)):
        session_id = repr(session_id)
    values = (_monotonic_ns(), kind, handle_id, mode, phase, session_id, tags, site, _get_ident(), data)
    if not subscribers and len(channels) == 1:
        return channels[0]._deliver(values)
    event: Event | EventRow | None = None
    if subscribers:
        with _lock:
            event = make_event(next(_seq), *values)
            for fn in subscribers:
                fn(event)
    for channel in channels:
        delivered = channel._deliver(values)
        if delivered is not None:
            event = delivered
    return event


def _emit_for_py(handle: Any, kind: str, site: str | None, capture_site: bool, data: dict[str, Any],
                 scope: Scope | None = None) -> Event | EventRow | None:
    """`emit_row` with a checkpoint handle's id, mode, phase and session id; then into its debug story, if any."""
    event = emit_row(kind, handle.handle_id, handle.mode, handle.phase, handle.session_id, site, capture_site,
                     data, scope)
    story = handle._story
    if story is not None and event is not None:
        story.add(event)
    return event


emit_row, emit_for = _emit_row_py, _emit_for_py
_NATIVE_SOURCE, _native_tried = Path(__file__).resolve().parent / "csrc" / "busfast.c", False


def use_native(on: bool = True) -> bool:
    """Emit and find call sites through the C twins of `_emit_row_py`, `_emit_for_py` and `sites.call_site`
    (`on`), or through the Python (NOTE [ Cost with nobody listening ], rule 6). Says whether C is in use."""
    global emit_row, emit_for, call_site, current_scope, _native_tried
    from ckpt_viz import cext, sites

    _native_tried, native = True, cext.extension(_NATIVE_SOURCE) if on else None
    if native is not None:
        native.configure(globals(), _SCOPE, _TAGS, _NO_TAGS, KeptRow, _emit_row_py, sites.call_site,
                         sites._skip_cache, sites._site_cache, _current_scope_py)
    emit_row, emit_for, call_site, current_scope = (
        (native.emit_row, native.emit_for, native.call_site, native.current_scope) if native is not None
        else (_emit_row_py, _emit_for_py, sites.call_site, _current_scope_py))
    return native is not None


def emit_error(exc: BaseException, where: str, **fields: Any) -> Event | EventRow | None:
    """Emit the `error` event for `exc` once: an exception that already has one is not reported again."""
    if getattr(exc, "_ckpt_viz_reported", False):
        return None
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__
        exc._ckpt_viz_reported = True  # type: ignore[attr-defined]
    code = getattr(exc, "code", None)  # a ckpt_viz error's code (see ckpt_viz.errors); data may set one
    data = {"where": where, "type": type(exc).__name__, "message": str(exc),
            "code": code if isinstance(code, str) else None, **fields.pop("data", {})}
    return emit("error", data=data, **fields)


# ---------------------------------------------------------------- user tags

@contextlib.contextmanager
def tag(**tags: Any) -> Iterator[Mapping[str, Any]]:
    """Tag every event emitted inside the block, e.g. `with tag(stage=0, microbatch=3):`."""
    global _tagged
    _tagged = True
    merged = {**context_value(_TAGS, _NO_TAGS), **tags}
    token = _TAGS.set(merged)
    try:
        yield merged
    finally:
        _TAGS.reset(token)


def current_tags() -> Mapping[str, Any]:
    """The tags open in this context (on an autograd worker: those of the code that launched the backward)."""
    return context_value(_TAGS, _NO_TAGS)
