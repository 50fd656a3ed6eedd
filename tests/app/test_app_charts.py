"""The chart pages with AppTest: units in the tables, "other" explained, Compare's split note, the Events
plain text, state words, and the clicks' selection turned into a cursor seq.

One recording of the default model (cached by the app's loader across the tests of this process).
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.analysis.memory import memory
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.words import category_word, format_bytes
from ckpt_viz.catalog import DEFAULT_MODEL
from ckpt_viz.render import palette
from ckpt_viz.render.eventlog import event_fields
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from traces import split_trace

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
UNIT = r"^\d+(\.\d)? (B|KiB|MiB|GiB)$"


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def runs() -> dict:
    """Independent recordings of the default model (recordings are deterministic)."""
    return {m: obtain_trace(RunRequest("builtin", DEFAULT_MODEL, mode=m))
            for m in ("split-reentrant", "reentrant", "none", "nonreentrant")}


def _app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=120).run()


def _errors(at: AppTest) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def _plain(markdown: str) -> str:
    """Markdown written by `ui.text.md` as the browser shows it."""
    import re

    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace("  \n", "\n")).replace("\u2060", "")


def _sample_at(trace, seq):
    return [m for m in trace.memory if m.seq <= seq][-1]


def test_memory_tables_are_in_the_units_of_the_metrics_and_other_is_explained(runs: dict) -> None:
    trace = runs["split-reentrant"]
    at = _app()
    at.switch_page("views/memory.py").run()
    assert not _errors(at), _errors(at)
    assert at.slider(key="cursor_slider").value == 0  # a new run starts at its first event
    sample = _sample_at(trace, trace.events[0].seq)
    at_cursor, at_peak = (t.value for t in at.dataframe[:2])
    assert list(at_cursor.columns) == ["category", "size", "share", "what it is"]
    assert at_cursor["size"].str.match(UNIT).all() and at_peak["size"].str.match(UNIT).all()
    expected = {category_word(c): format_bytes(b) for c, b in sample.bytes_by_category.items()}
    assert dict(zip(at_cursor["category"], at_cursor["size"])) == expected
    peak = memory(trace).peak
    shares = [s.bytes_by_category.get("other", 0) / s.total_nbytes for s in (sample, _sample_at(trace, peak.seq))]
    notes = [_plain(i.value) for i in at.info if _plain(i.value).startswith('"other" is')]
    assert [f"{100 * x:.0f}%" for x in shares if x >= 0.2] == [n.split()[2] for n in notes], (shares, notes)
    assert next(m.value for m in at.metric if m.label == "Total at the peak") == format_bytes(peak.total)
    assert "split modes peak higher" in " ".join(_plain(c.value) for c in at.caption)


def test_compare_explains_the_split_peak_with_its_numbers(runs: dict) -> None:
    at = _app()
    at.switch_page("views/compare.py").run()
    assert not _errors(at), _errors(at)
    table = at.dataframe[0].value
    peaks = {m: memory(t).peak.total for m, t in runs.items()}
    assert dict(zip(table["mode"], table["peak"])) == {m: format_bytes(p) for m, p in peaks.items()}
    assert all(table[c].dropna().str.match(UNIT).all() for c in table.columns if c.startswith("at the peak: "))
    notes = [_plain(i.value) for i in at.info if "Why the split modes peak higher" in _plain(i.value)]
    lowest = min(("reentrant", "nonreentrant"), key=peaks.get)
    if peaks["split-reentrant"] > peaks[lowest]:
        (note,) = notes
        assert "every replay is kept until DW runs" in note
        assert (f"split-reentrant peaks at {format_bytes(peaks['split-reentrant'])}, "
                f"{format_bytes(peaks['split-reentrant'] - peaks[lowest])} above {lowest}") in note
    else:  # the general explanation is not shown where this run's peaks contradict it
        assert notes == []


def test_events_plain_text_keeps_every_column_and_the_overview_speaks_in_state_words(runs: dict) -> None:
    at = _app()
    at.button(key="cursor_next_replay").click().run()
    states = dict(zip(at.dataframe[0].value["state"], at.dataframe[0].value["handles"]))
    assert "waiting for DX" in states and "phase_dx" not in states
    at.switch_page("views/events.py").run()
    assert not _errors(at), _errors(at)
    table = at.dataframe[0].value
    text = at.code[-1].value  # the plain-text tab
    lines = text.splitlines()[1:]
    assert len(lines) == len(table)
    for (_, row), line in zip(table.iterrows(), lines):
        for column in ("seq", "kind", "handle", "phase", "session", "tags", "site", "details"):
            assert str(row[column]) in line, (column, line)
    details = at.code[1].value  # the cursor's event, every field, whole
    event = runs["split-reentrant"].events[int(at.slider(key="cursor_slider").value)]
    assert details.splitlines() == [f"{k}={v}" for k, v in event_fields(event).items()]
    cursor_line = at.code[0].value
    assert cursor_line.startswith("seq ") and " · replay started · " in cursor_line and "=" not in cursor_line


def test_a_chart_click_becomes_a_cursor_seq() -> None:
    sys.path.insert(0, str(ROOT / "app"))
    from ui.show import picked_seq

    run = SimpleNamespace(trace=split_trace())
    assert picked_seq(run, {palette.CURSOR_PICK: [{"seq": 12}]}) == 12
    assert picked_seq(run, {palette.CURSOR_PICK: [{"x": 2.0}]}) == passes(run.trace).aligned_seq(2.0) == 16
    assert picked_seq(run, {palette.CURSOR_PICK: []}) is None and picked_seq(run, {}) is None
