"""The Lessons page in a real browser: walk lesson 1 to its end with Next, answering its question first."""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import CHROMIUM, SHOTS, goto_page, screenshot, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def test_walk_lesson_one_to_its_end_answering_its_question(browser_page) -> None:
    from playwright.sync_api import expect

    from ckpt_viz.lessons.loader import load_lessons

    page = browser_page
    lesson = load_lessons()[0]
    goto_page(page, "Lessons")
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text(f"Step 1 of {len(lesson.steps)}: {lesson.steps[0].title}")).to_be_visible()
    question = lesson.steps[0].question
    expect(main.get_by_text(question.ask)).to_be_visible()
    expect(main.get_by_text("Predict first")).to_be_visible()  # no answer before a pick
    main.get_by_text(question.choices[question.answer], exact=True).click()
    settle(page)
    expect(main.get_by_text("Right.", exact=False)).to_be_visible()
    expect(main.locator('[data-testid="stVegaLiteChart"]').first).to_be_visible()  # the step's memory view
    expect(main.locator('[data-testid="stSliderThumbValue"]').first).to_be_visible()  # the shared cursor
    for n in range(2, len(lesson.steps) + 1):
        main.get_by_role("button", name="Next", exact=True).click()
        settle(page)
        expect(main.get_by_text(f"Step {n} of {len(lesson.steps)}: {lesson.steps[n - 1].title}")).to_be_visible()
    expect(main.get_by_text("End of the lesson.")).to_be_visible()
    expect(main.get_by_role("button", name="Next", exact=True)).to_have_count(0)
    SHOTS.mkdir(parents=True, exist_ok=True)
    screenshot(page, SHOTS / "20_lessons.png")
    assert not page.errors, page.errors
