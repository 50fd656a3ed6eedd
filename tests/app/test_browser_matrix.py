"""Every page against every kind of source, in a real browser (issue 30's "done means"): no exception box anywhere,
the source picker always there, and the counts, states and peak the Overview, Compare and Handles pages show equal
`ckpt_viz.analysis.summary.summary` of the same run, recorded (or read) here, independently of the app.

The sources: the built-in models, each once, in the five modes between them; a pipeline schedule; a broken run; a
model file and a Hugging Face model (both run in the sandbox); a saved trace; a merged 2-rank trace (the rank files
of tests/data/distributed, merged by `ckpt-viz merge`'s `merge_run`). A full cross product of every built-in model
in every mode with every page would take about an hour on the two-core machine, so the built-ins are sampled (every
model and every mode appear); tests/app/test_figures_agree.py checks the figures of every model in every mode
headless.

1. `test_every_page_of_a_source`: one source opened from its URL, then every page through the navigation, the
   cursor moved on each (the next replay, or one event, then the last event), the figures checked at the end.
2. `test_the_source_changes_while_on_each_page`: on each page in turn, the source is changed with the sidebar's
   picker (each kind of source in rotation): the page stays, with no exception and the picker drawn.
Marked slow (about 8 minutes together on two cores).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlencode

import pytest

from browser import CHROMIUM, ROOT, goto_page, settle

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

PAGES = [("Overview", "Overview"), ("Autograd graph", "Autograd graph"), ("Memory", "Memory"), ("Handles", "Handles"),
         ("Debugger", "Debugger"), ("Routing (DX/DW)", "Routing (DX/DW)"), ("Schedule timeline", "Schedule timeline"),
         ("Events", "Events"), ("Compare", None), ("Lessons", "Lessons"), ("Glossary", "Glossary")]
# id -> (kind, target, mode, schedule): the URL's parameters and the sidebar's choices of one source
SOURCES: dict[str, tuple[str, str, str, str]] = {
    "mlp-split-reentrant": ("builtin", "mlp", "split-reentrant", ""),
    "transformer-reentrant": ("builtin", "transformer", "reentrant", ""),
    "dropout-nonreentrant": ("builtin", "dropout", "nonreentrant", ""),
    "excluded-split-nonreentrant": ("builtin", "excluded", "split-nonreentrant", ""),
    "closure-none": ("builtin", "closure", "none", ""),
    "pipeline-ZB-H1": ("builtin", "pipeline", "pipeline", "ZB-H1"),
    "broken-dx-after-dw": ("broken", "dx-after-dw", "", ""),
    "model-file": ("file", "examples/user_model.py:make_model", "reentrant", ""),
    "hf-gpt2": ("file", "examples/hf_gpt2.py:make_model", "split-reentrant", ""),
    "saved-trace": ("trace", "saved", "", ""),
    "merged-2-rank": ("trace", "merged", "", ""),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The saved trace (mlp, reentrant, recorded here) and the merged 2-rank trace, as files the app opens by path."""
    from ckpt_viz.cli.merge import merge_run
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    folder = tmp_path_factory.mktemp("matrix")
    saved = folder / "saved.json"
    obtain_trace(RunRequest("builtin", "mlp", mode="reentrant")).save(saved)
    run = folder / "ranks" / "run-a"
    run.mkdir(parents=True)
    for rank_file in (ROOT / "tests" / "data" / "distributed").glob("rank-*.json*"):
        shutil.copy2(rank_file, run / rank_file.name)
    merged, _ = merge_run(str(folder / "ranks"))
    assert {e.tags.get("rank") for e in merged} == {0, 1}
    merged_path = folder / "merged.json"
    merged.save(merged_path)
    return {"saved": str(saved), "merged": str(merged_path)}


def _target(source: tuple[str, str, str, str], files: dict[str, str]) -> str:
    kind, target, _, _ = source
    return files[target] if kind == "trace" else target


def _params(source: tuple[str, str, str, str], files: dict[str, str]) -> dict[str, str]:
    kind, _, mode, schedule = source
    params = {"model" if kind == "builtin" else kind: _target(source, files)}
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
    if kind == "file":  # in the sandbox, as the app runs it (its limits: ui.runs.RunConfig's defaults)
        return obtain_trace(RunRequest("user", target, mode=mode, timeout_s=120.0, memory_mb=4096))
    return obtain_trace(RunRequest("builtin", target, mode=mode, schedule=schedule or "1F1B", microbatches=4))


def _healthy(page, where: str, heading: str | None) -> None:
    """No exception box, the source picker drawn, and the page still `heading`."""
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, f"{where}: {boxes.first.inner_text()[:800]}"
    picker = page.locator('[data-testid="stSidebar"] [data-testid="stRadio"]').filter(has_text="Broken runs to explore")
    assert picker.count() == 1, f"{where}: the source picker is gone"
    if heading is not None:
        shown = page.locator('[data-testid="stMain"] h1').first.inner_text()
        assert shown == heading, f"{where}: page {shown!r}"
    assert not page.errors, f"{where}: {page.errors}"


def _move_cursor(page, where: str) -> None:
    """The next replay (or the next event), then the last event: each step redraws the page without error."""
    if page.locator(".st-key-cursor_next button").count() == 0:  # a page without the run's cursor (Glossary)
        return
    for key in ("cursor_next_replay", "cursor_next", "cursor_last"):
        button = page.locator(f".st-key-{key} button").first
        if key == "cursor_next" and page.locator(".st-key-cursor_next_replay button").first.is_enabled():
            continue
        if button.is_enabled():
            button.click()
            settle(page, 120_000)
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


def _check_figures(page, server: str, source, files, where: str) -> None:
    """The Overview, Handles and Compare pages state the run's summary (NOTE [ Figures of a run ] in ui/runs.py)."""
    from ckpt_viz.analysis.summary import summary
    from ckpt_viz.analysis.words import format_bytes, state_word

    s = summary(_trace(source, files))
    peak = format_bytes(s.peak.total) if s.peak else "not sampled"
    params = _params(source, files)

    page.goto(f"{server}/?{urlencode({**params, 'cursor': '999999999'})}", timeout=60_000)  # the last event
    settle(page, 240_000)
    _healthy(page, f"{where}: Overview", "Overview")
    assert _metrics(page) == {"Events": f"{s.events:,}", "Handles": f"{s.handles:,}", "Replays": f"{s.replays:,}",
                              "Refused replays": f"{s.refused:,}", "Released": f"{s.released:,}",
                              "Peak memory": peak}, where
    if s.handles:  # "Handles at the cursor", at the last event: the states at the end of the run
        cells = _grid(page)
        assert cells[:3] == ["state", "handles", "meaning"], cells
        rows = [cells[i:i + 3] for i in range(3, len(cells), 3)]
        assert {r[0]: int(r[1]) for r in rows} == {state_word(k): n for k, n in s.states.items()}, (where, rows)

    page.goto(f"{server}/handles?{urlencode(params)}", timeout=60_000)
    settle(page, 240_000)
    _healthy(page, f"{where}: Handles", "Handles")
    if s.handles:
        assert _metrics(page) == {"Handles": f"{s.handles:,}", "Replays": f"{s.replays:,}",
                                  "Released": f"{s.released:,}", "Refused replays": f"{s.refused:,}"}, where
        ends = "At the end of the run: " + ", ".join(f"{n} {state_word(k)}" for k, n in s.states.items())
        assert ends in page.locator('[data-testid="stMain"]').inner_text(), where

    # Compare, two runs: the sidebar's run is A (a built-in partner, through the URL's `vs`).
    page.goto(f"{server}/compare?{urlencode({**params, 'vs': 'builtin:mlp:none'})}", timeout=60_000)
    settle(page, 240_000)
    _healthy(page, f"{where}: Compare", "Compare two runs")
    table = page.locator('[data-testid="stMain"] [data-testid="stTable"]').first
    rows = table.evaluate("t => [...t.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th,td')]"
                          ".map(c => c.innerText.trim()))")
    a = {row[-3]: row[-2] for row in rows if len(row) >= 3}
    assert {k: a.get(k) for k in ("events", "checkpoint regions", "replays", "released", "refused replays",
                                  "errors", "peak")} == {
        "events": str(s.events), "checkpoint regions": str(s.handles), "replays": str(s.replays),
        "released": str(s.released), "refused replays": str(s.refused), "errors": str(s.errors),
        "peak": format_bytes(s.peak.total) if s.peak else "no samples"}, (where, a)


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_page_of_a_source(browser_page, server, files, name: str) -> None:
    source = SOURCES[name]
    page = browser_page
    page.goto(f"{server}/?{urlencode(_params(source, files))}", timeout=60_000)
    settle(page, 240_000)  # a model file runs in the sandbox: the first one starts it
    _healthy(page, f"{name}: opened", "Overview")
    for label, title in PAGES:
        # Compare opens on the modes of a model it can run, else on two runs.
        goto_page(page, label, title or ("Compare two runs" if source[0] in ("trace", "broken") else "Compare modes"))
        where = f"{name}: {label}"
        _healthy(page, where, None)
        _move_cursor(page, where)
    _check_figures(page, server, source, files, name)


def test_the_source_changes_while_on_each_page(browser_page, files) -> None:
    page = browser_page
    sidebar = page.locator('[data-testid="stSidebar"]')
    kinds = {"builtin": "Built-in model", "file": "Model file (.py)", "trace": "Saved trace",
             "broken": "Broken runs to explore"}
    rotation = list(SOURCES)
    for i, (label, title) in enumerate(PAGES):
        goto_page(page, label, title)
        heading = page.locator('[data-testid="stMain"] h1').first.inner_text()
        name = rotation[i % len(rotation)]
        kind, target, mode, schedule = SOURCES[name]
        sidebar.locator(".st-key-src_kind").get_by_text(kinds[kind], exact=True).click()
        settle(page, 240_000)
        if kind == "builtin":
            _select(page, "src_model", target)
        elif kind == "broken":
            _select(page, "src_broken", target)
        elif kind == "file":
            sidebar.locator(".st-key-src_file_how").get_by_text("Path", exact=True).click()
            _fill(page, "src_ref", target)
        else:
            sidebar.locator(".st-key-src_trace_how").get_by_text("Path", exact=True).click()
            settle(page, 240_000)
            _fill(page, "src_trace_path", files[target])
        if mode:
            _select(page, "src_mode", mode)
        if schedule:
            _select(page, "src_schedule", schedule)
        where = f"{label}: source changed to {name}"
        # The page stays (Compare's heading follows its view, which follows the source).
        _healthy(page, where, heading if label != "Compare" else None)
        _move_cursor(page, where)
    assert not page.errors, page.errors


def _select(page, key: str, option: str) -> None:
    box = page.locator(f'[data-testid="stSidebar"] .st-key-{key} [data-testid="stSelectbox"]')
    if box.locator("input").input_value() == option:
        return
    box.click()
    page.get_by_role("option", name=option, exact=True).click()
    settle(page, 240_000)


def _fill(page, key: str, text: str) -> None:
    field = page.locator(f'[data-testid="stSidebar"] .st-key-{key} input')
    field.fill(text)
    field.press("Enter")
    settle(page, 240_000)
