"""Read lessons/ into `Lesson` and `Step` objects, and say clearly what is wrong with one that does not fit.

Torch-free: the loader reads TOML and checks names, and never runs a lesson's script
(that is `ckpt_viz.lessons.runner`). A lesson is a folder `lessons/NN_slug/` with
`lesson.toml` (the data) and `run.py` (small functions that record its traces and
check its claims). The data, one table per step:

    title = "..."                    summary = "..."
    [[steps]]
    title = "..."                    prose = "..."          (markdown)
    run = "record_none"              a function of run.py returning a Trace (its source is shown)
    views = ["memory", "lanes"]      from VIEWS
    cursor = "peak"                  see CURSORS: an int seq, "start", "end", "peak",
                                     "first KIND", "last KIND", "first KIND hN"
    check = "check_peak"             a function of run.py: check(trace, runs) -> str, the fact shown
    [steps.question]                 optional: predict, then reveal
    ask = "..."   choices = ["...", "..."]   answer = 0   explain = "..."
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from ckpt_viz.errors import LessonError

__all__ = ["CURSORS", "VIEWS", "Lesson", "LessonError", "Question", "Step", "lessons_dir", "load_lesson",
           "load_lessons"]

_API = "ckpt_viz.lessons"
VIEWS: tuple[str, ...] = ("graph", "memory", "lanes", "routing", "events")
CURSORS = "an event seq (int), 'start', 'end', 'peak', 'first KIND', 'last KIND' or 'first KIND hN'"
_CURSOR = re.compile(r"^(start|end|peak|(first|last) [a-z_]+( h\d+)?)$")
_LESSON_KEYS = {"title", "summary", "steps"}
_STEP_KEYS = {"title", "prose", "run", "views", "cursor", "check", "question"}
_QUESTION_KEYS = {"ask", "choices", "answer", "explain"}


@dataclass(frozen=True)
class Question:
    ask: str
    choices: tuple[str, ...]
    answer: int
    explain: str = ""


@dataclass(frozen=True)
class Step:
    title: str
    prose: str
    run: str
    views: tuple[str, ...] = ()
    cursor: int | str = "end"
    check: str = ""
    question: Question | None = None


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


def lessons_dir() -> Path:
    """The repository's lessons/ folder (beside the package)."""
    return Path(__file__).resolve().parents[2] / "lessons"


def _fail(where: str, what: str, tip: str) -> LessonError:
    return LessonError(f"{_API}: {where}: {what}.\nTip: {tip}")


def _text(table: dict, key: str, where: str, *, required: bool = True) -> str:
    value = table.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise _fail(where, f"'{key}' must be a non-empty string, got {value!r}", f"write {key} = \"...\"")
    return value.strip()


def _unknown(table: dict, known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise _fail(where, f"unknown key(s) {', '.join(map(repr, extra))}",
                    f"the known keys are {', '.join(sorted(known))}")


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
    return Question(_text(table, "ask", where), tuple(choices), answer,
                    _text(table, "explain", where, required=False))


def _step(table: Any, where: str) -> Step:
    if not isinstance(table, dict):
        raise _fail(where, "a step must be a table", "write each step under [[steps]]")
    _unknown(table, _STEP_KEYS, where)
    views = table.get("views", [])
    if not isinstance(views, list) or any(v not in VIEWS for v in views):
        raise _fail(where, f"'views' must list names from {', '.join(VIEWS)}, got {views!r}",
                    "pick the views to show at the step's cursor")
    cursor = table.get("cursor", "end")
    if not (type(cursor) is int and cursor >= 0) and not (isinstance(cursor, str) and _CURSOR.match(cursor)):
        raise _fail(where, f"'cursor' {cursor!r} is not a cursor", f"use {CURSORS}")
    question = _question(table["question"], f"{where} question") if "question" in table else None
    return Step(_text(table, "title", where), _text(table, "prose", where), _text(table, "run", where),
                tuple(views), cursor, _text(table, "check", where), question)


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
