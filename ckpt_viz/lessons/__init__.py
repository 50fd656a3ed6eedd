"""Lessons: step through checkpointing and split backward on real runs, each claim checked.

`from ckpt_viz import lessons` is the door the app, the CLI and the lessons' checks use. Torch-free at
import: `load_lessons()` reads lessons/ (see lessons/README.md and the format in loader.py); a step's
runs record their traces on first use (`show_step`, `check_step`); `helpers` is what the checks share.
"""
from ckpt_viz.lessons import helpers
from ckpt_viz.lessons.glossary import SPLIT_COST, TERMS, glossary
from ckpt_viz.lessons.helpers import builtin, kib, ms, peak, peak_by_category, percent, recompute_ms, replays
from ckpt_viz.lessons.loader import (
    PAGES,
    VIEWS,
    Knob,
    Lesson,
    LessonError,
    Question,
    Step,
    lessons_dir,
    load_lesson,
    load_lessons,
)
from ckpt_viz.lessons.runner import (
    Shown,
    StepResult,
    check_step,
    fill,
    knob_values,
    resolve_cursor,
    run_code,
    run_source,
    show_step,
    step_trace,
    trace_of,
)

__all__ = ["PAGES", "SPLIT_COST", "TERMS", "VIEWS", "Knob", "Lesson", "LessonError", "Question", "Shown", "Step",
           "StepResult", "builtin", "check_step", "fill", "glossary", "helpers", "kib", "knob_values", "lessons_dir",
           "load_lesson", "load_lessons", "ms", "peak", "peak_by_category", "percent",
           "recompute_ms", "replays", "resolve_cursor", "run_code", "run_source", "show_step", "step_trace",
           "trace_of"]
