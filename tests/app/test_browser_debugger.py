"""The Debugger page in a real browser: pick a broken run, open the Debugger, follow its finding to its event.

The finding's event is checked against the same broken run recorded here, independently of the app.
A screenshot goes to artifacts/screenshots/08_debugger.png.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import CHROMIUM, SHOTS, cursor_text, goto_page, screenshot, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def test_follow_a_finding_of_a_broken_run_to_its_event(browser_page) -> None:
    from playwright.sync_api import expect

    from ckpt_viz.analysis.diagnosis import diagnose
    from ckpt_viz.codes import DIAGNOSIS_CODES
    from ckpt_viz.run.broken import record_broken

    (expected,) = diagnose(record_broken("dx-after-dw"))
    page = browser_page
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Broken runs to explore", exact=True).click()
    settle(page, 120_000)
    expect(sidebar.get_by_text("See the Debugger page", exact=False)).to_be_visible()
    goto_page(page, "Debugger")
    main = page.locator('[data-testid="stMain"]')
    cause = DIAGNOSIS_CODES["released_by_dw"].cause
    expect(main.locator('[data-testid="stRadio"]').get_by_text(cause, exact=False)).to_be_visible()
    story = main.locator('[data-testid="stCode"]').filter(has_text="reason dw_complete").first
    expect(story).to_contain_text("backward_weight(loss, None, [w], handles=[h])")
    assert cursor_text(page) == "0"  # a new run: the cursor at its first event
    page.locator(".st-key-debug_goto button").click()
    settle(page)
    assert cursor_text(page) == str(expected.release_event.seq)  # positions are seqs in a broken run
    bar = main.locator('[data-testid="stCode"]').first
    expect(bar).to_contain_text("released")
    assert not page.errors, page.errors
    SHOTS.mkdir(parents=True, exist_ok=True)
    screenshot(page, SHOTS / "08_debugger.png")
