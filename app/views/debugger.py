"""The debugger: every problem of the run, what happened in order, the line of code, and the fix."""
import streamlit as st

from ckpt_viz.analysis.claims import outcome_claim
from ckpt_viz.analysis.diagnosis import diagnose, replay_checks_note
from ckpt_viz.render.graph import render_graph
from ckpt_viz.render.swimlane import render_lifecycles
from ckpt_viz.render.text import format_event
from ui.cursor import cursor_bar, position_of, set_cursor
from ui.graphview import graph_view, snapshot_note
from ui.runs import current, run_key
from ui.show import show_chart, source_line
from ui.text import md

FINDING = "debug_finding"  # the picker's key is per run (`run_key`): a new run starts at its first finding


def _label(findings: list, i: int) -> str:
    f = findings[i]
    who = f"h{f.handle_id}" if f.handle_id is not None else "run"
    return md(f"{i + 1}. {who}: {f.cause or f.summary}")


def _follow(run, key: str, findings: list) -> None:
    """A finding of `run` was chosen: move its cursor to the finding's releasing event (else its refusal or
    error). The picker is `run`'s own, so its value is an index into `findings`."""
    i = st.session_state.get(key)
    if isinstance(i, int) and 0 <= i < len(findings) and findings[i].seq is not None:
        set_cursor(run, findings[i].seq)


run = current()
st.title("Debugger")
findings = diagnose(run.trace)
seq = cursor_bar(run)
unchecked = replay_checks_note(run.trace)  # replays the sampled divergence checks skipped: never claim them clean
if not findings:
    st.success(md(outcome_claim(run.trace)))
    if unchecked:
        st.warning(md(unchecked))
    st.caption("To see the debugger at work, pick **Broken runs to explore** in the sidebar's source picker.")
    st.stop()

st.caption(f"{len(findings)} problem{'s' if len(findings) != 1 else ''} found. Choose one: the time cursor moves "
           "to the event that caused it.")
if unchecked:
    st.warning(md(unchecked))
key = run_key(run.config, FINDING)
i = st.radio("Findings", range(len(findings)), key=key, format_func=lambda i: _label(findings, i),
             on_change=_follow, args=(run, key, findings), label_visibility="collapsed")
f = findings[i if isinstance(i, int) and 0 <= i < len(findings) else 0]
at = f" (event #{f.seq})" if f.seq is not None else ""
st.button(f"Move the cursor to this finding's event{at}", key="debug_goto", on_click=set_cursor,
          args=(run, f.seq), disabled=f.seq is None or position_of(run, f.seq) == position_of(run, seq))

st.error(f"**{md(f.cause or f.summary)}**")
st.caption(f"Finding code: {md(f.code)}")
st.subheader("What happened")
st.code(f.explanation, language=None, wrap_lines=True)
if f.site:
    st.markdown("**Your line of code:**")
    st.code(f.site, language=None, wrap_lines=True)
    st.code(source_line(f.site, run.trace), language="python", wrap_lines=True)
st.info(f"**Fix:** {md(f.fix)}")

if f.handle_id is not None:
    st.subheader(f"h{f.handle_id}: its lane")
    show_chart(render_lifecycles, run.trace, cursor=seq, handles=(f.handle_id,))
    graph = render_graph(run.trace, seq, highlight=f.handle_id, collapse=False)
    if graph is not None:
        with st.expander(f"Autograd graph at the cursor, h{f.handle_id} highlighted"):
            graph_view(graph, key="debug_graph_zoom", name=f"debugger h{f.handle_id}", note=snapshot_note(run, seq))
with st.expander(f"The events of this finding ({len(f.events)})"):
    st.code("\n".join(format_event(e, site=True) for e in f.events) or "(none)", language=None, wrap_lines=True)
