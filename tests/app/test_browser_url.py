"""The URL holds the view, in a real browser: the source, the page and the cursor survive a reload, open the same
view from a shared link in a new tab (a new session), and the back button returns to the views before.
Each view is read from what the browser shows (the page's heading, the sidebar's picker, the cursor's line).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from browser import CHROMIUM, cursor_text, goto_page, pick_option, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def _view(page) -> tuple[str, str, str, str, str]:
    """(page heading, source kind, model or broken run, mode, the cursor's event line) as the browser shows them."""
    sidebar = page.locator('[data-testid="stSidebar"]')
    heading = page.locator('[data-testid="stMain"] h1').first.inner_text()
    kind = sidebar.locator('[data-testid="stRadio"]').first.locator("input:checked").locator("xpath=../..").inner_text()
    boxes = sidebar.locator('[data-testid="stSelectbox"]')
    values = [boxes.nth(i).locator("input").input_value() for i in range(boxes.count())]
    line = page.locator('[data-testid="stCode"]').first.inner_text() if heading not in ("Glossary",) else ""
    return heading, kind.strip(), values[0] if values else "", values[1] if len(values) > 1 else "", line


def _choose(page, key: str, option: str) -> None:
    """Pick `option` in the sidebar selectbox of widget key `key`, and wait for the run."""
    pick_option(page, key, option)
    settle(page, 120_000)


def _step(page, key: str) -> None:
    before = cursor_text(page)
    page.locator(f".st-key-{key} button").click()
    page.wait_for_function(
        "b => document.querySelector('[data-testid=\"stSliderThumbValue\"]').innerText !== b", arg=before,
        timeout=30_000)
    settle(page)


def _back_to(page, expected: tuple) -> None:
    """Press back until the view is `expected`: once, or twice after a page change. Streamlit's navigation drops
    the query string when it changes page and the app writes the view back, so a page change may leave a history
    entry without parameters before the whole one (NOTE [ The URL holds the view ] in app/ui/url.py, rule 2): back
    onto it keeps the view shown, never another one."""
    shown = _view(page)
    for _ in range(2):
        page.go_back()
        settle(page, 120_000)
        now = _view(page)
        if now == expected:
            return
        assert now == shown, (now, shown, expected)  # the entry without parameters: the same view
    raise AssertionError(f"after two backs: {_view(page)} instead of {expected}")


def test_a_reload_a_link_and_the_back_button_show_the_same_views(browser_page, server) -> None:
    page = browser_page
    _choose(page, "src_model", "transformer")
    _choose(page, "src_mode", "reentrant")
    _step(page, "cursor_next_replay")
    overview = _view(page)
    assert overview[:4] == ("Overview", "Built-in model", "transformer", "reentrant"), overview
    assert "replay started" in overview[4]
    goto_page(page, "Handles")
    _step(page, "cursor_next")
    handles = _view(page)
    assert handles[0] == "Handles" and handles[4] != overview[4]
    url = page.url
    assert re.search(r"/handles\?", url) and "model=transformer" in url and "mode=reentrant" in url, url

    # 1. A reload: the same page, source and cursor.
    page.reload()
    settle(page, 120_000)
    assert _view(page) == handles and page.url == url

    # 2. The link opened in a new tab: a new session, which has seen nothing of this one.
    shared = page.context.new_page()
    try:
        shared.goto(url, timeout=60_000)
        settle(shared, 120_000)
        assert _view(shared) == handles
    finally:
        shared.close()

    # 3. Back: the cursor before the step, then the Overview at its cursor; forward again.
    _back_to(page, (*handles[:4], overview[4]))
    _back_to(page, overview)
    page.go_forward()
    settle(page, 120_000)
    assert _view(page)[0] == "Handles"

    # 4. A broken run and its cursor, through a page change and a reload.
    page.locator('[data-testid="stSidebar"]').get_by_text("Broken runs to explore", exact=True).click()
    settle(page, 120_000)
    _choose(page, "src_broken", "second-backward")
    _step(page, "cursor_next_refusal")
    goto_page(page, "Debugger")
    broken = _view(page)
    assert broken[1:3] == ("Broken runs to explore", "second-backward") and "replay refused" in broken[4], broken
    page.reload()
    settle(page, 120_000)
    assert _view(page) == broken
    assert page.locator('[data-testid="stException"]').count() == 0
    assert not page.errors, page.errors


def test_a_link_with_a_bad_value_opens_the_defaults_for_it(browser_page, server) -> None:
    """A value no widget offers (a model that does not exist, a mode a model lacks) is left out, as if absent."""
    page = browser_page
    page.goto(f"{server}/handles?model=nonesuch&mode=pipeline&cursor=5", timeout=60_000)
    settle(page, 120_000)
    heading, kind, model, mode, line = _view(page)
    assert (heading, kind, model, mode) == ("Handles", "Built-in model", "mlp", "split-reentrant")
    assert line.startswith("seq 5 · ")
    assert page.locator('[data-testid="stException"]').count() == 0
    assert not page.errors, page.errors
