"""The autograd graph as a server-drawn SVG in a scrolling frame: the graph page's and the Debugger's.

`checkpoint_dot(run, seq, ...)` is the checkpoint view at the cursor (handle states,
refused replays, an optional highlighted handle); `show_svg(dot, zoom)` draws DOT with
the `dot` binary and shows it as a new HTML element, with no animated transition
(see NOTE [ Graphs drawn on the server ] in ckpt_viz.render.svg).
"""
from __future__ import annotations

import html
import re

import streamlit as st

from ckpt_viz import CkptVizError, dot_svg, end_dot, refused_handles, render_graph
from ui.runs import Run
from ui.session_end import on_end, session_id

ZOOMS = (25, 50, 75, 100, 150, 200, 300)


@st.cache_data(max_entries=64, show_spinner=False)
def _svg(dot: str, zoom: int, _owner: str | None = None) -> str:
    return dot_svg(dot, zoom / 100, owner=_owner)  # within NOTE [ dot's limits ] (ckpt_viz.render.svg)


def checkpoint_dot(run: Run, seq: int, *, highlight: int | None = None, collapse: bool = False,
                   rankdir: str = "TB") -> str | None:
    """The checkpoint view of the snapshot shown at `seq`, or None when the trace has no snapshot."""
    snapshot = run.index.snapshot_at(seq)
    if snapshot is None:
        return None
    return render_graph(snapshot, states=run.index.handle_states(seq), collapse=collapse, collapse_above=0,
                        rankdir=rankdir, highlight=highlight, refused=refused_handles(run.trace, seq))


def snapshot_note(run: Run, seq: int) -> str:
    """Which snapshot the graph at `seq` is, in words (a cursor before the first one says so)."""
    snapshot = run.index.snapshot_at(seq)
    if snapshot is None:
        return ""
    what = f"snapshot **{snapshot.label}** (taken at seq {snapshot.seq}, {len(snapshot.nodes)} nodes)"
    if snapshot.seq > seq:
        note = (f"No snapshot was taken by seq {seq} yet: this is the first one, {what}. "
                f"Handle states are as of seq {seq}.")
    else:
        note = f"Showing {what}; handle states as of seq {seq}."
    if run.trace.count("exclude_saved") and not any(n.get("exclude") is not None for n in snapshot.nodes):
        note += (" This run has excluded regions, but none is in this snapshot: in a reentrant checkpoint they live "
                 "inside the replay, so they show in a snapshot taken while a replay is retained (before DW).")
    return note


def show_svg(dot: str, zoom: int = 100, *, name: str = "graph") -> None:
    """`dot` as an SVG at `zoom` percent (fixed font size) in a frame that scrolls to pan.

    The frame is an iframe document (st.html's sanitizer drops SVG elements), rebuilt on every
    cursor move; the SVG is Graphviz's own output, whose text dot escapes.
    """
    owner = session_id()
    on_end(owner, "dot", lambda: end_dot(owner), at_disconnect=True)  # NOTE [ Session end ]
    try:
        svg = _svg(dot, zoom, owner)
    except CkptVizError as err:  # DotLimitError: over NOTE [ dot's limits ]
        st.error(str(err))
        return
    size = re.match(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg)
    height = int(float(size.group(2)) * 4 / 3) + 16 if size else 600  # points -> CSS pixels
    st.iframe(f'<body style="margin:0"><div class="ckpt-graph" data-graph="{html.escape(name)}">{svg}</div></body>',
              height=min(max(height, 120), 820))


def zoom_picker(key: str, container=st) -> int:
    """A zoom percentage (100 = Graphviz's own size: labels about 13 px)."""
    return container.select_slider("Zoom", ZOOMS, value=100, key=key, format_func=lambda z: f"{z}%",
                                   help="Scroll inside the frame to pan; 100% keeps labels at their natural size.")
