"""DX/DW routing: in the backward pass at the cursor, how DX flows from block to block and where DW went."""
import streamlit as st

from ckpt_viz import pass_title, render_routing, routing_at, routing_rows
from ui.cursor import cursor_bar
from ui.downloads import download_svg_button
from ui.graphview import show_svg
from ui.runs import current

run = current()
st.title("Routing (DX/DW)")
st.caption("DX (input grads) flows upstream from block to block at once; DW (weight grads) runs later, block by "
           "block. Each handle replays once per micro-batch: DX replays it, DW reuses the replay and then releases it.")
seq = cursor_bar(run)
routing = routing_at(run.trace, seq)  # per-pass data is computed once per trace, then bisected
if routing["start_seq"] is None:
    st.info("No backward pass has started at this point of the run: move the cursor forward.")
    st.stop()

st.subheader(pass_title(routing))
cols = st.columns(4)
cols[0].metric("Handles reached", len(routing["handles"]))
cols[1].metric("Replayed in this pass", len(routing["handles_replayed"]),
               help="Replays finished by the cursor" + (f"; {len(routing['handles_replaying'])} still replaying"
                                                        if routing["handles_replaying"] else ""))
cols[2].metric("Released by this pass", len(routing["released"]))
cols[3].metric("Refused replays", len(routing["refused"]))
dot = render_routing(run.trace, seq)
show_svg(dot, name=f"routing seq {seq}")
download_svg_button(dot, f"routing_seq{seq}", key="dl_routing_svg")

st.dataframe(routing_rows(run.trace, seq), hide_index=True, width="stretch")
