"""Handle lifecycles, and the debugger: why was this handle released before it could replay?"""
import streamlit as st

from ckpt_viz.analysis.diagnosis import diagnose, diagnose_handle
from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.lifecycle import MARK_MEANINGS, lifecycle
from ckpt_viz.analysis.summary import summary
from ckpt_viz.analysis.words import reason_word, state_word
from ckpt_viz.render.swimlane import render_lifecycles
from ckpt_viz.render.text import format_event
from ckpt_viz.vocabulary import STATE_MEANINGS
from ui.cursor import cursor_bar, position_of, seq_at, window
from ui.runs import current, run_key
from ui.show import show_chart, source_line
from ui.text import md

run = current()
st.title("Handles")
seq = cursor_bar(run)
life = lifecycle(run.trace)
handles = life.handle_ids
if not handles:
    st.info("This trace has no checkpoint handles (mode 'none', or nothing was checkpointed).")
    st.stop()

# The figures of the run (NOTE [ Figures of a run ] in ui/runs.py): the same as the Overview's and Compare's.
figures = summary(run.trace)
cols = st.columns(4)
cols[0].metric("Handles", f"{figures.handles:,}")
cols[1].metric("Replays", f"{figures.replays:,}")
cols[2].metric("Released", f"{figures.released:,}")
cols[3].metric("Refused replays", f"{figures.refused:,}")
st.caption("At the end of the run: " + ", ".join(f"{n} {state_word(s)}" for s, n in figures.states.items()))

big = len(run.trace) > 1_201
st.subheader("Lifecycles" + (" around the cursor" if big else ""))
# Around the cursor on a big trace: the whole run's states, clipped to 600 events either side.
p = position_of(run, seq)
span = {"start": seq_at(run, p - 600), "stop": seq_at(run, p + 600) + 1} if big else {}
show_chart(render_lifecycles, run.trace, cursor=seq, **span)
with st.expander("What the states mean"):
    st.dataframe([{"state": state_word(s), "meaning": m} for s, m in STATE_MEANINGS.items()], hide_index=True,
                 width="stretch")
    st.caption("Red cross on a lane: " + MARK_MEANINGS["refused"])

st.subheader("Why was this handle released before replay?")
problems = diagnose(run.trace)
if problems:
    st.dataframe([{"handle": f"h{d.handle_id}" if d.handle_id is not None else "-", "problem": d.cause,
                   "what happened": d.summary} for d in problems], hide_index=True, width="stretch")
first = next((d.handle_id for d in problems if d.handle_id in handles), handles[0])
# The picker is this run's own (`run_key`) and names each handle by what it checkpointed, never by a state: its
# options stay the same while the cursor moves, so what it shows is always the chosen handle (issue 30). The state
# at the cursor is said under it.
if len(handles) <= 5_000:
    names = handle_labels(run.trace)
    handle = st.selectbox("Handle", handles, index=handles.index(first), key=run_key(run.config, "debug_handle"),
                          format_func=lambda h: f"h{h} · {names[h]}" if h in names else f"h{h}")
else:
    handle = int(st.number_input("Handle id", min(handles), max(handles), first,
                                 key=run_key(run.config, "debug_handle_id")))
st.markdown(f"At the cursor (seq {seq}), **h{handle}** is **{state_word(life.state_at(handle, seq))}**.")
# The run's findings about this handle (`diagnose`, once per trace); with none, how it ended (`diagnose_handle`).
mine = [d for d in problems if d.handle_id == handle]
for d in mine or [diagnose_handle(run.trace, handle)]:
    (st.success if d.ok else st.error)(f"**h{handle}: {md(d.cause or 'no problem found.')}** {md(d.summary)}")
    for title, event in (("Released by", d.release_event), ("Replay refused at", d.refused_event),
                         ("Error", d.error_event)):
        if event is not None:
            st.markdown(f"**{title}** (seq {event.seq}):")
            st.code(format_event(event, site=True), language=None, wrap_lines=True)
    if d.site:
        st.markdown("**Line of code:**")
        st.code(d.site, language=None, wrap_lines=True)
        st.code(source_line(d.site, run.trace), language="python")
    if not d.ok:
        st.info(f"**Fix:** {md(d.fix)}")
if mine:
    st.page_link("views/debugger.py", label="The whole story on the Debugger page", icon=":material/bug_report:")

st.subheader(f"Handle states at seq {seq}")
states = life.states_at(seq) if len(handles) <= 2_000 else None
shown = handles if states is not None else sorted(
    {e.handle_id for e in window(run, seq, 200).events if e.handle_id is not None})
rows = []
for h in shown:
    state = states[h] if states is not None else life.state_at(h, seq)
    rows.append({"handle": f"h{h}", "state": state_word(state),
                 "reason": reason_word(life.reason_at(h, seq)) if state == "released" else ""})
st.dataframe(rows, hide_index=True, width="stretch", height=min(38 + 35 * len(shown), 400))
