"""The event bus: where the runtime's facts go, and which recordings they reach.

Owns `emit`, `subscribe`, the recording scopes (channels), user tags and call-site capture. Standard
library only; it never imports torch or any UI.

NOTE [ Cost with nobody listening ]
  1. Every hook point in the runtime is written `if bus.enabled: bus.emit(...)`. `enabled` is a plain module
     attribute that is True only while a subscriber is attached or a channel (a recording) is open anywhere in
     the process, so with nobody listening a hook point costs one attribute read and a branch: no event object,
     no string formatting, no stack walk (NOTE [ Instrumentation cost ] in docs/runtime.md).
  2. While a recording is open on another thread but none here, a hook point reaches `emit`, which finds no
     listener for this context and returns None before building anything.
  3. Call sites (the user's `file:line`) are captured only inside `emit`, only while somebody listens here.
  4. A subscriber that raises propagates into the runtime; it is not swallowed.
  5. With somebody listening, `emit` builds one event (a frozen msgspec Struct) per channel, numbered by that
     channel from seq 0 under the channel's lock, so two threads emitting into one recording never share or skip
     a seq and its list is in seq order.

NOTE [ Recording scopes ]
  1. A *channel* is one scoped listener with its own seq from 0 (a recording owns one). `open_channel(fn)` adds
     it to the scope of the current context, a ContextVar holding the open channels innermost last;
     `Channel.close()` removes exactly that channel again. Removal is by identity, never a ContextVar token
     reset, so closing out of order, or with an exception escaping, leaves every other channel as it was.
  2. `emit` hands one event to each channel of the scope and returns the innermost channel's (so a seq the
     runtime quotes back, such as a release's, is in the numbering of the innermost recording). Global
     subscribers (`subscribe`) share one process-wide counter and see every event of every context.
  3. Nested channels share the outermost one's `Scope.shared` dict: per-recording state that must be the same
     for all of them (the runtime's handle numbering).
  4. Threads do not inherit a scope: a thread started inside a recording reaches it only when handed over
     explicitly (`Recording.attach()`), so two app sessions on Streamlit threads never leak into each other's
     traces.
  5. Autograd worker threads: on CUDA the engine runs backward nodes on device threads whose context is not the
     caller's. The runtime installs `set_launch_context(fn)`, where `fn` returns the context of the code that
     launched the running backward; `current_scope` and the tags fall back to it when this context has none.
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
from typing import Any, Protocol, TypeVar

from ckpt_viz.events import ActionFinished, ActionStarted, Error, EventBase
from ckpt_viz.launch import context_value, launch_context, set_launch_context
from ckpt_viz.sites import call_site, skip_frames_in
from ckpt_viz.vocabulary import HandleMode, Phase

__all__ = ["Channel", "Scope", "Subscriber", "action", "call_site", "context_value", "current_scope", "current_tags",
           "emit", "emit_error", "enabled", "enter_scope", "name_of", "open_channel", "set_launch_context",
           "skip_frames_in", "subscribe", "tag"]

E = TypeVar("E", bound=EventBase)


class Subscriber(Protocol):
    def __call__(self, event: EventBase) -> None: ...


enabled: bool = False  # See NOTE [ Cost with nobody listening ], rule 1.

_subscribers: tuple[Subscriber, ...] = ()
_open_channels = 0
_lock = threading.RLock()
_seq = itertools.count()
_TagValue = str | int | float | bool | None  # what `EventBase.tags` holds
_NO_TAGS: dict[str, _TagValue] = {}
_TAGS: contextvars.ContextVar[dict[str, _TagValue] | None] = contextvars.ContextVar("ckpt_viz_tags", default=None)
_tagged = False  # True once any `tag()` block opened in this process: until then no context has tags
_SCALARS = (str, int, float, bool)
_SCALAR_TYPES = frozenset(_SCALARS)
_monotonic_ns, _get_ident = time.monotonic_ns, threading.get_ident


def _update_enabled() -> None:
    global enabled
    enabled = bool(_subscribers) or _open_channels > 0


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Attach `fn(event)` to every event emitted from now on, in every context; returns a function that detaches
    `fn` again (calling it twice is harmless)."""
    global _subscribers, _seq
    if not callable(fn):
        raise TypeError(f"ckpt_viz.bus.subscribe: expected a callable taking one event, got {fn!r}.\n"
                        "Tip: pass a function such as `lambda event: print(event.kind)`.")
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
    """One scoped listener with its own seq from 0 (NOTE [ Recording scopes ]): each event goes to `fn`."""

    __slots__ = ("__weakref__", "_lock", "_seq", "fn", "is_open", "names")

    def __init__(self, fn: Subscriber, names: Mapping[int, str] | None) -> None:
        self.fn: Subscriber | None = fn
        self.names = names or {}
        self.is_open = True
        self._seq = 0
        self._lock = threading.Lock()

    def _deliver(self, cls: type[E], common: dict[str, Any], fields: dict[str, Any]) -> E | None:
        with self._lock:  # seq order is delivery order, also when two threads emit into one channel
            fn = self.fn
            if fn is None:
                return None
            event = cls(seq=self._seq, **common, **fields)
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
            _open_channels -= 1
            _update_enabled()
        with self._lock:  # waits for a delivery in progress: once close() returns, nothing more reaches fn
            self.fn = None  # it keeps nothing alive
        own = _SCOPE.get()
        if own is not None and self in own.channels:
            rest = tuple(c for c in own.channels if c is not self)
            _SCOPE.set(Scope(channels=rest, shared=own.shared) if rest else None)


@dataclass(frozen=True, slots=True)
class Scope:
    """The channels code running here belongs to (innermost last), and the state they share."""

    channels: tuple[Channel, ...] = ()
    shared: dict[str, Any] = field(default_factory=dict)

    def is_open(self) -> bool:
        return any(channel.is_open for channel in self.channels)


_EMPTY = Scope()
_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("ckpt_viz_scope", default=None)


def current_scope() -> Scope:
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


def open_channel(fn: Subscriber, *, names: Mapping[int, str] | None = None) -> Channel:
    """Open a channel in the current context, inside the channels already open here; `close()` it when done.

    `fn` gets each event the code of this context emits, numbered from seq 0. `names`: id(object) -> name (a
    recording's parameter names, read with `name_of`).
    """
    global _open_channels
    channel = Channel(fn, names)
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

def emit(cls: type[E], *, handle_id: int | None = None, mode: HandleMode | None = None, phase: Phase | None = None,
         session_id: Any = None, site: str | None = None, capture_site: bool = True, scope: Scope | None = None,
         **fields: Any) -> E | None:
    """Build an event of type `cls` for every listener of this context; see NOTE [ Recording scopes ].

    `fields` are the fields of the event's kind. Returns the innermost recording's event (its `seq` and `site`
    are those the trace holds), a global subscriber's if no recording listens here, or None if nobody listens.
    """
    own = _SCOPE.get()
    if (scope is None or scope is own) and own is not None and not _subscribers and len(own.channels) == 1:
        channel = own.channels[0]  # the usual case: one recording open here, nobody else (NOTE [ Cost ... ], 5)
        if channel.is_open:
            if site is None and capture_site:
                site = call_site()
            if session_id is not None and type(session_id) not in _SCALAR_TYPES:
                session_id = session_id if isinstance(session_id, _SCALARS) else repr(session_id)
            tags = (_TAGS.get() or _NO_TAGS) if _tagged else _NO_TAGS
            with channel._lock:
                fn = channel.fn
                if fn is None:
                    return None
                built = cls(seq=channel._seq, t_ns=_monotonic_ns(), handle_id=handle_id, mode=mode, phase=phase,
                            session_id=session_id, tags=tags, site=site, thread_id=_get_ident(), **fields)
                channel._seq += 1
                fn(built)
            return built
    if scope is None or not scope.is_open():
        scope = current_scope()
    channels = scope.channels
    subscribers = _subscribers
    if not channels and not subscribers:
        return None
    if site is None and capture_site:
        site = call_site()
    if session_id is not None and not isinstance(session_id, _SCALARS):
        session_id = repr(session_id)
    common = {"t_ns": _monotonic_ns(), "handle_id": handle_id, "mode": mode, "phase": phase,
              "session_id": session_id, "tags": context_value(_TAGS, _NO_TAGS) if _tagged else _NO_TAGS,
              "site": site, "thread_id": _get_ident()}
    event: E | None = None
    if subscribers:
        with _lock:
            event = cls(seq=next(_seq), **common, **fields)
            for fn in subscribers:
                fn(event)
    for channel in channels:
        delivered = channel._deliver(cls, common, fields)
        if delivered is not None:
            event = delivered
    return event


def emit_error(exc: BaseException, where: str, **fields: Any) -> Error | None:
    """Emit the `error` event for `exc` once: an exception that already has one is not reported again.

    `fields` are the event's common fields (handle_id, mode, ...) and, optionally, `code` and `retain_graph`.
    """
    if getattr(exc, "_ckpt_viz_reported", False):
        return None
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__
        exc._ckpt_viz_reported = True  # type: ignore[attr-defined]  # a marker set on any exception, by design
    code = fields.pop("code", None) or getattr(exc, "code", None)  # a ckpt_viz error's code (ckpt_viz.errors)
    return emit(Error, where=where, type=type(exc).__name__, message=str(exc)[:65536],
                code=code if isinstance(code, str) else None, **fields)


# ---------------------------------------------------------------- user tags

@contextlib.contextmanager
def tag(**tags: Any) -> Iterator[Mapping[str, Any]]:
    """Tag every event emitted inside the block, e.g. `with tag(stage=0, microbatch=3):`.

    Tag values are str, int, float, bool or None; anything else is kept as its repr.
    """
    global _tagged
    _tagged = True
    plain: dict[str, _TagValue] = {k: v if v is None or isinstance(v, _SCALARS) else repr(v) for k, v in tags.items()}
    outer = context_value(_TAGS, _NO_TAGS)
    merged = {**outer, **plain}
    token = _TAGS.set(merged)
    try:
        yield merged
    finally:
        _TAGS.reset(token)


def current_tags() -> Mapping[str, Any]:
    """The tags open in this context (on an autograd worker: those of the code that launched the backward)."""
    return context_value(_TAGS, _NO_TAGS)


@contextlib.contextmanager
def action(**tags: Any) -> Iterator[Mapping[str, Any]]:
    """Run the block as one pipeline action: tagged with `tags` (as `tag`), between an `action_started` and an
    `action_finished` event that carry nothing but those tags, so the action's box on the schedule timeline spans
    all its work (NOTE [ Timeline boxes ] in ckpt_viz/analysis/actions.py). The end is marked also when the block
    raises. With nobody listening it costs what `tag` costs (NOTE [ Cost with nobody listening ], rule 1).

        with bus.action(stage=1, microbatch=3, action="DW"):
            backward_weight(...)
    """
    with tag(**tags) as merged:
        if enabled:
            emit(ActionStarted, capture_site=False)
        try:
            yield merged
        finally:
            if enabled:
                emit(ActionFinished, capture_site=False)
