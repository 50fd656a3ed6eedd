"""The event log: filter a trace's events, turn them into table rows, plain text and CSV.

Pure functions of the typed events; standard library and msgspec only. An event in words (the
cursor's line) is `ckpt_viz.analysis.words.describe_event`.

    filter_events(trace, kinds={"released", "replay_refused"}, handles={3})
    event_rows(events) -> [{"seq": 49, "kind": "released", "handle": "h3", ...}, ...]
    rows_text(rows)    -> the same rows as aligned plain text: every column, nothing cut
    rows_csv(rows)     -> the same rows as CSV, no cell a spreadsheet reads as a formula

NOTE [ CSV cells ]
  1. A trace's text (a site, a tag, an error message) is data. A spreadsheet runs a text cell
     that starts with "=", "+", "-", "@", a tab or a carriage return as a formula, so `rows_csv`
     prefixes such a cell with a single quote; numbers and every other cell are written as they are.
"""
from __future__ import annotations

import csv
import io
from bisect import bisect_left
from collections.abc import Collection, Iterable
from typing import Any

from ckpt_viz.events import Event, fields_of
from ckpt_viz.render.text import format_event
from ckpt_viz.trace import Trace

__all__ = ["ROW_COLUMNS", "csv_cell", "event_details", "event_fields", "event_rows", "filter_events", "rows_csv",
           "rows_text"]


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
    events = trace.events
    lo = 0 if start is None else bisect_left(events, start, key=lambda e: e.seq)
    hi = len(events) if stop is None else bisect_left(events, stop, key=lambda e: e.seq)
    picked: Iterable[Event] = events[lo:hi] if (lo, hi) != (0, len(events)) else events
    if kinds is not None:
        wanted_kinds = set(kinds)
        picked = [e for e in picked if e.kind in wanted_kinds]
    if handles is not None:
        wanted_handles = set(handles)
        picked = [e for e in picked if e.handle_id in wanted_handles]
    if phases is not None:
        wanted_phases = set(phases)
        picked = [e for e in picked if e.phase in wanted_phases]
    if text:
        needle = text.lower()
        picked = [e for e in picked if needle in format_event(e, site=True).lower()]
    return list(picked)


ROW_COLUMNS: tuple[str, ...] = ("seq", "kind", "handle", "phase", "session", "tags", "site", "details")


def _short(value: Any) -> str:
    """A compact, complete form: lists as [a,b], dicts as {k:v}; a multi-line string joined with " | "."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(_field(v)) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_short(v)}" for k, v in value.items()) + "}"
    return " | ".join(line.strip() for line in str(value).splitlines() if line.strip())


def _field(value: Any) -> Any:
    """A struct (a tensor's meta, a captured parameter) as its fields."""
    fields = getattr(type(value), "__struct_fields__", None)
    return {k: getattr(value, k) for k in fields} if fields is not None else value


def event_fields(event: Event) -> dict[str, str]:
    """Every field of the event's kind (after the fields every event has), each value in its compact, complete
    form."""
    return {k: _short(_field(v)) for k, v in fields_of(event).items()}


def event_details(event: Event) -> str:
    """Every field of the event's kind, "name=value", two spaces apart, nothing cut."""
    return "  ".join(f"{k}={v}" for k, v in event_fields(event).items())


def event_rows(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Table rows, one column per `ROW_COLUMNS`: seq, kind, handle ("h3" or ""), phase, session,
    tags ("stage=0 microbatch=1"), site, details (every field of the event's kind, nothing cut)."""
    return [{
        "seq": e.seq,
        "kind": e.kind,
        "handle": f"h{e.handle_id}" if e.handle_id is not None else "",
        "phase": e.phase or "",
        "session": "" if e.session_id is None else str(e.session_id),
        "tags": " ".join(f"{k}={v}" for k, v in (e.tags or {}).items()),
        "site": e.site or "",
        "details": event_details(e),
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


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """A cell as CSV text a spreadsheet will not run (NOTE [ CSV cells ]): "=1+1" -> "'=1+1" (a number as it is)."""
    if value is None:
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    return "'" + text if text.startswith(_FORMULA) else text


def rows_csv(rows: list[dict[str, Any]], columns: Iterable[str] | None = None) -> bytes:
    """Rows (e.g. `event_rows`) as UTF-8 CSV with a header, every cell through `csv_cell`."""
    names = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([csv_cell(n) for n in names])
    for r in rows:
        writer.writerow([csv_cell(r.get(n, "")) for n in names])
    return out.getvalue().encode("utf-8")
