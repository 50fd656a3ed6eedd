"""AppTest of the Lessons and Glossary pages: a lesson's first step, its question before the answer, Next."""
from __future__ import annotations

import base64
import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[2] / "app"


def _plain(markdown: str) -> str:
    """Markdown written by the app's `ui.text.md` as the browser shows it."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace("  \n", "\n")).replace("\u2060", "")


def _page(name: str) -> AppTest:
    import sys

    sys.path.insert(0, str(APP))
    return AppTest.from_file(str(APP / "views" / name), default_timeout=240)


def test_lessons_page_steps_with_next_and_reveals_the_answer_after_a_pick() -> None:
    at = _page("lessons.py").run()
    assert not at.exception, at.exception
    assert at.selectbox[0].value.startswith("1. What does autograd save")
    assert "Step 1 of 2" in at.get("progress")[0].proto.text
    from ckpt_viz.lessons.loader import load_lessons
    from ckpt_viz.lessons.runner import check_step, step_trace

    lesson = load_lessons()[0]
    at_peak = check_step(lesson, lesson.steps[0]).seq  # the step opens the shared cursor at its own cursor
    events = step_trace(lesson, lesson.steps[0]).events
    assert at.slider[0].value == max(i for i, e in enumerate(events) if e.seq <= at_peak)
    assert not at.success and at.radio[0].value is None  # the question comes before the answer
    at.radio[0].set_value(at.radio[0].options[1]).run()
    assert at.success and "Right." in at.success[0].value
    next(b for b in at.button if b.label == "Next").click().run()
    assert not at.exception, at.exception
    assert "Step 2 of 2" in at.get("progress")[0].proto.text
    assert any("Checked on the run: activations rise" in i.value.replace("**", "") for i in at.info)


def test_glossary_lists_states_categories_and_terms_in_the_pages_words() -> None:
    from ckpt_viz.analysis.words import CATEGORY_WORDS, STATE_WORDS

    at = _page("glossary.py").run()
    assert not at.exception, at.exception
    assert [s.value for s in at.subheader][:3] == ["Terms", "Memory categories", "Handle states"]
    assert set(at.dataframe[1].value["word"]) == set(CATEGORY_WORDS.values())
    assert set(at.dataframe[2].value["word"]) == set(STATE_WORDS.values())  # "waiting for DX", never "phase_dx"


def test_overview_says_what_to_look_at_and_memory_explains_the_split_cost() -> None:
    from ckpt_viz.catalog import DEFAULT_MODEL
    from ckpt_viz.lessons.glossary import SPLIT_COST
    from ckpt_viz.run.zoo import build_builtin

    at = AppTest.from_file(str(APP / "streamlit_app.py"), default_timeout=240).run()
    assert not at.exception, at.exception
    look_at = build_builtin(DEFAULT_MODEL).look_at
    assert look_at and any(look_at in _plain(i.value) for i in at.info), [i.value for i in at.info]
    at.switch_page("views/memory.py").run()  # the default mode is split-reentrant
    assert not at.exception, at.exception
    assert any(SPLIT_COST in _plain(c.value) for c in at.caption), [c.value for c in at.caption]
    at.switch_page("views/glossary.py").run()
    assert [t.value for t in at.title] == ["Glossary"]


def test_a_graph_step_draws_the_server_side_svg_of_its_own_run() -> None:
    """Lesson 3's first step shows the graph: drawn by `dot` and shown as an image (as on the graph page, so
    nothing morphs between cursor positions and nothing in it runs), with the checkpoint region of the step's own
    run."""
    at = _page("lessons.py").run()
    at.selectbox(key="lesson_pick").set_value(next(o for o in at.selectbox(key="lesson_pick").options
                                                   if o.startswith("3."))).run()
    assert not at.exception, at.exception
    graphs = [base64.b64decode(data).decode() for element in at.get("html")
              for data in re.findall(r'class="ckpt-graph"[^>]*src="data:image/svg\+xml;base64,([^"]+)"',
                                     element.proto.body)]
    assert len(graphs) == 1 and "<svg" in graphs[0] and re.search(r"h\d+ · ", graphs[0]), graphs[:1]
    assert not at.get("iframe")
    assert not at.get("graphviz_chart")
