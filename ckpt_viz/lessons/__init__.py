"""Lessons: step through checkpointing and split backward on real runs, each claim checked.

`from ckpt_viz import lessons` is the door the app and the lesson scripts use. Torch-free at
import: `load_lessons()` reads lessons/ (see lessons/README.md); a step's run records its
trace on first use (`check_step`, `step_trace`); `runs` holds the runs written with the
runtime itself, `helpers` what the scripts share.
"""
from ckpt_viz.lessons import helpers, runs
from ckpt_viz.lessons.glossary import SPLIT_COST, TERMS, glossary
from ckpt_viz.lessons.helpers import builtin, kib, peak, peak_by_category, replays
from ckpt_viz.lessons.loader import VIEWS, Lesson, LessonError, Question, Step, lessons_dir, load_lesson, load_lessons
from ckpt_viz.lessons.runner import StepResult, check_step, resolve_cursor, run_source, step_trace, trace_of

__all__ = ["SPLIT_COST", "TERMS", "VIEWS", "Lesson", "LessonError", "Question", "Step", "StepResult", "builtin",
           "check_step", "glossary", "helpers", "kib", "lessons_dir", "load_lesson", "load_lessons", "peak",
           "peak_by_category", "replays", "resolve_cursor", "run_source", "runs", "step_trace", "trace_of"]
