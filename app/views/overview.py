"""Overview: what ran, what happened to its handles, where memory peaked, and what went wrong."""
import streamlit as st

from ckpt_viz import STATE_MEANINGS, format_bytes, lifecycle, memory_peak, palette, render_memory
from ui.cursor import cursor_bar, cursor_seq
from ui.downloads import download_trace_buttons
from ui.runs import current, handle_lifecycle, kind_counts, run_diagnosis
from ui.show import show_chart


def handle_totals(trace):
    """Replays and releases over the whole run, from the lifecycle (non-reentrant frames count as released too)."""
    life = lifecycle(trace)
    reasons = life.released_reasons()
    return {"replays": life.replay_count(), "released": sum(reasons.values()),
            "reasons": reasons.most_common()}


run = current()
meta = run.trace.meta
st.title("Overview")
st.caption(f"**{run.config.label}** · {meta.get('description') or meta.get('model', '')}")
if meta.get("look_at"):
    st.info(f"**What to look at:** {meta['look_at']}", icon=":material/visibility:")


# A cursor move (step buttons, slider, a click on the chart) reruns only this part of the page: the sidebar and the
# heading are not sent or drawn again. On a big trace a step costs the server almost nothing; what is left is the
# browser redrawing what it is sent (in Chromium without a GPU, about 0.2 s of CPU a step; a fifth less this way).
# The memory chart is sent first, into its place below the cursor bar and the figures (containers made before it):
# the browser's longest job on the first page is drawing it (Vega), and it does that while the server still works
# on the rest (the cursor bar, the event counts, the lifecycle), instead of after.
@st.fragment
def at_the_cursor(run) -> None:
    if not len(run.index.seqs):
        cursor_bar(run)  # says the trace holds no events, and stops
    seq = cursor_seq(run)
    bar, figures = st.container(), st.container()

    st.subheader("Memory over the run")
    if len(run.trace.memory):
        show_chart(render_memory, {run.config.label: run.trace}, cursor=seq, max_points=300, pick=run,
                   key="overview_memory_chart", cache_on=run.trace, cursor_rows=[{"seq": seq}])
        st.caption("Hover for the bytes by category at a point; click to move the cursor there. "
                   "The Memory page has the tables.")
    else:
        st.info("This trace has no memory samples.")

    with bar:
        cursor_bar(run)  # at `seq`, the cursor `cursor_seq` read
    with figures:
        kinds = kind_counts(run.trace)
        peak = run.cached(memory_peak)
        cols = st.columns(6)
        cols[0].metric("Events", f"{len(run.trace):,}")
        cols[1].metric("Handles", f"{len(run.index.handles):,}")
        replays, released = cols[2].empty(), cols[4].empty()  # from the lifecycle: filled last (see below)
        cols[3].metric("Refused replays", f"{kinds['replay_refused']:,}")
        cols[5].metric("Peak memory", format_bytes(peak["total"]) if peak else "not sampled",
                       help=f"at seq {peak['seq']}: " + ", ".join(f"{palette.category_word(c)} {format_bytes(b)}"
                                                               for c, b in peak["top"])
                       if peak else None)

    left, right = st.columns(2, gap="large")
    with left:
        st.subheader("Handles at the cursor")
        states = st.empty()
    with right:
        st.subheader("Problems")
        big = len(run.trace) > 200_000  # diagnosing reads every event: on request only for a big trace
        problems = None
        if not big or st.button("Diagnose every handle", help=f"Reads all {len(run.trace):,} events once"):
            problems = run.cached(run_diagnosis)  # diagnose_all, the same
        elif kinds["replay_refused"] or kinds["error"]:
            st.warning(f"{kinds['replay_refused']:,} refused replays and {kinds['error']:,} errors in this run.")
        if problems:
            for d in problems[:5]:
                st.warning(f"**{'run' if d.handle_id is None else f'h{d.handle_id}'}**: {d.cause}")
            st.page_link("views/debugger.py", label="What happened, and the fix: the Debugger",
                         icon=":material/troubleshoot:")
        elif problems is not None:
            st.success("No problem found: no refused replay, and every handle was released.")
        st.caption("Downloads")
        download_trace_buttons(run)

    # Last, what needs the handles' lifecycle (one pass over the events of a big trace): the browser draws the
    # rest of the page meanwhile.
    handle_lifecycle(run)
    totals = run.cached(handle_totals)
    replays.metric("Replays", f"{totals['replays']:,}")
    released.metric("Released", f"{totals['released']:,}", help="handles released by the end of the run: "
                    + ("; ".join(f"{n} because {palette.reason_word(r)}" for r, n in totals["reasons"]) or "none"))
    counts = lifecycle(run.trace).counts_at(seq)
    states.dataframe([{"state": palette.state_word(s), "handles": n, "meaning": STATE_MEANINGS[s]}
                      for s, n in counts.items()], hide_index=True, width="stretch")


at_the_cursor(run)
