"""Memory by category over the run, with the cursor and the peak marked."""
import streamlit as st

from ckpt_viz import format_bytes, memory_peak, render_memory
from ui.cursor import cursor_bar
from ui.downloads import download_png_button
from ui.runs import current
from ui.show import show_chart

run = current()
st.title("Memory")
seq = cursor_bar(run)
if not len(run.trace.memory):
    st.info("This trace has no memory samples (recorded without memory=True).")
    st.stop()

chart = show_chart(render_memory, {run.config.label: run.trace}, cursor=seq)
download_png_button(chart, f"memory_seq{seq}", key="dl_memory_png")

sample, peak = run.index.memory_at(seq), run.cached(memory_peak)
left, right = st.columns(2)
with left:
    st.subheader(f"At the cursor (seq {seq})")
    if sample is None:
        st.info("No memory sample yet at this point of the run.")
    else:
        st.metric("Total", format_bytes(sample.total_nbytes), help=f"{sample.total_nbytes:,} bytes")
        st.dataframe([{"category": c, "bytes": b} for c, b in sample.bytes_by_category.items()],
                     hide_index=True, width="stretch")
        if sample.by_stage:
            st.caption("By pipeline stage")
            st.dataframe([{"stage": s, **cats} for s, cats in sorted(sample.by_stage.items())], hide_index=True)
with right:
    st.subheader("Peak")
    if peak:
        st.metric("Total at the peak", format_bytes(peak["total"]),
                  help=f"{peak['total']:,} bytes at seq {peak['seq']}")
        st.dataframe([{"category": c, "bytes": b} for c, b in peak["top"]], hide_index=True,
                     width="stretch")
