"""`reset_state()`: the runtime's module-level state back to what a fresh process has (test isolation).

Resets the recompute sessions still registered (each cleared as `clear_recompute_session`
clears it), the handle-id counter (from h0 again, only when no handle or frame is alive,
so ids never collide) and the memory probe's hook (detached). The checkpoint switches
(`set_checkpoint_early_stop`, `set_checkpoint_debug_enabled`) and the debug story are
context managers and restore themselves. tests/conftest.py calls this before every test.
"""
from __future__ import annotations

from typing import Any

from ckpt_viz.runtime import memtags, session
from ckpt_viz.runtime.reentrant_handle import restart_handle_ids

__all__ = ["reset_state"]


def reset_state() -> dict[str, Any]:
    """Forget leftover sessions, detach a leftover memory hook, number handles from h0 if none is alive.

    Returns:
        What was left over: {"sessions": the ids cleared, "memory_hook": whether one was attached,
        "handle_ids_restarted": whether numbering starts at h0 again}.
    """
    with session._LOCK:  # the registry is the session module's own; read its keys under its lock
        leftover = list(session._REGISTRY)
    for session_id in leftover:
        session.clear_recompute_session(session_id)
    hooked = memtags.enabled
    if hooked:
        memtags.install(None)
    return {"sessions": leftover, "memory_hook": hooked, "handle_ids_restarted": restart_handle_ids()}
