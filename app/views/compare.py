"""Compare modes: the same model with no checkpoint, non-reentrant, reentrant and split, lined up by pass."""
import streamlit as st

from ckpt_viz import SPLIT_COST, format_bytes, memory_peak, palette, render_memory, render_peaks
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

# The cursor is the sidebar run's; each run's passes (forward, DX, DW) share one axis, so it falls at the same pass.
chart = show_chart(render_memory, {m: r.trace for m, r in runs.items()}, cursor=seq, cursor_in=run.trace,
                   pick=run, key="compare_chart")
st.caption(f"Each run's forward, DX and DW passes line up (a full backward spans both DX and DW), whatever the "
           f"runs' lengths. The magenta rule is the cursor of the **{run.config.mode}** run in the sidebar; click a "
           "line to move it to that point of the passes. Hover a point for its bytes and event.")
download_png_button(chart, "compare_modes", key="dl_compare_png")

peaks = {mode: r.cached(memory_peak) for mode, r in runs.items()}
rows = []
for mode, r in runs.items():
    peak = peaks[mode]
    at_peak = r.index.memory_at(peak["seq"]).bytes_by_category if peak else {}
    rows.append({"mode": mode, "events": len(r.trace), "handles": len(r.index.handles),
                 "replays": r.trace.count("replay_started"), "refused": r.trace.count("replay_refused"),
                 "released": r.trace.count("released"), "peak": format_bytes(peak["total"]) if peak else "-",
                 **{f"at the peak: {palette.category_word(c)}": format_bytes(b) for c, b in at_peak.items() if b}})
st.subheader("Replays and peak memory by category")
st.dataframe(rows, hide_index=True, width="stretch")
show_chart(render_peaks, {m: r.trace for m, r in runs.items()})

split = {m: p["total"] for m, p in peaks.items() if p and m.startswith("split")}
checkpointed = {m: p["total"] for m, p in peaks.items() if p and m in ("reentrant", "nonreentrant")}
if split:
    above = [f"{m} peaks at {format_bytes(t)}, {format_bytes(t - min(checkpointed.values()))} above "
             f"{min(checkpointed, key=checkpointed.get)}" for m, t in split.items()
             if checkpointed and t > min(checkpointed.values())]
    st.info(SPLIT_COST + (" Here: " + "; ".join(above) + "." if above else ""))  # the glossary's words
