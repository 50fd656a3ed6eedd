"""Compare modes: the same model with no checkpoint, non-reentrant, reentrant and split, lined up by part of the
step."""
import streamlit as st

from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import category_word, format_bytes
from ckpt_viz.lessons.glossary import SPLIT_COST
from ckpt_viz.render.memory import render_memory, render_peaks
from ui.cursor import cursor_bar
from ui.downloads import download_png_button
from ui.runs import current, runs_for_modes
from ui.show import show_chart
from ui.text import md

run = current()
st.title("Compare modes")
seq = cursor_bar(run)
if not run.config.runs_model:
    st.info("Compare modes runs one model in several modes: pick a built-in model or a model file in the sidebar "
            "(a saved trace holds one mode, and a broken run uses its own).")
    st.stop()

modes = st.multiselect("Modes", ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant"),
                       default=("none", "nonreentrant", "reentrant", "split-reentrant"), key="compare_modes")
if not modes:
    st.info("Pick at least one mode.")
    st.stop()
runs = runs_for_modes(run.config, modes)
if not runs:
    st.stop()

# The cursor is the sidebar run's; each run's parts (forward, DX, DW) share one axis, so it falls at the same part.
chart = show_chart(render_memory, {m: r.trace for m, r in runs.items()}, cursor=seq, cursor_in=run.trace,
                   pick=run, key="compare_chart")
st.caption(f"Each run's forward, DX and DW line up (a full backward spans both DX and DW), whatever the "
           f"runs' lengths. The magenta rule is the cursor of the **{md(run.config.mode)}** run in the sidebar; click "
           "a line to move it to that point of the step. Hover a point for its bytes and event.")
download_png_button(chart, "compare_modes", key="dl_compare_png")

# The figures of each run (NOTE [ Figures of a run ] in ui/runs.py): the same as the Overview's for that run.
figures = {mode: summary(r.trace) for mode, r in runs.items()}
rows = []
for mode, s in figures.items():
    at_peak = s.peak.by_category if s.peak else {}
    rows.append({"mode": mode, "events": s.events, "handles": s.handles, "replays": s.replays, "refused": s.refused,
                 "released": s.released, "peak": format_bytes(s.peak.total) if s.peak else "-",
                 **{f"at the peak: {category_word(c)}": format_bytes(b) for c, b in at_peak.items() if b}})
st.subheader("Replays and peak memory by category")
st.dataframe(rows, hide_index=True, width="stretch")
show_chart(render_peaks, {m: r.trace for m, r in runs.items()})

peaks = {m: s.peak.total for m, s in figures.items() if s.peak}
split = {m: t for m, t in peaks.items() if m.startswith("split")}
checkpointed = {m: t for m, t in peaks.items() if m in ("reentrant", "nonreentrant")}
if split:
    above = [f"{m} peaks at {format_bytes(t)}, {format_bytes(t - min(checkpointed.values()))} above "
             f"{min(checkpointed, key=checkpointed.get)}" for m, t in split.items()
             if checkpointed and t > min(checkpointed.values())]
    st.info(md(SPLIT_COST + (" Here: " + "; ".join(above) + "." if above else "")))  # the glossary's words
