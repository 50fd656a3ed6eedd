"""Every kind of source in a real browser (issue 30's "done means"): no exception box anywhere, the source picker
always there, and the counts, states and peak the Overview, Compare and Handles pages show equal
`ckpt_viz.analysis.summary.summary` of the same run, recorded (or read) here, independently of the app.

The kinds of source: a built-in model, a pipeline schedule, a broken run, a model file and a Hugging Face model
(both run in the sandbox), a saved trace, and a merged 2-rank trace (the rank files of tests/data/distributed,
merged by `ckpt-viz merge`'s `merge_run`).

1. `test_the_figures_of_each_kind_of_source`: a source of each kind opened from its URL at its last event: the
   Overview's figures and its states at the end of the run; the Handles page (through the navigation) and its
   figures; Compare beside a built-in partner named by the URL's `vs`, with the run's column. The cursor moves on
   each of the three pages (the next replay, else one event, else back to the first).
2. `test_the_source_changes_while_on_each_page`: every page in turn, the source changed there with the sidebar's
   picker to the next of `ROTATION` (every kind of source, every built-in model, every mode); the page stays, with
   no exception and the picker drawn, and the cursor moves on the new run.

The product of every page with every kind of source and a cursor move on each runs headless, where a page's
exception shows the same (tests/app/test_app_matrix.py, tests/app/test_app.py, tests/app/test_debugger_page.py),
and the figures of every built-in model in every mode and every broken run in tests/app/test_figures_agree.py;
Compare's modes view is drawn in a browser by tests/app/test_browser.py. One chromium serves the file, and each
step waits for what it changed rather than for a fixed time.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from browser import CHROMIUM, CHROMIUM_ARGS, goto_page, pick_option, settle

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

# (navigation label, heading); Compare's heading follows its view (modes of a model, or two runs)
PAGES = [("Overview", "Overview"), ("Autograd graph", "Autograd graph"), ("Memory", "Memory"), ("Handles", "Handles"),
         ("Debugger", "Debugger"), ("Routing (DX/DW)", "Routing (DX/DW)"), ("Schedule timeline", "Schedule timeline"),
         ("Events", "Events"), ("Compare", None), ("Plan", "Plan"), ("Lessons", "Lessons"), ("Glossary", "Glossary")]
NO_CURSOR = {"Plan", "Glossary"}  # the pages that draw no time cursor
OWN_RUN = {"Lessons"}  # its cursor, once a step's question is answered, is the lesson's own run's: not moved here
# id -> (kind, target, mode, schedule): the URL's parameters and the sidebar's choices of one source
SOURCES: dict[str, tuple[str, str, str, str]] = {
    "transformer-reentrant": ("builtin", "transformer", "reentrant", ""),
    "pipeline-ZB-H1": ("builtin", "pipeline", "pipeline", "ZB-H1"),
    "broken-dx-after-dw": ("broken", "dx-after-dw", "", ""),
    "model-file": ("file", "examples/user_model.py:make_model", "reentrant", ""),
    "hf-gpt2": ("file", "examples/hf_gpt2.py:make_model", "split-reentrant", ""),
    "saved-trace": ("trace", "saved", "", ""),
    "merged-2-rank": ("trace", "merged", "", ""),
}
# the source picked on each page of PAGES in turn (test 2): every kind, every built-in model, every mode
ROTATION: list[tuple[str, str, str, str]] = [
    ("builtin", "dropout", "nonreentrant", ""),  # the page opens on the default, mlp in split-reentrant
    ("builtin", "mlp", "split-reentrant", ""),
    ("builtin", "excluded", "split-nonreentrant", ""),
    ("builtin", "closure", "none", ""),
    ("broken", "second-backward", "", ""),  # the Debugger's flow of issue 30
    ("file", "examples/user_model.py:make_model", "reentrant", ""),
    ("builtin", "pipeline", "pipeline", "GPipe"),
    ("builtin", "transformer", "reentrant", ""),
    ("trace", "saved", "", ""),
    ("broken", "phase-never-set", "", ""),
    ("trace", "merged", "", ""),
    ("file", "examples/hf_gpt2.py:make_model", "split-reentrant", ""),
]
WAIT_MS = 240_000  # a model file runs in the sandbox; the first one starts it


@pytest.fixture(scope="module")
def page(server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """One headless chromium for the file (each test opens its views by URL: a new Streamlit session each time);
    `page.errors` collects uncaught page errors."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1500, "height": 1000})
        try:
            tab = context.pages[0] if context.pages else context.new_page()
            tab.errors = []
            tab.on("pageerror", lambda exc: tab.errors.append(str(exc)))
            yield tab
        finally:
            context.close()


# The browser may draw a finished run's elements seconds after the app says the run ended (it draws the charts
# first): a step is done when the run it started ended, the figures are drawn (`settle`) and the page has not
# changed for QUIET_MS (waiting CALM_MS at most); what a check reads, it waits for as well.
QUIET_MS, CALM_MS = 300, 15_000
_QUIET = """([quiet, cap]) => new Promise(resolve => {
  const done = () => { observer.disconnect(); clearTimeout(timer); clearTimeout(limit); resolve(true); };
  const observer = new MutationObserver(() => { clearTimeout(timer); timer = setTimeout(done, quiet); });
  let timer = setTimeout(done, quiet);
  const limit = setTimeout(done, cap);
  observer.observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
})"""


def _drawn(page) -> None:
    settle(page, WAIT_MS, pause_ms=0)
    page.evaluate(_QUIET, [QUIET_MS, CALM_MS])


def _open(page, url: str) -> None:
    """Open `url` (a new Streamlit session) and wait until its first script run is drawn."""
    page.errors.clear()
    page.goto(url, timeout=60_000)
    page.locator('[data-testid="stMain"] h1').first.wait_for(timeout=WAIT_MS)  # the run has begun
    _drawn(page)


def _query(page) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(page.url).query, keep_blank_values=True))


def _then(page, action, wanted) -> None:
    """Do `action` (a change of the source picker), wait until the app wrote the view it asks for into the URL
    (`wanted(query) -> bool`; ui/url.py publishes the picker's source early in each run), then until it is drawn."""
    action()
    deadline = time.monotonic() + WAIT_MS / 1000
    while not wanted(_query(page)):
        assert time.monotonic() < deadline, f"the URL never named the new source: {page.url}"
        page.wait_for_timeout(50)
    _drawn(page)


def _params(source: tuple[str, str, str, str], files: dict[str, str]) -> dict[str, str]:
    kind, target, mode, schedule = source
    params = {"model" if kind == "builtin" else kind: files[target] if kind == "trace" else target}
    if mode:
        params["mode"] = mode
    if schedule:
        params.update(schedule=schedule, mb="4")
    return params


def _trace(source: tuple[str, str, str, str], files: dict[str, str]):
    """The same run, recorded or read here (recordings are deterministic: tests/run/test_determinism.py)."""
    from ckpt_viz.run.obtain import RunRequest, obtain_trace
    from ckpt_viz.trace import Trace

    kind, target, mode, schedule = source
    if kind == "trace":
        return Trace.load(files[target])
    if kind == "broken":
        return obtain_trace(RunRequest("broken", target))
    if kind == "file":  # in this process: the sandbox's recording differs only in its clock (t_ns)
        from ckpt_viz.run.scenarios import run_scenario
        from ckpt_viz.usermodel.load import load_model

        return run_scenario(load_model(target), mode, memory=True, graphs=True)
    return obtain_trace(RunRequest("builtin", target, mode=mode, schedule=schedule or "1F1B", microbatches=4))


def _healthy(page, where: str, heading: str | None) -> None:
    """No exception box, the source picker drawn, and the page still `heading`."""
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, f"{where}: {boxes.first.inner_text()[:800]}"
    picker = page.locator('[data-testid="stSidebar"] [data-testid="stRadio"]').filter(has_text="Broken runs to explore")
    with contextlib.suppress(PlaywrightTimeout):  # a run the page started after it settled may redraw it (CI saw it)
        picker.first.wait_for(state="visible", timeout=30_000)
    assert picker.count() == 1, f"{where}: the source picker is gone"
    if heading is not None:
        shown = page.locator('[data-testid="stMain"] h1').first.inner_text()
        assert shown == heading, f"{where}: page {shown!r}"
    assert not page.errors, f"{where}: {page.errors}"


def _cursor(page) -> str:
    return page.locator('[data-testid="stMain"] .st-key-cursor_slider [data-testid="stSliderThumbValue"]').first \
        .inner_text()


def _move_cursor(page, where: str, label: str = "") -> None:
    """Move the cursor with one of its buttons (the next replay, else one event, else back to the first), wait until
    the cursor shows the new place and the page is drawn again, and check the page. A page of `NO_CURSOR` has
    none, and one of `OWN_RUN` another run's: it is left as it is."""
    if label in OWN_RUN:
        return
    drawn = page.locator('[data-testid="stMain"] .st-key-cursor_first button').count() == 1
    assert drawn == (label not in NO_CURSOR), f"{where}: the time cursor is {'' if drawn else 'not '}drawn"
    if not drawn:
        return
    for key in ("cursor_next_replay", "cursor_next", "cursor_first"):
        button = page.locator(f'[data-testid="stMain"] .st-key-{key} button').first
        if button.is_enabled():
            break
    else:
        raise AssertionError(f"{where}: no cursor button is enabled")
    before = _cursor(page)
    button.click()
    page.wait_for_function(
        "before => { const v = document.querySelector("
        "'[data-testid=\"stMain\"] .st-key-cursor_slider [data-testid=\"stSliderThumbValue\"]');"
        " return v && v.innerText !== before; }", arg=before, timeout=WAIT_MS)
    _drawn(page)
    _healthy(page, f"{where}, {key}", None)


def _metrics(page) -> dict[str, str]:
    out = {}
    for metric in page.locator('[data-testid="stMain"] [data-testid="stMetric"]').all():
        label = metric.locator('[data-testid="stMetricLabel"]').inner_text().strip()
        out[label] = metric.locator('[data-testid="stMetricValue"]').inner_text().strip()
    return out


def _grid(page, index: int = 0) -> list[str]:
    """The cells of a dataframe on the page, as its accessible grid holds them (header cells first)."""
    frame = page.locator('[data-testid="stMain"] [data-testid="stDataFrame"]').nth(index)
    return frame.evaluate("e => [...e.querySelectorAll('[role=columnheader], [role=gridcell]')].map(c => c.innerText)")


def _check_overview(page, s, where: str) -> None:
    """At the last event: the Overview states the run's summary (NOTE [ Figures of a run ] in ui/runs.py), and
    its "Handles at the cursor" table the states at the end of the run."""
    from playwright.sync_api import expect

    from ckpt_viz.analysis.words import format_bytes, state_word

    peak = format_bytes(s.peak.total) if s.peak else "not sampled"
    expect(page.locator('[data-testid="stMain"] [data-testid="stMetric"]')).to_have_count(6, timeout=WAIT_MS)
    assert _metrics(page) == {"Events": f"{s.events:,}", "Handles": f"{s.handles:,}", "Replays": f"{s.replays:,}",
                              "Refused replays": f"{s.refused:,}", "Released": f"{s.released:,}",
                              "Peak memory": peak}, where
    if s.handles:
        page.wait_for_function("() => document.querySelectorAll("
                               "'[data-testid=\"stMain\"] [data-testid=\"stDataFrame\"] [role=gridcell]').length > 0",
                               timeout=WAIT_MS)
        cells = _grid(page)
        assert cells[:3] == ["state", "handles", "meaning"], cells
        rows = [cells[i:i + 3] for i in range(3, len(cells), 3)]
        assert {r[0]: int(r[1]) for r in rows} == {state_word(k): n for k, n in s.states.items()}, (where, rows)


def _check_handles(page, s, where: str) -> None:
    """The Handles page's figures and its line on the end of the run, whatever the cursor."""
    from playwright.sync_api import expect

    from ckpt_viz.analysis.words import state_word

    if not s.handles:
        return
    expect(page.locator('[data-testid="stMain"] [data-testid="stMetric"]')).to_have_count(4, timeout=WAIT_MS)
    assert _metrics(page) == {"Handles": f"{s.handles:,}", "Replays": f"{s.replays:,}",
                              "Released": f"{s.released:,}", "Refused replays": f"{s.refused:,}"}, where
    ends = "At the end of the run: " + ", ".join(f"{n} {state_word(k)}" for k, n in s.states.items())
    expect(page.locator('[data-testid="stMain"]')).to_contain_text(ends, timeout=WAIT_MS)


def _check_compare(page, server: str, params: dict[str, str], s, where: str) -> None:
    """Compare, two runs: the sidebar's run is A, beside a built-in partner named by the URL's `vs`; A's column
    states the run's summary."""
    from ckpt_viz.analysis.words import format_bytes

    _open(page, f"{server}/compare?{urlencode({**params, 'vs': 'builtin:mlp:none'})}")
    _healthy(page, where, "Compare two runs")
    table = page.locator('[data-testid="stMain"] [data-testid="stTable"]').first
    table.wait_for(timeout=WAIT_MS)
    rows = table.evaluate("t => [...t.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th,td')]"
                          ".map(c => c.innerText.trim()))")
    a = {row[-3]: row[-2] for row in rows if len(row) >= 3}
    assert {k: a.get(k) for k in ("events", "checkpoint regions", "replays", "released", "refused replays",
                                  "errors", "peak")} == {
        "events": str(s.events), "checkpoint regions": str(s.handles), "replays": str(s.replays),
        "released": str(s.released), "refused replays": str(s.refused), "errors": str(s.errors),
        "peak": format_bytes(s.peak.total) if s.peak else "no samples"}, (where, a)
    _move_cursor(page, where)


@pytest.mark.parametrize("name", list(SOURCES))
def test_the_figures_of_each_kind_of_source(page, server, matrix_files, name: str) -> None:
    files = matrix_files
    from ckpt_viz.analysis.summary import summary

    source = SOURCES[name]
    s = summary(_trace(source, files))
    params = _params(source, files)
    _open(page, f"{server}/?{urlencode({**params, 'cursor': '999999999'})}")  # at the last event
    _healthy(page, f"{name}: opened", "Overview")
    _check_overview(page, s, f"{name}: Overview")
    _move_cursor(page, f"{name}: Overview")
    goto_page(page, "Handles", pause_ms=0)
    _drawn(page)
    _healthy(page, f"{name}: Handles", "Handles")
    _check_handles(page, s, f"{name}: Handles")
    _move_cursor(page, f"{name}: Handles")
    _check_compare(page, server, params, s, f"{name}: Compare")


_KIND_PARAM = {"builtin": ("model",), "broken": ("broken",), "file": ("file", "upload"), "trace": ("trace", "upload")}


def test_the_source_changes_while_on_each_page(page, server, matrix_files) -> None:
    files = matrix_files
    assert len(ROTATION) == len(PAGES)
    sidebar = page.locator('[data-testid="stSidebar"]')
    kinds = {"builtin": "Built-in model", "file": "Model file (.py)", "trace": "Saved trace",
             "broken": "Broken runs to explore"}
    _open(page, server)
    for (label, title), (kind, target, mode, schedule) in zip(PAGES, ROTATION):
        if label != "Overview":
            two_runs = any(k in _query(page) for k in ("broken", "trace", "upload"))  # one mode only
            goto_page(page, label, title or ("Compare two runs" if two_runs else "Compare modes"), pause_ms=0)
            _drawn(page)
        heading = page.locator('[data-testid="stMain"] h1').first.inner_text()
        radio = sidebar.locator(".st-key-src_kind").get_by_text(kinds[kind], exact=True)
        _then(page, radio.click, lambda q, kind=kind: any(k in q for k in _KIND_PARAM[kind]))
        if kind == "builtin":
            _select(page, "src_model", target, "model")
        elif kind == "broken":
            _select(page, "src_broken", target, "broken")
        elif kind == "file":
            how = sidebar.locator(".st-key-src_file_how").get_by_text("Path", exact=True)
            _then(page, how.click, lambda q: "file" in q)
            _fill(page, "src_ref", target, "file")
        else:
            how = sidebar.locator(".st-key-src_trace_how").get_by_text("Path", exact=True)
            _then(page, how.click, lambda q: "trace" in q)
            _fill(page, "src_trace_path", files[target], "trace")
        if mode:
            _select(page, "src_mode", mode, "mode")
        if schedule:
            _select(page, "src_schedule", schedule, "schedule")
        where = f"{label}: source changed to {kind} {target} {mode} {schedule}".rstrip()
        # The page stays (Compare's heading follows its view, which follows the source).
        _healthy(page, where, heading if label != "Compare" else None)
        _move_cursor(page, where, label)
    assert not page.errors, page.errors


def _select(page, key: str, option: str, param: str) -> None:
    box = page.locator(f'[data-testid="stSidebar"] .st-key-{key} [data-testid="stSelectbox"]')
    if box.locator("input").input_value() == option:
        return
    _then(page, lambda: pick_option(page, key, option), lambda q: q.get(param) == option)


def _fill(page, key: str, text: str, param: str) -> None:
    from playwright.sync_api import expect

    field = page.locator(f'[data-testid="stSidebar"] .st-key-{key} input')

    def type_in() -> None:
        field.fill(text)
        expect(field).to_have_value(text)
        field.press("Enter")

    _then(page, type_in, lambda q: q.get(param) == text)
