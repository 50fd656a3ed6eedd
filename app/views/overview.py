"""Overview: what ran, what happened to its handles, where memory peaked, and what went wrong."""
import streamlit as st

from ckpt_viz.analysis.claims import outcome_claim, run_claims
from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import category_word, format_bytes, reason_word, state_word
from ckpt_viz.render.memory import render_memory
from ckpt_viz.vocabulary import STATE_MEANINGS
from ui.cursor import cursor_bar, cursor_seq
from ui.downloads import download_trace_buttons
from ui.runs import current
from ui.show import show_chart
from ui.text import md

run = current()
meta = run.trace.meta
st.title("Overview")
st.caption(f"**{md(run.config.label)}** · {md(meta.get('description') or meta.get('model') or '')}")
if meta.get("look_at"):
    st.info(f"**What to look at:** {md(meta['look_at'])}", icon=":material/visibility:")
# What this run did, in sentences built from its analysis (ckpt_viz.analysis.claims): never a general claim that
# its own figures could contradict.
if said := run_claims(run.trace):
    st.markdown("**What this run shows**\n\n" + "\n".join(f"- {md(c)}" for c in said))


# A cursor move (step buttons, slider, a click on the chart) reruns only this part of the page: the sidebar and the
# heading are not sent or drawn again. The memory chart is sent first, into its place below the cursor bar and the
# figures (containers made before it): the browser's longest job on the first page is drawing it (Vega), and it
# does that while the server still works on the rest.
@st.fragment
def at_the_cursor(run) -> None:
    if not run.trace.events:
        cursor_bar(run)  # says the trace holds no events, and stops
    seq = cursor_seq(run)
    bar, figures = st.container(), st.container()

    st.subheader("Memory over the run")
    if run.trace.memory:
        show_chart(render_memory, {run.config.label: run.trace}, cursor=seq, max_points=300, pick=run,
                   key="overview_memory_chart", cache_on=run.trace, cursor_rows=[{"seq": seq}])
        st.caption("Hover for the bytes by category at a point; click to move the cursor there. "
                   "The Memory page has the tables.")
    else:
        st.info("This trace has no memory samples.")

    with bar:
        cursor_bar(run)  # at `seq`, the cursor `cursor_seq` read
    figures_at = figures.container()

    left, right = st.columns(2, gap="large")
    with left:
        st.subheader("Handles at the cursor")
        counts = lifecycle(run.trace).counts_at(seq)
        st.dataframe([{"state": state_word(s), "handles": n, "meaning": STATE_MEANINGS[s]} for s, n in counts.items()],
                     hide_index=True, width="stretch")
    with right:
        st.subheader("Problems")
        problems = diagnose(run.trace)
        for d in problems[:5]:
            who = "run" if d.handle_id is None else f"h{d.handle_id}"
            st.warning(f"**{who}**: {md(d.cause or d.summary)}")
        if problems:
            st.page_link("views/debugger.py", label="What happened, and the fix: the Debugger",
                         icon=":material/troubleshoot:")
        else:
            st.success(md(outcome_claim(run.trace)))
        st.caption("Downloads")
        download_trace_buttons(run)

    # The figures of the run (NOTE [ Figures of a run ] in ui/runs.py): the same as Compare's, Handles' and info's.
    with figures_at:
        s = summary(run.trace)
        cols = st.columns(6)
        cols[0].metric("Events", f"{s.events:,}")
        cols[1].metric("Handles", f"{s.handles:,}")
        cols[2].metric("Replays", f"{s.replays:,}")
        cols[3].metric("Refused replays", f"{s.refused:,}")
        reasons = lifecycle(run.trace).released_reasons()
        cols[4].metric("Released", f"{s.released:,}", help="handles released by the end of the run: " + (
            "; ".join(f"{n} because {reason_word(r)}" for r, n in reasons.most_common()) or "none"))
        cols[5].metric("Peak memory", format_bytes(s.peak.total) if s.peak else "not sampled",
                       help=f"at seq {s.peak.seq}: " + ", ".join(f"{category_word(c)} {format_bytes(b)}"
                                                              for c, b in s.peak.top) if s.peak else None)


at_the_cursor(run)
