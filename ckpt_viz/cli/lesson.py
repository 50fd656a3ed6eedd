"""`ckpt-viz lesson`: list the lessons; `ckpt-viz lesson N` walks lesson N in the terminal.

Each step prints its prose, the code it runs, the events around its cursor (the plain-text
trace of `ckpt_viz.render.text`), its question (the answer after a pause) and what its check
found. On a terminal it waits for Enter between steps; otherwise (a pipe, CI) it runs
straight through.
"""
from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["lesson_command", "walk"]

_AROUND = 6  # events shown either side of the cursor


def _pause(out: TextIO, prompt: str, interactive: bool) -> None:
    if interactive:
        out.write(prompt)
        out.flush()
        sys.stdin.readline()


def walk(number: int, *, out: TextIO = sys.stdout, interactive: bool = False) -> int:
    """Print lesson `number` step by step; 0 when every check held."""
    from ckpt_viz.errors import CkptVizError
    from ckpt_viz.lessons.loader import load_lessons
    from ckpt_viz.lessons.runner import check_step, run_source, step_trace
    from ckpt_viz.render.text import render_text

    lessons = {lesson.number: lesson for lesson in load_lessons()}
    if number not in lessons:
        raise CkptVizError(f"ckpt-viz lesson: no lesson {number}; there are {min(lessons)} to {max(lessons)}.\n"
                           "Tip: `ckpt-viz lesson` lists them.")
    lesson = lessons[number]
    out.write(f"Lesson {lesson.number}: {lesson.title}\n{lesson.summary}\n")
    for i, step in enumerate(lesson.steps, 1):
        result = check_step(lesson, step)
        events = step_trace(lesson, step).events
        at = next((k for k, e in enumerate(events) if e.seq >= result.seq), len(events) - 1)
        window = events[max(0, at - _AROUND): at + _AROUND + 1]
        out.write(f"\n== Step {i}/{len(lesson.steps)}: {step.title} ==\n\n{step.prose.strip()}\n\n")
        out.write("Code:\n" + "".join(f"    {line}\n" for line in run_source(lesson, step).splitlines()))
        out.write(f"\nEvents around the cursor (seq {result.seq}):\n{render_text(window)}")
        if step.question:
            q = step.question
            out.write(f"\nQuestion: {q.ask}\n" + "".join(f"  {k + 1}. {c}\n" for k, c in enumerate(q.choices)))
            _pause(out, "Think, then press Enter for the answer... ", interactive)
            out.write(f"Answer: {q.answer + 1}. {q.choices[q.answer]}. {q.explain}\n")
        out.write(f"\nChecked on the run: {result.fact}\n")
        if i < len(lesson.steps):
            _pause(out, "\nPress Enter for the next step... ", interactive)
    out.write(f"\nEnd of lesson {lesson.number}.\n")
    return 0


def lesson_command(args: Any) -> int:
    from ckpt_viz.lessons.loader import load_lessons

    if args.number is None:
        for lesson in load_lessons():
            print(f"{lesson.number:>2}. {lesson.title}  ({len(lesson.steps)} steps)")
        print("\nWalk one: ckpt-viz lesson N")
        return 0
    interactive = sys.stdin.isatty() and sys.stdout.isatty() and not args.no_pause
    return walk(args.number, interactive=interactive)
