"""The event bus: where the runtime's facts go.

Owns `subscribe`, `emit`, user tags and call-site capture. Standard library only;
it never imports torch or any UI.

NOTE [ Cost with nobody listening ]
  1. Every hook point in the runtime is written `if bus.enabled: bus.emit(...)`.
     `enabled` is a plain module attribute that is True only while at least one
     subscriber is attached, so with nothing subscribed a hook point costs one
     attribute read and a branch: no Event object, no string formatting, no
     stack walk (spec D8).
  2. Call sites (`file:line` of the user's code) are captured only inside
     `emit`, that is, only while somebody listens.
  3. A subscriber that raises propagates into the runtime; it is not swallowed.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Protocol

from ckpt_viz.events import Event

__all__ = ["Subscriber", "call_site", "current_tags", "emit", "emit_error", "enabled", "skip_frames_in", "subscribe",
           "tag"]


class Subscriber(Protocol):
    def __call__(self, event: Event) -> None: ...


enabled: bool = False  # See NOTE [ Cost with nobody listening ], rule 1.

_subscribers: tuple[Subscriber, ...] = ()
_lock = threading.RLock()
_seq = itertools.count()
_TAGS: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("ckpt_viz_tags", default={})


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Attach `fn(event)` to every event emitted from now on.

    Returns:
        A function that detaches `fn` again (calling it twice is harmless).
    """
    global enabled, _subscribers, _seq
    if not callable(fn):
        raise TypeError(f"ckpt_viz.subscribe: expected a callable taking one Event, got {fn!r}.")
    with _lock:
        if not _subscribers:
            _seq = itertools.count()  # a fresh listener sees seq 0, 1, 2, ...
        _subscribers = (*_subscribers, fn)
        enabled = True

    def unsubscribe() -> None:
        global enabled, _subscribers
        with _lock:
            remaining = list(_subscribers)
            if fn in remaining:
                remaining.remove(fn)
            _subscribers = tuple(remaining)
            enabled = bool(_subscribers)

    return unsubscribe


def emit(
    kind: str,
    *,
    handle_id: int | None = None,
    mode: str | None = None,
    phase: str | None = None,
    session_id: Any = None,
    site: str | None = None,
    capture_site: bool = True,
    data: Mapping[str, Any] | None = None,
) -> Event | None:
    """Build one Event and hand it to every subscriber; return it (None if nobody listens)."""
    subscribers = _subscribers
    if not subscribers:
        return None
    if site is None and capture_site:
        site = call_site()
    with _lock:
        seq = next(_seq)
        event = Event(
            seq=seq,
            t_ns=time.monotonic_ns(),
            kind=kind,
            handle_id=handle_id,
            mode=mode,
            phase=phase,
            session_id=_json_session_id(session_id),
            tags=_TAGS.get(),
            site=site,
            thread_id=threading.get_ident(),
            data=data or {},
        )
        for fn in subscribers:
            fn(event)
    return event


def emit_error(exc: BaseException, where: str, **fields: Any) -> Event | None:
    """Emit the `error` event for `exc` once: an exception that already has one is not reported again."""
    if getattr(exc, "_ckpt_viz_reported", False):
        return None
    try:
        exc._ckpt_viz_reported = True  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        pass
    code = getattr(exc, "code", None)  # a ckpt_viz error's code (see ckpt_viz.errors); data may set one
    data = {"where": where, "type": type(exc).__name__, "message": str(exc),
            "code": code if isinstance(code, str) else None, **fields.pop("data", {})}
    return emit("error", data=data, **fields)


def _json_session_id(session_id: Any) -> Any:
    if session_id is None or isinstance(session_id, (str, int, float, bool)):
        return session_id
    return repr(session_id)


# ---------------------------------------------------------------- user tags

@contextlib.contextmanager
def tag(**tags: Any) -> Iterator[Mapping[str, Any]]:
    """Tag every event emitted inside the block, e.g. `with tag(stage=0, microbatch=3):`."""
    merged = {**_TAGS.get(), **tags}
    token = _TAGS.set(merged)
    try:
        yield merged
    finally:
        _TAGS.reset(token)


def current_tags() -> Mapping[str, Any]:
    """The tags open in this context."""
    return _TAGS.get()


# ---------------------------------------------------------------- call sites

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The runtime and the bus are never "the user's code"; scenarios and lessons are.
_SKIP_PREFIXES: list[str] = [_PACKAGE_DIR + "runtime" + os.sep, os.path.abspath(__file__),
                             _PACKAGE_DIR + "recording.py"]
_skip_cache: dict[str, bool] = {}
_library_dirs_added = False


def skip_frames_in(path: str) -> None:
    """Never report a line of `path` (a file, or a folder ending in os.sep) as the user's call site."""
    _SKIP_PREFIXES.append(os.path.abspath(path) + (os.sep if path.endswith(os.sep) else ""))
    _skip_cache.clear()


def _library_dirs() -> None:
    global _library_dirs_added
    _library_dirs_added = True
    for name in ("torch", "contextlib", "threading", "functools"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            _SKIP_PREFIXES.append(folder + os.sep if name == "torch" else os.path.abspath(path))


def _skipped(filename: str) -> bool:
    hit = _skip_cache.get(filename)
    if hit is None:
        if not _library_dirs_added:
            _library_dirs()
        path = os.path.abspath(filename)
        hit = filename.startswith("<") or any(path.startswith(p) for p in _SKIP_PREFIXES)
        _skip_cache[filename] = hit
    return hit


def call_site(depth: int = 2) -> str | None:
    """The innermost `file:line` outside ckpt_viz, torch and the standard context helpers."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _skipped(filename):
            return f"{_short_path(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_short_cache: dict[str, str] = {}


def _short_path(filename: str) -> str:
    short = _short_cache.get(filename)
    if short is None:
        try:
            rel = os.path.relpath(filename)
        except ValueError:
            rel = filename
        short = filename if rel.startswith("..") else rel
        _short_cache[filename] = short
    return short
