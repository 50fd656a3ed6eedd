"""What a Streamlit session owns ends when Streamlit ends the session: its sandbox, its uploads, its `dot`.

NOTE [ Session end ]
  1. Streamlit 1.67 has no hook for the end of a session. A session whose tab closed is
     disconnected at once (its script run is stopped), kept for a reconnect for
     `server.disconnectedSessionTTL` seconds (120 by default), then dropped without a word
     to the app; its state is freed by the garbage collector, if ever (reference cycles):
     8 closed sessions left 5 warm sandboxes (1.66 GB) and 8 upload folders behind for
     over 5 minutes (issue 25, finding 4).
  2. So one reaper thread per app process asks the runtime, every `REAP_S` seconds, whether
     each session that owns something is still active (`Runtime.is_active_session`: public,
     thread-safe). A session found inactive ends, at once, what it registered with
     `at_disconnect=True` (its `dot` processes: their script run is gone). A session
     inactive for longer than the TTL, which Streamlit can no longer resume, ends all the
     rest (its warm sandbox, its run, its upload folder).
  3. So nothing a session owns outlives it by more than TTL + 2 x `REAP_S` plus the time
     the kill takes (tests/app/test_browser_session_end.py measures it with real sessions).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["REAP_S", "on_end", "reap_once", "session_id"]

REAP_S = 5.0


@dataclass
class _Owned:
    last_active: float
    at_end: dict[str, Callable[[], None]] = field(default_factory=dict)
    at_disconnect: dict[str, Callable[[], None]] = field(default_factory=dict)


_SESSIONS: dict[str, _Owned] = {}
_LOCK = threading.Lock()
_REAPER: list[threading.Thread] = []


def session_id() -> str | None:
    """The id of the session whose script is running on this thread (None outside a script run)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else None


def on_end(session: str | None, key: str, end: Callable[[], None], *, at_disconnect: bool = False) -> None:
    """Call `end()` once when `session` ends (NOTE [ Session end ]); `at_disconnect`: as soon as it is found
    disconnected. A second registration under the same `key` replaces the first."""
    if session is None:
        return
    with _LOCK:
        owned = _SESSIONS.setdefault(session, _Owned(time.monotonic()))
        (owned.at_disconnect if at_disconnect else owned.at_end)[key] = end
        if not _REAPER:
            thread = threading.Thread(target=_reap, daemon=True, name="ckpt_viz session reaper")
            _REAPER.append(thread)
            thread.start()


def _reap() -> None:
    while True:
        time.sleep(REAP_S)
        with contextlib.suppress(Exception):  # the reaper outlives any one bad callback
            reap_once()


def reap_once() -> list[str]:
    """One round of NOTE [ Session end ], rule 2; the ids of the sessions that ended."""
    from streamlit import config, runtime

    if not runtime.exists():
        return []
    active = runtime.get_instance().is_active_session
    ttl = float(config.get_option("server.disconnectedSessionTTL"))
    now, calls, ended = time.monotonic(), [], []
    with _LOCK:
        for session, owned in list(_SESSIONS.items()):
            if active(session):
                owned.last_active = now
                continue
            calls += owned.at_disconnect.values()
            owned.at_disconnect.clear()
            if now - owned.last_active > ttl:
                calls += owned.at_end.values()
                del _SESSIONS[session]
                ended.append(session)
    for call in calls:  # outside the lock: a sandbox's close waits for its run to stop
        with contextlib.suppress(Exception):
            call()
    return ended
