"""Memory by category over the run: the parts of the step as bands, the cursor and the peak marked; a click moves
the cursor."""
import streamlit as st

from ckpt_viz.analysis.memory import memory, memory_table, other_note, rank_memory, rank_trace
from ckpt_viz.analysis.words import category_word, format_bytes
from ckpt_viz.lessons.glossary import SPLIT_COST
from ckpt_viz.render.memory import render_memory, render_rank_memory
from ui.cursor import cursor_bar
from ui.downloads import download_png_button
from ui.runs import current
from ui.show import show_chart
from ui.text import md, md_table

run = current()
st.title("Memory")
seq = cursor_bar(run)
if not run.trace.memory:
    st.info("This trace has no memory samples (recorded without memory=True).")
    st.stop()

# A merged distributed trace: every rank summed, or one rank's own memory (its samples alone, the same seqs).
ranks = rank_memory(run.trace)
shown, name = run.trace, run.config.label
if ranks:
    everyone = "every rank (summed)"
    choice = st.radio("Rank", [everyone, *(f"rank {r}" for r in ranks)], horizontal=True, key="memory_rank",
                      help="A merged trace holds each rank's own memory samples; the run's reading is the sum of "
                           "every rank's latest one.")
    if choice != everyone:
        rank = int(choice.removeprefix("rank "))
        shown, name = rank_trace(run.trace, rank), f"{run.config.label} · rank {rank}"
chart = show_chart(render_memory, {name: shown}, cursor=seq, pick=run, key="memory_chart",
                   cache_on=shown, cursor_rows=[{"seq": seq}])
st.caption("Hover the chart for a sample's bytes by category and its event; click it to move the cursor there. "
           "Parameters are the grey base band: they keep their size through the step. The light bands behind "
           "are the parts of the step: forward, then DX and DW (or one full backward).")
if str(run.trace.meta.get("mode", "")).startswith("split"):
    st.caption(md(SPLIT_COST))
download_png_button(chart, f"memory_seq{seq}", key="dl_memory_png")

facts = memory(shown)
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
        one_reading = shown is not run.trace or not ranks  # every rank summed is no one sample's reading
        sample = shown.memory[i] if i is not None and one_reading else None
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

if ranks:
    st.subheader("Each rank")
    st.caption("One panel per rank, on one x (the merged trace's events) and one y scale, so the ranks compare; "
               "each titled with its own peak. The magenta rule is the cursor.")
    show_chart(render_rank_memory, run.trace, cursor=seq)
    st.table(md_table([{"rank": f"rank {r}", "samples": len(f), "peak": format_bytes(f.peak.total) if f.peak else "-",
                        "at seq": f.peak.seq if f.peak else "-", "at the cursor": format_bytes(f.total_at(seq))}
                       for r, f in ranks.items()]))
