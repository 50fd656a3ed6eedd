"""The Overview, Compare and Handles pages state the same counts, states and peak for a run, all read from its
one `ckpt_viz.analysis.summary.summary` (NOTE [ Figures of a run ] in app/ui/runs.py): on every built-in model in
every mode and on every broken run. (Overview "Released 3" against Compare "released 0" for one non-reentrant run
was the bug: both now read `RunSummary.released`.) And the Handles page answers for each handle what
`diagnose(trace, h)`, else `diagnose_handle(trace, h)`, says, with the state at the cursor said under its picker."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.analysis.diagnosis import diagnose, diagnose_handle
from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.summary import RunSummary, summary
from ckpt_viz.analysis.words import format_bytes, state_word
from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, BUILTIN_MODEL_NAMES
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import RUN_MODES

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
COMPARED = ("none", "nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant")  # Compare's modes


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _plain(markdown: str) -> str:
    """Markdown written by `ui.text.md` as the browser shows it."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace("  \n", "\n")).replace("\u2060", "")


def _app(**state: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


def _shown(at: AppTest) -> Trace:
    from ui import runs  # AppTest put app/ on sys.path

    return runs.load_run(at.session_state["run_config"]).run.trace


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _overview_and_handles(at: AppTest) -> RunSummary:
    """The Overview's and the Handles page's figures equal the run's summary; returns it."""
    s = summary(_shown(at))
    overview = _metrics(at)
    assert overview == {"Events": f"{s.events:,}", "Handles": f"{s.handles:,}", "Replays": f"{s.replays:,}",
                        "Refused replays": f"{s.refused:,}", "Released": f"{s.released:,}",
                        "Peak memory": format_bytes(s.peak.total) if s.peak else "not sampled"}
    at.switch_page("views/handles.py").run()
    assert not at.exception, at.exception
    if s.handles:
        assert _metrics(at) == {"Handles": f"{s.handles:,}", "Replays": f"{s.replays:,}",
                                "Released": f"{s.released:,}", "Refused replays": f"{s.refused:,}"}
        ends = next(c.value for c in at.caption if c.value.startswith("At the end of the run: "))
        assert ends == "At the end of the run: " + ", ".join(f"{n} {state_word(k)}" for k, n in s.states.items())
    at.switch_page("views/overview.py").run()
    return s


def _compare(at: AppTest, figures: dict[str, RunSummary]) -> None:
    at.switch_page("views/compare.py").run()
    at.multiselect(key="compare_modes").set_value(list(COMPARED)).run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    for _, row in table.iterrows():
        s = figures[row["mode"]]
        assert (row["events"], row["handles"], row["replays"], row["refused"], row["released"]) == (
            s.events, s.handles, s.replays, s.refused, s.released), row["mode"]
        assert row["peak"] == (format_bytes(s.peak.total) if s.peak else "-")
        for category, nbytes in (s.peak.by_category.items() if s.peak else ()):
            if nbytes:
                column = next(c for c in table.columns if c.startswith("at the peak: ") and
                              c.endswith(category.replace("_", " ")))
                assert row[column] == format_bytes(nbytes), (row["mode"], category)
    assert set(table["mode"]) == set(COMPARED)


def _every_mode(model: str) -> None:
    at = _app(src_model=model)
    figures = {}
    modes = [m for m in RUN_MODES if m != "pipeline" or "pipeline" in at.selectbox(key="src_mode").options]
    for mode in modes:
        at.selectbox(key="src_mode").set_value(mode).run()
        assert not at.exception, at.exception
        figures[mode] = _overview_and_handles(at)
    at.selectbox(key="src_mode").set_value("split-reentrant").run()
    _compare(at, figures)


def test_the_default_model_in_every_mode() -> None:
    _every_mode("mlp")


@pytest.mark.parametrize("model", [m for m in BUILTIN_MODEL_NAMES if m != "mlp"])
def test_every_built_in_model_in_every_mode(model: str) -> None:
    _every_mode(model)


@pytest.mark.parametrize("name", BROKEN_SCENARIO_NAMES)
def test_every_broken_run(name: str) -> None:
    at = _app(src_kind="Broken runs to explore", src_broken=name)
    _overview_and_handles(at)


def test_the_nonreentrant_run_says_released_on_every_page() -> None:
    at = _app(src_model="mlp", src_mode="nonreentrant")
    trace = _shown(at)
    assert trace.count("released") == 0  # non-reentrant frames emit no `released` event ...
    s = _overview_and_handles(at)
    assert s.released == 4  # ... and all four are released, on every page
    _compare(at, {m: _mode_summary(m) for m in COMPARED})


def _mode_summary(mode: str) -> RunSummary:
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    return summary(obtain_trace(RunRequest("builtin", "mlp", mode=mode)))


@pytest.mark.parametrize("name", ["session-cleared-early", "dx-after-dw", "outputs-dropped"])
def test_the_handles_page_answers_for_each_handle_what_the_diagnosis_says(name: str) -> None:
    at = _app(src_kind="Broken runs to explore", src_broken=name)
    trace = _shown(at)
    at.switch_page("views/handles.py").run()
    at.button(key="cursor_next_release").click().run()
    seq = trace.events[at.slider(key="cursor_slider").value].seq
    (picker,) = [b for b in at.selectbox if (b.key or "").startswith("debug_handle_")]  # the run's own picker
    life = lifecycle(trace)
    for h in life.handle_ids:  # the picker names each handle, never a state that the cursor would make stale
        assert picker.format_func(h) in (f"h{h}", f"h{h} · {handle_labels(trace).get(h)}"), h
    for h in life.handle_ids:
        picker.set_value(h).run()
        assert not at.exception, at.exception
        # The chosen handle's state at the cursor, said under the picker in words.
        said = _plain("\n".join(m.value for m in at.markdown))
        assert f"At the cursor (seq {seq}), h{h} is {state_word(life.state_at(h, seq))}." in said.replace("**", ""), h
        expected = diagnose(trace, h) or [diagnose_handle(trace, h)]
        boxes = [_plain(b.value) for b in [*at.error, *at.success] if b.value.startswith(f"**h{h}")]
        assert boxes == [f"**h{h}: {d.cause or 'no problem found.'}** {d.summary}" for d in expected], h
