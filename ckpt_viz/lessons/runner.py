"""Run a lesson's steps: record the runs a step names (once per knob setting), check them, fill in its text.

A step's `run` (and `compare`) are functions of the lesson's run.py that return a Trace;
their keyword arguments are the step's knobs. `check(trace, runs)` (or `check(trace, runs,
knobs)`, given the run's keyword arguments in force) asserts what the step
claims and returns the figures its text states ({"peak": "1.2 MiB", ...}, from
`ckpt_viz.analysis`); `runs(name, **knobs)` is the (cached) trace of another run function of
the lesson. `show_step` puts it together: the prose, claim and question filled with the
figures (NOTE [ Numbers come from the run ] in loader.py), the traces, the cursor, and the
code each run shows (`run_code`: the function, the helpers of run.py it calls, and the
call with the knobs' values, runnable as it is). This module imports no torch; a script
imports it when it runs.
"""
from __future__ import annotations

import ast
import gc
import importlib.util
import inspect
import sys
import textwrap
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import Any

from ckpt_viz.analysis.memory import memory
from ckpt_viz.lessons.loader import Knob, Lesson, LessonError, Question, Step, fields
from ckpt_viz.trace import Trace

__all__ = ["Shown", "StepResult", "check_step", "fill", "knob_values", "resolve_cursor",
           "run_code", "run_source", "script", "show_step", "step_trace", "trace_of"]

_API = "ckpt_viz.lessons"
_KEPT_RUNS = 128  # traces kept per process (a knob records a new one per setting); the 14 lessons' default
# runs are about 60 traces of 2-120 KiB each as JSON (1 MiB in all), so every lesson stays recorded
_modules: dict[str, ModuleType] = {}
_traces: OrderedDict[tuple, Trace] = OrderedDict()
_lock = threading.RLock()


@dataclass(frozen=True)
class StepResult:
    """What a step's check found: `fact` is its claim filled in; `seq` is the step's cursor on its trace;
    `figures` the check's figures and the run function's keyword arguments (the knobs' values)."""

    fact: str
    seq: int
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Shown:
    """A step as a student sees it, every text filled with its run's figures.

    Attributes:
        prose, claim: the step's text and the sentence its check asserted.
        question: the question with its ask, choices and explanation filled in (None without one).
        trace, seq: the step's run and its cursor; other, other_seq: the compare run's trace (or None) and the
            step's cursor on it (its last event when it has no such event: a fixed run has no error).
        code, other_code: the code each run shows (runnable as it is: `run_code`).
        knobs: the knob values the runs were recorded with.
        figures: the check's figures.
    """

    prose: str
    claim: str
    question: Question | None
    trace: Trace
    seq: int
    other: Trace | None
    other_seq: int | None
    code: str
    other_code: str
    knobs: dict[str, Any]
    figures: dict[str, Any]


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


# -- knobs


def _defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def knob_values(lesson: Lesson, step: Step, chosen: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The value of each of the step's knobs: `chosen`'s, else the run function's default; raise LessonError for
    a value the knob does not offer."""
    defaults = _defaults(_function(lesson, step.run))
    out: dict[str, Any] = {}
    for knob in step.knobs:
        if knob.name not in defaults:
            raise LessonError(f"{_API}: lesson {lesson.number}: the knob {knob.name!r} is no keyword argument with a "
                              f"default of {step.run}().\nTip: write def {step.run}({knob.name}=...).")
        value = (chosen or {}).get(knob.name, defaults[knob.name])
        out[knob.name] = _checked(lesson, knob, value)
    unknown = set(chosen or {}) - {k.name for k in step.knobs}
    if unknown:
        raise LessonError(f"{_API}: lesson {lesson.number}: this step has no knob {', '.join(sorted(unknown))}.\n"
                          f"Tip: its knobs are {', '.join(k.name for k in step.knobs) or 'none'}.")
    return out


def _checked(lesson: Lesson, knob: Knob, value: Any) -> Any:
    if knob.multi:
        picked = tuple(value) if isinstance(value, (list, tuple)) else None
        if picked is None or any(v not in knob.values for v in picked):
            raise LessonError(f"{_API}: lesson {lesson.number}: knob {knob.name!r} takes any of {list(knob.values)}, "
                              f"got {value!r}.\nTip: pick values from that list.")
        return tuple(v for v in knob.values if v in picked)  # in the knob's order, each once
    if value not in knob.values:
        raise LessonError(f"{_API}: lesson {lesson.number}: knob {knob.name!r} takes one of {list(knob.values)}, got "
                          f"{value!r}.\nTip: pick a value from that list.")
    return value


def _accepted(fn: Callable[..., Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    names = inspect.signature(fn).parameters
    return {k: v for k, v in knobs.items() if k in names}


# -- runs


def trace_of(lesson: Lesson, name: str, knobs: Mapping[str, Any] | None = None) -> Trace:
    """The trace run.py's function `name` records with `knobs` (those it takes), recorded on first use and kept
    (the last `_KEPT_RUNS` runs of the process)."""
    fn = _function(lesson, name)
    kwargs = _accepted(fn, knobs or {})
    key = (str(lesson.folder), name, tuple(sorted(kwargs.items())))
    with _lock:
        if key in _traces:
            _traces.move_to_end(key)
            return _traces[key]
        _numbered_from_h0()
        trace = fn(**kwargs)
        if not isinstance(trace, Trace):
            raise LessonError(f"{_API}: lesson {lesson.number}: {name}() returned {type(trace).__name__}, "
                              "not a Trace.\nTip: return rec.trace of `with ckpt_viz.record(...) as rec:`.")
        _traces[key] = trace
        while len(_traces) > _KEPT_RUNS:
            _traces.popitem(last=False)
        return trace


def _numbered_from_h0() -> None:
    """The next run numbers its handles from h0, as in a fresh process (the ids its text names): a handle an
    earlier run left in a reference cycle is collected first (NOTE [ Handle numbering ] in
    ckpt_viz/runtime/handle_ids.py, rule 3)."""
    from ckpt_viz.runtime.handle_ids import restart_handle_ids

    if not restart_handle_ids():
        gc.collect()
        restart_handle_ids()


def step_trace(lesson: Lesson, step: Step, knobs: Mapping[str, Any] | None = None) -> Trace:
    """The trace of the step's `run` function (with `knobs`)."""
    return trace_of(lesson, step.run, knob_values(lesson, step, knobs))


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


# -- text


def fill(template: str, figures: Mapping[str, Any], where: str = "the text") -> str:
    """`template` with each {name} replaced by its figure; raise LessonError naming a figure the check did not
    return."""
    missing = [name for name in fields(template) if name not in figures]
    if missing:
        raise LessonError(f"{_API}: {where} states {', '.join('{' + m + '}' for m in missing)}, which its check did "
                          f"not return (it returned {', '.join(sorted(figures)) or 'nothing'}).\nTip: return that "
                          "figure from the check, computed from the run.")
    return template.format_map(dict(figures))


def _figures(lesson: Lesson, step: Step, trace: Trace, knobs: dict[str, Any]) -> dict[str, Any]:
    check = _function(lesson, step.check)
    where = f"lesson {lesson.number} step {lesson.steps.index(step) + 1} ({step.title!r})"

    def runs(name: str, **given: Any) -> Trace:
        return trace_of(lesson, name, {**knobs, **given})

    extra = {"knobs": {**_defaults(_function(lesson, step.run)), **knobs}} \
        if "knobs" in inspect.signature(check).parameters else {}
    try:
        figures = check(trace, runs, **extra)
    except AssertionError as exc:
        raise LessonError(f"{_API}: {where}: the run does not show what the prose claims: {exc}.\nTip: the "
                          "runtime or the model changed; re-read the step's prose against its run.") from exc
    if not isinstance(figures, dict):
        raise LessonError(f"{_API}: {where}: {step.check}() returned {type(figures).__name__}, not its figures.\n"
                          "Tip: return a dict {figure name: value} of what the text states.")
    return figures


def check_step(lesson: Lesson, step: Step, knobs: Mapping[str, Any] | None = None) -> StepResult:
    """Run the step (record its trace if needed) and its check; raise LessonError if the claim does not hold."""
    values = knob_values(lesson, step, knobs)
    trace = trace_of(lesson, step.run, values)
    seq = resolve_cursor(trace, step.cursor)
    figures = {**_defaults(_function(lesson, step.run)), **values, **_figures(lesson, step, trace, values)}
    return StepResult(fill(step.claim, figures, f"lesson {lesson.number}'s claim"), seq, figures)


def show_step(lesson: Lesson, step: Step, knobs: Mapping[str, Any] | None = None) -> Shown:
    """The step as shown (see `Shown`): its runs recorded, its check passed, its text filled in."""
    values = knob_values(lesson, step, knobs)
    result = check_step(lesson, step, values)
    figures = result.figures
    where = f"lesson {lesson.number} step {lesson.steps.index(step) + 1}"
    question = None
    if step.question is not None:
        q = step.question
        question = Question(fill(q.ask, figures, f"{where}'s question"),
                            tuple(fill(c, figures, f"{where}'s choices") for c in q.choices), q.answer,
                            fill(q.explain, figures, f"{where}'s explanation"))
    other = trace_of(lesson, step.compare, values) if step.compare else None
    other_seq = None
    if other is not None:
        try:
            other_seq = resolve_cursor(other, step.cursor)
        except LessonError:
            other_seq = resolve_cursor(other, "end")
    return Shown(prose=fill(step.prose, figures, f"{where}'s prose"), claim=result.fact, question=question,
                 trace=trace_of(lesson, step.run, values), seq=result.seq, other=other, other_seq=other_seq,
                 code=run_code(lesson, step.run, values),
                 other_code=run_code(lesson, step.compare, values) if step.compare else "", knobs=values,
                 figures=figures)


# -- code


def _helpers(fn: FunctionType) -> list[FunctionType]:
    """The functions of `fn`'s own module that it calls, and theirs, in the order they are defined."""
    module = fn.__module__
    seen: dict[str, FunctionType] = {}

    def names(code: Any) -> set[str]:
        found = set(code.co_names)
        for const in code.co_consts:
            if hasattr(const, "co_names"):
                found |= names(const)
        return found

    todo = [fn]
    while todo:
        current = todo.pop()
        for name in names(current.__code__):
            value = current.__globals__.get(name)
            if isinstance(value, FunctionType) and value.__module__ == module and value is not fn \
                    and value.__name__ not in seen:
                seen[value.__name__] = value
                todo.append(value)
    return sorted(seen.values(), key=lambda f: f.__code__.co_firstlineno)


def run_source(lesson: Lesson, step: Step) -> str:
    """The source of the function the step runs (its own lines only)."""
    return textwrap.dedent(inspect.getsource(_function(lesson, step.run)))


def run_code(lesson: Lesson, name: str, knobs: Mapping[str, Any] | None = None) -> str:
    """The code a run shows: the helpers of run.py it calls, the function, and `trace = name(knobs)`; runnable
    as it is in a fresh interpreter (tests/lessons runs it), its lines short enough to read without scrolling."""
    fn = _function(lesson, name)
    if not isinstance(fn, FunctionType):
        raise LessonError(f"{_API}: lesson {lesson.number}: {name} is no plain function.\nTip: define it with def.")
    parts = [textwrap.dedent(inspect.getsource(f)).rstrip() for f in (*_helpers(fn), fn)]
    args = ", ".join(f"{k}={v!r}" for k, v in _accepted(fn, knobs or {}).items())
    code = "\n\n\n".join(parts) + f"\n\n\ntrace = {fn.__name__}({args})\n"
    ast.parse(code)  # a syntax error here is a bug of the lesson's run.py
    return code
