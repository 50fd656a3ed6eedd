"""render_text of hand-built traces against reviewed golden files (also after a save/load round trip)."""
from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_viz.render.text import render_text
from ckpt_viz.trace import Trace
from traces import nonreentrant_trace, refused_trace, split_trace

GOLDEN = Path(__file__).parent / "golden"
CASES: list[tuple[str, Callable[[], Trace]]] = [
    ("split_dx_dw", split_trace),
    ("refused_after_ordinary", refused_trace),
    ("nonreentrant_session", nonreentrant_trace),
]


def _assert_golden(name: str, text: str) -> None:
    expected = (GOLDEN / f"{name}.txt").read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "rendered"))
    assert text == expected, f"render_text differs from tests/golden/{name}.txt:\n{diff}"


@pytest.mark.parametrize("name, build", CASES, ids=[c[0] for c in CASES])
def test_render_text_matches_golden(name: str, build: Callable[[], Trace]) -> None:
    _assert_golden(name, render_text(build().events, site=True))


@pytest.mark.parametrize("name, build", CASES, ids=[c[0] for c in CASES])
def test_render_text_of_a_loaded_trace_matches_golden(name: str, build: Callable[[], Trace], tmp_path: Path) -> None:
    path = tmp_path / f"{name}.json.gz"
    build().save(path)
    _assert_golden(name, render_text(Trace.load(path).events, site=True))


def test_golden_lines_are_one_per_event() -> None:
    trace = split_trace()
    lines = (GOLDEN / "split_dx_dw.txt").read_text().splitlines()
    assert len(lines) == len(trace.events) + 1  # plus the header
    assert [int(line.split()[0]) for line in lines[1:]] == [e.seq for e in trace.events]
