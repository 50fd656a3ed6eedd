"""Autograd graph at the cursor: checkpoint regions, their handle states, and what DX and DW reach."""
import streamlit as st

from ckpt_viz import GRAPH_LEGEND, TORCHVIZ_LEGEND, collapse_runs, render_torchviz_view
from ui.cursor import cursor_bar
from ui.downloads import download_svg_button
from ui.graphview import checkpoint_dot, show_svg, snapshot_note, zoom_picker
from ui.runs import current

run = current()
st.title("Autograd graph")
seq = cursor_bar(run)
snapshot = run.index.snapshot_at(seq)
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
        runs = collapse_runs(snapshot, states=run.index.handle_states(seq))
        st.caption("Collapsed: " + "; ".join(f"h{r[0]}–h{r[-1]} ({len(r)} identical regions)" for r in runs)
                   if runs else "Nothing to collapse here: no 3 consecutive regions are identical (same ops, "
                   "shapes and state at the cursor).")
    dot = checkpoint_dot(run, seq, collapse=collapse, rankdir=rankdir)
    legend = GRAPH_LEGEND
else:
    b.caption("Collapse applies to the checkpoint view only: torchviz draws every node.")
    dot = render_torchviz_view(snapshot, rankdir=rankdir)
    legend = TORCHVIZ_LEGEND
if dot is None:
    st.info("This trace does not store torchviz's drawing (it was recorded before ckpt_viz kept "
            "torchviz.make_dot's output, or without torchviz installed). Re-record it to see this view; "
            "the checkpoint view shows the same graph.")
    st.stop()
show_svg(dot, zoom, name=f"{view} seq {snapshot.seq}")
st.caption(legend.replace("\n", "  \n"))
download_svg_button(dot, f"graph_seq{seq}", key="dl_graph_svg")
