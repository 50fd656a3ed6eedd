"""DX/DW routing: in the backward pass at the cursor, how DX flows from block to block and where DW went."""
import streamlit as st

from ckpt_viz import input_words, pass_title, release_words, render_routing, routing_at
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


def _state(h: int) -> str:
    if h in routing["refused"]:
        return "replay refused"
    if h in routing["released"]:
        return "released: " + release_words(routing["release_reasons"].get(h))
    if h in routing["handles_replayed"]:
        return "replayed here"
    return "replaying" if h in routing["handles_replaying"] else "reached (no replay in this pass)"


def _dx(h: int) -> str:
    if h not in routing["targets"]:
        return "not routed yet" if routing["phase"] != "dw" else "none (DW pass)"
    explicit = set(routing["explicit_params"].get(h, []))
    words = [input_words(run.trace, h, i) for i in routing["targets"][h] if i not in explicit]
    return ", ".join(words) if words else "no inputs got a gradient"


st.dataframe([{"handle": f"h{h}", "in this pass": _state(h), "DX went to": _dx(h),
               "DW to parameter inputs": ", ".join(input_words(run.trace, h, i, parameter=True)
                                                   for i in routing["explicit_params"].get(h, [])) or "none",
               "parameters given .grad": ", ".join(routing["captured"].get(h, [])) or "none",
               "DX dropped (DW pass)": ", ".join(input_words(run.trace, h, i)
                                                 for i in routing["discarded"].get(h, [])) or "none"}
              for h in routing["handles"]], hide_index=True, width="stretch")
