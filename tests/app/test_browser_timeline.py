"""The Schedule timeline in a real browser: pick the built-in pipeline run (ZB-H1), open the timeline, walk the
cursor to a DW action and check the page says so, against the same run recorded here."""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import CHROMIUM, SHOTS, cursor_text, goto_page, screenshot, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def _pick(page, label: str, option: str) -> None:
    """Choose `option` in the sidebar selectbox labelled `label`."""
    box = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(
        has=page.locator("label").get_by_text(label, exact=True))
    box.scroll_into_view_if_needed()  # the sidebar is taller than the window: the lower boxes are below the fold
    box.locator("input").click()
    page.get_by_role("option", name=option, exact=True).click()
    settle(page, 120_000)


def test_timeline_walks_to_a_dw_action(browser_page) -> None:
    from playwright.sync_api import expect

    from ckpt_viz.analysis.actions import actions
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    page = browser_page
    _pick(page, "Built-in model", "pipeline")
    _pick(page, "Mode", "pipeline")
    _pick(page, "Schedule", "ZB-H1")
    goto_page(page, "Schedule timeline")
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text("Planned against executed order")).to_be_visible()
    assert main.locator('[data-testid="stVegaLiteChart"]').count() == 4  # timeline, stage memory, side by side

    trace = obtain_trace(RunRequest("builtin", "pipeline", mode="pipeline", schedule="ZB-H1", microbatches=4))
    dw = [a for a in actions(trace) if a.action == "DW"]
    main.get_by_role("button", name="Next F", exact=True).wait_for()
    first_button = main.get_by_role("button", name="First", exact=True)
    if first_button.is_enabled():  # the cursor may start at the first event already
        first_button.click()
        settle(page)
    main.get_by_role("button", name="Next DW", exact=True).click()
    settle(page)
    first = dw[0]
    expect(main.get_by_text(f"stage {first.stage} runs DW (weight grads) of micro-batch {first.microbatch}",
                            exact=False)).to_be_visible()
    assert int(cursor_text(page).replace(",", "")) == first.start_seq
    main.get_by_role("button", name="Next DW", exact=True).click()  # and on to the next one
    settle(page)
    second = dw[1]
    expect(main.get_by_text(f"stage {second.stage} runs DW (weight grads) of micro-batch {second.microbatch}",
                            exact=False)).to_be_visible()
    screenshot(page, SHOTS / "09_timeline.png")
    assert not page.errors, page.errors
