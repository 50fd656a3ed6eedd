"""The Debugger page, driven headless with AppTest: a broken run's finding, its story, its line, the cursor moves.

The expected facts (the release's seq, the recorded line of code) come from recording the same
broken run here, independently of the app.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.codes import DIAGNOSIS_CODES
from ckpt_viz.run.broken import record_broken

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def expected():
    # recorded as the app records it: with memory, whose sampling points add a `memory_sampled` event as each
    # backward opens (ckpt_viz/probe/points.py NOTE rule 3), so the story's seqs are the app's
    (finding,) = diagnose(record_broken("dx-after-dw", memory=True))
    return finding


def _broken(name: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["src_kind"] = "Broken runs to explore"
    at.session_state["src_broken"] = name
    at.run()
    assert not at.exception, at.exception
    return at


def _debugger_on_saved(trace, path: Path) -> AppTest:
    """The Debugger page on `trace`, saved to `path` and opened as a saved trace."""
    trace.save(path)
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["src_kind"] = "Saved trace"
    at.session_state["src_trace_how"] = "Path"
    at.session_state["src_trace_path"] = str(path)
    at.run()
    at.switch_page("views/debugger.py").run()
    assert not at.exception, at.exception
    return at


def _plain(markdown: str) -> str:
    """Markdown written by `ui.text.md` as the browser shows it."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace("  \n", "\n")).replace("\u2060", "")


def _finding_picker(at: AppTest):
    """The Debugger's finding picker: one per run (its key is `ui.runs.run_key(config, "debug_finding")`)."""
    (radio,) = [r for r in at.radio if (r.key or "").startswith("debug_finding_")]
    return radio


def _position(at: AppTest) -> int:
    return at.slider(key="cursor_slider").value


def test_the_debugger_page_shows_the_finding_and_follows_it_to_its_event(expected) -> None:
    at = _broken("dx-after-dw")
    at.switch_page("views/debugger.py").run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Debugger"]
    radio = _finding_picker(at)
    assert len(radio.options) == 1 and DIAGNOSIS_CODES["released_by_dw"].cause in _plain(radio.options[0])
    assert any(DIAGNOSIS_CODES["released_by_dw"].cause in _plain(e.value) for e in at.error)
    codes = [c.value for c in at.code]
    story = next(c for c in codes if c.startswith("h0"))
    assert story == expected.explanation and "reason dw_complete" in story
    assert "backward_weight(loss, None, [w], handles=[h])" in story  # the line as recorded
    assert any(c.endswith("backward_weight(loss, None, [w], handles=[h])  # DW first: it releases h") for c in codes)
    assert any(expected.fix in _plain(i.value) for i in at.info)
    assert re.search(r"\bR\d+\b", "\n".join([*codes, *(e.value for e in at.error)])) is None  # no spec ids
    # The new run's cursor is at its first event; following the finding moves it to the release.
    assert _position(at) == 0
    at.button(key="debug_goto").click().run()
    assert not at.exception, at.exception
    assert expected.release_event.kind == "released"
    assert _position(at) == expected.release_event.seq  # a broken run's seqs are its positions (from 0)
    # "Next error" on the cursor bar: the refused set_phase, right after the release.
    at.button(key="cursor_next_error").click().run()
    assert _position(at) == expected.refused_event.seq == expected.release_event.seq + 1


def test_choosing_another_finding_moves_the_cursor_to_its_event(tmp_path: Path) -> None:
    import ckpt_viz
    from ckpt_viz.run.broken import BrokenRun, _released_by_hand, _session_never_cleared

    run = BrokenRun()
    with ckpt_viz.record() as rec:  # two mistakes in one run: a handle released by hand, a session never cleared
        try:
            _released_by_hand(run)
        except Exception:
            pass
        _session_never_cleared(run)
    for cleanup in run.cleanups:
        cleanup()
    first, second = diagnose(rec.trace)
    assert (first.code, second.code) == ("released_explicitly", "session_never_cleared")
    at = _debugger_on_saved(rec.trace, tmp_path / "two.json")
    assert len(_finding_picker(at).options) == 2
    _finding_picker(at).set_value(1).run()
    assert not at.exception, at.exception
    assert _position(at) == second.seq  # a saved recording's seqs are its positions
    assert any(second.fix in _plain(i.value) for i in at.info)
    _finding_picker(at).set_value(0).run()
    assert _position(at) == first.seq == first.release_event.seq


def test_the_handles_page_names_causes_in_words() -> None:
    at = _broken("session-cleared-early")
    at.switch_page("views/handles.py").run()
    assert not at.exception, at.exception
    shown = _plain("\n".join([*(e.value for e in at.error), *(i.value for i in at.info),
                               *(m.value for m in at.markdown)]))
    assert DIAGNOSIS_CODES["session_cleared_early"].cause in shown
    assert "Cause: R" not in shown and re.search(r"\bR\d+\b", shown) is None


@pytest.mark.parametrize("name", ["dx-without-retain-graph", "outputs-dropped"])
def test_every_page_opens_on_a_broken_run(name: str) -> None:
    at = _broken(name)
    pages = sorted(p.relative_to(ROOT / "app").as_posix() for p in (ROOT / "app" / "views").glob("*.py"))
    registered = (ROOT / "app" / "streamlit_app.py").read_text()
    for page in [p for p in pages if f'"{p}"' in registered]:
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)


def test_a_clean_run_has_nothing_to_debug() -> None:
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["src_kind"] = "Built-in model"
    at.session_state["src_model"] = "closure"
    at.run()
    at.switch_page("views/debugger.py").run()
    assert not at.exception, at.exception
    assert any("No problem found" in s.value for s in at.success)


def test_a_clean_run_whose_replays_were_sampled_says_how_many_were_not_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch import nn

    import ckpt_viz
    from ckpt_viz.runtime import checkpoint
    from ckpt_viz.runtime import divergence_sampling as sampling

    monkeypatch.setattr(sampling, "BUDGET", 0.0)  # after a region's first runs none is checked: deterministic
    monkeypatch.setattr(sampling, "P_MIN", 0.0)
    block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    for _ in range(sampling.FIRST_CHECKS + 1):  # the last step's replay is past the region's first runs
        x = torch.randn(4, 8, requires_grad=True)
        with ckpt_viz.record() as rec:
            checkpoint(block, x, use_reentrant=True).sum().backward()
    assert rec.trace.meta["replay_checks"]["skipped"] == 1 and not diagnose(rec.trace)
    at = _debugger_on_saved(rec.trace, tmp_path / "sampled.json")
    (success,) = [s.value for s in at.success]
    assert _plain(success) == ("No problem found in this run: 0 refused replays, 0 errors; 1 of 1 handle released by "
                               "the end of the run.")
    (warning,) = [_plain(w.value) for w in at.warning]
    assert "0 of 1 checkpointed runs checked" in warning and "1 not checked" in warning and "checks('all')" in warning


def test_a_new_run_starts_at_its_first_finding_and_names_its_code() -> None:
    """The finding chosen on one run is not carried to the next one (whose cursor starts at its first event)."""
    from ckpt_viz import Trace

    corpus = ROOT / "tests" / "data" / "mistakes"
    first, second = corpus / "rank-killed-sigkill.json.gz", corpus / "rank-killed-sigterm.json.gz"
    assert [len(diagnose(Trace.load(p))) for p in (first, second)] == [2, 2]
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["src_kind"] = "Saved trace"
    at.session_state["src_trace_how"] = "Path"
    at.session_state["src_trace_path"] = str(first)
    at.run()
    at.switch_page("views/debugger.py").run()
    assert not at.exception, at.exception
    _finding_picker(at).set_value(1).run()
    assert not at.exception, at.exception
    assert any(c.value == "Finding code: run\\_partial" for c in at.caption)
    at.session_state["src_trace_path"] = str(second)
    at.run()
    assert not at.exception, at.exception
    assert _finding_picker(at).value == 0 and _position(at) == 0
    assert any(c.value == "Finding code: error\\_raised" for c in at.caption)
