"""app/ui/url.py headless (AppTest): a URL's view opens (source, mode, cursor), bad values are left out, the app
writes the view it shows, and keeps a page's own parameter (Compare's partner run, `vs`)."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "app"))


def _open(**params: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


def test_a_urls_view_opens_and_the_app_writes_the_view_it_shows() -> None:
    from ui.runs import RunConfig

    at = _open(model="transformer", mode="reentrant", cursor="7")
    assert at.session_state["run_config"] == RunConfig("builtin", "transformer", mode="reentrant")
    assert at.slider(key="cursor_slider").value == 7  # built-in runs: positions are seqs
    assert dict(at.query_params) == {"model": "transformer", "mode": "reentrant", "cursor": "7"}
    at.button(key="cursor_next").click().run()
    assert at.query_params["cursor"] == "8"
    at.selectbox(key="src_model").set_value("mlp").run()  # a new source: its run starts at its first event
    assert dict(at.query_params) == {"model": "mlp", "mode": "reentrant", "cursor": "0"}


def test_a_broken_run_and_a_trace_path_open_from_the_url(tmp_path: Path) -> None:
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    at = _open(broken="second-backward", cursor="3")
    assert at.session_state["src_kind"] == "Broken runs to explore" and at.session_state["src_broken"] == \
        "second-backward"
    assert at.slider(key="cursor_slider").value == 3
    path = tmp_path / "t.json"
    obtain_trace(RunRequest("builtin", "mlp", mode="reentrant")).save(path)
    at = _open(trace=str(path))
    assert at.session_state["run_config"].source == "trace" and at.session_state["run_config"].target == str(path)
    assert at.query_params["trace"] == str(path) and at.query_params["cursor"] == "0"


def test_values_no_widget_offers_are_left_out() -> None:
    at = _open(model="nonesuch", mode="pipeline", broken_not="x", cursor="2")
    config = at.session_state["run_config"]
    assert (config.source, config.target, config.mode) == ("builtin", "mlp", "split-reentrant")
    assert at.slider(key="cursor_slider").value == 2  # the cursor applies to the run shown
    assert at.query_params["model"] == "mlp" and at.query_params["mode"] == "split-reentrant"
    assert at.query_params["broken_not"] == "x"  # a parameter the app does not own stays


def test_the_partner_value_survives_the_apps_own_writes_of_the_view() -> None:
    """Compare's `vs` (written and read through `ui.url.set_param` / `param`) is not the app's to drop: moving the
    cursor rewrites the view and keeps it; and Compare's partner picker reads it on a reload."""
    at = _open(model="mlp", vs="builtin:mlp:none")
    assert at.query_params["vs"] == "builtin:mlp:none"
    at.button(key="cursor_next").click().run()
    assert at.query_params["vs"] == "builtin:mlp:none" and at.query_params["cursor"] == "1"
    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    assert at.session_state["vs_kind"] == "Built-in run" and at.session_state["vs_mode"] == "none"
    assert at.query_params["vs"] == "builtin:mlp:none"
