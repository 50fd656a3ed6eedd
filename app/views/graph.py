"""Autograd graph at the cursor: checkpoint regions, their handle states, and what DX and DW reach."""
import streamlit as st

from ckpt_viz import GRAPH_LEGEND, render_graph, render_torchviz_view
from ui.cursor import cursor_bar
from ui.downloads import download_svg_button
from ui.runs import current

run = current()
st.title("Autograd graph")
seq = cursor_bar(run)
snapshot = run.index.snapshot_at(seq)
if snapshot is None:
    st.info("This trace has no graph snapshots (recorded without graphs=True).")
    st.stop()

a, b, c = st.columns(3)
view = a.radio("View", ("Checkpoint regions", "Plain autograd (torchviz)"), horizontal=True, key="graph_view")
collapse = b.toggle("Collapse repeated blocks", True, key="graph_collapse")
rankdir = c.radio("Direction", ("TB", "LR"), horizontal=True, key="graph_rankdir")
if view == "Checkpoint regions":
    dot = render_graph(snapshot, states=run.index.handle_states(seq), collapse=collapse, rankdir=rankdir)
else:
    dot = render_torchviz_view(snapshot)
st.caption(f"Snapshot **{snapshot.label}** (taken at seq {snapshot.seq}; {len(snapshot.nodes)} nodes), "
           f"handle states as of seq {seq}.")
st.graphviz_chart(dot, width="stretch")
st.caption(GRAPH_LEGEND.replace("\n", "  \n"))
download_svg_button(dot, f"graph_seq{seq}", key="dl_graph_svg")
