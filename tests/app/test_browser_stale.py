"""While a run is slow, the page still dims what it showed before, in Chromium: after 0.5 s, down to Streamlit's
stale opacity by 1.5 s, and back at once when the run's result arrives (app/streamlit_app.py STALE_FADE: the same
dimming in three steps instead of a transition repainted at every frame).

The server is made slow by holding its WebSocket messages (Playwright's `route_web_socket`): the first two
messages after a click (the run started) go through, the rest wait about 2.2 s.
Skipped when /usr/bin/chromium is missing."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from browser import CHROMIUM, cursor_text, settle

# serial: the dimming is sampled against the wall clock (none before 0.4 s, dimmed after 1.7 s, in steps).
pytestmark = [pytest.mark.browser, pytest.mark.serial,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]
_HEADING_OPACITY = ("() => { const h = [...document.querySelectorAll('[data-testid=\"stMain\"] .stElementContainer')]"
                    ".find(e => e.innerText.trim() === 'Memory over the run');"
                    " return [getComputedStyle(h).opacity, h.getAttribute('data-stale')]; }")


def test_a_slow_run_dims_the_page_in_steps_and_undims_it_at_once(browser_page) -> None:
    from playwright.sync_api import expect

    page = browser_page
    held: list = []
    state = {"hold": False, "passed": 0}

    def route(ws) -> None:
        server = ws.connect_to_server()
        state["ws"] = ws

        def from_server(message) -> None:
            if state["hold"] and state["passed"] >= 2:
                held.append(message)
                return
            state["passed"] += state["hold"]
            ws.send(message)
        server.on_message(from_server)
        ws.on_message(lambda message: server.send(message))

    page.route_web_socket("**/_stcore/stream", route)
    page.reload()
    settle(page, 120_000)
    before = cursor_text(page)
    assert page.evaluate(_HEADING_OPACITY) == ["1", "false"]
    state["hold"] = True
    page.get_by_role("button", name="+1", exact=True).click()
    start = time.monotonic()
    samples: list[tuple[float, str, str]] = []
    while time.monotonic() - start < 2.2:
        samples.append((time.monotonic() - start, *page.evaluate(_HEADING_OPACITY)))
        page.wait_for_timeout(50)
    state["hold"] = False
    assert held, "no server message was held: the run was not slowed"
    for message in held:  # the run's result arrives
        state["ws"].send(message)
    expect(page.locator('[data-testid="stSliderThumbValue"]').first).to_have_text(str(int(before) + 1))
    settle(page)
    assert page.evaluate(_HEADING_OPACITY) == ["1", "false"]
    early = [float(o) for t, o, stale in samples if t < 0.4]
    late = [float(o) for t, o, stale in samples if t > 1.7]
    middle = {round(float(o), 2) for t, o, stale in samples if 0.6 < t < 1.5}
    assert early and min(early) == 1.0, samples  # no dimming in the first half second
    assert late and max(late) < 0.5 and all(s == "true" for t, o, s in samples if t > 1.7), samples  # dimmed
    assert len(middle) <= 4, samples  # in steps, not a transition sampled at every frame
