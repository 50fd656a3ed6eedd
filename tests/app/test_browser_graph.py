"""The graph page in a real browser: every node keeps its shape and every region its colour at every cursor stop.

The bug this guards: Streamlit's graphviz_chart animates from one graph to the next in the browser
(d3-graphviz), so stepping the cursor from one snapshot to another left nodes with `<polygon cx=
rx=>` and regions without their fill. The page now shows an SVG drawn on the server, as an image (a
data: URL, so nothing in it can run) made anew on every cursor move; this walks the default run
(default model, default mode) on the graph page with the default clicks (First, then Next replay
until there is none, then Last, which reaches every snapshot), decodes the image's SVG in the page at
each stop and checks that the browser drew it. It also checks that no request left the local server
during the whole walk, and that no iframe shows a graph.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from browser import CHROMIUM, goto_page, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

# What the page's SVG holds, read in the browser: per node its shape element and attributes, per region its fill.
_READ_SVG = """() => {
  const img = document.querySelector('img.ckpt-graph');
  if (!img || !img.complete || !img.naturalWidth) return null;  // the browser drew the image
  const text = new TextDecoder().decode(Uint8Array.from(atob(img.src.split(',')[1]), c => c.charCodeAt(0)));
  const svg = new DOMParser().parseFromString(text, 'image/svg+xml').documentElement;
  if (svg.tagName !== 'svg') return null;
  // A node's or region's first shape (inside the <g> that a tooltip wraps it in; its link is gone: NOTE [ Inert SVG ])
  const first = g => g.querySelector(':scope > polygon, :scope > ellipse, :scope > path, :scope > g > polygon,'
                                     + ' :scope > g > ellipse, :scope > g > path');
  const attrs = el => el ? Object.fromEntries([...el.attributes].map(a => [a.name, a.value])) : null;
  return {
    graph: img.dataset.graph,
    nodes: [...svg.querySelectorAll('g.node')].map(g => ({
      title: g.querySelector(':scope > title')?.textContent, tag: first(g)?.tagName, attrs: attrs(first(g))})),
    clusters: [...svg.querySelectorAll('g.cluster')].map(g => ({
      title: g.querySelector(':scope > title')?.textContent,
      label: [...g.querySelectorAll(':scope > text, :scope > g > text')].map(t => t.textContent).join(' '),
      tag: first(g)?.tagName, fill: first(g)?.getAttribute('fill')})),
  };
}"""
_NUMBER = r"-?\d+(\.\d+)?"


def _check_shape(node: dict, where: str) -> None:
    tag, attrs = node["tag"], node["attrs"]
    assert tag in ("polygon", "ellipse", "path"), f"{where}: node {node['title']} has no shape ({tag})"
    if tag == "polygon":
        assert not {"cx", "cy", "rx", "ry"} & set(attrs), f"{where}: {node['title']} polygon with ellipse attrs {attrs}"
        points = re.findall(rf"{_NUMBER},{_NUMBER}", attrs.get("points", ""))
        assert len(points) >= 3, f"{where}: {node['title']} polygon points {attrs.get('points')!r}"
    elif tag == "ellipse":
        assert "points" not in attrs, f"{where}: {node['title']} ellipse with points"
        for key in ("cx", "cy", "rx", "ry"):
            assert re.fullmatch(_NUMBER, attrs.get(key, "")), f"{where}: {node['title']} ellipse {key}={attrs.get(key)}"
    else:
        assert attrs.get("d", "").strip(), f"{where}: {node['title']} path without d"
    assert attrs.get("fill", "none") not in ("none", "", "transparent"), f"{where}: {node['title']} lost its fill"


def test_every_snapshot_keeps_its_shapes_and_colours_and_nothing_leaves_the_server(browser_page, server) -> None:
    from ckpt_viz.analysis.words import STATE_WORDS
    from ckpt_viz.catalog import DEFAULT_MODEL
    from ckpt_viz.render.graph import EXCLUDED_FILL, NODE_COLOURS, REGION_FILLS
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    page = browser_page
    trace = obtain_trace(RunRequest("builtin", DEFAULT_MODEL, mode="split-reentrant"))  # the app's default run
    node_count = {f"seq {g.seq}": len(g.nodes) for g in trace.graphs}
    word_fill = {word: REGION_FILLS[state] for state, word in STATE_WORDS.items()}
    node_fills = {c.lower() for c in NODE_COLOURS.values()} | {f.lower() for f in REGION_FILLS.values()}

    goto_page(page, "Autograd graph")
    stops, seen = [], set()

    def read(where: str) -> None:
        assert page.locator("img.ckpt-graph").count() == 1, f"{where}: not one graph image on the page"
        assert page.locator('[data-testid="stMain"] iframe').count() == 0, f"{where}: a frame on the page"
        svg = page.evaluate(_READ_SVG)
        assert svg is not None, f"{where}: no graph SVG on the page"
        snapshot = re.search(r"seq \d+$", svg["graph"]).group(0)
        seen.add(snapshot)
        assert len(svg["nodes"]) == node_count[snapshot], f"{where}: {len(svg['nodes'])} nodes drawn of {snapshot}"
        for node in svg["nodes"]:
            _check_shape(node, where)
            assert node["attrs"]["fill"].lower() in node_fills, f"{where}: {node['title']} fill {node['attrs']}"
        regions = [c for c in svg["clusters"] if c["title"].startswith("cluster_h")]
        assert len(regions) == len(trace.handle_ids()), f"{where}: regions {[c['title'] for c in svg['clusters']]}"
        for cluster in regions:
            assert cluster["tag"] in ("polygon", "path") and cluster["fill"], f"{where}: {cluster}"
            # "h<id> · <module>" over "<state>[ · replay refused]": the state is the label's last words
            label = cluster["label"].strip().removesuffix(" · replay refused")
            state = max((w for w in word_fill if label.endswith(" " + w)), key=len)
            assert cluster["fill"].lower() == word_fill[state].lower(), f"{where}: {cluster}"
        for cluster in svg["clusters"]:
            if cluster["title"].startswith("cluster_x"):
                assert cluster["fill"].lower() == EXCLUDED_FILL.lower(), f"{where}: {cluster}"
        stops.append(where)

    def click(key: str) -> bool:
        button = page.locator(f".st-key-{key} button")
        if button.is_disabled():
            return False
        before = page.locator('[data-testid="stSliderThumbValue"]').first.inner_text()
        button.click()
        page.wait_for_function(
            "b => document.querySelector('[data-testid=\"stSliderThumbValue\"]').innerText !== b", arg=before,
            timeout=30_000)
        settle(page)
        return True

    click("cursor_first")
    read("first")
    replays = 0
    while click("cursor_next_replay"):
        replays += 1
        read(f"next replay {replays}")
    assert replays == trace.count("replay_started")
    click("cursor_last")
    read("last")
    assert seen == set(node_count), f"snapshots shown {sorted(seen)}, recorded {sorted(node_count)}"
    assert not page.errors, page.errors
    outside = [url for url in page.requests
               if not url.startswith((server, "data:", "blob:", "about:"))]
    assert not outside, f"requests that left {server}: {outside[:10]}"
    assert not svg_links(page), "a graph kept a link"


def svg_links(page) -> list[str]:
    """Any <a>, href or script left in the graph image's SVG."""
    return page.evaluate("""() => {
      const img = document.querySelector('img.ckpt-graph');
      const text = new TextDecoder().decode(Uint8Array.from(atob(img.src.split(',')[1]), c => c.charCodeAt(0)));
      return [...text.matchAll(/<a[ >]|href=|<script/g)].map(m => m[0]);
    }""")
