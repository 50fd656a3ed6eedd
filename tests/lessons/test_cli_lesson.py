"""`ckpt-viz lesson` lists the lessons; `ckpt-viz lesson N` walks the app's steps in the terminal with the same
questions and the same reveal: nothing of the run before the answer, then the verdict, the claim and the views."""
from __future__ import annotations

import io
import subprocess
import sys

from ckpt_viz.cli import main
from ckpt_viz.cli.lesson import walk
from ckpt_viz.lessons.loader import load_lessons
from ckpt_viz.lessons.runner import show_step

LESSONS = load_lessons()


def test_lesson_lists_every_lesson(capsys) -> None:
    assert main(["lesson"]) == 0
    out = capsys.readouterr().out
    for lesson in LESSONS:
        assert f"{lesson.number:>2}. {lesson.title}  ({len(lesson.steps)} steps)" in out


def test_lesson_n_runs_straight_through_without_a_terminal() -> None:
    done = subprocess.run([sys.executable, "-m", "ckpt_viz", "lesson", "3"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lesson = LESSONS[2]
    assert out.count("== Step ") == len(lesson.steps) and "Press Enter" not in out
    assert "backward_entered" in out and "replay_started" in out  # the plain-text trace at the cursor
    question = next(s.question for s in lesson.steps if s.question)
    assert out.index(question.ask) < out.index(f"Answer: {question.answer + 1}.")
    assert "trace = record_checkpointed(depth=4, batch=384)" in out  # the code, runnable as it is
    assert "Checked on the run: for each of the 4 handles: backward_entered < replay_started" in out
    assert out.rstrip().endswith(f"Next: ckpt-viz lesson 4 ({LESSONS[3].title})")


def test_the_terminal_shows_the_steps_text_filled_from_its_run_and_its_views_in_text() -> None:
    lesson = LESSONS[0]
    out = io.StringIO()
    assert walk(1, out=out) == 0
    text = out.getvalue()
    for step in lesson.steps:
        shown = show_step(lesson, step)
        assert shown.prose.strip() in text and f"Checked on the run: {shown.claim}" in text
    assert "Peak " in text and "activations" in text and "Recompute: 0 replay(s)" in text


def test_a_wrong_answer_gets_the_answer_the_explanation_and_the_figure_and_nothing_before() -> None:
    lesson = LESSONS[1]
    step = lesson.steps[1]
    shown = show_step(lesson, step)
    # Enter after step 1; step 2: out of range, then wrong; Enter; step 3: right; Enter
    answers = iter(["\n", "9\n", "1\n", "\n", "2\n", "\n"])
    out = io.StringIO()
    assert walk(2, out=out, interactive=True, read=lambda: next(answers, "\n")) == 0
    text = out.getvalue()
    part = text[text.index("== Step 2/"):text.index("== Step 3/")]
    asked = part.index(shown.question.ask)
    before = part[:asked]
    assert "Checked on the run" not in before and "Handle lanes" not in before and shown.claim not in before
    assert "Type a number from 1 to 3." in part
    verdict = part.index(f"Not quite: the answer is 2. {shown.question.choices[1]}. {shown.question.explain}")
    assert asked < verdict < part.index(f"Checked on the run: {shown.claim}") < part.index("Handle lanes")
    step3 = text[text.index("== Step 3/"):]
    assert step3.index("Right. ") < step3.index("Checked on the run")


def test_a_knob_is_set_with_set_and_a_wrong_one_is_refused(capsys) -> None:
    out = io.StringIO()
    assert walk(1, out=out, knobs={"depth": "2", "batch": "64"}) == 0
    assert "trace = record_none(depth=2, batch=64)" in out.getvalue()
    assert "Checked on the run: 2 blocks keep" in out.getvalue()
    assert main(["lesson", "1", "--set", "depth=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckpt-viz lesson: --set depth='3': expected one of 1, 2, 4, 8.") and "Tip: " in err
    assert main(["lesson", "1", "--set", "width=3"]) == 2
    assert "lesson 1 has no knob width" in capsys.readouterr().err


def test_an_unknown_lesson_says_which_exist(capsys) -> None:
    assert main(["lesson", "99"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckpt-viz lesson: no lesson 99; there are 1 to 14.") and "Tip: " in err


def test_lesson_n_pauses_between_steps_on_a_terminal() -> None:
    import os
    import pty
    import select
    import time

    lesson = LESSONS[2]
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ckpt_viz", "lesson", "3"], stdin=follower, stdout=follower,
                            stderr=subprocess.PIPE, close_fds=True)
    os.close(follower)
    out, deadline = b"", time.monotonic() + 400
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:
                    break
                out += chunk
                if chunk.rstrip().endswith(b"..."):  # a pause: "Press Enter ..." waits for a line
                    os.write(leader, b"\n")
                elif chunk.rstrip().endswith(b"):"):  # "Your answer (1-2):"
                    os.write(leader, b"2\n")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, (text[-2000:], proc.stderr.read())
    questions = sum(1 for s in lesson.steps if s.question)
    assert text.count("Press Enter for the next step") == len(lesson.steps) - 1
    assert text.count("Your answer (1-") == questions
    assert text.index("Your answer (1-") < text.index("Right. ")
