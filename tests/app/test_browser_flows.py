"""Issue 30's flows in a real browser (a `streamlit run` server, Debian's chromium driven by Playwright), each
checked against the analysis of the same run recorded here, independently of the app:

1. the Debugger survives the broken run being changed twice while on it, the source picker stays, and the next
   page keeps the source;
2. the Handles page's picker and its state line agree with the cursor at every step;
3. Routing says what runs during a backward that has reached no checkpoint yet (never "not started"), or shows
   the pass the user's backward call opened;
4. the graph's regions are drawn in the cursor's states and the page says which snapshot is shown, taken after
   or before the cursor;
5. no Cancel button is left once a sandboxed model file's run finished.
"""
from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from browser import CHROMIUM, cursor_text, goto_page, pick_option, settle, shown_text

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def _no_exception(page, where: str) -> None:
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, f"{where}: {boxes.first.inner_text()[:600]}"


def _picker(page):
    """The sidebar's source picker (its radio of source kinds)."""
    return page.locator('[data-testid="stSidebar"] [data-testid="stRadio"]').filter(has_text="Broken runs to explore")


def _choose(page, key: str, option: str) -> None:
    """Pick `option` in the sidebar selectbox of widget key `key`, and wait for the run."""
    pick_option(page, key, option)
    settle(page, 120_000)


def _main(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def test_the_debugger_survives_the_broken_run_changed_twice_and_the_source_stays(browser_page) -> None:
    from playwright.sync_api import expect

    from ckpt_viz.analysis.diagnosis import diagnose
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    page = browser_page
    page.locator('[data-testid="stSidebar"]').get_by_text("Broken runs to explore", exact=True).click()
    settle(page, 120_000)
    _choose(page, "src_broken", "dx-after-dw")
    goto_page(page, "Debugger")
    # The flow the sidebar suggests, then on through a run of several findings (one picked, so the picker holds a
    # value of its run when the run changes) and back to runs of one.
    for name in ("second-backward", "phase-never-set", "cache-in-replay", "dx-after-dw", "session-mismatch"):
        _choose(page, "src_broken", name)
        _no_exception(page, name)
        assert _picker(page).count() == 1, f"{name}: the source picker is gone"
        expect(page.get_by_role("heading", name="Debugger", exact=True)).to_be_visible()
        findings = diagnose(obtain_trace(RunRequest("broken", name)))  # as the app records it: memory sampled
        radio = page.locator('[data-testid="stMain"] [data-testid="stRadio"]')
        for f in findings:  # the picker lists this run's findings, not the last run's
            expect(radio).to_contain_text(f.cause or f.summary)
        assert radio.get_by_role("radio").count() == len(findings), name
        if len(findings) > 1:  # choosing another finding moves this run's cursor to its event
            radio.get_by_role("radio").nth(1).check(force=True)
            settle(page)
            _no_exception(page, f"{name}, second finding")
            assert cursor_text(page) == str(findings[1].seq), name
    goto_page(page, "Overview")  # the next page keeps the source
    _no_exception(page, "Overview")
    expect(page.locator('[data-testid="stMain"]').get_by_text("broken run session-mismatch")).to_be_visible()
    assert page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(
        has_text="Broken run").locator("input").input_value() == "session-mismatch"
    assert not page.errors, page.errors


def test_the_handles_picker_and_its_state_line_follow_the_cursor(browser_page) -> None:
    from ckpt_viz.analysis.handles import handle_labels
    from ckpt_viz.analysis.lifecycle import lifecycle
    from ckpt_viz.analysis.words import state_word
    from ckpt_viz.catalog import DEFAULT_MODEL
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    trace = obtain_trace(RunRequest("builtin", DEFAULT_MODEL, mode="split-reentrant"))  # the app's default run
    life, names = lifecycle(trace), handle_labels(trace)
    page = browser_page
    goto_page(page, "Handles")
    picker = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').first
    for step in ("cursor_next_replay", "cursor_next_replay", "cursor_next_release", "cursor_last", "cursor_first"):
        page.locator(f".st-key-{step} button").click()
        settle(page)
        seq = int(re.match(r"seq (\d+) · ", page.locator('[data-testid="stCode"]').first.inner_text())[1])
        shown = picker.locator("input").input_value()
        match = re.fullmatch(r"h(\d+) · (.+)", shown)
        assert match and match[2] == names[int(match[1])], shown  # the handle and its block, never a stale state
        h = int(match[1])
        line = page.locator('[data-testid="stMain"] [data-testid="stMarkdown"]').filter(has_text="At the cursor (seq")
        said = f"At the cursor (seq {seq}), h{h} is {state_word(life.state_at(h, seq))}."
        assert line.inner_text().strip() == said, (step, line.inner_text())
    _no_exception(page, "Handles")
    assert not page.errors, page.errors


def test_routing_says_what_runs_during_a_backward_that_reached_no_checkpoint_yet(browser_page, server) -> None:
    from ckpt_viz.analysis.passes import passes
    from ckpt_viz.analysis.routing import no_pass_words, pass_title, routing_at
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    page = browser_page
    # The first seq of the backward, before any checkpoint is reached. split-reentrant: backward_input sets the
    # handles' phase before its backward call, so no pass is open yet and the page says what runs. nonreentrant:
    # the user's backward call (backward_called) opens the pass, which has reached no handle yet.
    for mode, opened in (("split-reentrant", False), ("nonreentrant", True)):
        trace = obtain_trace(RunRequest("builtin", "mlp", mode=mode))
        step = passes(trace)
        seq = next(e.seq for e in trace.events if step.part_at(e.seq) != "F")  # a backward is running
        routing = routing_at(trace, seq)
        assert (routing.start_seq is not None, routing.handles) == (opened, ()), (mode, seq, routing)
        page.goto(f"{server}/routing?model=mlp&mode={mode}&cursor={seq}", timeout=60_000)  # the URL holds the view
        settle(page, 120_000)
        text = shown_text(page.locator('[data-testid="stMain"]'))
        said = pass_title(routing) if opened else no_pass_words(trace, routing)
        assert said in text, (mode, seq, said, text[:800])
        assert opened or "running here" in said, said
        assert "No backward pass has started" not in text, mode
        assert re.match(rf"seq {seq} · ", page.locator('[data-testid="stCode"]').first.inner_text()), mode
        _no_exception(page, mode)
    assert not page.errors, page.errors


def _svg(page) -> str:
    src = page.locator("img.ckpt-graph").first.get_attribute("src")
    return base64.b64decode(src.split(",", 1)[1]).decode("utf-8")


def test_the_graph_draws_the_cursors_states_and_says_when_its_snapshot_was_taken(browser_page) -> None:
    from ckpt_viz.analysis.handles import handle_labels
    from ckpt_viz.analysis.lifecycle import lifecycle
    from ckpt_viz.analysis.routing import snapshot_before, snapshot_relation
    from ckpt_viz.analysis.words import state_word
    from ckpt_viz.catalog import DEFAULT_MODEL
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    trace = obtain_trace(RunRequest("builtin", DEFAULT_MODEL, mode="split-reentrant"))
    life, names = lifecycle(trace), handle_labels(trace)
    page = browser_page
    goto_page(page, "Autograd graph")
    for step in ("cursor_first", "cursor_next_replay", "cursor_last"):
        if page.locator(f".st-key-{step} button").is_enabled():
            page.locator(f".st-key-{step} button").click()
            settle(page)
        seq = int(re.match(r"seq (\d+) · ", page.locator('[data-testid="stCode"]').first.inner_text())[1])
        snapshot = snapshot_before(trace, seq)
        relation = snapshot_relation(trace, seq)
        assert ("after the cursor" in relation) == (snapshot.seq > seq), relation
        assert f"Showing snapshot {snapshot.label} ({len(snapshot.nodes)} nodes), {relation}." in _main(page), step
        svg = _svg(page)
        assert f"snapshot {relation}; handle states at seq {seq}" in svg.replace("&#39;", "'"), step  # the title too
        for h in {n.handle_id for n in snapshot.nodes if n.handle_id is not None and n.kind != "trigger"}:
            region = re.search(rf"<title>cluster_h{h}</title>(.*?)</g>", svg, re.S)
            texts = re.findall(r"<text[^>]*>([^<]*)</text>", region[1])
            assert texts[:2] == [f"h{h} · {names[h]}", state_word(life.state_at(h, seq))], (step, h, texts)
    _no_exception(page, "graph")
    assert not page.errors, page.errors


def test_no_cancel_button_is_left_after_a_sandboxed_run_finished(browser_page) -> None:
    from playwright.sync_api import expect

    page = browser_page
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Model file (.py)", exact=True).click()
    settle(page, 120_000)
    field = sidebar.locator(".st-key-src_ref input")  # a model file whose factory takes 3 s, run in the sandbox
    field.fill("tests/data/models/slow_start.py:make_model")
    field.press("Enter")
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_role("button", name="Cancel")).to_be_visible(timeout=60_000)  # while it runs
    expect(page.locator('[data-testid="stMetric"]').filter(has_text="Handles")).to_contain_text("3", timeout=120_000)
    settle(page, 120_000)
    assert main.get_by_role("button", name="Cancel").count() == 0, _main(page)[:600]
    goto_page(page, "Handles")  # and on the next page, which reads the same finished run
    assert main.get_by_role("button", name="Cancel").count() == 0
    _no_exception(page, "model file")
    assert not page.errors, page.errors
