"""The app in a real browser: a `streamlit run` server, driven by Playwright on Debian's chromium.

Visits every page through the sidebar navigation, steps the time cursor and checks
that the page changed, and saves a screenshot of every page to artifacts/screenshots/
(with CKPT_VIZ_UPDATE_SCREENSHOTS=1 also to docs/screenshots/, for the README).
Skipped only when /usr/bin/chromium is missing (CI installs it).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from browser import CHROMIUM, DOCS_SHOTS, SHOTS, cursor_text, goto_page, screenshot, settle

PAGES = [  # (navigation label, page title, file name of its screenshot)
    ("Overview", "Overview", "01_overview.png"),
    ("Autograd graph", "Autograd graph", "02_graph.png"),
    ("Memory", "Memory", "03_memory.png"),
    ("Handles", "Handles", "04_handles.png"),
    ("Routing (DX/DW)", "Routing (DX/DW)", "05_routing.png"),
    ("Events", "Events", "06_events.png"),
    ("Compare", "Compare modes", "07_compare_modes.png"),  # 07_compare.png: two runs (test_browser_compare)
]

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def _handle_picker_agrees_with_the_lifecycle(page) -> None:
    """What the browser draws in the Handles page's picker: h0 and its block's qualified name, no state (a state in
    the picker would be the state of when it was chosen, not at the cursor: issue 30; the state line at each
    cursor stop is tests/app/test_browser_flows.py's), as the same default run recorded here names it."""
    import re

    from ckpt_viz.analysis.handles import handle_labels
    from ckpt_viz.catalog import DEFAULT_MODEL
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    picker = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').first
    shown = " ".join(i.input_value() for i in picker.locator("input").all())  # the chosen option is the input's value
    match = re.fullmatch(r"h0 · (\S+)", shown.strip())
    assert match, shown
    trace = obtain_trace(RunRequest("builtin", DEFAULT_MODEL, mode="split-reentrant"))
    assert match[1] == handle_labels(trace)[0] == "blocks.0"
    _handle_finding_agrees_with_diagnose(page, trace)


def _handle_finding_agrees_with_diagnose(page, trace) -> None:
    """What the browser draws as h0's answer to "why was this handle released?": the default run has no problem,
    so the page shows `diagnose_handle`'s answer for h0, with its releasing event."""
    from ckpt_viz.analysis.diagnosis import diagnose_handle

    finding = diagnose_handle(trace, 0)
    assert finding.ok and finding.release_event is not None  # the default run ends cleanly: DW released h0
    main = page.locator('[data-testid="stMain"]')
    answer = main.locator('[data-testid="stAlertContentSuccess"]').first.inner_text()
    assert answer.startswith("h0: no problem found.") and finding.summary in answer, answer
    assert f"Released by (seq {finding.release_event.seq}):" in main.inner_text(), main.inner_text()


def test_every_page_in_a_real_browser(browser_page) -> None:
    from playwright.sync_api import expect

    page = browser_page
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Put the cursor at the first replay (it starts at the first event): every page then shows the middle of a
    # backward pass.
    page.locator(".st-key-cursor_next_replay button").click()
    expect(page.locator('[data-testid="stCode"]').first).to_contain_text("replay started", timeout=30_000)
    settle(page)
    for label, title, shot in PAGES:
        goto_page(page, label, title)
        assert page.locator('[data-testid="stException"]').count() == 0, title
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0, title
        screenshot(page, SHOTS / shot)
        if title == "Handles":
            _handle_picker_agrees_with_the_lifecycle(page)

        # Step the cursor back one event: the slider and the page's content change.
        before_value, before_main = cursor_text(page), page.locator('[data-testid="stMain"]').inner_text()
        page.locator(".st-key-cursor_prev button").click()
        expect(page.locator('[data-testid="stSliderThumbValue"]').first).to_have_text(
            str(int(before_value) - 1), timeout=30_000)
        settle(page)
        assert page.locator('[data-testid="stMain"]').inner_text() != before_main, title
        page.locator(".st-key-cursor_next button").click()  # and back: the next page starts there too
        expect(page.locator('[data-testid="stSliderThumbValue"]').first).to_have_text(before_value, timeout=30_000)
        settle(page)
        assert page.locator('[data-testid="stMain"]').inner_text() == before_main, title
    assert not page.errors, page.errors
    assert {shot for *_, shot in PAGES} <= {p.name for p in SHOTS.glob("*.png")}
    if os.environ.get("CKPT_VIZ_UPDATE_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        for *_, shot in PAGES:
            shutil.copy2(SHOTS / shot, DOCS_SHOTS / shot)
