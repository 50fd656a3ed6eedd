"""The Plan page in a real browser: a saved trace with a plan profile shows the trade-off curve and the
recommendation for a typed budget, word for word ckpt_viz.plan's for the same file and budget, and a built-in run
is profiled by the page's button."""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import CHROMIUM, SHOTS, goto_page, open_saved_trace, screenshot, settle, shown_text

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded transformer run (reentrant) with its plan profile."""
    from ckpt_viz.plan.profile import attach, profile_spec
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    trace = run_scenario(build_builtin("transformer"), "reentrant", memory=True)
    attach(trace, profile_spec(build_builtin("transformer")))
    path = tmp_path_factory.mktemp("plan") / "transformer_plan.json.gz"
    trace.save(path)
    return path


def _budget(page, text: str) -> None:
    box = page.locator('[data-testid="stMain"]').get_by_label("Memory budget", exact=True)
    box.fill(text)
    box.press("Enter")
    settle(page, 120_000)


def test_the_curve_and_the_planners_recommendation_for_a_budget(browser_page, saved: Path) -> None:
    from playwright.sync_api import expect

    from ckpt_viz.plan.schema import profile_of
    from ckpt_viz.plan.search import format_bytes, parse_bytes, recommend
    from ckpt_viz.plan.snippets import code
    from ckpt_viz.trace import Trace

    page = browser_page
    open_saved_trace(page, str(saved))
    goto_page(page, "Plan")
    main = page.locator('[data-testid="stMain"]')
    profile = profile_of(Trace.load(saved))
    whole = recommend(profile, 1 << 62, kind="reentrant")
    budget = format_bytes((whole.floor + whole.baseline.peak) / 2)
    _budget(page, budget)
    rec = recommend(profile, parse_bytes(budget), kind="reentrant")  # the trace's mode is the page's kind
    assert rec.prediction is not None and rec.prediction.peak <= parse_bytes(budget)  # it meets the budget
    assert rec.prediction.policy.blocks and len(rec.curve) >= 2
    # where the recompute comes from, for this profile (its replays were timed in runs of the model)
    assert all(b.replay_ns for b in profile.blocks)
    expect(main.get_by_text("the recompute is each block's replay as timed in runs of the model.",
                            exact=False)).to_be_visible()
    alert = main.locator('[data-testid="stAlertContentSuccess"]')
    expect(alert).to_have_count(1)
    assert shown_text(alert) == rec.words  # the planner's sentence for this file and budget, as it is
    chart = main.locator('[data-testid="stVegaLiteChart"]')
    expect(chart).to_have_count(1)
    assert chart.locator("canvas, svg").count() >= 1  # the curve is drawn
    text = shown_text(main)
    metric = main.locator('[data-testid="stMetric"]').filter(has_text="Predicted peak")
    assert shown_text(metric.locator('[data-testid="stMetricValue"]')) == format_bytes(rec.prediction.peak)
    assert f"{len(rec.curve)} points" in text
    code_block = main.locator('[data-testid="stCode"]')
    expect(code_block).to_have_count(1)
    assert code_block.inner_text().strip() == code(rec.prediction.policy, runtime="torch", comment=rec.words).strip()
    assert main.locator('[data-testid="stException"]').count() == 0
    screenshot(page, SHOTS / "13_plan.png")
    assert not page.errors, page.errors


def test_a_builtin_run_is_profiled_by_the_button(browser_page) -> None:
    from playwright.sync_api import expect

    from ckpt_viz.plan.search import parse_bytes

    page = browser_page  # the default source: the built-in mlp
    goto_page(page, "Plan")
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text("This run holds no plan profile", exact=False)).to_be_visible()
    main.get_by_role("button", name="Profile the model").click()
    expect(main.locator('[data-testid="stAlertContentSuccess"]')).to_have_count(1, timeout=180_000)
    settle(page, 180_000)
    words = shown_text(main.locator('[data-testid="stAlertContentSuccess"]'))
    peak, budget = words.split(": peak ", 1)[1].split(", budget ", 1)
    budget = budget.split(" (", 1)[0]
    assert parse_bytes(peak) <= parse_bytes(budget)  # the recommendation meets the budget it states
    assert main.locator('[data-testid="stVegaLiteChart"]').locator("canvas, svg").count() >= 1
    assert main.locator('[data-testid="stException"]').count() == 0
    assert not page.errors, page.errors
