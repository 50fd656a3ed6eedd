"""Handle lifecycles, and the debugger: why was this handle released before it could replay?"""
import streamlit as st

from ckpt_viz import (
    STATE_MEANINGS,
    filter_events,
    format_event,
    lifecycle,
    render_lifecycles,
)
from ui.cursor import cursor_bar, window
from ui.runs import current, handle_diagnosis, run_diagnosis
from ui.show import show_chart, source_line

run = current()
st.title("Handles")
seq = cursor_bar(run)
handles = run.index.handles
if not handles:
    st.info("This trace has no checkpoint handles (mode 'none', or nothing was checkpointed).")
    st.stop()

big = len(run.trace) > 1_201
st.subheader("Lifecycles" + (" around the cursor" if big else ""))
# Around the cursor on a big trace: the whole run's states, clipped to 600 events either side.
p = run.index.position(seq)
span = {"start": run.index.seq_at(p - 600), "stop": run.index.seq_at(p + 600) + 1} if big else {}
show_chart(render_lifecycles, run.trace, cursor=seq, **span)
with st.expander("What the states mean"):
    st.dataframe([{"state": s, "meaning": m} for s, m in STATE_MEANINGS.items()], hide_index=True, width="stretch")
    st.caption("Red cross on a lane: a replay was refused (the handle was already released or collected).")

st.subheader("Why was this handle released before replay?")
if len(run.trace) <= 200_000 or st.button("Diagnose every handle", help=f"Reads all {len(run.trace):,} events once"):
    problems = run.cached(run_diagnosis)
    if problems:
        st.dataframe([{"handle": f"h{d.handle_id}" if d.handle_id is not None else "-", "problem": d.cause,
                       "what happened": d.summary} for d in problems], hide_index=True, width="stretch")
    first = next((d.handle_id for d in problems if d.handle_id in handles), handles[0])
else:  # a big trace: start from the first refused replay, found from the kind column alone
    problems = None
    refused = run.cached(lambda trace: [e.handle_id for e in filter_events(trace, kinds=("replay_refused",))][:1])
    first = refused[0] if refused else handles[0]
if len(handles) <= 5_000:
    # What each handle checkpointed: the module's qualified name, with its call index when it ran more than once.
    blocks = run.cached(lambda trace: {e.handle_id: e.data.get("function")
                                       for e in filter_events(trace, kinds=("handle_created",))})
    handle = st.selectbox("Handle", handles, index=handles.index(first), key="debug_handle",
                          format_func=lambda h: " · ".join(filter(None, (
                              f"h{h}", blocks.get(h), f"{run.index.handle_state(h, seq)} at seq {seq}"))))
else:
    handle = int(st.number_input("Handle id", min(handles), max(handles), first, key="debug_handle_id"))
# diagnose(trace, handle) is the run's findings about this handle: the whole run's, once per trace (the Debugger's
# and the Overview's too), filtered. No problem: how the handle ended, and where, from the handle's events alone.
mine = [d for d in (problems if problems is not None else run.cached(run_diagnosis)) if d.handle_id == handle]
for d in mine or [run.cached(handle_diagnosis, handle)]:
    (st.success if d.ok else st.error)(f"**h{handle}: {d.cause or 'no problem found.'}** {d.summary}")
    for title, event in (("Released by", d.release_event), ("Replay refused at", d.refused_event),
                         ("Error", d.error_event)):
        if event is not None:
            st.markdown(f"**{title}** (seq {event.seq}):")
            st.code(format_event(event, site=True), language=None, wrap_lines=True)
    if d.site:
        st.markdown(f"**Line of code:** `{d.site}`")
        st.code(source_line(d.site, run.trace), language="python")
    if not d.ok:
        st.info(f"**Fix:** {d.fix}")
if mine:
    st.page_link("views/debugger.py", label="The whole story on the Debugger page", icon=":material/bug_report:")

st.subheader(f"Handle states at seq {seq}")
life = lifecycle(run.trace)  # the same states as the lanes above
states = life.states_at(seq) if len(handles) <= 2_000 else None
shown = handles if states is not None else sorted(
    {e.handle_id for e in window(run, seq, 200).events if e.handle_id is not None})
rows = []
for h in shown:
    state = states[h] if states else life.state_at(h, seq)
    rows.append({"handle": f"h{h}", "state": state, "reason": life.reason_at(h, seq) if state == "released" else ""})
st.dataframe(rows, hide_index=True, width="stretch", height=min(38 + 35 * len(shown), 400))
