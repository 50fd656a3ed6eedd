"""Every step of every lesson runs and its check holds; the loader's errors; built-in models teach checkpointing."""
from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
from ckpt_viz.lessons.loader import VIEWS, LessonError, lessons_dir, load_lesson, load_lessons
from ckpt_viz.lessons.runner import check_step, run_source, step_trace

LESSONS = load_lessons()
STEPS = [(lesson, i) for lesson in LESSONS for i in range(len(lesson.steps))]


def test_eleven_lessons_in_the_issue_order_listed_in_both_readmes() -> None:
    assert [lesson.number for lesson in LESSONS] == list(range(1, 12))
    index = (lessons_dir() / "README.md").read_text()
    positions = [index.index(f"`{lesson.folder.name}`") for lesson in LESSONS]
    assert positions == sorted(positions), "lessons/README.md lists the lessons out of order"
    readme = (lessons_dir().parent / "README.md").read_text()
    section = readme[readme.index("## Lessons"):].split("\n## ", 1)[0]
    assert [line.split(".")[0] for line in section.splitlines() if line[:1].isdigit()] == [
        str(n) for n in range(1, 12)], "README.md's Lessons section lists one line per lesson"


@pytest.mark.parametrize(("lesson", "i"), STEPS, ids=[f"{le.number:02d}-step{i + 1}" for le, i in STEPS])
def test_every_step_runs_and_its_check_holds(lesson, i: int) -> None:
    step = lesson.steps[i]
    result = check_step(lesson, step)
    assert result.fact.strip()
    trace = step_trace(lesson, step)
    assert result.seq in {e.seq for e in trace.events}, "the step's cursor is no event of its trace"
    assert f"def {step.run}(" in run_source(lesson, step)
    assert set(step.views) <= set(VIEWS) and step.views, "a step shows at least one view"


def test_every_lesson_asks_at_least_one_question() -> None:
    assert all(any(s.question for s in lesson.steps) for lesson in LESSONS)


def _write(folder: Path, toml: str, script: str = "def r():\n    pass\n") -> Path:
    folder.mkdir(parents=True)
    (folder / "lesson.toml").write_text(toml)
    (folder / "run.py").write_text(script)
    return folder


GOOD_STEP = 'title = "t"\nprose = "p"\nrun = "r"\nviews = ["memory"]\ncheck = "c"\n'


@pytest.mark.parametrize(("step", "message"), [
    (GOOD_STEP + 'cursor = "middle"\n', "'cursor' 'middle' is not a cursor"),
    (GOOD_STEP.replace('["memory"]', '["lane"]'), "'views' must list names from graph, memory"),
    (GOOD_STEP + "colour = 1\n", "unknown key(s) 'colour'"),
    (GOOD_STEP.replace('check = "c"\n', ""), "'check' must be a non-empty string"),
    (GOOD_STEP + '[steps.question]\nask = "?"\nchoices = ["a", "b"]\nanswer = 2\n', "'answer' must be the index"),
])
def test_a_lesson_that_does_not_fit_says_where_and_what(tmp_path: Path, step: str, message: str) -> None:
    folder = _write(tmp_path / "01_bad", f'title = "T"\nsummary = "S"\n[[steps]]\n{step}')
    with pytest.raises(LessonError) as info:
        load_lesson(folder)
    text = str(info.value)
    assert text.startswith("ckpt_viz.lessons: ") and "lesson.toml step 1" in text and message in text, text
    assert text.splitlines()[-1].startswith("Tip: ")


def test_a_check_that_does_not_hold_fails_the_step(tmp_path: Path) -> None:
    script = ("from ckpt_viz import Trace\nfrom ckpt_viz.events import Event\n\n\ndef r():\n"
              "    return LESSON_TRACE\n\n\ndef c(trace, runs):\n    assert trace.count('released') == 1, "
              "'no release'\n")
    folder = _write(tmp_path / "01_claims", f'title = "T"\nsummary = "S"\n[[steps]]\n{GOOD_STEP}', script)
    lesson = load_lesson(folder)
    from ckpt_viz.lessons.runner import script as module
    from ckpt_viz.trace import Trace

    module(lesson).LESSON_TRACE = Trace.from_json(step_trace(LESSONS[0], LESSONS[0].steps[0]).to_json())
    with pytest.raises(LessonError, match=r"does not show what the prose claims: no release\.\nTip: "):
        check_step(lesson, lesson.steps[0])


@pytest.mark.parametrize("model", BUILTIN_MODEL_NAMES)
def test_checkpointed_modes_peak_measurably_below_none(model: str) -> None:
    """The models teach checkpointing: see NOTE [ Sizes: activations dominate ] in ckpt_viz/run/zoo.py."""
    from ckpt_viz.lessons.helpers import builtin, peak

    none = peak(builtin(model, "none"))
    for mode in ("nonreentrant", "reentrant"):
        assert peak(builtin(model, mode)) < 0.9 * none, f"{model} {mode} does not peak below none"
