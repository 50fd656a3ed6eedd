"""Compare modes: the same model with no checkpoint, non-reentrant, reentrant and split reentrant."""
import streamlit as st

from ckpt_viz import memory_peak, render_memory
from ui.cursor import cursor_bar
from ui.downloads import download_png_button
from ui.runs import current, runs_for_modes
from ui.show import show_chart

run = current()
st.title("Compare modes")
seq = cursor_bar(run)
if not run.config.runs_model:
    st.info("Compare modes runs one model in several modes: pick a built-in model or a model file in the sidebar "
            "(a saved trace holds one mode).")
    st.stop()

modes = st.multiselect("Modes", ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant"),
                       default=("none", "nonreentrant", "reentrant", "split-reentrant"), key="compare_modes")
if not modes:
    st.info("Pick at least one mode.")
    st.stop()
runs = runs_for_modes(run.config, modes)
if not runs:
    st.stop()

# The cursor at the same point of each run: its position in the picked run, as a fraction of the run.
fraction = run.index.position(seq) / max(len(run.index.seqs) - 1, 1)
first = next(iter(runs.values())).index
chart = show_chart(render_memory, {m: r.trace for m, r in runs.items()},
                   cursor=first.seq_at(round(fraction * (len(first.seqs) - 1))))
download_png_button(chart, "compare_modes", key="dl_compare_png")

rows, at_peaks = [], []
for mode, r in runs.items():
    peak = r.cached(memory_peak)
    at_peak = r.index.memory_at(peak["seq"]).bytes_by_category if peak else {}
    rows.append({"mode": mode, "events": len(r.trace), "handles": len(r.index.handles),
                 "replays": r.trace.count("replay_started"), "refused": r.trace.count("replay_refused"),
                 "released": r.trace.count("released"), "peak bytes": peak["total"] if peak else None,
                 **{f"peak: {c}": b for c, b in at_peak.items()}})
    at_peaks.append({"mode": mode, **at_peak})
st.subheader("Replays and peak memory by category")
st.dataframe(rows, hide_index=True, width="stretch")
categories = [c for c in at_peaks[0] if c != "mode" and any(row.get(c) for row in at_peaks)]
if categories:
    st.bar_chart(at_peaks, x="mode", y=categories, horizontal=True, stack=True, x_label="",
                 y_label="bytes at the peak")  # horizontal: x is the mode axis, y the bytes
