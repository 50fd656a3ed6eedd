"""The Lessons page in a real browser (Debian's chromium, a real `streamlit run` server): in every lesson that asks,
nothing of the run and no answer shows before the student picks one; a wrong pick shows the right answer, the
claim and the run's views. Lesson 1 walked to its end leads to the next lesson."""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import CHROMIUM, CHROMIUM_ARGS, ROOT, SHOTS, choose, screenshot, settle
from ckpt_viz.lessons.loader import load_lessons
from ckpt_viz.lessons.runner import show_step

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

LESSONS = load_lessons()
ASKED = [(lesson, next(i for i, s in enumerate(lesson.steps) if s.question)) for lesson in LESSONS]
RUN_VIEWS = ('[data-testid="stVegaLiteChart"], img.ckpt-graph, [data-testid="stDataFrame"], '
             '[data-testid="stTable"], [data-testid="stMetric"], [data-testid="stSlider"]')


@pytest.fixture(scope="module")
def chromium(server: str):
    """One headless chromium for the module; each test gets a fresh context of it (`lessons_page`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def lessons_page(chromium, server: str):
    """A fresh context (its own cookies, so its own Streamlit session) opened straight on the Lessons page.
    `lessons_page.errors` collects uncaught page errors."""
    from playwright.sync_api import expect

    context = chromium.new_context(viewport={"width": 1500, "height": 1000})
    try:
        page = context.new_page()
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        page.goto(f"{server}/lessons", timeout=60_000)
        expect(page.get_by_role("heading", name="Lessons", exact=True)).to_be_visible(timeout=120_000)
        settle(page, 120_000)
        yield page
    finally:
        context.close()


def _open(page, lesson, step: int) -> None:
    from playwright.sync_api import expect

    main = page.locator('[data-testid="stMain"]')
    name = f"{lesson.number}. {lesson.title}"
    choose(page, main.locator('.st-key-lesson_pick [data-testid="stSelectbox"]'), name)
    # the picked lesson's first step, not the page before the pick: a Next clicked before the rerun started
    # would step the lesson shown before (settle alone can look while the script has not started yet)
    expect(main.get_by_text(f"Step 1 of {len(lesson.steps)}: {lesson.steps[0].title}", exact=True)).to_be_visible(
        timeout=240_000)
    settle(page, 240_000)
    for n in range(step):
        main.get_by_role("button", name="Next", exact=True).click()
        # the step's runs record first (a Hugging Face model imports transformers): wait for the step itself
        expect(main.get_by_text(f"Step {n + 2} of {len(lesson.steps)}: ", exact=False)).to_be_visible(
            timeout=240_000)
        settle(page, 240_000)


@pytest.mark.parametrize(("lesson", "i"), ASKED, ids=[f"lesson{le.number:02d}" for le, _ in ASKED])
def test_no_answer_and_nothing_of_the_run_shows_before_the_student_answers(lessons_page, lesson, i: int) -> None:
    from playwright.sync_api import expect

    step = lesson.steps[i]
    page = lessons_page
    shown = show_step(lesson, step)  # choices are figures of the run's structure, the same in the server's run
    _open(page, lesson, i)
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text("Predict first", exact=False)).to_be_visible()
    # 1. Before an answer: no view of the run, no claim, no verdict, no explanation.
    assert main.locator(RUN_VIEWS).count() == 0, "a view of the run shows before the answer"
    text = main.inner_text()
    assert "Checked on the run" not in text and "Not quite" not in text and "Right." not in text
    # the explanation's words before its first figure, as the browser shows them (no markdown marks)
    static = step.question.explain.split("{", 1)[0].strip().replace("`", "").replace("**", "")
    assert not static or static not in text, static
    # 2. A wrong pick: the right answer, the explanation, the claim and the views that show why.
    wrong = next(k for k in range(len(shown.question.choices)) if k != step.question.answer)
    main.locator('[data-testid="stRadio"]').first.get_by_text(shown.question.choices[wrong], exact=True).click()
    verdict = main.locator('[data-testid="stAlertContentError"]').first
    expect(verdict).to_contain_text("Not quite: the answer is", timeout=120_000)
    settle(page, 240_000)
    expect(verdict).to_contain_text(shown.question.choices[step.question.answer])
    if static:
        expect(verdict).to_contain_text(static)
    expect(main.get_by_text("Checked on the run:", exact=False)).to_be_visible()
    # the views follow the verdict in the same script run: wait for them as for the verdict
    expect(main.locator(RUN_VIEWS).first, "the answer shows no view of the run").to_be_visible(timeout=120_000)
    _every_view_drawn(page, step)
    assert not page.errors, page.errors
    if lesson.number in (4, 8):
        SHOTS.mkdir(parents=True, exist_ok=True)
        screenshot(page, SHOTS / f"2{lesson.number // 4}_lesson{lesson.number:02d}.png")


# what each view of app/ui/lessonview.py draws, as the browser shows it (the charts on a canvas or an SVG)
DRAWN = {"memory": '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg',
         "lanes": '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg',
         "timeline": '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg',
         "stages": '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg',
         "curve": '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg',
         "graph": "img.ckpt-graph", "routing": "img.ckpt-graph",
         "events": '[data-testid="stCode"]:has-text("seq")',
         "cost": '[data-testid="stMetric"]:has-text("Recompute time")',
         "debugger": '[data-testid="stAlert"]'}


def _every_view_drawn(page, step) -> None:
    """Each view the step names is on the page under its title and drawn (a chart painted, a graph's image decoded,
    the events' text, the recompute metric, the Debugger's verdict), once per run shown (two where it compares)."""
    import sys

    from playwright.sync_api import expect

    sys.path.insert(0, str(ROOT / "app"))
    from ui.lessonview import VIEW_TITLES

    main = page.locator('[data-testid="stMain"]')
    runs = 2 if step.compare else 1
    assert "This run has nothing to draw here." not in main.inner_text()
    for name in step.views:
        titles = main.get_by_text(VIEW_TITLES[name], exact=True)
        expect(titles.nth(runs - 1), f"the {name} view's title").to_be_visible()
        wanted = runs * sum(1 for v in step.views if DRAWN[v] == DRAWN[name])
        # drawn after the script run: wait for the `wanted`-th (a view never drawn still fails, after the wait)
        expect(main.locator(DRAWN[name]).nth(wanted - 1), f"the {name} view is not drawn {wanted} time(s)"
               ).to_be_attached(timeout=60_000)
    images = main.locator("img.ckpt-graph")
    assert all(images.nth(k).evaluate("i => i.complete && i.naturalWidth > 0") for k in range(images.count()))


def test_walk_lesson_one_to_its_end_and_on_to_the_next_lesson(lessons_page) -> None:
    from playwright.sync_api import expect

    page = lessons_page
    lesson = LESSONS[0]
    _open(page, lesson, 0)
    main = page.locator('[data-testid="stMain"]')
    question = show_step(lesson, lesson.steps[0]).question
    main.get_by_text(question.choices[question.answer], exact=True).click()
    settle(page)
    expect(main.get_by_text("Right.", exact=False)).to_be_visible()
    expect(main.locator('[data-testid="stVegaLiteChart"]').first).to_be_visible()  # the step's memory view
    for n in range(2, len(lesson.steps) + 1):
        main.get_by_role("button", name="Next", exact=True).click()
        expect(main.get_by_text(f"Step {n} of {len(lesson.steps)}: {lesson.steps[n - 1].title}")).to_be_visible(
            timeout=240_000)
        settle(page)
    expect(main.get_by_role("link", name="See it on the Memory page")).to_be_visible()
    SHOTS.mkdir(parents=True, exist_ok=True)
    screenshot(page, SHOTS / "20_lessons.png")
    main.get_by_role("button", name=f"Next lesson: 2. {LESSONS[1].title}").click()
    expect(main.get_by_text(f"Step 1 of {len(LESSONS[1].steps)}: {LESSONS[1].steps[0].title}")).to_be_visible(
        timeout=240_000)
    assert not page.errors, page.errors
