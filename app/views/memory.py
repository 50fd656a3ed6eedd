"""Memory by category over the run: passes as bands, the cursor and the peak marked; a click moves the cursor."""
import streamlit as st

from ckpt_viz import SPLIT_COST, format_bytes, memory_peak, memory_table, other_note, render_memory
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

chart = show_chart(render_memory, {run.config.label: run.trace}, cursor=seq, pick=run, key="memory_chart",
                   cache_on=run.trace, cursor_rows=[{"seq": seq}])
st.caption("Hover the chart for a sample's bytes by category and its event; click it to move the cursor there. "
           "Parameters are the grey base band: they keep their size through the step. The light bands behind "
           "are the passes: forward, then DX and DW (or one full backward).")
if str(run.trace.meta.get("mode", "")).startswith("split"):
    st.caption(SPLIT_COST)
download_png_button(chart, f"memory_seq{seq}", key="dl_memory_png")

sample, peak = run.index.memory_at(seq), run.cached(memory_peak)
left, right = st.columns(2)
with left:
    st.subheader(f"At the cursor (seq {seq})")
    if sample is None:
        st.info("No memory sample yet at this point of the run.")
    else:
        st.metric("Total", format_bytes(sample.total_nbytes), help=f"{sample.total_nbytes:,} bytes")
        st.dataframe(memory_table(sample.bytes_by_category), hide_index=True, width="stretch")
        if note := other_note(sample.bytes_by_category):
            st.info(note)
        if sample.by_stage:
            st.caption("By pipeline stage")
            st.dataframe([{"stage": s, **{c: format_bytes(b) for c, b in cats.items()}}
                          for s, cats in sorted(sample.by_stage.items())], hide_index=True)
with right:
    st.subheader("Peak")
    if peak:
        st.metric("Total at the peak", format_bytes(peak["total"]),
                  help=f"{peak['total']:,} bytes at seq {peak['seq']}")
        at_peak = run.index.memory_at(peak["seq"])
        rows = memory_table(at_peak.bytes_by_category if at_peak else dict(peak["top"]))
        st.dataframe([{k: v for k, v in r.items() if k != "what it is"} for r in rows], hide_index=True,
                     width="stretch")  # the meanings are in the table at the cursor
        if at_peak is not None and (note := other_note(at_peak.bytes_by_category)):
            st.info(note)
