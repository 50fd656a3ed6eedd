"""Lessons: pick one, step with Next and Back. Predict, then see: a step's run (its views, its cursor, the claim
its check asserted) shows once its question is answered; knobs re-run the step's code; the code is shown as it
runs; two runs side by side where a step compares them; links to the pages that go deeper."""
import streamlit as st

from ckpt_viz.lessons.loader import load_lessons
from ckpt_viz.lessons.runner import fill, knob_values, show_step
from ui import lessonview
from ui.cursor import cursor_bar, set_cursor
from ui.runs import Run, RunConfig
from ui.text import md

LESSONS = {f"{le.number}. {le.title}": le for le in load_lessons()}
NAMES = list(LESSONS)
st.title("Lessons")
name = st.selectbox("Lesson", NAMES, key="lesson_pick")
lesson = LESSONS[name]
step_key = f"lesson_step_{lesson.number}"
i = st.session_state.setdefault(step_key, 0)
step = lesson.steps[i]
st.progress((i + 1) / len(lesson.steps), text=f"Step {i + 1} of {len(lesson.steps)}: {step.title}")
st.caption(md(lesson.summary))


def _move(by: int) -> None:
    st.session_state[step_key] = min(max(st.session_state[step_key] + by, 0), len(lesson.steps) - 1)


def _next_lesson(name: str) -> None:
    st.session_state["lesson_pick"] = name


def _navigation() -> None:
    back, nxt = st.columns(2)
    back.button("Back", on_click=_move, args=(-1,), disabled=i == 0, width="stretch")
    if i < len(lesson.steps) - 1:
        nxt.button("Next", on_click=_move, args=(1,), type="primary", width="stretch")
    elif NAMES.index(name) < len(NAMES) - 1:
        following = NAMES[NAMES.index(name) + 1]
        nxt.button(f"Next lesson: {following}", on_click=_next_lesson, args=(following,), type="primary",
                   width="stretch", key="lesson_next_lesson")
    else:
        nxt.success("End of the last lesson.")


defaults = knob_values(lesson, step)
chosen = lessonview.knobs(lesson, step, defaults)
with st.spinner("Recording this step's run..."):
    shown = show_step(lesson, step, chosen)
escaped = {k: md(v) for k, v in shown.figures.items()}  # figures may carry a trace's text: shown as text
st.markdown(fill(step.prose, escaped, "the prose"))

with st.expander("The code this step runs (copy it, run it: `trace` holds the run)", expanded=True):
    if step.compare:
        left, right = st.columns(2)
        left.markdown(f"**{md(step.sides[0])}**")
        left.code(shown.code, language="python", wrap_lines=True)
        right.markdown(f"**{md(step.sides[1])}**")
        right.code(shown.other_code, language="python", wrap_lines=True)
    else:
        st.code(shown.code, language="python", wrap_lines=True)

answered = True
if shown.question is not None:
    q = step.question
    pick = st.radio(fill(q.ask, escaped), [fill(c, escaped) for c in q.choices], index=None,
                    key=f"answer_{lesson.number}_{i}")
    answered = pick is not None
    if not answered:
        st.caption("Predict first: pick an answer, then the run shows whether you were right.")
    elif [fill(c, escaped) for c in q.choices].index(pick) == q.answer:
        st.success(f"Right. {fill(q.explain, escaped)}")
    else:
        st.error(f"Not quite: the answer is **{fill(q.choices[q.answer], escaped)}**. {fill(q.explain, escaped)}")

if answered:
    st.info(f"**Checked on the run:** {fill(step.claim, escaped)}", icon=":material/check_circle:")
    base = f"lesson {lesson.number} step {i + 1}"
    knob_words = ", ".join(f"{k}={v}" for k, v in shown.knobs.items())
    config = RunConfig("trace", f"{base} {knob_words}".strip(), mode="", name=step.sides[0] if step.compare else
                       f"{base}")
    run = Run(config, shown.trace)
    if st.session_state.get("lesson_cursor_for") != config:
        st.session_state["lesson_cursor_for"] = config
        set_cursor(run, shown.seq)
    cursor_views = {"memory", "lanes", "routing", "graph", "events"}
    seq = cursor_bar(run) if cursor_views & set(step.views) else shown.seq
    key = f"lesson_{lesson.number}_{i}"
    if shown.other is not None:
        other = Run(RunConfig("trace", f"{base} other {knob_words}", mode="", name=step.sides[1]), shown.other)
        other_seq = shown.other_seq
        left, right = st.columns(2, gap="large")
        for column, side, shown_run, at in ((left, step.sides[0], run, seq), (right, step.sides[1], other, other_seq)):
            with column:
                st.subheader(md(side))
                for name_ in step.views:
                    lessonview.view(name_, shown_run, at, key=f"{key}_{side}_{name_}")
    else:
        for name_ in step.views:
            lessonview.view(name_, run, seq, key=f"{key}_{name_}")
    lessonview.see_links(step.see, shown.trace, seq, f"lesson{lesson.number:02d}-step{i + 1}")
_navigation()
