"""The event log: filter a trace's events and turn them into table rows.

Pure functions of the trace; standard library only.

    filter_events(trace, kinds={"released", "replay_refused"}, handles={3})
    event_rows(events) -> [{"seq": 49, "kind": "released", "handle": "h3", ...}, ...]
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from ckpt_viz.events import Event
from ckpt_viz.render.text import format_event
from ckpt_viz.trace import Trace
from ckpt_viz.trace.index import TraceIndex, event_column

__all__ = ["event_rows", "filter_events"]


def filter_events(trace: Trace, *, kinds: Collection[str] | None = None, handles: Collection[int] | None = None,
                  phases: Collection[str] | None = None, text: str | None = None, start: int | None = None,
                  stop: int | None = None) -> list[Event]:
    """The events that pass every given filter, in order.

    Args:
        kinds: event kinds to keep.
        handles: handle ids to keep (events without a handle are dropped).
        phases: phases to keep ("ordinary", "dx", "dw").
        text: a case-insensitive substring of the event's one-line form (`format_event`
            with its site), e.g. "dw_complete" or "test_x.py:12".
        start, stop: keep start <= seq < stop.
    """
    window = TraceIndex.of(trace).window(start, stop)
    kind_col = event_column(trace, "kind") if kinds is not None else None
    handle_col = event_column(trace, "handle_id") if handles is not None else None
    phase_col = event_column(trace, "phase") if phases is not None else None
    kinds_set = set(kinds) if kinds is not None else None
    handles_set = set(handles) if handles is not None else None
    phases_set = set(phases) if phases is not None else None
    positions: Iterable[int] = window
    if kind_col is not None:
        positions = (i for i in positions if kind_col[i] in kinds_set)  # type: ignore[operator]
    if handle_col is not None:
        positions = (i for i in positions if handle_col[i] in handles_set)  # type: ignore[operator]
    if phase_col is not None:
        positions = (i for i in positions if phase_col[i] in phases_set)  # type: ignore[operator]
    events = trace.events
    picked = [events[i] for i in positions]
    if text:
        needle = text.lower()
        picked = [e for e in picked if needle in format_event(e, site=True).lower()]
    return picked


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_short(v)}" for k, v in value.items()) + "}"
    line = str(value).splitlines()[0] if str(value) else ""
    return line if len(line) <= 80 else line[:77] + "..."


def event_rows(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Table rows: seq, kind, handle ("h3" or ""), phase, session, tags ("stage=0 microbatch=1"), site, details."""
    return [{
        "seq": e.seq,
        "kind": e.kind,
        "handle": f"h{e.handle_id}" if e.handle_id is not None else "",
        "phase": e.phase or "",
        "session": "" if e.session_id is None else str(e.session_id),
        "tags": " ".join(f"{k}={v}" for k, v in (e.tags or {}).items()),
        "site": e.site or "",
        "details": "  ".join(f"{k}={_short(v)}" for k, v in (e.data or {}).items()),
    } for e in events]
