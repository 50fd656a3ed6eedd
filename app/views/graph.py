"""Autograd graph at the cursor: checkpoint regions, their handle states, and what DX and DW reach."""
import streamlit as st

from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.routing import snapshot_before
from ckpt_viz.render.graph import (
    COLLAPSE_ABOVE,
    COLLAPSE_REGIONS_ABOVE,
    GRAPH_LEGEND,
    TORCHVIZ_LEGEND,
    collapse_runs,
    render_graph,
    render_torchviz_view,
)
from ui.cursor import cursor_bar
from ui.downloads import download_svg_button
from ui.graphview import graph_view, snapshot_note
from ui.runs import current
from ui.text import md

run = current()
st.title("Autograd graph")
seq = cursor_bar(run)
snapshot = snapshot_before(run.trace, seq)
if snapshot is None:
    st.info("This trace has no graph snapshots (recorded without graphs=True).")
    st.stop()

a, b, c = st.columns([3, 3, 2])
view = a.radio("View", ("Checkpoint regions", "Plain autograd (torchviz)"), horizontal=True, key="graph_view")
rankdir = c.radio("Direction", ("TB", "LR"), horizontal=True, key="graph_rankdir",
                  help="TB: the loss at the top; LR: the loss on the left")
note = snapshot_note(run, seq)
if view == "Checkpoint regions":
    expand = b.toggle("Expand repeated blocks", False, key="graph_expand",
                      help=f"A big graph (over {COLLAPSE_ABOVE} nodes or {COLLAPSE_REGIONS_ABOVE} regions) draws each "
                           "run of 3 or more identical regions (same ops, shapes and state) as its first region and "
                           "one node for the rest; expand to draw every region.")
    graph = render_graph(run.trace, seq, collapse=not expand, rankdir=rankdir)
    runs = [] if expand else collapse_runs(run.trace, seq, collapse_above=COLLAPSE_ABOVE,
                                           collapse_regions_above=COLLAPSE_REGIONS_ABOVE)
    if runs:
        names = handle_labels(run.trace)
        note += "  \nCollapsed: " + "; ".join(
            f"h{r[0]}–h{r[-1]}" + (f" ({md(names[r[0]])} – {md(names[r[-1]])})" if r[0] in names and r[-1] in names
                                   else "") + f", {len(r)} regions identical to h{r[0] - 1}, as one node"
            for r in runs) + ". Turn on **Expand repeated blocks** to draw each."
    legend = GRAPH_LEGEND
else:
    b.caption("Collapse applies to the checkpoint view only: torchviz draws every node.")
    graph = render_torchviz_view(run.trace, seq, rankdir=rankdir)
    legend = TORCHVIZ_LEGEND
if graph is None:
    st.info("This trace does not store torchviz's drawing (it was recorded without torchviz installed). "
            "Re-record it with torchviz to see this view; the checkpoint view shows the same graph.")
    st.stop()
graph_view(graph, key="graph_zoom", name=f"{view} seq {snapshot.seq}", note=note)
st.caption(legend.replace("\n", "  \n"))
download_svg_button(graph.source, f"graph_seq{seq}", key="dl_graph_svg")
