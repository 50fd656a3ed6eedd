"""Charts, the event table and the cursor in a real browser; and no request leaves the local server.

Clicks the Memory chart, a row of the Events table and the Compare chart, and checks that the shared cursor
moved to the event under the click (read back from the slider and the cursor line), then
walks every page of the navigation and checks Playwright's request log: only the server's
own URLs (and data:, blob:, about:) were requested. Skipped when /usr/bin/chromium is missing.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from browser import CHROMIUM, cursor_text, goto_page, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]
LOCAL_SCHEMES = ("data:", "blob:", "about:")


def _cursor_seq(page) -> int:
    """The seq the cursor line names ("seq 31 · memory sampled · ...")."""
    line = page.locator('[data-testid="stCode"]').first.inner_text()
    match = re.match(r"seq (\d+) · ", line)
    assert match, line
    return int(match[1])


def _to_first_event(page) -> None:
    from playwright.sync_api import expect

    first = page.locator(".st-key-cursor_first button")
    if first.is_enabled():
        first.click()
    # the rerun starts after the click returns: wait for its result, then for the figures
    expect(page.locator('[data-testid="stSliderThumbValue"]').first).to_have_text("0", timeout=30_000)
    settle(page)


def _default_run():
    from ckpt_viz.catalog import DEFAULT_MODEL
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    return obtain_trace(RunRequest("builtin", DEFAULT_MODEL, mode="split-reentrant"))


def test_clicking_a_chart_and_an_event_row_moves_the_cursor(browser_page) -> None:
    from playwright.sync_api import expect

    page = browser_page
    trace = _default_run()  # recordings are deterministic: the same events as the app's run
    sample_seqs = {s.seq for s in trace.memory}
    seqs = [e.seq for e in trace.events]

    goto_page(page, "Memory")
    _to_first_event(page)
    chart = page.locator(".st-key-memory_chart")
    chart.scroll_into_view_if_needed()
    box = chart.bounding_box()
    picked = []
    for fraction in (0.35, 0.75):  # two clicks, left then right, in the plot's middle height
        before = cursor_text(page)
        page.mouse.click(box["x"] + box["width"] * fraction, box["y"] + box["height"] * 0.6)
        expect(page.locator('[data-testid="stSliderThumbValue"]').first).not_to_have_text(before, timeout=30_000)
        settle(page)
        seq = _cursor_seq(page)
        assert seq in sample_seqs, seq  # a click selects the memory sample drawn under the pointer
        assert int(cursor_text(page)) == seqs.index(seq)  # the slider moved to the same event
        picked.append(seq)
    assert 0 < picked[0] < picked[1], picked

    goto_page(page, "Events")
    _to_first_event(page)  # rows 0 .. 10: the cursor's event and ten after it
    grid = page.locator('[class*="st-key-ev_table"]')
    grid.scroll_into_view_if_needed()
    gbox = grid.bounding_box()
    row_height = (gbox["height"] - 38) / 11  # the page sizes the table to 38 px plus its 11 rows
    assert row_height >= 35, gbox
    row = 4
    page.mouse.click(gbox["x"] + 16, gbox["y"] + 38 + row_height * (row + 0.5) - 3)  # the row's selection box
    expect(page.locator('[data-testid="stSliderThumbValue"]').first).to_have_text(str(row), timeout=30_000)
    settle(page)
    assert _cursor_seq(page) == seqs[row]
    event = trace.events[row]  # the cursor line names the event's handle by its region, as drawn
    assert event.handle_id is not None, event
    from ckpt_viz.analysis.handles import handle_labels

    assert f"h{event.handle_id} {handle_labels(trace)[event.handle_id]} · " in \
        page.locator('[data-testid="stCode"]').first.inner_text()
    assert page.locator('[data-testid="stMain"]').get_by_text(f"showing 15 around seq {seqs[row]}").count() == 1

    # Compare lines runs up by part: a click in the middle of the DX band puts the cursor in this run's DX part.
    from ckpt_viz.analysis.passes import passes

    goto_page(page, "Compare", "Compare modes")
    chart = page.locator(".st-key-compare_chart")
    chart.scroll_into_view_if_needed()
    box = chart.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.6)
    expect(page.locator('[data-testid="stSliderThumbValue"]').first).not_to_have_text(str(row), timeout=30_000)
    settle(page)
    dx = next(s for s in passes(trace).spans if s.part == "DX")
    assert dx.start_seq <= _cursor_seq(page) < dx.end_seq, (_cursor_seq(page), dx)
    assert not page.errors, page.errors


def test_no_request_leaves_the_local_server_on_any_page(browser_page, server) -> None:
    page = browser_page
    nav = page.locator('[data-testid="stSidebarNav"]')
    labels = [link.inner_text().strip().splitlines()[-1] for link in nav.get_by_role("link").all()]  # after the icon
    assert {"Overview", "Memory", "Events", "Compare"} <= set(labels), labels
    for label in labels:
        nav.get_by_role("link", name=label, exact=True).click()
        settle(page)
        assert page.locator('[data-testid="stException"]').count() == 0, label
    page.reload()
    settle(page)
    outside = sorted({url for url in page.requests if not url.startswith((server, *LOCAL_SCHEMES))})
    assert not outside, outside
    assert any(url.startswith(server) for url in page.requests)
    assert not page.errors, page.errors
