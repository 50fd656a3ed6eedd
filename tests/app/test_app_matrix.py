"""Every page against every kind of source, headless (AppTest), the cursor moved on each: no exception on any page
and no error box but a broken run's (issue 30's "done means", the part a page's own script decides).

The kinds of source: the built-in models (each model once, every mode among them), a pipeline schedule, a broken
run, a model file and a Hugging Face model (both run in the sandbox), a saved trace and a merged 2-rank trace (the
rank files of tests/data/distributed, merged by `ckpt-viz merge`'s `merge_run`). On each page the cursor moves once
(the next replay, else one event, else back to the first) and the page is drawn again. Compare opens on its
two-runs view here (the modes view records five runs of the model; tests/app/test_app.py opens it for the built-in
and the model file).

The same kinds in a browser, with their figures checked and the source changed while on each page:
tests/app/test_browser_matrix.py. Every built-in model in every mode and every broken run:
tests/app/test_figures_agree.py.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
# id -> the source picker's widget values
SOURCES: dict[str, dict[str, object]] = {
    "mlp-split-reentrant": {"src_model": "mlp", "src_mode": "split-reentrant"},
    "dropout-nonreentrant": {"src_model": "dropout", "src_mode": "nonreentrant"},
    "excluded-split-nonreentrant": {"src_model": "excluded", "src_mode": "split-nonreentrant"},
    "closure-none": {"src_model": "closure", "src_mode": "none"},
    "transformer-reentrant": {"src_model": "transformer", "src_mode": "reentrant"},
    "pipeline-ZB-H1": {"src_model": "pipeline", "src_mode": "pipeline", "src_schedule": "ZB-H1"},
    "broken-dx-after-dw": {"src_kind": "Broken runs to explore", "src_broken": "dx-after-dw"},
    "model-file": {"src_kind": "Model file (.py)", "src_file_how": "Path",
                   "src_ref": "examples/user_model.py:make_model", "src_mode": "reentrant"},
    "hf-gpt2": {"src_kind": "Model file (.py)", "src_file_how": "Path", "src_ref": "examples/hf_gpt2.py:make_model",
                "src_mode": "split-reentrant"},
    "saved-trace": {"src_kind": "Saved trace", "src_trace_how": "Path", "src_trace_path": "saved"},
    "merged-2-rank": {"src_kind": "Saved trace", "src_trace_how": "Path", "src_trace_path": "merged"},
}
MOVES = ("cursor_next_replay", "cursor_next", "cursor_first")
NO_CURSOR = {"views/glossary.py", "views/plan.py"}  # the pages that draw no time cursor
OWN_RUN = {"views/lessons.py"}  # its cursor, once a step's question is answered, is the lesson's own run's
pytestmark = pytest.mark.slow  # about a minute on two cores (the model files run in the sandbox)


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # `streamlit run app` runs from the root; model references are relative to it


def _pages() -> list[tuple[str, str]]:
    """(page file, title) of every page the entrypoint registers, in its order."""
    registered = (ROOT / "app" / "streamlit_app.py").read_text()
    return re.findall(r'st\.Page\("(views/\w+\.py)", title="([^"]+)"', registered)


def _problems(at: AppTest, page: str, broken: bool) -> list[str]:
    """Exceptions, and error boxes except where a broken run's error is the page's subject."""
    errors = [] if broken and page in ("views/debugger.py", "views/handles.py") else [e.value for e in at.error]
    return [str(e.value) for e in at.exception] + [str(e) for e in errors]


def test_the_pages_name_what_the_entrypoint_registers() -> None:
    pages = [page for page, _ in _pages()]
    assert sorted(pages) == sorted(p.relative_to(ROOT / "app").as_posix()
                                   for p in (ROOT / "app" / "views").glob("*.py")), pages
    assert NO_CURSOR | OWN_RUN < set(pages)


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_page_with_a_cursor_move(matrix_files: dict[str, str], name: str) -> None:
    files = matrix_files
    state = dict(SOURCES[name])
    if state.get("src_trace_path") in files:
        state["src_trace_path"] = files[str(state["src_trace_path"])]
    at = AppTest.from_file(APP, default_timeout=300)
    for key, value in state.items():
        at.session_state[key] = value
    at.session_state["compare_view"] = "Two runs"
    at.run()
    broken = name.startswith("broken")
    assert not _problems(at, "views/overview.py", broken), (name, _problems(at, "views/overview.py", broken))
    for page, title in _pages():
        at.switch_page(page).run()
        where = f"{name}: {page}"
        assert not _problems(at, page, broken), (where, _problems(at, page, broken))
        expected = "Compare two runs" if page == "views/compare.py" else title
        assert [t.value for t in at.title][:1] == [expected], where
        if page in OWN_RUN:
            continue
        buttons = {b.key: b for b in at.button if b.key in MOVES}
        assert bool(buttons) == (page not in NO_CURSOR), (where, sorted(buttons))
        if not buttons:
            continue
        key = next(k for k in MOVES if not buttons[k].disabled)
        before = at.slider(key="cursor_slider").value
        buttons[key].click().run()
        assert not _problems(at, page, broken), (where, key, _problems(at, page, broken))
        assert at.slider(key="cursor_slider").value != before, (where, key)
    assert at.session_state["run_config"].source == {"builtin": "builtin", "Broken runs to explore": "broken",
                                                      "Model file (.py)": "user", "Saved trace": "trace"}[
        str(state.get("src_kind", "builtin"))], name  # the source stayed through every page
