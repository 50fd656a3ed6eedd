"""Compare in a real browser: two saved traces of a real model (the README's GPT-2 without and with checkpointing)
side by side, their differences stated, and every figure the page states equal to the analysis of the same files."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from browser import CHROMIUM, SHOTS, goto_page, open_saved_trace, screenshot, settle, shown_text, table_rows

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

ROOT = Path(__file__).resolve().parent.parent.parent
BEFORE = "docs/examples/gpt2_no_checkpoint.json.gz"  # relative to the server's folder, the repository root
AFTER = "docs/examples/gpt2_checkpoint.json.gz"


def test_two_saved_traces_side_by_side_with_their_differences(browser_page) -> None:
    from playwright.sync_api import expect

    from ckpt_viz.analysis.compare import compare
    from ckpt_viz.analysis.words import category_word, format_bytes
    from ckpt_viz.trace import Trace

    page = browser_page
    open_saved_trace(page, BEFORE)
    goto_page(page, "Compare", "Compare two runs")
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text("Pick the run to compare this one with", exact=False)).to_be_visible()
    partner = main.get_by_label("Trace file path", exact=True)
    partner.fill(AFTER)
    partner.press("Enter")
    expect(main.get_by_role("heading", name="What differs", exact=True)).to_be_visible(timeout=60_000)
    settle(page)

    a, b = Trace.load(ROOT / BEFORE), Trace.load(ROOT / AFTER)
    c = compare(a, b, (Path(BEFORE).name, Path(AFTER).name))
    text = shown_text(main)
    assert len(c.differences) >= 4
    for d in c.differences:  # every sentence, as the analysis words it from the two files
        assert d.sentence in text, d.sentence
    assert c.b.summary.peak.total < c.a.summary.peak.total  # checkpointing lowers this model's peak, and it says so
    assert f"{Path(AFTER).name} peaks at {format_bytes(c.b.summary.peak.total)}" in text and " lower than " in text
    figures = {row[0]: row[1:] for row in table_rows(page, 0)}
    sa, sb = c.a.summary, c.b.summary
    assert figures["events"] == [str(sa.events), str(sb.events)]
    assert figures["checkpoint regions"] == [str(sa.handles), str(sb.handles)]
    assert figures["replays"] == [str(sa.replays), str(sb.replays)]
    assert figures["released"] == [str(sa.released), str(sb.released)]
    assert figures["peak"] == [format_bytes(sa.peak.total), format_bytes(sb.peak.total)]
    by_part = table_rows(page, 1)
    assert [row[0] for row in by_part] == ["forward", "full backward"]
    assert [row[1] for row in by_part] == [str(c.a.part(p).events) for p in ("F", "B")]
    categories = {row[0]: row[1:3] for row in table_rows(page, 2)}
    assert categories == {category_word(r.category): [format_bytes(r.a), format_bytes(r.b)] for r in c.categories}
    # the partner is in the URL
    assert parse_qs(urlparse(page.url).query).get("vs") == [f"trace:{AFTER}"]
    assert main.locator('[data-testid="stException"]').count() == 0
    sources = page.locator('[data-testid="stSidebar"] [data-testid="stRadio"]').filter(has_text="Built-in model")
    assert sources.count() == 1  # the source picker is still there
    screenshot(page, SHOTS / "07_compare.png")
    assert not page.errors, page.errors


def test_a_link_with_vs_opens_compare_on_that_partner(browser_page, server) -> None:
    """A shared link: /compare?vs=builtin:mlp:none compares the sidebar's run (the default: mlp, split-reentrant)
    with mlp run without checkpointing, and says what the analysis of those two runs says."""
    from playwright.sync_api import expect

    from ckpt_viz.analysis.compare import compare
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    page = browser_page
    page.goto(f"{server}/compare?vs=builtin:mlp:none", timeout=60_000)
    settle(page, 120_000)
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_role("heading", name="Compare two runs", exact=True)).to_be_visible(timeout=60_000)
    expect(main.get_by_role("heading", name="What differs", exact=True)).to_be_visible(timeout=60_000)
    settle(page)
    assert main.get_by_role("radio", name="Built-in run", exact=True).is_checked()
    a = obtain_trace(RunRequest("builtin", "mlp", mode="split-reentrant"))
    b = obtain_trace(RunRequest("builtin", "mlp", mode="none"))
    c = compare(a, b, ("mlp · split-reentrant", "mlp · none"))
    text = shown_text(main)
    for d in c.differences:
        if d.topic not in ("bubble", "step"):  # (no pipeline here: none of those)
            assert d.sentence in text, d.sentence
    assert parse_qs(urlparse(page.url).query).get("vs") == ["builtin:mlp:none"]
    assert main.locator('[data-testid="stException"]').count() == 0
    assert not page.errors, page.errors


def test_a_crafted_trace_compared_and_its_bubbles_show_its_text_as_text(browser_page, server, tmp_path) -> None:
    """A trace whose labels, names and stage tags are markdown, HTML and script (tests/app/test_browser_hostile.py)
    beside a built-in run: its text is shown as its characters in the sentences and tables of Compare and in the
    timeline's bubble table; nothing runs, nothing is fetched."""
    from playwright.sync_api import expect
    from test_browser_hostile import IMAGE, MARK, NAME, crafted_trace

    from ckpt_viz.analysis.actions import bubble_rows
    from ckpt_viz.trace import Trace

    path = tmp_path / "crafted.json"
    crafted_trace(path)
    page = browser_page
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Saved trace", exact=True).click()
    settle(page)
    sidebar.locator('input[type="file"]').set_input_files(
        {"name": NAME, "mimeType": "application/json", "buffer": path.read_bytes()})
    expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible(timeout=120_000)
    settle(page, 120_000)
    goto_page(page, "Compare", "Compare two runs")
    main = page.locator('[data-testid="stMain"]')
    main.get_by_text("Built-in run", exact=True).click()
    expect(main.get_by_role("heading", name="What differs", exact=True)).to_be_visible(timeout=120_000)
    settle(page)
    text = shown_text(main)
    assert f"A = {NAME} (the sidebar's run)" in text  # the uploaded file's name, as its characters
    assert f"{NAME} replays " in text
    goto_page(page, "Schedule timeline")
    lanes = [row[0] for row in table_rows(page, 0)]
    assert lanes == [row[""] for row in bubble_rows(Trace.load(path))] and any(IMAGE in lane for lane in lanes)
    assert page.evaluate("() => window.__ckpt_pwned") is None, MARK
    outside = sorted({u for u in page.requests if not u.startswith((server, "data:", "blob:", "about:"))})
    assert not outside, outside
    assert main.locator("img[src*='127.0.0.2']").count() == 0 and main.locator("a[href*='127.0.0.2']").count() == 0
    assert not page.errors, page.errors
