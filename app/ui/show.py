"""Small helpers that put a thing on a page: an altair chart (fast, clickable), a line of the user's code."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import streamlit as st

from ckpt_viz import aligned_seq, palette
from ui.cursor import set_cursor


def show_chart(render: Callable[..., Any], *args: Any, pick: Any = None, key: str | None = None,
               **kwargs: Any) -> Any:
    """Build an altair chart with `render(*args, **kwargs)`, show it, and return it (for a download).

    Same picture as st.altair_chart, without altair's JSON-schema validation of every
    data row (about 2 s for a 5,000-row chart, on each cursor move); the renderers'
    charts are validated by their own tests.

    Args:
        pick: a `Run`: a click on the chart moves that run's cursor (the chart's selection
            `palette.CURSOR_PICK`, see `picked_seq`); None: the chart ignores clicks.
        key: the chart's widget key (needed with `pick`).
    """
    import altair as alt
    from altair.utils.schemapi import debug_mode

    with debug_mode(False):
        chart = render(*args, **kwargs)
    with alt.theme.enable("none"):  # as st.altair_chart does: no fixed 300 px view from altair's default theme
        spec = chart.to_dict(validate=False)
    # Fit the width to the page; keep the renderer's height for the plot (a lane chart sizes it by its lanes).
    spec.setdefault("autosize", {"type": "fit-x", "contains": "padding"})
    if pick is None or key is None:
        st.vega_lite_chart(spec, width="stretch")
    else:
        st.vega_lite_chart(spec, width="stretch", key=key, on_select=partial(_on_pick, pick, key),
                           selection_mode=[palette.CURSOR_PICK])
    return chart


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
            return aligned_seq(run.trace, float(point["x"]))
    return None


def _on_pick(run: Any, key: str) -> None:
    state = st.session_state.get(key)
    selection = state.get("selection") if hasattr(state, "get") else None
    seq = picked_seq(run, selection or {})
    if seq is not None:
        set_cursor(run, seq)


def source_line(site: str, trace: Any) -> str:
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
