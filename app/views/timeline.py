"""Schedule timeline: stage (or rank) by time, one box per F / DX / DW / B action, on the shared cursor."""
from dataclasses import replace

import streamlit as st

from ckpt_viz.analysis.actions import actions, bubble_lines, bubble_rows, bubbles, planned_vs_executed
from ckpt_viz.analysis.memory import stage_memory
from ckpt_viz.analysis.words import part_word
from ckpt_viz.render.timeline import render_bubbles, render_stage_memory, render_timeline
from ckpt_viz.run.schedules import SCHEDULES
from ui.cursor import cursor_bar, position_of, set_cursor_position
from ui.runs import current, load_run
from ui.show import show_chart
from ui.text import md, md_table

run = current()
st.title("Schedule timeline")
seq = cursor_bar(run)
done = actions(run.trace)
if not done:
    st.info("This run has no pipeline actions. Pick the built-in model 'pipeline' with mode 'pipeline', or open a "
            "merged trace of a real run (`ckpt-viz record --distributed` or `ckpt-viz merge`) as a saved trace.")
    st.stop()

here = [a for a in done if a.start_seq <= seq <= a.end_seq]
row = st.container(horizontal=True, gap="small", vertical_alignment="center")
for kind in ("F", "DX", "DW", "B"):
    later = next((a for a in done if a.action == kind and a.start_seq > seq), None)
    target = position_of(run, later.start_seq) if later is not None else None
    row.button(f"Next {kind}", key=f"timeline_next_{kind}", on_click=set_cursor_position, args=(run, target or 0),
               disabled=target is None, help=f"move the cursor to the start of the next {part_word(kind)} action")
if here:
    for a in here:
        torch_name = " " + md(f"(torch's {a.torch_action})") if a.torch_action in ("I", "W") else ""
        step = f", step {a.step}" if a.step is not None else ""
        st.markdown(f"**At the cursor:** {md(a.lane)} runs **{md(part_word(a.action))}**{torch_name} of "
                    f"micro-batch {md(a.microbatch)}{md(step)}; {a.replays} replay(s) in it.")
else:
    st.markdown("**At the cursor:** between actions.")

in_process = any(a.tick is not None for a in done) and not run.trace.meta.get("distributed")
modes = ["tick", "time", "events"] if in_process else ["time", "events"]
x = st.radio("x axis", modes, horizontal=True, key="timeline_x",
             help="time: the recorded clock (merged ranks aligned to rank 0); tick: the schedule's unit ticks; "
                  "events: event seqs")
show_chart(render_timeline, run.trace, cursor=seq, x=x)
if stage_memory(run.trace):  # on the same x, right below: one point of the run at one place in both
    show_chart(render_stage_memory, run.trace, cursor=seq, x=x)
st.caption("Boxes: F forward, DX input grads (torch's I), DW weight grads (torch's W), B both at once. Thin green "
           "boxes inside are checkpoint replays. Below, the bytes each stage holds, on the same axis. The magenta "
           "rule is the cursor.")

found = bubbles(run.trace)
st.subheader("Step time and bubbles")
steps = [s.step for s in found.steps]
step = st.selectbox("Step", steps, key="timeline_step") if len(steps) > 1 else (steps[0] if steps else None)
line = dict(zip(steps, bubble_lines(run.trace))).get(step)
if line:
    st.markdown(md(line))
st.table(md_table(bubble_rows(run.trace, step)))
show_chart(render_bubbles, run.trace, step=step)
if found.unit == "tick":
    st.caption("One process runs every stage in turn here, so its clock cannot show stages overlapping: these "
               "figures are in the schedule's ticks (F, DX and DW one tick, B two), each stage its own device. "
               "Idle ticks are the bubble.")
else:
    st.caption("A rank is busy inside its actions (from each action's start to its end); the rest of the step it "
               "waits: for a send or a receive, or for the schedule. That idle share is its bubble. A stage's "
               "figures are those of its actions alone.")
if not found.exact and found.unit != "tick":
    st.warning("Some actions of this trace have no start and end events (it was recorded before they existed), so "
               "their boxes run from their first to their last checkpoint event: work outside those counts as idle, "
               "and the bubbles above are upper bounds. Tip: record the run again for exact figures.")

plan = planned_vs_executed(run.trace)
if plan:
    st.subheader("Planned against executed order")
    st.dataframe([{"lane": p.lane, "planned": p.planned, "executed": p.executed, "same": p.same,
                   "first difference": "-" if p.first_difference is None else p.first_difference} for p in plan],
                 hide_index=True, width="stretch")

if run.config.source == "builtin" and run.config.mode == "pipeline":
    st.subheader("Two schedules side by side")
    others = [s for s in SCHEDULES if s != run.config.schedule]
    other = st.selectbox("Compare with", others, key="timeline_other")
    loaded = load_run(replace(run.config, schedule=other))
    side = "tick" if x == "events" else x  # event seqs do not compare across runs
    left, right = st.columns(2)
    with left:
        show_chart(render_timeline, run.trace, x=side, title=f"{run.config.schedule} × {run.config.microbatches} mb")
        st.caption(md("; ".join(bubble_lines(run.trace))))
    with right:
        if loaded.error is not None:
            st.warning(md(f"{other} failed: {loaded.error}"))
        else:
            show_chart(render_timeline, loaded.run.trace, x=side, title=f"{other} × {run.config.microbatches} mb")
            st.caption(md("; ".join(bubble_lines(loaded.run.trace))))
