"""DX/DW routing: in the backward pass at the cursor, how DX flows from block to block and where DW went."""
import streamlit as st

from ckpt_viz.analysis.claims import passes_claim
from ckpt_viz.analysis.routing import no_pass_words, pass_title, routing_at, routing_rows
from ckpt_viz.render.routing import render_routing
from ui.cursor import cursor_bar
from ui.downloads import download_svg_button
from ui.graphview import graph_view
from ui.runs import current
from ui.text import md

run = current()
st.title("Routing (DX/DW)")
st.caption("DX (input grads) is the backward that reaches the blocks' inputs, block to block; DW (weight grads) the "
           "one that reaches their weights. A full backward does both at once.")
said = passes_claim(run.trace)  # this run's passes, from the analysis (ckpt_viz.analysis.claims)
if said:
    st.caption(f"In this run: {md(said)}")
seq = cursor_bar(run)
routing = routing_at(run.trace, seq)
if routing.start_seq is None:
    st.info(md(no_pass_words(run.trace, routing)))
    st.stop()

st.subheader(md(pass_title(routing)))
cols = st.columns(4)
cols[0].metric("Handles reached", len(routing.handles))
cols[1].metric("Replayed in this pass", len(routing.replayed),
               help="Replays finished by the cursor" + (f"; {len(routing.replaying)} still replaying"
                                                        if routing.replaying else ""))
cols[2].metric("Released by this pass", len(routing.released))
cols[3].metric("Refused replays", len(routing.refused))
graph = render_routing(run.trace, seq)
graph_view(graph, key="routing_zoom", name=f"routing seq {seq}")
download_svg_button(graph.source, f"routing_seq{seq}", key="dl_routing_svg")

st.dataframe(routing_rows(run.trace, seq), hide_index=True, width="stretch")
