"""Graphs on a page: a server-drawn, inert SVG shown as an image in a scrolling box; the graph page's and the
Debugger's note on which snapshot is shown; the zoom picker.

`show_svg(graph, zoom)` draws a `graphviz.Digraph` (from `ckpt_viz.render.graph` or
`ckpt_viz.render.routing`) with the `dot` binary and shows it as a new element, with no animated
transition (NOTE [ Graphs drawn on the server ] in ckpt_viz/render/svg.py).

NOTE [ A graph is an image ]
  1. The SVG is `dot_svg`'s, already stripped of script, links, handlers and font names (NOTE
     [ Inert SVG ] there), and it is shown as an <img> whose source is a data: URL: a browser runs
     nothing inside an SVG image and loads nothing it refers to. No iframe, no SVG in the page's DOM.
  2. The image keeps Graphviz's size times the zoom (1 pt = 4/3 CSS px), so a label reads at about
     13 px at 100 % whatever the graph's size; its box scrolls to pan.
  3. "Fit", every graph's default zoom, shows the whole graph in its frame: the image at its own
     size, shrunk (never grown) by the browser to the frame's width and `FIT_HEIGHT`, so every
     checkpoint region is in view whatever the graph's size; a percentage zooms in to read it.
"""
from __future__ import annotations

import base64
import html
import re
from typing import Any

import streamlit as st

from ckpt_viz.analysis.routing import snapshot_before, snapshot_relation
from ckpt_viz.errors import CkptVizError
from ckpt_viz.render.svg import dot_svg, end_dot
from ui.runs import Run
from ui.session_end import on_end, session_id
from ui.text import md

FIT = "Fit"
ZOOMS: tuple[int | str, ...] = (FIT, 25, 50, 75, 100, 150, 200, 300)
FIT_HEIGHT = 720  # px: the tallest a fitted graph is drawn (NOTE [ A graph is an image ], rule 3)
_SIZE = re.compile(r'\bwidth="([\d.]+)pt" height="([\d.]+)pt"')


@st.cache_data(max_entries=64, show_spinner=False)
def _svg(dot: str, zoom: int, _owner: str | None = None) -> str:
    return dot_svg(dot, zoom / 100, owner=_owner)  # within NOTE [ dot's limits ] (ckpt_viz.render.svg)


def snapshot_note(run: Run, seq: int) -> str:
    """Which snapshot the graph at `seq` is, and where it was taken relative to the cursor
    (`analysis.routing.snapshot_relation`), as markdown whose trace text is escaped; "" when the trace has none."""
    snapshot = snapshot_before(run.trace, seq)
    if snapshot is None:
        return ""
    note = (f"Showing snapshot **{md(snapshot.label)}** ({len(snapshot.nodes)} nodes), "
            f"{md(snapshot_relation(run.trace, seq))}. The regions are drawn in their states at the cursor "
            f"(seq {seq}).")
    if run.trace.count("exclude_saved") and not any(n.exclude is not None for n in snapshot.nodes):
        note += (" This run has excluded regions, but none is in this snapshot: in a reentrant checkpoint they live "
                 "inside the replay, so they show in a snapshot taken while a replay is retained (before DW).")
    return note


def show_svg(graph: Any, zoom: int | str = FIT, *, name: str = "graph") -> None:
    """`graph` (a `graphviz.Digraph`, or DOT text of ours) as an inert SVG image at `zoom` percent (or fitted to
    its frame: `FIT`), in a box that scrolls to pan (NOTE [ A graph is an image ])."""
    source = graph if isinstance(graph, str) else graph.source
    owner = session_id()
    on_end(owner, "dot", lambda: end_dot(owner), at_disconnect=True)  # NOTE [ Session end ]
    fit = zoom == FIT
    try:
        svg = _svg(source, 100 if fit else int(zoom), owner)
    except (CkptVizError, ValueError) as err:  # over NOTE [ dot's limits ], or dot wrote no SVG: say so
        st.error(md(str(err)))
        return
    size = _SIZE.search(svg)
    width, height = (float(size.group(1)) * 4 / 3, float(size.group(2)) * 4 / 3) if size else (800.0, 600.0)
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    if fit:  # the browser shrinks the image to the frame, keeping its proportions (rule 3)
        box_height, style = int(min(max(height, 120), FIT_HEIGHT) + 16), \
            f"width:auto;height:auto;max-width:100%;max-height:{FIT_HEIGHT}px;display:block;margin:auto"
    else:
        box_height, style = int(min(max(height + 16, 120), 820)), \
            f"width:{width:.0f}px;height:{height:.0f}px;max-width:none;display:block"
    st.html(f'<div class="ckpt-graph-box" style="overflow:auto;max-height:{box_height}px;border:1px solid #e6e6e6;'
            f'border-radius:4px"><img class="ckpt-graph" data-graph="{html.escape(name)}" '
            f'data-zoom="{"fit" if fit else int(zoom)}" alt="{html.escape(name)}" '
            f'src="data:image/svg+xml;base64,{data}" style="{style}"></div>')


def zoom_picker(key: str, container: Any = st) -> int | str:
    """A zoom: `FIT` (the default: the whole graph in its frame) or a percentage (100 = Graphviz's own size:
    labels about 13 px)."""
    return container.select_slider("Zoom", ZOOMS, value=FIT, key=key,
                                   format_func=lambda z: z if isinstance(z, str) else f"{z}%",
                                   help="Fit: the whole graph in its frame. A percentage: scroll inside the box to "
                                        "pan; 100% keeps labels at their natural size.")


def graph_view(graph: Any, *, key: str, name: str, note: str = "") -> None:
    """A graph with its zoom (Fit by default) above it and `note` (markdown, its trace text escaped) under the
    zoom: what every page that shows a graph draws."""
    left, right = st.columns([3, 1], vertical_alignment="bottom")
    zoom = zoom_picker(key, right)
    if note:
        left.caption(note)
    show_svg(graph, zoom, name=name)
