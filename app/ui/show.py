"""Small helpers that put a thing on a page: an altair chart (fast, clickable), a line of the user's code.

NOTE [ Charts cached per trace ]
  1. A chart shown with `cache_on=trace` is built once per trace object (kept beside it, in a
     weak dictionary: never by the session or its settings, so two sessions share a chart only
     when they show the same trace object, which holds the same events; it goes with the trace).
  2. Its rows travel as named Arrow datasets (`_spec_and_datasets`), its cursor rule reads the
     dataset `CURSOR_DATA`. A cursor move rebuilds nothing on the server, and sends a spec
     equal to the last one: Streamlit's frontend then keeps the Vega view and replaces the one
     dataset whose bytes changed (the cursor's), instead of embedding the chart again.
"""
from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import streamlit as st

from ckpt_viz.analysis.passes import passes
from ckpt_viz.render import palette
from ckpt_viz.trace import Trace
from ui.cursor import set_cursor

CURSOR_DATA = "cursor"  # the named dataset of the cursor's rows, in a chart shown with `cache_on`
# trace -> chart name -> (spec, datasets); nothing in a value refers to its trace (NOTE rule 1)
_CHARTS: weakref.WeakKeyDictionary[Trace, dict[str, Any]] = weakref.WeakKeyDictionary()


def show_chart(render: Callable[..., Any], *args: Any, pick: Any = None, key: str | None = None,
               cache_on: Trace | None = None, cursor_rows: list[dict] | None = None, **kwargs: Any) -> Any:
    """Build an altair chart with `render(*args, **kwargs)`, show it, and return it, or a function that builds it
    (for a download).

    Same picture as st.altair_chart, without altair's JSON-schema validation of every
    data row (about 2 s for a 5,000-row chart, on each cursor move); the renderers'
    charts are validated by their own tests.

    Args:
        pick: a `Run`: a click on the chart moves that run's cursor (the chart's selection
            `palette.CURSOR_PICK`, see `picked_seq`); None: the chart ignores clicks.
        key: the chart's widget key (needed with `pick`).
        cache_on: the trace that `args` and `kwargs` (the cursor aside) are made of, alone: the chart
            is built once for it (See NOTE [ Charts cached per trace ]) and `render` must take
            `cursor_data` and `datasets` (as `render_memory` does). `cursor_rows` are then the rows
            its cursor rule reads (for the memory chart of one trace, [{"seq": cursor}]), and a
            function that builds the chart at the cursor is returned (a download calls it) instead
            of the chart.
    """
    if cache_on is not None:
        static = {k: v for k, v in kwargs.items() if k != "cursor"}
        name = f"app:chart:{render.__module__}.{render.__qualname__}:{key}:{sorted(static.items())!r}"
        charts = _CHARTS.setdefault(cache_on, {})
        if name not in charts:
            charts[name] = _spec_and_datasets(render, *args, cursor_data=CURSOR_DATA, **static)
        spec, datasets = charts[name]
        _show({**spec, "datasets": {**datasets, CURSOR_DATA: _arrow(cursor_rows or [])}}, pick, key)
        return partial(render, *args, **kwargs)
    if "datasets" in inspect.signature(render).parameters:  # rows by name, never walked by altair (rule 2)
        spec, datasets = _spec_and_datasets(render, *args, **kwargs)
        _show({**spec, "datasets": datasets}, pick, key)
        return partial(render, *args, **kwargs)
    chart, spec = _spec(render, *args, **kwargs)
    _show(spec, pick, key)
    return chart


def _spec(render: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """The altair chart `render(*args, **kwargs)` and its Vega-Lite spec, unvalidated, sized to the page's width."""
    import altair as alt
    from altair.utils.schemapi import debug_mode

    with debug_mode(False):
        chart = render(*args, **kwargs)
    with alt.theme.enable("none"):  # as st.altair_chart does: no fixed 300 px view from altair's default theme
        spec = chart.to_dict(validate=False)
    # Fit the width to the page; keep the renderer's height for the plot (a lane chart sizes it by its lanes).
    spec.setdefault("autosize", {"type": "fit-x", "contains": "padding"})
    _no_mark_descriptions(spec)
    return chart, spec


def _no_mark_descriptions(spec: dict[str, Any]) -> None:
    """Vega-Lite gives every mark item an ARIA description, a text built from its fields (format calls and string
    joins), which Streamlit's Vega evaluates item by item with its expression interpreter: on the Overview's memory
    chart of a big trace, thousands of items. Only the SVG renderer ever shows them; these charts draw on a canvas
    (Streamlit's default renderer, which a spec changes through usermeta.embedOptions.renderer), where they are
    never read, so a canvas chart is built without them, as Streamlit itself does for charts of over 5,000 rows.
    A chart given another renderer, or its own mark aria setting, is left as it is."""
    usermeta = spec.get("usermeta")
    options = usermeta.get("embedOptions") if isinstance(usermeta, dict) else None
    renderer = options.get("renderer") if isinstance(options, dict) else None
    if renderer not in (None, "canvas"):
        return
    config = spec.setdefault("config", {})
    config.setdefault("mark", {}).setdefault("aria", False)


def _spec_and_datasets(render: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[dict[str, Any],
                                                                                        dict[str, bytes]]:
    """The spec of `render(*args, datasets=rows, **kwargs)`, whose layers read their rows by name from
    `rows`, and those datasets as Arrow bytes (See NOTE [ Charts cached per trace ], rule 2). Altair never
    sees the rows: its chart constructors and to_dict copy and walk every value of every row."""
    rows: dict[str, list[dict]] = {}
    _, spec = _spec(render, *args, datasets=rows, **kwargs)
    return spec, {name: _arrow(values) for name, values in rows.items()}


def _arrow(rows: list[dict]) -> bytes:
    """Rows as Arrow IPC stream bytes (as streamlit.dataframe_util serialises a pyarrow table)."""
    import pyarrow as pa

    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a column of mixed types (a trace's tags): as text, that column
        mixed = {k for k in {k for r in rows for k in r}
                 if len({type(r[k]) for r in rows if r.get(k) is not None}) > 1}
        table = pa.Table.from_pylist([{k: str(v) if k in mixed and v is not None else v for k, v in r.items()}
                                      for r in rows])
    sink = pa.BufferOutputStream()
    with pa.RecordBatchStreamWriter(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _show(spec: dict[str, Any], pick: Any, key: str | None) -> None:
    if pick is None or key is None:
        st.vega_lite_chart(spec, width="stretch")
    else:
        st.vega_lite_chart(spec, width="stretch", key=key, on_select=partial(_on_pick, pick, key),
                           selection_mode=[palette.CURSOR_PICK])


def picked_seq(run: Any, selection: Any) -> int | None:
    """The seq a chart click chose: {"seq": s} directly, {"x": x} on Compare's axis of passes (the
    event of `run` at that point of its passes); None when the selection holds neither."""
    points = selection.get(palette.CURSOR_PICK) if hasattr(selection, "get") else None
    if isinstance(points, dict):
        points = [points]
    for point in points or ():
        if isinstance(point, dict) and isinstance(point.get("seq"), (int, float)):
            return int(point["seq"])
        if isinstance(point, dict) and isinstance(point.get("x"), (int, float)):
            return passes(run.trace).aligned_seq(float(point["x"]))
    return None


def _on_pick(run: Any, key: str) -> None:
    state = st.session_state.get(key)
    selection = state.get("selection") if hasattr(state, "get") else None
    seq = picked_seq(run, selection or {})
    if seq is not None:
        set_cursor(run, seq)


def source_line(site: str, trace: Trace) -> str:
    """The line of code at `site` ("file:line"), numbered, as `trace` recorded it; plain text.

    Only what the trace holds (`trace.meta["sources"]`, kept when the recording closed: NOTE
    [ What a recording captures ], rule 7, in ckpt_viz/recording.py): never read from the file
    system, so a crafted `site` cannot show another file. "(source not recorded)" otherwise.
    """
    sources = (getattr(trace, "meta", None) or {}).get("sources")
    text = sources.get(site) if isinstance(sources, dict) else None
    if not isinstance(text, str) or not text.strip():
        return "(source not recorded)"
    return f"{site.rpartition(':')[2]}: {text.strip()}"
