"""Autograd graph at the cursor: checkpoint regions, their handle states, and what DX and DW reach."""
import streamlit as st

from ckpt_viz.analysis.routing import snapshot_before
from ckpt_viz.render.graph import GRAPH_LEGEND, TORCHVIZ_LEGEND, collapse_runs, render_graph, render_torchviz_view
from ui.cursor import cursor_bar
from ui.downloads import download_svg_button
from ui.graphview import show_svg, snapshot_note, zoom_picker
from ui.runs import current

run = current()
st.title("Autograd graph")
seq = cursor_bar(run)
snapshot = snapshot_before(run.trace, seq)
if snapshot is None:
    st.info("This trace has no graph snapshots (recorded without graphs=True).")
    st.stop()

a, b, c, d = st.columns([3, 3, 2, 3])
view = a.radio("View", ("Checkpoint regions", "Plain autograd (torchviz)"), horizontal=True, key="graph_view")
rankdir = c.radio("Direction", ("TB", "LR"), horizontal=True, key="graph_rankdir",
                  help="TB: the loss at the top; LR: the loss on the left")
zoom = zoom_picker("graph_zoom", d)
st.caption(snapshot_note(run, seq))
if view == "Checkpoint regions":
    collapse = b.toggle("Collapse repeated blocks", False, key="graph_collapse",
                        help="Draw each run of 3 or more identical regions (same ops, shapes and state) as one node")
    if collapse:
        runs = collapse_runs(run.trace, seq)
        st.caption("Collapsed: " + "; ".join(f"h{r[0]}–h{r[-1]} ({len(r)} identical regions)" for r in runs)
                   if runs else "Nothing to collapse here: no 3 consecutive regions are identical (same ops, "
                   "shapes and state at the cursor).")
    graph = render_graph(run.trace, seq, collapse=collapse, collapse_above=0, rankdir=rankdir)
    legend = GRAPH_LEGEND
else:
    b.caption("Collapse applies to the checkpoint view only: torchviz draws every node.")
    graph = render_torchviz_view(run.trace, seq, rankdir=rankdir)
    legend = TORCHVIZ_LEGEND
if graph is None:
    st.info("This trace does not store torchviz's drawing (it was recorded without torchviz installed). "
            "Re-record it with torchviz to see this view; the checkpoint view shows the same graph.")
    st.stop()
show_svg(graph, zoom, name=f"{view} seq {snapshot.seq}")
st.caption(legend.replace("\n", "  \n"))
download_svg_button(graph.source, f"graph_seq{seq}", key="dl_graph_svg")
