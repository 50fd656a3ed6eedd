"""Small helpers that put a thing on a page: an altair chart (fast), a line of the user's code (as recorded)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st


def show_chart(render: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Build an altair chart with `render(*args, **kwargs)`, show it, and return it (for a download).

    Same picture as st.altair_chart, without altair's JSON-schema validation of every
    data row (about 2 s for a 5,000-row chart, on each cursor move); the renderers'
    charts are validated by their own tests.
    """
    import altair as alt
    from altair.utils.schemapi import debug_mode

    with debug_mode(False):
        chart = render(*args, **kwargs)
    with alt.theme.enable("none"):  # as st.altair_chart does: no fixed 300 px view from altair's default theme
        spec = chart.to_dict(validate=False)
    # Fit the width to the page; keep the renderer's height for the plot (a lane chart sizes it by its lanes).
    spec.setdefault("autosize", {"type": "fit-x", "contains": "padding"})
    st.vega_lite_chart(spec, width="stretch")
    return chart


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
