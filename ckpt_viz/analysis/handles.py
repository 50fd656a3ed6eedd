"""What each handle is: its creation event, and the name a page calls it by.

    created_events(trace)  -> {3: HandleCreated(function="Block.forward", label="blocks.3", ...)}
    handle_labels(trace)   -> {3: "blocks.3"}   the checkpointed module's qualified name, else the function

Standard library only.
"""
from __future__ import annotations

from ckpt_viz.analysis._cache import derived
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.events import HandleCreated
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import HANDLE_MODES

__all__ = ["created_events", "handle_label", "handle_labels", "mode_counts", "observed_mode"]


def created_events(trace: Trace) -> dict[int, HandleCreated]:
    """handle -> its `handle_created` event, once per trace (handles created before the recording are absent); kept
    by the lifecycle's one pass over the events."""
    return derived(trace, "created", lambda t: lifecycle(t).created_events())


def handle_label(created: HandleCreated | None) -> str:
    """The name of a handle's region: the module's qualified name when known, else the function's; "" if neither."""
    if created is None:
        return ""
    return created.label or created.function or ""


def handle_labels(trace: Trace) -> dict[int, str]:
    """handle -> the name of its region (`handle_label`), for every handle with one."""
    def build(t: Trace) -> dict[int, str]:
        return {h: label for h, e in created_events(t).items() if (label := handle_label(e))}
    return derived(trace, "labels", build)


def observed_mode(trace: Trace) -> str:
    """The checkpoint kinds the handles of `trace` used, with whose runtime: "nonreentrant (torch)",
    "reentrant (ckpt_viz) + nonreentrant (torch)", or "none" when it holds no handle."""
    used = dict.fromkeys(f"{e.mode} ({e.runtime})" for e in created_events(trace).values())
    return " + ".join(used) if used else "none"


def mode_counts(trace: Trace) -> dict[str, int]:
    """How many handles each kind of checkpoint has ("reentrant", "nonreentrant", "exclude"), in `HANDLE_MODES`
    order, kinds with none left out; a handle none of whose events names a mode counts under "unknown"."""
    def build(t: Trace) -> dict[str, int]:
        first: dict[int, str | None] = {}
        for e in t.events:
            h = e.handle_id
            if h is not None and first.get(h) is None:
                first[h] = e.mode
        found = [m or "unknown" for m in first.values()]
        return {m: n for m in (*HANDLE_MODES, "unknown") if (n := found.count(m))}
    return derived(trace, "mode_counts", build)
