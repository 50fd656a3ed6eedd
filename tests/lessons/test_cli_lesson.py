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


def test_lesson_n_pauses_between_steps_on_a_terminal() -> None:
    import os
    import pty
    import select
    import time

    lesson = load_lessons()[2]
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ckpt_viz", "lesson", "3"], stdin=follower, stdout=follower,
                            stderr=subprocess.PIPE, close_fds=True)
    os.close(follower)
    out, deadline = b"", time.monotonic() + 240
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
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, (text[-2000:], proc.stderr.read())
    questions = sum(1 for s in lesson.steps if s.question)
    assert text.count("Press Enter for the next step") == len(lesson.steps) - 1
    assert text.count("press Enter for the answer") == questions
    assert text.index("press Enter for the answer") < text.index("Answer: ")
