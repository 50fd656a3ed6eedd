"""One recompute-session system for both checkpoint kinds (spec D3).

Owns the collector, the session registry, activations, prefire and clearing. The
two handle kinds (reentrant handles and non-reentrant frames) plug in through the
small `SessionMember` protocol below, so this module imports neither of them.

NOTE [ Sessions ]
  1. A handle joins a session id by `register(member, sid)`: through
     `recompute_handle` (prefire), through the split helpers, or through
     `ReentrantCheckpointHandle.bind_session`. The registry holds members weakly.
  2. `recompute_session_ctx(sid, retain_on_unpack)` creates one activation, makes it
     current (a ContextVar) and binds it onto every member registered under `sid`.
     The binding lives on the member, because autograd may call backward on a
     worker thread that cannot see the caller's ContextVar. On exit the members
     that carry this activation are unbound and the ContextVar is reset.
  3. A member that was never registered under `sid` is not affected by the
     activation (that is how scenario R3 arises).
  4. `clear_recompute_session(sid)` pops the members: reentrant handles are released
     with reason `session_cleared`, non-reentrant frames drop that session's
     recomputed tensors. Clearing twice is harmless.
  5. Prefire (`recompute_handle`) replays a member now: inside the current
     activation when it has the same id and retains, else inside a temporary
     retaining session; any other current activation is an error.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections.abc import Hashable, Iterator
from typing import Any, Protocol

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointError, CheckpointUsageError
from ckpt_viz.events import Prefired, SessionActivated, SessionBound, SessionCleared, SessionDeactivated

__all__ = [
    "SessionActivation",
    "clear_recompute_session",
    "current_activation",
    "current_collector",
    "emit_error",
    "recompute_handle",
    "recompute_handle_collector_ctx",
    "recompute_session_ctx",
    "register",
]


class SessionMember(Protocol):
    handle_id: int
    mode: str
    active_session: SessionActivation | None

    def _bind_activation(self, activation: SessionActivation | None) -> None: ...
    def _session_cleared(self, session_id: Hashable) -> None: ...
    def _prefire(self) -> None: ...


class SessionActivation:
    """One entry into `recompute_session_ctx`: an id and its retention policy."""

    __slots__ = ("retain_on_unpack", "session_id")

    def __init__(self, session_id: Hashable, retain_on_unpack: bool) -> None:
        self.session_id = session_id
        self.retain_on_unpack = retain_on_unpack

    def __repr__(self) -> str:
        return f"SessionActivation({self.session_id!r}, retain_on_unpack={self.retain_on_unpack})"


_COLLECTOR: contextvars.ContextVar[list | None] = contextvars.ContextVar("ckpt_viz_collector", default=None)
_SESSION: contextvars.ContextVar[SessionActivation | None] = contextvars.ContextVar("ckpt_viz_session", default=None)
_REGISTRY: dict[Hashable, weakref.WeakSet[Any]] = {}
_LOCK = threading.RLock()


def current_activation() -> SessionActivation | None:
    """The activation of the innermost open `recompute_session_ctx`, or None."""
    return _SESSION.get()


def current_collector() -> list | None:
    """The list of the open `recompute_handle_collector_ctx`, or None."""
    return _COLLECTOR.get()


def validate_session_id(session_id: Any, api: str) -> None:
    if session_id is None:
        raise emit_error(CheckpointUsageError(
            f"{api}: session_id must not be None.\nTip: use one id per micro-batch, such as (stage, microbatch)."
        ), api)
    try:
        hash(session_id)
    except TypeError:
        raise emit_error(CheckpointUsageError(
            f"{api}: session_id must be hashable, got {type(session_id).__name__} {session_id!r}.\n"
            "Tip: use an int, a str or a tuple instead."
        ), api) from None


def emit_error(exc: BaseException, where: str, **fields: Any) -> BaseException:
    """Emit the `error` event of `exc` (with `fields`, such as handle_id) while recording; return `exc` to raise."""
    if bus.enabled:
        bus.emit_error(exc, where, **fields)
    return exc


@contextlib.contextmanager
def recompute_handle_collector_ctx() -> Iterator[list]:
    """Collect every checkpoint created in the block (frames and unscoped reentrant handles).

    Yields:
        A fresh list that receives the handles in creation order; pass them to
        `recompute_handle` or to the split helpers.
    """
    handles: list = []
    token = _COLLECTOR.set(handles)
    try:
        yield handles
    finally:
        _COLLECTOR.reset(token)


def register(member: Any, session_id: Hashable) -> None:
    """Register `member` under `session_id`; bind the current activation if it has that id."""
    with _LOCK:
        _REGISTRY.setdefault(session_id, weakref.WeakSet()).add(member)
        member.session_id = session_id  # later events name the session even before it is activated
        activation = _SESSION.get()
        if activation is not None and activation.session_id == session_id:
            _bind(member, activation)
    if bus.enabled:
        bus.emit(SessionBound, handle_id=member.handle_id, mode=member.mode, session_id=session_id,
                 activation_present=activation is not None and activation.session_id == session_id,
                 retain=bool(activation and activation.session_id == session_id and activation.retain_on_unpack))


def _bind(member: Any, activation: SessionActivation) -> None:
    current = member.active_session
    if current is not None and current is not activation:
        if member.mode == "reentrant":
            raise CheckpointError(
                f"ckpt_viz.recompute_session_ctx: Concurrent reentrant recompute sessions on one frame are "
                f"unsupported (handle h{member.handle_id} is bound to session {current.session_id!r}, "
                f"activating {activation.session_id!r}).\nTip: leave the first session before activating another."
            )
        raise CheckpointError(
            f"ckpt_viz.recompute_session_ctx: Concurrent recompute sessions on the same checkpoint frame are not "
            f"supported (frame h{member.handle_id} is bound to session {current.session_id!r}, activating "
            f"{activation.session_id!r}).\nTip: leave the first session before activating another."
        )
    member._bind_activation(activation)


def members(session_id: Hashable) -> list:
    """The live members registered under `session_id`, in no particular order."""
    with _LOCK:
        return list(_REGISTRY.get(session_id, ()))


@contextlib.contextmanager
def recompute_session_ctx(session_id: Hashable, retain_on_unpack: bool = False) -> Iterator[Hashable]:
    """Activate `session_id` for its registered handles while the block runs.

    Args:
        session_id: hashable, not None; one id per micro-batch.
        retain_on_unpack: keep recomputed tensors (non-reentrant) and replay graphs
            (reentrant) after they are used, so a second pass can use them again.

    Yields:
        The session id. See NOTE [ Sessions ], rule 2.
    """
    api = "ckpt_viz.recompute_session_ctx"
    validate_session_id(session_id, api)
    if not isinstance(retain_on_unpack, bool):
        raise emit_error(CheckpointUsageError(
            f"{api}: retain_on_unpack must be bool, got {type(retain_on_unpack).__name__} {retain_on_unpack!r}.\n"
            "Tip: pass True or False."), api)
    if _SESSION.get() is not None:
        raise emit_error(CheckpointError(
            f"{api}: Nested recompute session contexts are not supported (session {_SESSION.get().session_id!r} "
            f"is open, entering {session_id!r}).\nTip: leave the outer session first."), api)
    activation = SessionActivation(session_id, retain_on_unpack)
    bound: list = []
    with _LOCK:
        token = _SESSION.set(activation)
        try:
            for member in list(_REGISTRY.get(session_id, ())):
                _bind(member, activation)
                bound.append(member)
        except BaseException as exc:
            for member in bound:
                member._bind_activation(None)
            _SESSION.reset(token)
            raise emit_error(exc, api)  # noqa: B904  (emit_error returns exc itself)
    if bus.enabled:
        bus.emit(SessionActivated, session_id=session_id, retain_on_unpack=retain_on_unpack,
                 handles=tuple(sorted(m.handle_id for m in bound)))
    try:
        yield session_id
    finally:
        with _LOCK:
            released = [m for m in _REGISTRY.get(session_id, ()) if m.active_session is activation]
            for member in released:
                member._bind_activation(None)
            _SESSION.reset(token)
        if bus.enabled:
            bus.emit(SessionDeactivated, session_id=session_id, retain_on_unpack=retain_on_unpack,
                     handles=tuple(sorted(m.handle_id for m in released)))


def clear_recompute_session(session_id: Hashable) -> None:
    """Forget `session_id`: release its reentrant handles and drop its recomputed tensors.

    See NOTE [ Sessions ], rule 4. Calling it twice is safe.
    """
    validate_session_id(session_id, "ckpt_viz.clear_recompute_session")
    with _LOCK:
        popped = list(_REGISTRY.pop(session_id, ()))
    for member in popped:
        member._session_cleared(session_id)
    if bus.enabled:
        bus.emit(SessionCleared, session_id=session_id,
                 handles=tuple(sorted(m.handle_id for m in popped if m.mode == "reentrant")),
                 frames=tuple(sorted(m.handle_id for m in popped if m.mode != "reentrant")))


def recompute_handle(handle: Any, session_id: Hashable) -> None:
    """Prefire: replay `handle` now so that its later consumers in `session_id` reuse the replay.

    Args:
        handle: a non-reentrant frame or a reentrant handle from
            `recompute_handle_collector_ctx` or `reentrant_checkpoint_scope`.
        session_id: the session its consumers will run in.

    See NOTE [ Sessions ], rule 5.
    """
    api = "ckpt_viz.recompute_handle"
    if not getattr(handle, "_is_checkpoint_handle", False):
        raise emit_error(CheckpointUsageError(
            f"{api}: handle must be produced by recompute_handle_collector_ctx() or reentrant_checkpoint_scope(), "
            f"got {type(handle).__name__}.\nTip: collect handles with `with recompute_handle_collector_ctx() as "
            "handles:` around the forward."), api)
    validate_session_id(session_id, api)
    active = _SESSION.get()
    if active is not None and active.session_id == session_id and active.retain_on_unpack:
        path = "in_session"
    elif active is not None:
        raise emit_error(CheckpointError(
            f"{api}: recompute_handle cannot enter another active recompute session (session {active.session_id!r} "
            f"with retain_on_unpack={active.retain_on_unpack} is open; prefiring h{handle.handle_id} for "
            f"{session_id!r}).\nTip: prefire outside any session, or inside recompute_session_ctx({session_id!r}, "
            "retain_on_unpack=True)."), api, handle_id=handle.handle_id)
    else:
        path = "temporary_session"
    if bus.enabled:
        bus.emit(Prefired, handle_id=handle.handle_id, mode=handle.mode, session_id=session_id, path=path)
    if path == "in_session":
        register(handle, session_id)
        handle._prefire()
        return
    register(handle, session_id)
    with recompute_session_ctx(session_id, retain_on_unpack=True):
        handle._prefire()
