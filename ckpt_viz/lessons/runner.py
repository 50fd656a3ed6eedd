"""Run a lesson's steps: record the trace a step names (once per lesson and function), find its cursor, check it.

A step's `run` and `check` are functions of the lesson's run.py. `run()` returns a Trace;
`check(trace, runs)` asserts what the step's prose claims on that trace and returns the
fact in words ("peak 1.5 MiB without checkpointing, 0.9 MiB with"); `runs(name)` gives
the (cached) trace of another run function of the same lesson, for comparisons. The
scripts import torch; this module does not until a script runs.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ckpt_viz.analysis.memory import memory
from ckpt_viz.lessons.loader import Lesson, LessonError, Step
from ckpt_viz.trace import Trace

__all__ = ["StepResult", "check_step", "resolve_cursor", "run_source", "script", "step_trace", "trace_of"]

_API = "ckpt_viz.lessons"
_modules: dict[str, ModuleType] = {}
_traces: dict[tuple[str, str], Trace] = {}
_lock = threading.RLock()


@dataclass(frozen=True)
class StepResult:
    """What a step's check found: `fact` in words; `seq` is the step's cursor on its trace."""

    fact: str
    seq: int


def script(lesson: Lesson) -> ModuleType:
    """The lesson's run.py, imported once."""
    key = str(lesson.script)
    with _lock:
        if key not in _modules:
            name = f"ckpt_viz_lesson_{lesson.number:02d}_{lesson.slug}"
            spec = importlib.util.spec_from_file_location(name, lesson.script)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            _modules[key] = module
        return _modules[key]


def _function(lesson: Lesson, name: str) -> Callable[..., Any]:
    fn = getattr(script(lesson), name, None)
    if not callable(fn):
        raise LessonError(f"{_API}: lesson {lesson.number} ({lesson.folder.name}): run.py has no function "
                          f"{name!r}.\nTip: define def {name}(...) in {lesson.script}.")
    return fn


def run_source(lesson: Lesson, step: Step) -> str:
    """The source of the function the step runs: the code a learner reads beside the views."""
    return inspect.getsource(_function(lesson, step.run))


def trace_of(lesson: Lesson, name: str) -> Trace:
    """The trace run.py's function `name` records, recorded on first use and cached for the process."""
    key = (str(lesson.folder), name)
    with _lock:
        if key not in _traces:
            trace = _function(lesson, name)()
            if not isinstance(trace, Trace):
                raise LessonError(f"{_API}: lesson {lesson.number}: {name}() returned {type(trace).__name__}, "
                                  "not a Trace.\nTip: return the trace of ckpt_viz.record(...) or obtain_trace(...).")
            _traces[key] = trace
        return _traces[key]


def step_trace(lesson: Lesson, step: Step) -> Trace:
    """The trace of the step's `run` function."""
    return trace_of(lesson, step.run)


def resolve_cursor(trace: Trace, cursor: int | str) -> int:
    """The seq a step's cursor names on `trace` (see `ckpt_viz.lessons.loader.CURSORS`)."""
    seqs = [e.seq for e in trace.events]
    if not seqs:
        raise LessonError(f"{_API}: the step's trace has no events.\nTip: record the run with ckpt_viz.record().")
    if isinstance(cursor, int):
        return cursor
    if cursor == "start":
        return seqs[0]
    if cursor == "end":
        return seqs[-1]
    if cursor == "peak":
        peak = memory(trace).peak
        if peak is None:
            raise LessonError(f"{_API}: cursor 'peak' needs memory samples.\nTip: record with memory=True.")
        return peak.seq
    which, kind, *handle = cursor.split()
    hits = [e.seq for e in trace.events if e.kind == kind
            and (not handle or e.handle_id == int(handle[0][1:]))]
    if not hits:
        raise LessonError(f"{_API}: cursor {cursor!r}: the trace has no such event.\nTip: kinds in this trace: "
                          f"{', '.join(sorted({e.kind for e in trace.events}))}.")
    return hits[0] if which == "first" else hits[-1]


def check_step(lesson: Lesson, step: Step) -> StepResult:
    """Run the step (record its trace if needed) and its check; raise LessonError if the claim does not hold."""
    trace = step_trace(lesson, step)
    seq = resolve_cursor(trace, step.cursor)
    check = _function(lesson, step.check)
    try:
        fact = check(trace, lambda name: trace_of(lesson, name))
    except AssertionError as exc:
        raise LessonError(f"{_API}: lesson {lesson.number} step {lesson.steps.index(step) + 1} "
                          f"({step.title!r}): the run does not show what the prose claims: {exc}.\nTip: the "
                          "runtime or the model changed; re-read the step's prose against its run.") from exc
    return StepResult(str(fact), seq)
