"""Where a chart's rows go: inline in the altair chart, or by name into a dict the caller sends on its own.

altair copies and walks every value of every row when a chart is built and when it becomes a spec (a
5,000-row chart: seconds). A renderer that takes `datasets` puts each layer's rows there instead, by
name ("d0", "d1", ...), and its layers read `alt.NamedData(name)`: altair never sees the rows, and the
caller sends them itself (the app as Arrow, NOTE [ Charts cached per trace ] in app/ui/show.py).

    with collecting(datasets):
        chart = alt.Chart(rows_data(rows)).mark_bar()...

Imports altair only.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import altair as alt

__all__ = ["collecting", "rows_data"]

_SINK: ContextVar[dict[str, list[dict[str, Any]]] | None] = ContextVar("chart_datasets", default=None)


@contextmanager
def collecting(datasets: dict[str, list[dict[str, Any]]] | None) -> Iterator[None]:
    """While the chart is built, `rows_data` puts rows in `datasets` (None: inline, as altair does)."""
    token = _SINK.set(datasets)
    try:
        yield
    finally:
        _SINK.reset(token)


def rows_data(rows: list[dict[str, Any]]) -> alt.Data | alt.NamedData:
    """A layer's data: its rows inline, or by name in the `datasets` being collected."""
    sink = _SINK.get()
    if sink is None:
        return alt.Data(values=rows)
    name = f"d{len(sink)}"
    sink[name] = rows
    return alt.NamedData(name=name)
