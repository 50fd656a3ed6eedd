"""Download buttons: the trace (JSON, or Perfetto JSON), a graph as SVG, a chart as PNG, events as CSV.

Each file is built when its button is clicked: the buttons get a callable `data`, which
Streamlit runs only then, so drawing a page never serialises a trace or draws an image.
A graph's SVG is `ckpt_viz.render.svg.dot_svg`'s, inert (NOTE [ Inert SVG ] there); a CSV's
cells are `ckpt_viz.render.eventlog.rows_csv`'s, no cell a formula (NOTE [ CSV cells ] there).
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import streamlit as st

from ckpt_viz.render.eventlog import rows_csv
from ckpt_viz.render.perfetto import render_perfetto
from ckpt_viz.render.svg import dot_svg
from ui.runs import Run


def _trace_bytes(run: Run) -> bytes:
    if run.config.source == "trace" and Path(run.config.target).is_file():
        return Path(run.config.target).read_bytes()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        run.trace.save(path)
        return path.read_bytes()


def perfetto_bytes(run: Run) -> bytes:
    return json.dumps(render_perfetto(run.trace)).encode()


def svg_bytes(dot: str) -> bytes:
    """A DOT source drawn as inert SVG by the graphviz binary (server side), as a standalone file, within NOTE
    [ dot's limits ] (ckpt_viz.render.svg)."""
    from ui.session_end import session_id

    return dot_svg(dot, owner=session_id(), inline=False).encode("utf-8")


def png_bytes(chart: Any) -> bytes:
    """An altair chart (or a function that builds one: `show_chart(..., cache_on=...)`) as PNG (vl-convert,
    no browser)."""
    import altair as alt
    import vl_convert

    if not hasattr(chart, "to_json"):
        chart = chart()
    with alt.data_transformers.disable_max_rows():
        spec = chart.to_json()
    return vl_convert.vegalite_to_png(spec, scale=2)


def _stem(run: Run) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run.config.label.replace(" · ", "_")).strip("_") or "trace"


def download_trace_buttons(run: Run) -> None:
    """Trace JSON (opens in this app) and Perfetto JSON (opens in ui.perfetto.dev)."""
    a, b = st.columns(2)
    a.download_button("Trace JSON", lambda: _trace_bytes(run), file_name=f"{_stem(run)}.json",
                      mime="application/json", on_click="ignore", key="dl_trace", icon=":material/download:")
    b.download_button("Perfetto JSON", lambda: perfetto_bytes(run), file_name=f"{_stem(run)}.perfetto.json",
                      mime="application/json", on_click="ignore", key="dl_perfetto", icon=":material/download:",
                      help="Open it in ui.perfetto.dev or chrome://tracing")


def download_svg_button(dot: str, name: str, key: str) -> None:
    st.download_button("Graph SVG", lambda: svg_bytes(dot), file_name=f"{name}.svg", mime="image/svg+xml",
                       on_click="ignore", key=key, icon=":material/download:")


def download_csv_button(rows: list[dict[str, Any]], name: str, key: str, label: str = "Events CSV") -> None:
    """`rows` (e.g. `event_rows`) as a CSV file, no cell a formula."""
    st.download_button(label, lambda: rows_csv(rows), file_name=f"{name}.csv", mime="text/csv", on_click="ignore",
                       key=key, icon=":material/download:")


def download_png_button(chart: Any, name: str, key: str) -> None:
    st.download_button("Chart PNG", lambda: png_bytes(chart), file_name=f"{name}.png", mime="image/png",
                       on_click="ignore", key=key, icon=":material/download:")
