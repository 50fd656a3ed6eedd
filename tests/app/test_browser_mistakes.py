"""The mistakes corpus on the Debugger page in a real browser (issue 28, "the Debugger page shows it").

One server, one chromium: a clean built-in run first (no finding, no error to jump to), then every saved trace
of tests/data/mistakes (rank files and merged ones, as the corpus has them) uploaded in turn. For each finding
`diagnose` gives, the page must show its code, its cause, its fix and the faulty call's line as the trace
recorded it; the cursor bar's "Next error" / "Next refusal" buttons and the finding's "Move the cursor" button
must agree with the list. The expected findings are computed here from the files, independently of the app.

The order (by name, rank files last) changes the run's event count at every upload, which is what the test
waits for after each one.
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import pairwise
from pathlib import Path

import pytest

from browser import CHROMIUM, ROOT, cursor_text, goto_page, settle, shown_text

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

CORPUS = ROOT / "tests" / "data" / "mistakes"
FINDINGS = '[class*="st-key-debug_finding_"]'  # the Debugger's picker: its key is per run (ui.runs.run_key)


def _wait_cursor(page, position: int) -> None:
    """Wait until the cursor bar shows `position`, then for the run to end."""
    page.wait_for_function("p => document.querySelector('[data-testid=\"stSliderThumbValue\"]')?.innerText === p",
                           arg=str(position), timeout=60_000)
    settle(page, 120_000)


def _wait_story(page, finding) -> None:
    """Wait until the page tells `finding`'s story (its first line names the handle and the cause)."""
    from playwright.sync_api import expect

    first = finding.explanation.splitlines()[0]
    story = page.locator('[data-testid="stMain"] [data-testid="stCode"]').filter(has_text=first)
    expect(story.first).to_be_visible(timeout=60_000)
    settle(page, 120_000)


def _words(text: str) -> str:
    return " ".join(text.split())


def _position(trace, seq: int) -> int:
    """The cursor position the app moves to for `seq`: the last event at or before it."""
    return max(bisect_right([e.seq for e in trace.events], seq) - 1, 0)


def _disabled(page, key: str) -> bool:
    return page.locator(f".st-key-{key} button").is_disabled()


def _check_finding(page, trace, f, *, chosen: bool) -> None:
    """The Debugger shows finding `f` (chosen in the list, or the first one of a new run)."""
    from ckpt_viz.codes import DIAGNOSIS_CODES

    main = page.locator('[data-testid="stMain"]')
    assert f.code in DIAGNOSIS_CODES and f.cause and f.fix
    error = _words(shown_text(main.locator('[data-testid="stAlertContentError"]').first))
    assert error == _words(f.cause), (f.code, error)
    info = _words(shown_text(main.locator('[data-testid="stAlertContentInfo"]').last))
    assert info == _words(f"Fix: {f.fix}"), (f.code, info)
    captions = [_words(shown_text(c)) for c in main.locator('[data-testid="stCaptionContainer"]').all()]
    assert f"Finding code: {f.code}" in captions, captions
    codes = [shown_text(c).strip() for c in main.locator('[data-testid="stCode"]').all()]
    if f.site is None:
        assert "Your line of code" not in shown_text(main), f.code
    else:
        line = trace.meta["sources"][f.site].strip()  # the corpus records the source of every site it blames
        assert f.site in codes and f"{f.site.rpartition(':')[2]}: {line}" in codes, (f.code, codes)
    # The cursor: choosing a finding moved it to its event; a new run's first finding waits for the button.
    assert f.seq is not None
    target = _position(trace, f.seq)
    if chosen or target == 0:
        assert int(cursor_text(page)) == target and _disabled(page, "debug_goto")
    else:
        assert cursor_text(page) == "0" and not _disabled(page, "debug_goto")
        page.locator(".st-key-debug_goto button").click()
        _wait_cursor(page, target)
        assert _disabled(page, "debug_goto")


def test_every_mistake_of_the_corpus_on_the_debugger(browser_page) -> None:
    from playwright.sync_api import expect

    from ckpt_viz import Trace
    from ckpt_viz.analysis.diagnosis import diagnose

    page = browser_page
    main = page.locator('[data-testid="stMain"]')
    # 1. The app's first run, a built-in model: nothing to debug, nothing to jump to.
    goto_page(page, "Debugger")
    expect(main.get_by_text("No problem found in this run", exact=False)).to_be_visible()
    assert main.locator(FINDINGS).count() == 0
    assert _disabled(page, "cursor_next_error") and _disabled(page, "cursor_next_refusal")
    first = int(main.locator('[data-testid="stSlider"]').inner_text().split(" to ")[1].split(")")[0]) + 1

    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Saved trace", exact=True).click()
    uploader = sidebar.locator('input[type="file"]')
    uploader.wait_for(state="attached", timeout=60_000)
    settle(page)
    # Rank files last: then each upload changes the run's event count, which the page shows when it has the run.
    traces = [(path, Trace.load(path)) for path in sorted(CORPUS.glob("*.json.gz"), key=lambda p: (".rank-" in p.name,
                                                                                                  p.name))]
    assert len(traces) >= 11
    counts = [first, *(len(t.events) for _, t in traces)]
    assert all(a != b for a, b in pairwise(counts)), counts
    seen_codes = set()
    for path, trace in traces:
        expected = diagnose(trace)
        uploader.set_input_files(str(path))
        slider = main.locator('[data-testid="stSlider"]').filter(has_text=f"(0 to {len(trace.events) - 1:,})")
        expect(slider).to_be_visible(timeout=60_000)
        settle(page, 120_000)
        assert page.locator('[data-testid="stException"]').count() == 0, path.name
        assert page.get_by_text("Connection error").count() == 0, path.name
        assert cursor_text(page) == "0", path.name  # a new run: the cursor at its first event
        # 2. The cursor bar's jumps agree with the list: an error or refusal to jump to is a finding on it.
        for button, kind in (("cursor_next_error", "error"), ("cursor_next_refusal", "replay_refused")):
            later = [e for e in trace.events[1:] if e.kind == kind]
            assert _disabled(page, button) == (not later), (path.name, button)
            for e in later:
                assert any(e in f.events or e.seq == f.seq for f in expected), (path.name, e)
        if not expected:
            expect(main.get_by_text("No problem found in this run", exact=False)).to_be_visible()
            assert main.locator(FINDINGS).count() == 0, path.name
            continue
        _wait_story(page, expected[0])
        assert "No problem found" not in shown_text(main), path.name
        options = main.locator(f'{FINDINGS} [data-testid="stRadioOption"]')
        assert options.count() == len(expected), path.name
        for i, f in enumerate(expected):
            assert _words(f.cause) in _words(shown_text(options.nth(i))), (path.name, i)
        assert options.nth(0).locator("input").is_checked(), path.name  # a new run starts at its first finding
        # 3. Each finding: its code, cause, fix and line; choosing it moves the cursor to its event.
        for i, f in enumerate(expected):
            if i:
                options.nth(i).click()
                _wait_story(page, f)
                _wait_cursor(page, _position(trace, f.seq))
            _check_finding(page, trace, f, chosen=i > 0)
            seen_codes.add(f.code)
        # 4. "Next error" from the finding's event lands on an error that a finding of the list names.
        if not _disabled(page, "cursor_next_error"):
            here = int(cursor_text(page))
            target = next(i for i, e in enumerate(trace.events) if i > here and e.kind == "error")
            page.locator(".st-key-cursor_next_error button").click()
            _wait_cursor(page, target)
            at = trace.events[target]
            assert any(at in f.events or at.seq == f.seq for f in expected), path.name
    assert not page.errors, page.errors
    assert {"trigger_missing_in_dw", "dw_skipped_handles", "released_by_ordinary_backward",
            "torch_reentrant_with_grad", "unasked_grads_accumulated", "error_raised", "run_partial"} <= seen_codes

