"""Small helpers that put a thing on a page: an altair chart (fast), a line of the user's code."""
from __future__ import annotations

import linecache
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

ROOT = Path(__file__).resolve().parent.parent.parent


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


def source_line(site: str) -> str | None:
    """The line of code at `site` ("file:line"), numbered, when the file can be read from here."""
    file, _, line = site.rpartition(":")
    if not file or not line.isdigit():
        return None
    for base in (Path.cwd(), ROOT):
        path = base / file
        if path.is_file():
            text = linecache.getline(str(path), int(line)).rstrip()
            return f"{line}: {text.strip()}" if text else None
    return None
