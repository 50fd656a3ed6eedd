"""Every step of every lesson runs and its check holds; its text states only figures from its run; the code it
shows runs as it is; its knobs run; each lesson shows what its title promises; the loader's errors."""
from __future__ import annotations

import gc
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
from ckpt_viz.lessons.loader import VIEWS, LessonError, fields, lessons_dir, load_lesson, load_lessons
from ckpt_viz.lessons.runner import check_step, run_code, show_step, step_trace
from ckpt_viz.runtime.handle_ids import restart_handle_ids
from ckpt_viz.trace import Trace

LESSONS = load_lessons()
STEPS = [(lesson, i) for lesson in LESSONS for i in range(len(lesson.steps))]
IDS = [f"{le.number:02d}-step{i + 1}" for le, i in STEPS]
KNOBBED = [(lesson, i) for lesson, i in STEPS if lesson.steps[i].knobs]
CODE_WIDTH = 88  # columns: the Lessons page's code box shows this many without scrolling (wrap_lines as a net)


def test_fourteen_lessons_in_order_listed_in_both_readmes() -> None:
    assert [lesson.number for lesson in LESSONS] == list(range(1, 15))
    index = (lessons_dir() / "README.md").read_text()
    positions = [index.index(f"`{lesson.folder.name}`") for lesson in LESSONS]
    assert positions == sorted(positions), "lessons/README.md lists the lessons out of order"
    readme = (lessons_dir().parent / "README.md").read_text()
    section = readme[readme.index("## Lessons"):].split("\n## ", 1)[0]
    assert [line.split(".")[0] for line in section.splitlines() if line[:1].isdigit()] == [
        str(n) for n in range(1, 15)], "README.md's Lessons section lists one line per lesson"


@pytest.mark.parametrize(("lesson", "i"), STEPS, ids=IDS)
def test_every_step_runs_its_check_holds_and_the_code_it_shows_runs_as_it_is(lesson, i: int) -> None:
    """One test per step, so the step's runs are recorded once (the runner keeps the last runs only)."""
    step = lesson.steps[i]
    shown = show_step(lesson, step)
    assert shown.claim.strip() and "{" not in shown.claim and "{" not in shown.prose
    assert shown.seq in {e.seq for e in shown.trace.events}, "the step's cursor is no event of its trace"
    assert set(step.views) <= set(VIEWS) and step.views, "a step shows at least one view"
    if step.compare:
        assert shown.other is not None and shown.other_seq in {e.seq for e in shown.other.events}
    if shown.question is not None:
        assert all("{" not in text for text in (shown.question.ask, shown.question.explain, *shown.question.choices))
    # the code it shows runs as it is, in a fresh namespace, and reads without scrolling sideways
    for name in (step.run, step.compare) if step.compare else (step.run,):
        code = run_code(lesson, name)
        wide = [line for line in code.splitlines() if len(line) > CODE_WIDTH]
        assert not wide, f"lines wider than {CODE_WIDTH} columns: {wide}"
        namespace: dict = {}
        if not restart_handle_ids():  # as in a fresh interpreter: no handle left in a cycle shifts the ids
            gc.collect()
        exec(compile(code, f"<lesson {lesson.number} step {i + 1}: {name}>", "exec"), namespace)  # a fresh namespace
        ran = namespace["trace"]
        assert isinstance(ran, Trace)
        if name == step.run:  # the same run as the step's: the same handles and replays
            assert sorted({e.kind for e in ran.events}) == sorted({e.kind for e in shown.trace.events})
            assert ran.handle_ids() == shown.trace.handle_ids()


NAMES = ("1F1B", "ZB-H1")  # schedules: names that hold digits, no figures


def _unfilled(template: str) -> str:
    """The template's own text: the figures ({...}), the code spans (`...`) and the schedules' names taken out."""
    text = re.sub(r"`[^`]*`", "", re.sub(r"\{[a-z_][a-z0-9_]*\}", "", template))
    for name in NAMES:
        text = text.replace(name, "")
    return text


@pytest.mark.parametrize(("lesson", "i"), STEPS, ids=IDS)
def test_no_number_is_typed_into_a_lessons_text(lesson, i: int) -> None:
    """NOTE [ Numbers come from the run ], rule 1: every figure is a {name} filled from the run."""
    for where, template in lesson.steps[i].texts().items():
        typed = re.findall(r"\d[\d.,]*", _unfilled(template))
        assert not typed, f"lesson {lesson.number} step {i + 1} {where}: typed-in number(s) {typed}: {template!r}"


def test_no_number_is_typed_into_a_lessons_title_or_summary() -> None:
    for lesson in LESSONS:
        for where, text in (("title", lesson.title), ("summary", lesson.summary)):
            assert not re.findall(r"\d", _unfilled(text)), f"lesson {lesson.number} {where}: {text!r}"


def test_every_lesson_asks_and_the_figures_of_its_text_are_named() -> None:
    assert all(any(s.question for s in lesson.steps) for lesson in LESSONS)
    for lesson in LESSONS:
        for step in lesson.steps:
            for template in step.texts().values():
                assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", name) for name in fields(template))


def test_at_least_five_steps_have_knobs_and_enough_steps() -> None:
    assert len(KNOBBED) >= 5, [(le.number, i + 1) for le, i in KNOBBED]
    assert len(STEPS) >= 38, len(STEPS)


def test_a_steps_code_runs_in_a_fresh_interpreter(tmp_path: Path) -> None:
    lesson = LESSONS[1]
    code = run_code(lesson, lesson.steps[-1].run, {"checkpointed": (1, 2)})
    assert code.rstrip().endswith("trace = record_checkpointed(checkpointed=(1, 2))")
    script = tmp_path / "step.py"
    script.write_text(code + "\nprint(len(trace.handle_ids()))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "2"


def _knob_settings(lesson, i: int) -> list[dict]:
    """Each knob at its first and its last value (a multi knob: none, and all but the first), the others at their
    defaults."""
    out = []
    for knob in lesson.steps[i].knobs:
        if knob.multi:
            out += [{knob.name: ()}, {knob.name: knob.values[1:]}]
        else:
            out += [{knob.name: knob.values[0]}, {knob.name: knob.values[-1]}]
    return out


@pytest.mark.parametrize(("lesson", "i"), KNOBBED, ids=[f"{le.number:02d}-step{i + 1}" for le, i in KNOBBED])
def test_every_knob_setting_runs_and_its_claim_holds(lesson, i: int) -> None:
    step = lesson.steps[i]
    claims = set()
    for setting in _knob_settings(lesson, i):
        result = check_step(lesson, step, setting)
        claims.add(result.fact)
        for name, value in setting.items():
            word = ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)
            if f"{{{name}}}" in step.claim and not isinstance(value, tuple):
                assert word in result.fact, (setting, result.fact)
    assert len(claims) == len(_knob_settings(lesson, i)), "a knob changed nothing the claim states"


def test_a_knob_value_the_step_does_not_offer_is_refused() -> None:
    lesson = LESSONS[0]
    with pytest.raises(LessonError, match=r"knob 'depth' takes one of \[1, 2, 4, 8\], got 3\.\nTip: "):
        check_step(lesson, lesson.steps[1], {"depth": 3})
    with pytest.raises(LessonError, match=r"this step has no knob width"):
        check_step(lesson, lesson.steps[1], {"width": 3})


# -- what each title promises (the app's views hold the figure: tests/lessons/test_app_lessons.py shows them)


def _lesson(n: int):
    return LESSONS[n - 1]


def test_lesson_4_and_10_show_the_bubble_on_the_schedule_timeline() -> None:
    from ckpt_viz.analysis.actions import bubbles
    from ckpt_viz.render.timeline import render_timeline

    for n, k in ((4, 2), (10, 0), (10, 1), (10, 2)):
        step = _lesson(n).steps[k]
        assert "timeline" in step.views
        shown = show_step(_lesson(n), step)
        for trace in (shown.trace, shown.other) if shown.other is not None else (shown.trace,):
            (figures,) = bubbles(trace).steps
            assert 0 < figures.bubble < 1 and bubbles(trace).unit == "tick"
            rows: dict = {}
            render_timeline(trace, x="tick", datasets=rows)
            assert any(r.get("action") in ("F", "DX", "DW", "B") for values in rows.values() for r in values)


def test_lesson_5_draws_the_trigger_in_the_graph() -> None:
    from ckpt_viz.render.graph import render_graph

    lesson = _lesson(5)
    step = lesson.steps[1]
    assert "graph" in step.views
    shown = show_step(lesson, step)
    dot = render_graph(shown.trace, shown.seq, collapse=False).source
    handles = shown.trace.handle_ids()
    assert all(f"trigger h{h}" in dot for h in handles), dot[:400]


def test_lesson_6_lanes_show_the_dw_states() -> None:
    from ckpt_viz.analysis.words import state_word
    from ckpt_viz.render.swimlane import lifecycle_intervals

    lesson = _lesson(6)
    fixed = show_step(lesson, lesson.steps[0])
    broken = show_step(lesson, lesson.steps[1])
    assert "lanes" in lesson.steps[0].views and "lanes" in lesson.steps[1].views
    assert "retained" in {r["state"] for r in lifecycle_intervals(fixed.trace)}
    assert "phase_dw" in {r["state"] for r in lifecycle_intervals(broken.trace)}
    assert state_word("retained") in fixed.claim and state_word("phase_dw") in broken.claim


def test_lesson_8_shows_three_broken_runs_beside_their_fixes_with_the_debuggers_story() -> None:
    from ckpt_viz.analysis.diagnosis import diagnose

    lesson = _lesson(8)
    assert "3" not in lesson.title and "three" in lesson.title and "three fixes" in lesson.title
    pairs = [s for s in lesson.steps if s.compare and s.sides == ("broken", "fixed")]
    assert len(pairs) == 3 and all("debugger" in s.views for s in pairs)
    codes = set()
    for step in pairs:
        shown = show_step(lesson, step)
        broken = [f for f in diagnose(shown.trace) if not f.ok]
        assert broken and broken[0].fix and broken[0].explanation
        assert not [f for f in diagnose(shown.other) if not f.ok]
        assert shown.code != shown.other_code and "def record_" in shown.other_code
        codes.add(broken[0].code)
    assert len(codes) == 3


def test_lesson_9_keeps_an_op_that_is_expensive_to_recompute_with_its_time() -> None:
    lesson = _lesson(9)
    shown = show_step(lesson, lesson.steps[1])
    assert "LayerNorm" not in shown.code and "checkpoint_exclude_wrapper(conv)" in shown.code
    assert "cost" in lesson.steps[1].views
    assert shown.figures["t_kept"].endswith(" ms") and shown.figures["t_recomputed"].endswith(" ms")
    assert float(shown.figures["gflop"]) > 0.1


def test_lesson_10_shows_memory_per_stage_side_by_side() -> None:
    from ckpt_viz.analysis.memory import stage_peaks

    lesson = _lesson(10)
    for step in lesson.steps[:2]:
        assert step.compare and "stages" in step.views
        shown = show_step(lesson, step)
        assert set(stage_peaks(shown.trace)) == set(stage_peaks(shown.other)) == {"0", "1"}


def test_every_lesson_links_to_the_next_and_to_the_pages_that_go_deeper() -> None:
    assert all(any(s.see for s in lesson.steps) for lesson in LESSONS)
    assert all(s.compare for lesson in LESSONS for s in lesson.steps
               if s.question and re.search(r"\b(which|or)\b.*\b(higher|lower|less|more|smaller)\b", s.question.ask,
                                           re.I)), "a question that compares two runs shows both"


# -- the loader


def _write(folder: Path, toml: str, script: str = "def r():\n    pass\n") -> Path:
    folder.mkdir(parents=True)
    (folder / "lesson.toml").write_text(toml)
    (folder / "run.py").write_text(script)
    return folder


GOOD_STEP = 'title = "t"\nprose = "p"\nrun = "r"\nviews = ["memory"]\ncheck = "c"\nclaim = "x"\n'


@pytest.mark.parametrize(("step", "message"), [
    (GOOD_STEP + 'cursor = "middle"\n', "'cursor' 'middle' is not a cursor"),
    (GOOD_STEP.replace('["memory"]', '["lane"]'), "'views' must list names from graph, memory"),
    (GOOD_STEP + "colour = 1\n", "unknown key(s) 'colour'"),
    (GOOD_STEP.replace('check = "c"\n', ""), "'check' must be a non-empty string"),
    (GOOD_STEP.replace('claim = "x"\n', ""), "'claim' must be a non-empty string"),
    (GOOD_STEP + '[steps.question]\nask = "?"\nchoices = ["a", "b"]\nanswer = 2\nexplain = "e"\n',
     "'answer' must be the index"),
    (GOOD_STEP.replace('claim = "x"', 'claim = "{Peak}"'), "asks for the figure {Peak}, which is no plain name"),
    (GOOD_STEP + '[[steps.knobs]]\nname = "depth"\nlabel = "d"\nvalues = [1]\n', "'values' must list at least two"),
    (GOOD_STEP + 'sides = ["a", "b"]\n', "there is no 'compare' run"),
    (GOOD_STEP + 'see = ["nowhere"]\n', "'see' must list names from overview"),
])
def test_a_lesson_that_does_not_fit_says_where_and_what(tmp_path: Path, step: str, message: str) -> None:
    folder = _write(tmp_path / "01_bad", f'title = "T"\nsummary = "S"\n[[steps]]\n{step}')
    with pytest.raises(LessonError) as info:
        load_lesson(folder)
    text = str(info.value)
    assert text.startswith("ckpt_viz.lessons: ") and "lesson.toml step 1" in text and message in text, text
    assert text.splitlines()[-1].startswith("Tip: ")


def test_a_check_that_does_not_hold_fails_the_step_and_a_missing_figure_is_named(tmp_path: Path) -> None:
    script = ("def r():\n    return LESSON_TRACE\n\n\ndef c(trace, runs):\n    assert trace.count('released') == 1, "
              "'no release'\n    return {}\n\n\ndef d(trace, runs):\n    return {'peak': 1}\n")
    steps = GOOD_STEP + "[[steps]]\n" + GOOD_STEP.replace('check = "c"', 'check = "d"').replace(
        'claim = "x"', 'claim = "{peak} and {total}"')
    folder = _write(tmp_path / "01_claims", f'title = "T"\nsummary = "S"\n[[steps]]\n{steps}', script)
    lesson = load_lesson(folder)
    from ckpt_viz.lessons.runner import script as module

    module(lesson).LESSON_TRACE = Trace.from_json(step_trace(LESSONS[0], LESSONS[0].steps[0]).to_json())
    with pytest.raises(LessonError, match=r"does not show what the prose claims: no release\.\nTip: "):
        check_step(lesson, lesson.steps[0])
    with pytest.raises(LessonError, match=r"states \{total\}, which its check did not return .*\nTip: return"):
        check_step(lesson, lesson.steps[1])


@pytest.mark.parametrize("model", [m for m in BUILTIN_MODEL_NAMES if m != "pipeline"])
def test_checkpointed_modes_peak_measurably_below_none(model: str) -> None:
    """The models teach checkpointing: see NOTE [ Sizes: activations dominate ] in ckpt_viz/run/zoo.py (the
    pipeline model teaches schedules, not this: its rule there)."""
    from ckpt_viz.lessons.helpers import builtin, peak

    none = peak(builtin(model, "none"))
    for mode in ("nonreentrant", "reentrant"):
        assert peak(builtin(model, mode)) < 0.9 * none, f"{model} {mode} does not peak below none"
