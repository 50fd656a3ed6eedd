"""DX/DW routing: in the backward pass at the cursor, which handles replayed and where their gradients went."""
import streamlit as st

from ckpt_viz import render_routing, routing_at
from ui.cursor import cursor_bar
from ui.downloads import download_svg_button
from ui.runs import current

run = current()
st.title("Routing (DX/DW)")
st.caption("dX (input grads) go upstream at once; dW (weight grads) run later. Each handle replays once per "
           "micro-batch: DX replays it, DW reuses the replay and then releases it.")
seq = cursor_bar(run)
routing = routing_at(run.trace, seq)  # per-pass data is computed once per trace, then bisected
if routing["start_seq"] is None:
    st.info("No backward pass has started at this point of the run: move the cursor forward.")
    st.stop()

phase = {"dx": "DX", "dw": "DW"}.get(routing["phase"], routing["phase"] or "?")
cols = st.columns(5)
cols[0].metric("Pass", phase, help=f"events {routing['start_seq']}–{routing['end_seq']}"
               + ("" if routing["complete"] else ", still running at the cursor"))
cols[1].metric("Handles reached", len(routing["handles"]))
cols[2].metric("Replayed in this pass", len(routing["handles_replayed"]))
cols[3].metric("Released by this pass", len(routing["released"]))
cols[4].metric("Refused replays", len(routing["refused"]))
dot = render_routing(run.trace, seq)
st.graphviz_chart(dot)  # natural size: a stretched LR graph of a few handles is huge
download_svg_button(dot, f"routing_seq{seq}", key="dl_routing_svg")
st.dataframe([{"handle": f"h{h}", "replayed here": h in routing["handles_replayed"],
               "dX targets (inputs)": str(routing["targets"].get(h, [])),
               "dW explicit params": str(routing["explicit_params"].get(h, [])),
               "captured .grad": ", ".join(routing["captured"].get(h, [])),
               "released": routing["release_reasons"].get(h, ""), "refused": h in routing["refused"]}
              for h in routing["handles"]], hide_index=True, width="stretch")
