"""Lessons: pick one, step with Next and Back; the prose beside the live views of the step's own run, at its cursor."""
import streamlit as st

from ckpt_viz.lessons.loader import load_lessons
from ckpt_viz.lessons.runner import check_step, run_source, step_trace
from ckpt_viz.render.eventlog import event_rows, rows_text
from ckpt_viz.render.graph import render_graph
from ckpt_viz.render.memory import render_memory
from ckpt_viz.render.routing import render_routing
from ckpt_viz.render.swimlane import render_lifecycles
from ui.cursor import cursor_bar, position_of, set_cursor
from ui.graphview import graph_view, snapshot_note
from ui.runs import Run, RunConfig
from ui.show import show_chart
from ui.text import md

LESSONS = {f"{le.number}. {le.title}": le for le in load_lessons()}
st.title("Lessons")
name = st.selectbox("Lesson", list(LESSONS), key="lesson_pick")
lesson = LESSONS[name]
step_key = f"lesson_step_{lesson.number}"
i = st.session_state.setdefault(step_key, 0)
step = lesson.steps[i]
st.progress((i + 1) / len(lesson.steps), text=f"Step {i + 1} of {len(lesson.steps)}: {step.title}")


def _move(by: int) -> None:
    st.session_state[step_key] = min(max(st.session_state[step_key] + by, 0), len(lesson.steps) - 1)


with st.spinner("Recording this step's run..."):
    result = check_step(lesson, step)
    trace = step_trace(lesson, step)
# The lesson's own run, on the shared cursor; a step opens at its cursor, and the learner may move it.
config = RunConfig("trace", f"lesson {lesson.number} step {i + 1}", mode=trace.meta.get("mode", ""))
run = Run(config, trace)
if st.session_state.get("lesson_cursor_for") != config:
    st.session_state["lesson_cursor_for"] = config
    set_cursor(run, result.seq)
left, right = st.columns([2, 3], gap="large")
with left:
    st.markdown(step.prose)
    with st.expander("The code this step runs", expanded=False):
        st.code(run_source(lesson, step), language="python")
    if step.question:
        q = step.question
        pick = st.radio(q.ask, q.choices, index=None, key=f"answer_{lesson.number}_{i}")
        if pick is None:
            st.caption("Predict first: pick an answer to reveal it.")
        elif q.choices.index(pick) == q.answer:
            st.success(f"Right. {q.explain}")
        else:
            st.error(f"Not quite: the answer is **{q.choices[q.answer]}**. {q.explain}")
    st.info(f"**Checked on the run:** {result.fact}", icon=":material/check_circle:")
    back, nxt = st.columns(2)
    back.button("Back", on_click=_move, args=(-1,), disabled=i == 0, width="stretch")
    if i < len(lesson.steps) - 1:
        nxt.button("Next", on_click=_move, args=(1,), type="primary", width="stretch")
    else:
        nxt.success("End of the lesson.")
with right:
    st.caption(f"This step's own run ({md(trace.meta.get('model') or 'a run')}, {md(trace.meta.get('mode') or '')}); "
               f"the step's cursor is seq {result.seq}")
    seq = cursor_bar(run)
    for view in step.views:
        if view == "memory" and len(trace.memory):
            show_chart(render_memory, {"this step": trace}, cursor=seq, max_points=300)
        elif view == "lanes" and trace.handle_ids():
            show_chart(render_lifecycles, trace, cursor=seq)
        elif view == "routing" and trace.handle_ids():
            graph_view(render_routing(trace, seq), key="lesson_routing_zoom", name=f"lesson routing seq {seq}")
        elif view == "graph" and trace.graphs:
            graph_view(render_graph(trace, seq, collapse=False), key="lesson_graph_zoom", name=f"lesson graph seq {seq}",
                       note=snapshot_note(run, seq))
        elif view == "events":
            at = position_of(run, seq)
            st.code(rows_text(event_rows(trace.events[max(0, at - 8): at + 9]), marker=seq), language=None)
