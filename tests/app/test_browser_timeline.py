"""The Schedule timeline in a real browser: pick the built-in pipeline run (ZB-H1), open the timeline, walk the
cursor to a DW action and check the page says so, against the same run recorded here; its step time and bubble
per stage. A merged 2-rank trace (tests/data/distributed): step time and bubble per rank and stage on the
timeline, each rank's memory on the Memory page."""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import (
    CHROMIUM,
    SHOTS,
    cursor_text,
    goto_page,
    open_saved_trace,
    screenshot,
    settle,
    shown_text,
    table_rows,
)

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


def _bubbles_shown(page, trace, word: str) -> None:
    """The page states the step time and every bubble as the analysis of `trace` does (an in-process run recorded
    here again: its ticks, not its wall-clock time, which no two recordings share)."""
    import re

    from ckpt_viz.analysis.actions import bubble_lines, bubble_rows

    main = page.locator('[data-testid="stMain"]')
    main.get_by_role("heading", name="Step time and bubbles", exact=True).scroll_into_view_if_needed()

    def ticks_only(text: str) -> str:
        return re.sub(r" \([^()]* recorded\)", "", text)

    line = bubble_lines(trace)[0]
    assert ticks_only(line) in ticks_only(shown_text(main)), line
    rows = [[str(v) for v in r.values()] for r in bubble_rows(trace)]
    assert table_rows(page, 0) == rows
    assert any(r[0].startswith(f"{word} ") for r in rows) and all(r[3].endswith("%") for r in rows)


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
    # the timeline, the memory per stage on its x, the bubbles, and two schedules side by side
    assert main.locator('[data-testid="stVegaLiteChart"]').count() == 5

    trace = obtain_trace(RunRequest("builtin", "pipeline", mode="pipeline", schedule="ZB-H1", microbatches=4))
    _bubbles_shown(page, trace, "stage")
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
    screenshot(page, SHOTS / "09_timeline_in_process.png")
    assert not page.errors, page.errors


def test_a_merged_two_rank_trace_shows_its_bubbles_and_each_ranks_memory(browser_page) -> None:
    """docs/examples/zbv_2_ranks.json.gz: a real 2-rank ZBVZeroBubble run of two steps, merged
    (docs/examples/make.py)."""
    from playwright.sync_api import expect

    from ckpt_viz.analysis.actions import bubbles
    from ckpt_viz.analysis.memory import rank_memory
    from ckpt_viz.analysis.words import format_bytes
    from ckpt_viz.trace import Trace

    path = "docs/examples/zbv_2_ranks.json.gz"  # relative to the server's folder, the repository root
    trace = Trace.load(Path(__file__).resolve().parent.parent.parent / path)
    assert [s.step for s in bubbles(trace).steps] == [0, 1] and trace.meta["distributed"]["world_size"] == 2
    page = browser_page
    open_saved_trace(page, path)
    goto_page(page, "Schedule timeline")
    main = page.locator('[data-testid="stMain"]')
    _bubbles_shown(page, trace, "rank")
    rows = table_rows(page, 0)
    assert [r[0] for r in rows] == ["rank 0", "rank 1", "stage 0", "stage 1", "stage 2", "stage 3"]
    assert "upper bound" not in shown_text(main)  # every action has its start and end events
    screenshot(page, SHOTS / "09_timeline.png")  # the README's bubble figures: per rank and stage of a real run

    goto_page(page, "Memory")
    ranks = rank_memory(trace)
    picker = main.locator('[data-testid="stRadio"]').filter(has_text="every rank (summed)")
    expect(picker).to_be_visible()
    each = {r[0]: r[1:] for r in table_rows(page, 0)}
    assert {k: v[1] for k, v in each.items()} == {f"rank {r}": format_bytes(f.peak.total) for r, f in ranks.items()}
    assert main.locator('[data-testid="stVegaLiteChart"]').count() == 2  # the memory chart and the small multiples
    picker.get_by_text("rank 1", exact=True).click()
    settle(page)
    peak = main.locator('[data-testid="stMetric"]').filter(has_text="Total at the peak")
    expect(peak).to_contain_text(format_bytes(ranks[1].peak.total))
    assert main.locator('[data-testid="stException"]').count() == 0
    assert not page.errors, page.errors
