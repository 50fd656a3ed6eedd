"""Compare in a real browser: two saved traces of a real model (the README's GPT-2 without and with checkpointing)
side by side, their differences stated, and every figure the page states equal to the analysis of the same files."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from browser import CHROMIUM, SHOTS, goto_page, screenshot, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

ROOT = Path(__file__).resolve().parent.parent.parent
BEFORE = "docs/examples/gpt2_no_checkpoint.json.gz"  # relative to the server's folder, the repository root
AFTER = "docs/examples/gpt2_checkpoint.json.gz"


def open_saved_trace(page, path: str) -> None:
    """Pick "Saved trace" by path in the sidebar and wait for the run."""
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Saved trace", exact=True).click()
    settle(page)
    sidebar.locator('[data-testid="stRadio"]').filter(has_text="Upload").get_by_text("Path", exact=True).click()
    settle(page)
    box = sidebar.get_by_label("Trace file path", exact=True)
    box.fill(path)
    box.press("Enter")
    settle(page, 120_000)


def table_rows(page, index: int) -> list[list[str]]:
    """The cells of the `index`-th table (st.table) of the page, row by row, header row left out."""
    table = page.locator('[data-testid="stMain"] [data-testid="stTable"]').nth(index)
    return [[c.strip() for c in row.split("\t")] for row in table.locator("tbody tr").all_inner_texts()]


def shown(element) -> str:
    return element.inner_text().replace("\u2060", "")


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
    text = shown(main)
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
