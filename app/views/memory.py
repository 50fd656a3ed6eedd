"""Memory by category over the run: the parts of the step as bands, the cursor and the peak marked; a click moves
the cursor."""
import streamlit as st

from ckpt_viz.analysis.memory import memory, memory_table, other_note
from ckpt_viz.analysis.words import category_word, format_bytes
from ckpt_viz.lessons.glossary import SPLIT_COST
from ckpt_viz.render.memory import render_memory
from ui.cursor import cursor_bar
from ui.downloads import download_png_button
from ui.runs import current
from ui.show import show_chart
from ui.text import md

run = current()
st.title("Memory")
seq = cursor_bar(run)
if not run.trace.memory:
    st.info("This trace has no memory samples (recorded without memory=True).")
    st.stop()

chart = show_chart(render_memory, {run.config.label: run.trace}, cursor=seq, pick=run, key="memory_chart",
                   cache_on=run.trace, cursor_rows=[{"seq": seq}])
st.caption("Hover the chart for a sample's bytes by category and its event; click it to move the cursor there. "
           "Parameters are the grey base band: they keep their size through the step. The light bands behind "
           "are the parts of the step: forward, then DX and DW (or one full backward).")
if str(run.trace.meta.get("mode", "")).startswith("split"):
    st.caption(md(SPLIT_COST))
download_png_button(chart, f"memory_seq{seq}", key="dl_memory_png")

facts = memory(run.trace)
at_cursor, peak = facts.at(seq), facts.peak
left, right = st.columns(2)
with left:
    st.subheader(f"At the cursor (seq {seq})")
    if not at_cursor:
        st.info("No memory sample yet at this point of the run.")
    else:
        total = facts.total_at(seq)
        st.metric("Total", format_bytes(total), help=f"{total:,} bytes")
        st.dataframe(memory_table(at_cursor), hide_index=True, width="stretch")
        if note := other_note(at_cursor):
            st.info(md(note))
        i = facts.index_at(seq)  # the sample at the cursor (facts keep one reading per sample, in order)
        sample = run.trace.memory[i] if i is not None else None
        if sample is not None and sample.by_stage:
            st.caption("By pipeline stage")
            st.dataframe([{"stage": s, **{category_word(c): format_bytes(b) for c, b in cats.items()}}
                          for s, cats in sorted(sample.by_stage.items())], hide_index=True)
with right:
    st.subheader("Peak")
    if peak:
        st.metric("Total at the peak", format_bytes(peak.total), help=f"{peak.total:,} bytes at seq {peak.seq}")
        rows = memory_table(peak.by_category)
        st.dataframe([{k: v for k, v in r.items() if k != "what it is"} for r in rows], hide_index=True,
                     width="stretch")  # the meanings are in the table at the cursor
        if note := other_note(peak.by_category):
            st.info(md(note))
