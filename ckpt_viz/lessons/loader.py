"""Read lessons/ into `Lesson` and `Step` objects, and say clearly what is wrong with one that does not fit.

Torch-free: the loader reads TOML and checks names, and never runs a lesson's script
(that is `ckpt_viz.lessons.runner`). A lesson is a folder `lessons/NN_slug/` with
`lesson.toml` (the data) and `run.py` (the functions that record its runs and check its
claims). The data, one table per step:

    title = "..."                    summary = "..."
    [[steps]]
    title = "..."
    prose = "..."                    markdown; {name} is a figure of the step's check (see NOTE)
    run = "record_none"              a function of run.py returning a Trace: the code the step shows
    compare = "record_ckpt"          optional: a second run, shown side by side (its code too)
    sides = ["without", "with"]      optional: the two runs' names (default "this run", "the other run")
    views = ["memory", "cost"]       from VIEWS, drawn for the run (and the compare run)
    cursor = "peak"                  see CURSORS: an int seq, "start", "end", "peak",
                                     "first KIND", "last KIND", "first KIND hN"
    check = "check_peak"             check(trace, runs) -> {figure name: value}; asserts the claims
    claim = "peak {peak}"            the sentence the check asserts, filled with its figures
    see = ["memory"]                 optional: app pages that show the run deeper (from PAGES)
    [[steps.knobs]]                  optional, any number: a live control
    name = "depth"                   a keyword argument of the run function (its default is the knob's)
    label = "Blocks"   values = [2, 4, 8]   multi = false (true: any subset of values, a tuple)
                                     values may be ints, strings or booleans ([true, false]: on and off)
    [steps.question]                 optional: predict, then see
    ask = "..."   choices = ["...", "..."]   answer = 0   explain = "..."   (all templates too)

NOTE [ Numbers come from the run ]
  1. Every figure a lesson states is a `{name}` in its text, filled with the value its step's
     check returned (from `ckpt_viz.analysis`), so no typed-in number can drift from the run.
     The text outside `{...}` and outside `code spans` holds no digit (tests/lessons checks it).
  2. The check asserts what the sentences say about those figures; the claim is the sentence
     it asserts, shown as "Checked on the run" once the student has answered.
  3. Before the student answers a step's question, nothing of the run is shown (its views,
     its cursor, its claim, the explanation): only the prose, the code and the question.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from ckpt_viz.errors import LessonError

__all__ = ["CURSORS", "PAGES", "VIEWS", "Knob", "Lesson", "LessonError", "Question", "Step", "fields",
           "lessons_dir", "load_lesson", "load_lessons"]

_API = "ckpt_viz.lessons"
VIEWS: tuple[str, ...] = ("graph", "memory", "lanes", "routing", "events", "timeline", "stages", "debugger",
                          "cost", "curve")
PAGES: tuple[str, ...] = ("overview", "graph", "memory", "handles", "debugger", "routing", "timeline", "events",
                          "compare")
CURSORS = "an event seq (int), 'start', 'end', 'peak', 'first KIND', 'last KIND' or 'first KIND hN'"
_CURSOR = re.compile(r"^(start|end|peak|(first|last) [a-z_]+( h\d+)?)$")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_LESSON_KEYS = {"title", "summary", "steps"}
_STEP_KEYS = {"title", "prose", "run", "compare", "sides", "views", "cursor", "check", "claim", "question", "knobs",
              "see"}
_QUESTION_KEYS = {"ask", "choices", "answer", "explain"}
_KNOB_KEYS = {"name", "label", "values", "multi", "help"}


@dataclass(frozen=True)
class Question:
    """Predict, then see: `answer` is the index of the right choice; every text is a template."""

    ask: str
    choices: tuple[str, ...]
    answer: int
    explain: str = ""


@dataclass(frozen=True)
class Knob:
    """A live control: the run function's keyword `name`, picked from `values` (any subset when `multi`)."""

    name: str
    label: str
    values: tuple[Any, ...]
    multi: bool = False
    help: str = ""


@dataclass(frozen=True)
class Step:
    title: str
    prose: str
    run: str
    views: tuple[str, ...] = ()
    cursor: int | str = "end"
    check: str = ""
    claim: str = ""
    question: Question | None = None
    knobs: tuple[Knob, ...] = ()
    compare: str = ""
    sides: tuple[str, str] = ("this run", "the other run")
    see: tuple[str, ...] = ()

    def texts(self) -> dict[str, str]:
        """Every template of the step by where it is (prose, claim, question parts): what NOTE rule 1 checks."""
        out = {"prose": self.prose, "claim": self.claim}
        if self.question is not None:
            out.update({"ask": self.question.ask, "explain": self.question.explain})
            out.update({f"choice {i + 1}": c for i, c in enumerate(self.question.choices)})
        return out


@dataclass(frozen=True)
class Lesson:
    number: int
    slug: str
    title: str
    summary: str
    folder: Path
    steps: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def script(self) -> Path:
        return self.folder / "run.py"


def fields(template: str) -> list[str]:
    """The figure names a template asks for ("peak {peak} of {total}" -> ["peak", "total"])."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise LessonError(f"{_API}: the template {template[:60]!r} does not parse ({exc}).\nTip: write a figure as "
                          "{name}, and a literal brace as {{ or }}.") from exc


def lessons_dir() -> Path:
    """The repository's lessons/ folder (beside the package)."""
    return Path(__file__).resolve().parents[2] / "lessons"


def _fail(where: str, what: str, tip: str) -> LessonError:
    return LessonError(f"{_API}: {where}: {what}.\nTip: {tip}")


def _text(table: dict, key: str, where: str, *, required: bool = True) -> str:
    value = table.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise _fail(where, f"'{key}' must be a non-empty string, got {value!r}", f"write {key} = \"...\"")
    text = value.strip()
    for name in fields(text):
        if not _NAME.match(name):
            raise _fail(where, f"'{key}' asks for the figure {{{name}}}, which is no plain name",
                        "name figures like {peak_none}: lower case, digits and _")
    return text


def _unknown(table: dict, known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise _fail(where, f"unknown key(s) {', '.join(map(repr, extra))}",
                    f"the known keys are {', '.join(sorted(known))}")


def _names(table: dict, key: str, allowed: tuple[str, ...], where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or any(v not in allowed for v in value):
        raise _fail(where, f"'{key}' must list names from {', '.join(allowed)}, got {value!r}",
                    f"pick {key} from that list")
    return tuple(value)


def _question(table: Any, where: str) -> Question:
    if not isinstance(table, dict):
        raise _fail(where, f"'question' must be a table, got {table!r}", "write [steps.question] with ask, "
                    "choices, answer")
    _unknown(table, _QUESTION_KEYS, where)
    choices = table.get("choices")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise _fail(where, f"'choices' must list at least two strings, got {choices!r}", "choices = [\"a\", \"b\"]")
    answer = table.get("answer")
    if type(answer) is not int or not 0 <= answer < len(choices):
        raise _fail(where, f"'answer' must be the index of the right choice (0 to {len(choices) - 1}), "
                    f"got {answer!r}", "count choices from 0")
    for choice in choices:
        _text({"choice": choice}, "choice", where)
    return Question(_text(table, "ask", where), tuple(c.strip() for c in choices), answer,
                    _text(table, "explain", where))


def _knob(table: Any, where: str) -> Knob:
    if not isinstance(table, dict):
        raise _fail(where, f"a knob must be a table, got {table!r}", "write [[steps.knobs]] with name, label, values")
    _unknown(table, _KNOB_KEYS, where)
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(where, f"a knob's 'name' must be a keyword of the run function, got {name!r}",
                    "name = \"depth\"")
    values = table.get("values")
    if (not isinstance(values, list) or len(values) < 2 or len({type(v) for v in values}) != 1
            or not all(isinstance(v, (int, str, bool)) for v in values)
            or len(set(values)) != len(values)):
        raise _fail(where, f"knob {name!r}: 'values' must list at least two different ints, strings or booleans "
                    "of one type, "
                    f"got {values!r}", "values = [2, 4, 8]")
    multi = table.get("multi", False)
    if not isinstance(multi, bool):
        raise _fail(where, f"knob {name!r}: 'multi' must be true or false, got {multi!r}", "multi = true")
    return Knob(name, _text(table, "label", where), tuple(values), multi, _text(table, "help", where, required=False))


def _step(table: Any, where: str) -> Step:
    if not isinstance(table, dict):
        raise _fail(where, "a step must be a table", "write each step under [[steps]]")
    _unknown(table, _STEP_KEYS, where)
    views = _names(table, "views", VIEWS, where)
    see = _names(table, "see", PAGES, where)
    cursor = table.get("cursor", "end")
    if not (type(cursor) is int and cursor >= 0) and not (isinstance(cursor, str) and _CURSOR.match(cursor)):
        raise _fail(where, f"'cursor' {cursor!r} is not a cursor", f"use {CURSORS}")
    question = _question(table["question"], f"{where} question") if "question" in table else None
    knobs_table = table.get("knobs", [])
    if not isinstance(knobs_table, list):
        raise _fail(where, "'knobs' must be an array of tables", "write each knob under [[steps.knobs]]")
    knobs = tuple(_knob(k, f"{where} knob {i + 1}") for i, k in enumerate(knobs_table))
    if len({k.name for k in knobs}) != len(knobs):
        raise _fail(where, "two knobs share a name", "give each knob its own run-function keyword")
    sides = table.get("sides", ["this run", "the other run"])
    if not isinstance(sides, list) or len(sides) != 2 or not all(isinstance(s, str) and s.strip() for s in sides):
        raise _fail(where, f"'sides' must name the two runs, got {sides!r}", "sides = [\"broken\", \"fixed\"]")
    compare = _text(table, "compare", where, required=False)
    if "sides" in table and not compare:
        raise _fail(where, "'sides' names two runs but there is no 'compare' run", "add compare = \"...\"")
    return Step(_text(table, "title", where), _text(table, "prose", where), _text(table, "run", where),
                views, cursor, _text(table, "check", where), _text(table, "claim", where), question, knobs,
                compare, (sides[0].strip(), sides[1].strip()), see)


def load_lesson(folder: str | Path) -> Lesson:
    """Read one lesson folder `NN_slug/`; raise LessonError saying what does not fit."""
    folder = Path(folder)
    match = re.match(r"^(\d+)_([a-z0-9_]+)$", folder.name)
    if not match:
        raise _fail(str(folder), "a lesson folder is named NN_slug", "rename it, e.g. 01_what_autograd_saves")
    data_file = folder / "lesson.toml"
    if not data_file.is_file() or not (folder / "run.py").is_file():
        raise _fail(str(folder), "a lesson folder holds lesson.toml and run.py", "add the missing file")
    try:
        data = tomllib.loads(data_file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise _fail(str(data_file), f"not valid TOML ({exc})", "check the quotes and brackets there") from exc
    where = str(data_file)
    _unknown(data, _LESSON_KEYS, where)
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise _fail(where, "a lesson needs at least one [[steps]] table", "add a [[steps]] table")
    return Lesson(int(match[1]), match[2], _text(data, "title", where), _text(data, "summary", where), folder,
                  tuple(_step(s, f"{where} step {i + 1}") for i, s in enumerate(steps)))


def load_lessons(root: str | Path | None = None) -> list[Lesson]:
    """Every lesson under `root` (default: the repository's lessons/), in number order."""
    root = Path(root) if root is not None else lessons_dir()
    if not root.is_dir():
        raise _fail(str(root), "no lessons folder here", "run from a checkout of ckpt_viz (lessons/ is beside "
                    "the package)")
    lessons = [load_lesson(p) for p in sorted(root.iterdir()) if p.is_dir() and re.match(r"^\d+_", p.name)]
    numbers = [lesson.number for lesson in lessons]
    if len(set(numbers)) != len(numbers):
        raise _fail(str(root), f"two lessons share a number ({numbers})", "number the folders 01, 02, ...")
    return lessons
