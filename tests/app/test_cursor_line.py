"""The cursor line says the event at the cursor in words (`analysis.words.describe_event`) and names its handle by
its region (`analysis.handles.handle_labels`): the checkpointed module's qualified name, else its function; the
same on a recorded run and on that run saved and loaded."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.analysis.handles import handle_labels
from ckpt_viz.analysis.words import describe_event
from ckpt_viz.trace import Trace
from traces import event_of

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _cursor_lines(path: Path) -> list[str]:
    """The cursor line at every position of the trace saved at `path`, as the Events page shows it."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["src_kind"] = "Saved trace"
    at.session_state["src_trace_how"] = "Path"
    at.session_state["src_trace_path"] = str(path)
    at.run()
    at.switch_page("views/events.py").run()
    lines = []
    for position in range(len(Trace.load(path))):
        at.slider(key="cursor_slider").set_value(position).run()
        assert not at.exception, at.exception
        lines.append(at.code[0].value)
    return lines


def test_the_line_names_each_handle_by_its_region(tmp_path: Path) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    trace = run_scenario(build_builtin("mlp"), "split-reentrant", memory=False, graphs=False)
    names = handle_labels(trace)
    assert sorted(names.values()) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    trace.save(tmp_path / "t.json")
    assert _cursor_lines(tmp_path / "t.json") == [describe_event(e, names) for e in trace.events]

    made = Trace(events=[event_of("handle_created", seq=0, t_ns=0, handle_id=3, function="a.first"),
                         event_of("replay_started", seq=1, t_ns=1, handle_id=3, trigger="backward"),
                         event_of("handle_created", seq=2, t_ns=2, handle_id=3, function="f", label="model.a"),
                         event_of("handle_created", seq=3, t_ns=3, handle_id=4)])
    assert handle_labels(made) == {3: "a.first"}  # the first creation names the handle; h4 names nothing
    made.save(tmp_path / "made.json")
    assert _cursor_lines(tmp_path / "made.json") == [
        "seq 0 · handle created · h3 a.first", "seq 1 · replay started · h3 a.first · for a backward",
        "seq 2 · handle created · h3 a.first", "seq 3 · handle created · h4"]
