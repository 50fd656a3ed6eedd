"""Schedule timeline: stage (or rank) by time, one box per F / DX / DW / B action, on the shared cursor."""
from dataclasses import replace

import streamlit as st

from ckpt_viz import (
    palette,
    planned_vs_executed,
    render_stage_memory,
    render_timeline,
    stage_memory_rows,
    timeline_actions,
)
from ui.cursor import CURSOR, cursor_bar
from ui.runs import current, load_run
from ui.show import show_chart

run = current()
st.title("Schedule timeline")
seq = cursor_bar(run)
actions = run.cached(timeline_actions)
if not actions:
    st.info("This run has no pipeline actions. Pick the built-in model 'pipeline' with mode 'pipeline', or open a "
            "merged trace of a real run (`ckpt-viz record --distributed` or `ckpt-viz merge`) as a saved trace.")
    st.stop()


def _go(position: int) -> None:  # the cursor's truth is a plain session key (NOTE in ui/cursor.py, rule 2)
    st.session_state[CURSOR] = (run.config, position)


here = [a for a in actions if a["start_seq"] <= seq <= a["end_seq"]]
row = st.container(horizontal=True, gap="small", vertical_alignment="center")
for kind in ("F", "DX", "DW", "B"):
    later = [a for a in actions if a["action"] == kind and a["start_seq"] > seq]
    target = run.index.position(later[0]["start_seq"]) if later else None
    row.button(f"Next {kind}", key=f"timeline_next_{kind}", on_click=_go, args=(target,), disabled=target is None,
               help=f"move the cursor to the start of the next {palette.action_word(kind)} action")
if here:
    for a in here:
        torch_name = f" (torch's {a['torch_action']})" if a["torch_action"] in ("I", "W") else ""
        step = f", step {a['step']}" if a["step"] is not None else ""
        st.markdown(f"**At the cursor:** {a['lane']} runs **{palette.action_word(a['action'])}**{torch_name} of "
                    f"micro-batch {a['microbatch']}{step}; {a['replays']} replay(s) in it.")
else:
    st.markdown("**At the cursor:** between actions.")

in_process = any(a["tick"] is not None for a in actions) and not run.trace.meta.get("distributed")
modes = ["tick", "time", "events"] if in_process else ["time", "events"]
x = st.radio("x axis", modes, horizontal=True, key="timeline_x",
             help="time: the recorded clock (merged ranks aligned to rank 0); tick: the schedule's unit ticks; "
                  "events: event positions")
show_chart(render_timeline, run.trace, cursor=seq, x=x)
st.caption("Boxes: F forward, DX input grads (torch's I), DW weight grads (torch's W), B both at once. Thin green "
           "boxes inside are checkpoint replays. The magenta rule is the cursor.")

plan = run.cached(planned_vs_executed)
if plan:
    st.subheader("Planned against executed order")
    st.dataframe(plan, hide_index=True, width="stretch")

if run.cached(stage_memory_rows):
    st.subheader("Memory per stage")
    show_chart(render_stage_memory, run.trace, cursor=seq)

if run.config.source == "builtin" and run.config.mode == "pipeline":
    from ckpt_viz import SCHEDULES

    st.subheader("Two schedules side by side")
    others = [s for s in SCHEDULES if s != run.config.schedule]
    other = st.selectbox("Compare with", others, key="timeline_other")
    loaded = load_run(replace(run.config, schedule=other))
    side = "tick" if x == "events" else x  # event positions do not compare across runs
    left, right = st.columns(2)
    with left:
        show_chart(render_timeline, run.trace, x=side,
                   title=f"{run.config.schedule} × {run.config.microbatches} mb")
    with right:
        if loaded.error is not None:
            st.warning(f"{other} failed: {loaded.error}")
        else:
            show_chart(render_timeline, loaded.run.trace, x=side,
                       title=f"{other} × {run.config.microbatches} mb")
