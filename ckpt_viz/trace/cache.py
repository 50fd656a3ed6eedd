"""Per-trace derived data: `derived` computes a value once per trace, `event_column` reads one field of every event.

Every view and the lifecycle read the trace through these two, so a cursor move never
rescans it and a loaded trace is never turned into a million `Event` objects.
Standard library only.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

from ckpt_viz.trace import columnpass
from ckpt_viz.trace.model import EventColumns, Trace

__all__ = ["derived", "event_column", "event_data", "event_data_key", "is_derived"]

_DERIVED: dict[int, tuple[Any, tuple[int, int, int], dict[str, Any]]] = {}


def derived(trace: Trace, name: str, build: Callable[[Trace], Any]) -> Any:
    """`build(trace)`, computed once per trace object and name.

    The result is dropped when the trace is garbage-collected or grows (a recording
    still appending). Renderers call this so a cursor move never rescans the trace.
    A result must not refer to the trace itself, or the trace would never be collected.
    """
    key = id(trace)
    stamp = (len(trace.events), len(trace.memory), len(trace.graphs))
    entry = _DERIVED.get(key)
    if entry is None or entry[0]() is not trace or entry[1] != stamp:
        ref = weakref.ref(trace, lambda _ref, key=key, cache=_DERIVED: cache.pop(key, None))
        entry = (ref, stamp, {})
        _DERIVED[key] = entry
    cache = entry[2]
    if name not in cache:
        cache[name] = build(trace)
    return cache[name]


def is_derived(trace: Trace, name: str) -> bool:
    """Whether `derived(trace, name, ...)` would return a value already computed (and build nothing)."""
    entry = _DERIVED.get(id(trace))
    return entry is not None and entry[0]() is trace and \
        entry[1] == (len(trace.events), len(trace.memory), len(trace.graphs)) and name in entry[2]


_CONTEXT_FIELD = {"kind": 0, "mode": 1, "phase": 2, "site": 3, "thread_id": 4}


def event_column(trace: Trace, name: str) -> list[Any]:
    """One Event field for every event, as a list (read from the columns of a loaded trace).

    Args:
        name: an `Event` field: seq, kind, handle_id, mode, phase, session_id, tags, site, data.
    """
    return derived(trace, f"column:{name}", lambda t: _read_column(t.events, name))


def _read_column(events: Any, name: str) -> list[Any]:
    if isinstance(events, EventColumns) and not events.materialized:
        cols = events.columns
        if name in _CONTEXT_FIELD:
            table = [row[_CONTEXT_FIELD[name]] for row in events.tables["context"]]
            return columnpass.take(table, cols["context"])
        if name == "tags":
            return columnpass.take(events.tables["tags"], cols["tags"])
        return list(cols[name])
    return [getattr(e, name) for e in events]


_ABSENT = object()


def _data_rows(trace: Trace) -> tuple[Any, list[int], list[dict[str, list[Any]]]] | None:
    """(shape, rows, by_key) of a loaded trace's packed data column: event i's data is shape `shape[i]`, whose
    key k's values are `by_key[shape[i]][k]`, at row `rows[i]`; None for other traces. Once per trace."""
    def build(t: Trace) -> tuple[Any, list[int], list[dict[str, list[Any]]]] | None:
        events = t.events
        column = events.columns.get("data") if isinstance(events, EventColumns) and not events.materialized else None
        if not all(hasattr(column, name) for name in ("keys", "shape", "values")):
            return None
        shape = column.shape
        rows = getattr(column, "_positions", None)  # the column's own, when it has read a row already
        if rows is None:
            rows = columnpass.rows(shape, len(column.keys))  # i -> row within its shape
            with contextlib.suppress(AttributeError):
                column._positions = rows  # the same list: reading event i's row later builds it not again
        return shape, rows, [dict(zip(names, values)) for names, values in zip(column.keys, column.values)]
    return derived(trace, "data:rows", build)


def event_data(trace: Trace) -> Callable[..., Any]:
    """`get(i, key, default=None)`: `events[i].data.get(key, default)`, without building event i's data dict.

    A loaded trace keeps its events' data by key (`ckpt_viz.trace.packed.DataColumn`): reading the
    `data` column whole builds a million dicts (0.7 s), while the views need a few keys of a few
    kinds of event. Other traces read the data column.
    """
    def build(t: Trace) -> Callable[..., Any]:
        packed_rows = _data_rows(t)
        if packed_rows is not None:
            shape, positions, by_key = packed_rows

            def packed(i: int, key: str, default: Any = None) -> Any:
                values = by_key[shape[i]].get(key, _ABSENT)
                return default if values is _ABSENT else values[positions[i]]
            return packed
        data = event_column(t, "data")
        return lambda i, key, default=None: (data[i] or {}).get(key, default)
    return derived(trace, "event_data", build)


def event_data_key(trace: Trace, key: str, default: Any = None) -> tuple[list[list[Any] | None], Any, Any]:
    """(by_shape, shape, rows) for reading one data key inline, without a call per event (a pass over a million
    events reads it a few hundred thousand times): `events[i].data.get(key, default)` is
    `default if by_shape[shape[i]] is None else by_shape[shape[i]][rows[i]]`. Once per trace, key and default."""
    def build(t: Trace) -> tuple[list[list[Any] | None], Any, Any]:
        packed_rows = _data_rows(t)
        if packed_rows is not None:
            shape, rows, by_key = packed_rows
            return [values.get(key) for values in by_key], shape, rows
        data = event_column(t, "data")
        return [[(d or {}).get(key, default) for d in data]], [0] * len(data), range(len(data))
    return derived(trace, f"data:key:{key}:{default!r}", build)
