"""A graph that shows its subject, in a real browser: at the default zoom (Fit) a checkpoint region lies inside the
graph frame's visible area, for the built-in transformer in reentrant mode and for a 32-layer Hugging Face Llama
(tests/data/models/llama32.py, run as a model file in the sandbox) in reentrant and non-reentrant mode; its regions
are named by handle and module (`h3 · model.layers.3`); the run of identical layers is collapsed by default; and every
page that shows a graph (the graph page, the Debugger, Routing, the Lessons) offers the zoom, Fit first.

Where a region is on the screen is computed from what the browser shows: the image's box and its frame's box
(getBoundingClientRect) and the SVG the image holds (its viewBox, the graph's transform and each region's outline).
"""
from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from browser import CHROMIUM, choose, goto_page, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

LLAMA = "tests/data/models/llama32.py:make_model"
_RECTS = """() => {
  const img = document.querySelector('img.ckpt-graph'), box = img.closest('.ckpt-graph-box');
  const r = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  return {img: r(img), box: r(box), viewport: [0, 0, window.innerWidth, window.innerHeight], src: img.src,
          zoom: img.dataset.zoom};
}"""
_PAIR = re.compile(r"(-?\d+(?:\.\d+)?)[, ](-?\d+(?:\.\d+)?)")


def _regions_on_screen(page) -> dict[str, tuple[float, float, float, float]]:
    """Each checkpoint region's outline on the screen (left, top, right, bottom in CSS px), from the image's SVG."""
    shown = page.evaluate(_RECTS)
    svg = base64.b64decode(shown["src"].split(",", 1)[1]).decode("utf-8")
    view = [float(v) for v in re.search(r'viewBox="([^"]+)"', svg)[1].split()]
    transform = re.search(r'<g id="graph0" class="graph" transform="([^"]+)"', svg)[1]
    scale = float(re.search(r"scale\(([\d.]+)", transform)[1])
    tx, ty = (float(v) for v in re.search(r"translate\((-?[\d.]+) (-?[\d.]+)\)", transform).groups())
    left, top, right, bottom = shown["img"]
    sx, sy = (right - left) / view[2], (bottom - top) / view[3]
    out = {}
    for title, body in re.findall(r'<g id="clust\d+" class="cluster">\s*<title>(cluster_h\d+)</title>(.*?)</g>', svg,
                                  re.S):
        outline = re.search(r'\s(?:points|d)="([^"]+)"', body)[1]
        points = [(float(x) * scale + tx, float(y) * scale + ty) for x, y in _PAIR.findall(outline)]
        xs, ys = [left + (x - view[0]) * sx for x, _ in points], [top + (y - view[1]) * sy for _, y in points]
        out[title] = (min(xs), min(ys), max(xs), max(ys))
    return out


def _visible_area(page) -> tuple[float, float, float, float]:
    shown = page.evaluate(_RECTS)
    box, viewport = shown["box"], shown["viewport"]
    return max(box[0], viewport[0]), max(box[1], viewport[1]), min(box[2], viewport[2]), min(box[3], viewport[3])


def _regions_in_view(page) -> list[str]:
    """The regions wholly inside the graph frame's visible area, once the frame is scrolled into the window."""
    page.locator(".ckpt-graph-box").first.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    x0, y0, x1, y1 = _visible_area(page)
    return [t for t, (a, b, c, d) in _regions_on_screen(page).items()
            if a >= x0 - 1 and b >= y0 - 1 and c <= x1 + 1 and d <= y1 + 1 and c > a and d > b]


def _svg(page) -> str:
    return base64.b64decode(page.evaluate(_RECTS)["src"].split(",", 1)[1]).decode("utf-8")


def _zoom(page) -> str:
    """The value the graph's zoom slider shows."""
    return page.locator('[data-testid="stMain"] [data-testid="stSlider"]').filter(has_text="Zoom").locator(
        '[data-testid="stSliderThumbValue"]').first.inner_text()


def test_the_transformers_regions_are_in_view_at_the_default_zoom(browser_page, server) -> None:
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    trace = obtain_trace(RunRequest("builtin", "transformer", mode="reentrant"))
    page = browser_page
    page.goto(f"{server}/graph?model=transformer&mode=reentrant&cursor=0", timeout=60_000)
    settle(page, 120_000)
    assert _zoom(page) == "Fit" and page.evaluate(_RECTS)["zoom"] == "fit"
    inside = _regions_in_view(page)
    assert inside, f"no region in view: {_regions_on_screen(page)} in {_visible_area(page)}"
    assert len(inside) == len({e.handle_id for e in trace.of_kind("handle_created")}) == 3  # every block
    for h in range(3):
        assert f">h{h} · blocks.{h}</text>" in _svg(page)
    # At 300 % the graph is wider than its frame (the frame scrolls): not every region is in view any more.
    thumb = page.locator('.st-key-graph_zoom input[type="range"]').first
    thumb.focus()
    thumb.press("End")
    settle(page)
    assert _zoom(page) == "300%" and len(_regions_in_view(page)) < 3
    assert not page.errors, page.errors


@pytest.mark.parametrize("mode", ["reentrant", "nonreentrant"])
def test_a_32_layer_hugging_face_model_opens_collapsed_with_a_region_in_view(browser_page, server, mode) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.goto(f"{server}/graph?file={LLAMA}&mode={mode}&cursor=0", timeout=60_000)
    expect(page.locator("img.ckpt-graph")).to_be_visible(timeout=240_000)  # the sandbox imports transformers
    settle(page, 120_000)
    assert _zoom(page) == "Fit"
    svg = _svg(page)
    # Collapsed by default: the layers that differ (the first reads the embedding) and the first of the identical
    # run drawn in full, the rest of the run as one node.
    drawn = re.findall(r"<title>cluster_h(\d+)</title>", svg)
    (block,) = re.findall(r">Block x(\d+)</text>", svg)
    assert int(block) >= 29 and len(drawn) + int(block) == 32, (drawn, block)
    first, last = 32 - int(block), 31
    assert f">model.layers.{first} – model.layers.{last}</text>" in svg
    for h in map(int, drawn):
        assert f">h{h} · model.layers.{h}</text>" in svg
    assert _regions_in_view(page), (_regions_on_screen(page), _visible_area(page))
    main = page.locator('[data-testid="stMain"]')
    expect(main).to_contain_text(f"Collapsed: h{first}–h{last} (model.layers.{first} – model.layers.{last}), "
                                 f"{block} regions identical to h{first - 1}")
    # Expanded on request: 32 regions, still fitted to the frame, the first in view.
    before = page.locator("img.ckpt-graph").first.get_attribute("src")
    main.get_by_role("switch", name="Expand repeated blocks").check(force=True)
    page.wait_for_function("b => { const i = document.querySelector('img.ckpt-graph'); return i && i.src !== b; }",
                           arg=before, timeout=120_000)  # dot lays out the whole graph: seconds
    settle(page, 120_000)
    assert len(re.findall(r"<title>cluster_h\d+</title>", _svg(page))) == 32
    assert _regions_in_view(page), (_regions_on_screen(page), _visible_area(page))
    assert page.locator('[data-testid="stException"]').count() == 0
    assert not page.errors, page.errors


def test_every_graph_has_its_zoom_fit_first(browser_page, server) -> None:
    page = browser_page
    # Routing, in the DW pass of the default run (its last event).
    page.goto(f"{server}/routing?cursor=999999", timeout=60_000)
    settle(page, 120_000)
    assert _zoom(page) == "Fit" and page.evaluate(_RECTS)["zoom"] == "fit"
    # The Debugger's graph of the broken run's handle.
    page.goto(f"{server}/debugger?broken=dx-after-dw", timeout=60_000)
    settle(page, 120_000)
    page.locator('[data-testid="stMain"] [data-testid="stExpander"]').filter(has_text="Autograd graph").click()
    settle(page)
    assert _zoom(page) == "Fit" and _regions_in_view(page)
    # A lesson's graph.
    goto_page(page, "Lessons")
    from ckpt_viz.lessons.loader import load_lessons

    lesson = next(le for le in load_lessons() if any("graph" in step.views for step in le.steps))
    choose(page, page.locator('[data-testid="stMain"] .st-key-lesson_pick [data-testid="stSelectbox"]'),
           f"{lesson.number}. {lesson.title}")
    settle(page, 120_000)
    step = next(i for i, s in enumerate(lesson.steps) if "graph" in s.views)
    for _ in range(step):
        page.locator('[data-testid="stMain"]').get_by_role("button", name="Next", exact=True).click()
        settle(page, 120_000)
    assert page.locator("img.ckpt-graph").count() >= 1
    assert _zoom(page) == "Fit"
    assert page.locator('[data-testid="stException"]').count() == 0
    assert not page.errors, page.errors
