"""The event log: filter a trace's events, turn them into table rows, plain text, and a line in words.

Pure functions of the trace; standard library only.

    filter_events(trace, kinds={"released", "replay_refused"}, handles={3})
    event_rows(events) -> [{"seq": 49, "kind": "released", "handle": "h3", ...}, ...]
    rows_text(rows)    -> the same rows as aligned plain text: every column, nothing cut
    describe_event(e, names={3: "blocks.3"})
                       -> "seq 49 · released · h3 blocks.3 · DW pass · because DW finished · train.py:77"
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from ckpt_viz.events import Event
from ckpt_viz.render import palette
from ckpt_viz.render.text import format_event
from ckpt_viz.trace import Trace
from ckpt_viz.trace.index import TraceIndex, event_column

__all__ = ["ROW_COLUMNS", "describe_event", "event_rows", "filter_events", "rows_text"]


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


ROW_COLUMNS: tuple[str, ...] = ("seq", "kind", "handle", "phase", "session", "tags", "site", "details")


def _short(value: Any) -> str:
    """A compact, complete form: lists as [a,b], dicts as {k:v}; a multi-line string joined with " | "."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_short(v)}" for k, v in value.items()) + "}"
    return " | ".join(line.strip() for line in str(value).splitlines() if line.strip())


def event_rows(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Table rows, one column per `ROW_COLUMNS`: seq, kind, handle ("h3" or ""), phase, session,
    tags ("stage=0 microbatch=1"), site, details (every data field, nothing cut)."""
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


def rows_text(rows: list[dict[str, Any]], *, marker: int | None = None) -> str:
    """`event_rows` as plain text: a header and one line per row with every column the table shows;
    the row with seq `marker` starts with ">". Empty columns are dropped; details come last, whole."""
    columns = [c for c in ROW_COLUMNS if c == "seq" or any(str(r.get(c, "")) for r in rows)]
    fixed = [c for c in columns if c != "details"]
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in fixed}
    def line(values: dict[str, Any], lead: str) -> str:
        cells = [str(values.get(c, "")).rjust(widths[c]) if c == "seq" else str(values.get(c, "")).ljust(widths[c])
                 for c in fixed]
        if "details" in columns:
            cells.append(str(values.get("details", "")))
        return (lead + "  ".join(cells)).rstrip()
    out = [line({c: c for c in columns}, "  ")]
    out += [line(r, "> " if marker is not None and r.get("seq") == marker else "  ") for r in rows]
    return "\n".join(out) + "\n"


# What `describe_event` says about an event's data, per kind: (data key, how to say it).
_WORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "handle_created": (("split", "split DX/DW"),),
    "phase_set": (("new", "phase set to {}"),),
    "replay_started": (("trigger", "for {}"),),
    "replay_finished": (("trigger", "for {}"),),
    "replay_refused": (("reason", "refused because {}"),),
    "released": (("reason", "because {}"),),
    "memory_sampled": (("at", "at {}"),),
    "error": (("type", "{}"), ("message", "{}")),
    "forward_failed": (("type", "{}"), ("message", "{}")),
    "replay_failed": (("type", "{}"), ("message", "{}")),
    "tensor_packed": (("nbytes", "{} bytes saved"),),
}
_TRIGGERS = {"backward": "a backward", "prefire": "a prefire (ahead of the backward)"}


def _said(kind: str, key: str, template: str, value: Any) -> str | None:
    if value is None or value is False or value == "":
        return None
    if key == "split":
        return template
    if key == "new":
        value = palette.phase_word(str(value))
    elif key == "trigger":
        value = _TRIGGERS.get(str(value), str(value))
    elif key == "reason":
        value = palette.reason_word(str(value))
    elif key == "message":
        value = str(value).splitlines()[0] if str(value).strip() else ""
    return template.format(value)


def describe_event(event: Event, names: dict[int, str] | None = None) -> str:
    """One event in words for the cursor line: seq, what happened, which handle (with its block's name),
    the pass, the one or two facts that matter, the stage and micro-batch, the user's file:line.
    No raw data keys (`collector=scope`, `input_count=1` stay in the Events table)."""
    parts = [f"seq {event.seq}", event.kind.replace("_", " ")]
    if event.handle_id is not None:
        name = (names or {}).get(event.handle_id)
        parts.append(f"h{event.handle_id} {name}" if name else f"h{event.handle_id}")
    if event.phase in ("dx", "dw"):
        parts.append(f"{palette.phase_word(event.phase)} pass")
    data = event.data or {}
    for key, template in _WORDS.get(event.kind, ()):
        said = _said(event.kind, key, template, data.get(key))
        if said:
            parts.append(said)
    tags = event.tags or {}
    if tags.get("stage") is not None:
        parts.append(f"stage {tags['stage']}")
    if tags.get("microbatch") is not None:
        parts.append(f"micro-batch {tags['microbatch']}")
    if event.site:
        parts.append(event.site)
    return " · ".join(parts)
