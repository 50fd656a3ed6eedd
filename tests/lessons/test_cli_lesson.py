"""`ckpt-viz lesson` lists the lessons; `ckpt-viz lesson N` walks one straight through when not on a terminal."""
from __future__ import annotations

import subprocess
import sys

from ckpt_viz.cli import main
from ckpt_viz.lessons.loader import load_lessons


def test_lesson_lists_every_lesson(capsys) -> None:
    assert main(["lesson"]) == 0
    out = capsys.readouterr().out
    for lesson in load_lessons():
        assert f"{lesson.number:>2}. {lesson.title}" in out


def test_lesson_n_runs_straight_through_without_a_terminal() -> None:
    done = subprocess.run([sys.executable, "-m", "ckpt_viz", "lesson", "3"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lesson = load_lessons()[2]
    assert out.count("== Step ") == len(lesson.steps) and "Press Enter" not in out
    assert "backward_entered" in out and "replay_started" in out  # the plain-text trace at the cursor
    question = next(s.question for s in lesson.steps if s.question)
    assert out.index(question.ask) < out.index(f"Answer: {question.answer + 1}.")
    assert "Checked on the run: for every handle: backward_entered < replay_started" in out


def test_an_unknown_lesson_says_which_exist(capsys) -> None:
    assert main(["lesson", "99"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckpt-viz lesson: no lesson 99; there are 1 to 11.") and "Tip: " in err
