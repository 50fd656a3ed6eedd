"""A crafted trace, uploaded under a crafted file name, shows its text as text on every page of the app in a real
browser: it runs no script and makes no request off 127.0.0.1 (issue 25: "Trace text is markdown", "Script runs
in the app's origin").

The trace is a real recording of the default model whose every free text was replaced by payloads: a markdown image
pointing at another host (`![](http://127.0.0.2/...)`), an <img> whose onerror sets a marker, a <script> setting the
same marker, an HTML-like graph label (Graphviz's <FONT FACE>), a link, a code span that breaks out. The model's
and region's names, the description and "what to look at", tags, sites, the session id, error messages, a
graph's label, node names and torchviz's labels all carry them. After each page: the marker is unset, the request
log holds only the server's own URLs (and data:), no element from the payloads exists, and the payload text is
on the page as characters. Skipped when /usr/bin/chromium is missing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from browser import CHROMIUM, goto_page, settle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]

MARK = "window.__ckpt_pwned = 1"
IMAGE = "![x](http://127.0.0.2/md.png)"
HTML = f"<img src=x onerror=\"{MARK}\">"
SCRIPT = f"<script>{MARK}</script>"
FONT = '<<FONT FACE="x&quot; onload=&quot;1">f</FONT>>'
LINK = "[click](http://127.0.0.2/link) http://127.0.0.2/auto www.example.com a@b.cd"
TICKS = "`x` ``` :red[red] :material/home: $x^2$ **bold**"
PAYLOAD = f"{IMAGE} {HTML} {SCRIPT}"
NAME = f"{IMAGE} {SCRIPT}.json"  # the uploaded file's name
PAGES = ["Overview", "Autograd graph", "Memory", "Handles", "Debugger", "Routing (DX/DW)", "Schedule timeline",
         "Events", "Compare", "Glossary"]
TITLES = {"Compare": "Compare two runs"}  # a saved trace opens Compare on two runs


def crafted_trace(path: Path) -> None:
    """The default run with every free text a payload, as a trace file (read back by `Trace.load`, so valid)."""
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin
    from ckpt_viz.trace import Trace

    trace = run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True)
    doc = json.loads(trace.to_json())
    doc["meta"].update(model=f"model {PAYLOAD}", description=f"description {PAYLOAD} {LINK} {TICKS}",
                       look_at=f"look at {PAYLOAD} {FONT}")
    doc["meta"]["sources"] = {f"evil.py:{n}": f"line {PAYLOAD}" for n in range(1, 4)}
    for n, event in enumerate(doc["events"]):
        event["site"] = f"evil.py:{n % 3 + 1} {IMAGE}`"
        if event["kind"] == "handle_created":
            event["label"] = event["function"] = f"{IMAGE} {HTML} {FONT}"
        if event.get("handle_id") is not None:
            event["tags"] = {"stage": f"{IMAGE} {SCRIPT}", "microbatch": HTML, "action": "F", "note": LINK}
        if event.get("session_id") is not None:
            event["session_id"] = f"session {HTML}"
        if event["kind"] == "memory_sampled" and event.get("at"):
            event["at"] = f"at {PAYLOAD}"
    last = doc["events"][-1]
    doc["events"].append({"kind": "error", "seq": last["seq"] + 1, "t_ns": last["t_ns"] + 1, "handle_id": 0,
                          "where": f"where {PAYLOAD}", "type": f"Type{HTML}", "message": f"message {PAYLOAD} {TICKS}",
                          "site": f"evil.py:1 {IMAGE}`"})
    for graph in doc["graphs"]:
        graph["label"] = f"graph {PAYLOAD} {FONT}"
        for node in graph["nodes"]:
            node["name"] = f"{node['name']} {HTML} {FONT}"
        for node in graph["torchviz"]["nodes"]:
            node["label"] = f"{FONT} {HTML}\n{IMAGE}"
    path.write_text(json.dumps(doc))
    Trace.load(path)  # a valid trace: shown, not refused


def _upload(page, path: Path) -> None:
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Saved trace", exact=True).click()
    settle(page)
    sidebar.locator('input[type="file"]').set_input_files(
        {"name": NAME, "mimeType": "application/json", "buffer": path.read_bytes()})
    page.wait_for_function("() => document.querySelector('[data-testid=\"stMain\"]').innerText.includes('Overview')")
    settle(page, 120_000)


def shown(element) -> str:
    """The element's text as a person reads it: the invisible word joiners that keep links from forming gone
    (NOTE [ Text as text ] in app/ui/text.py)."""
    return element.inner_text().replace("\u2060", "")


def _check(page, server: str, where: str) -> None:
    assert page.evaluate("() => window.__ckpt_pwned") is None, f"{where}: a payload ran script"
    outside = sorted({u for u in page.requests if not u.startswith((server, "data:", "blob:", "about:"))})
    assert not outside, f"{where}: requests off the server: {outside}"
    main = page.locator('[data-testid="stApp"]')
    images = main.locator("img").evaluate_all("els => els.map(e => e.getAttribute('src'))")
    assert all(src.startswith(("data:", server, "/")) for src in images if src), f"{where}: images {images}"
    links = main.locator("a[href]").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert not [h for h in links if "127.0.0.2" in h or "example.com" in h or h.startswith("mailto:")], \
        f"{where}: links {links}"
    assert main.locator("script, iframe, font, [onerror], [onload]").count() == 0, f"{where}: an element of a payload"
    assert page.locator('[data-testid="stException"]').count() == 0, where
    assert not page.errors, (where, page.errors)


def test_a_crafted_trace_shows_as_text_on_every_page(browser_page, server, tmp_path: Path) -> None:
    page = browser_page
    path = tmp_path / "crafted.json"
    crafted_trace(path)
    _upload(page, path)
    main = page.locator('[data-testid="stMain"]')
    overview = shown(main)
    # the payloads are on the page as their characters
    assert f"description {PAYLOAD}" in overview, overview[:2000]
    assert f"look at {PAYLOAD}" in overview and "[click](http://127.0.0.2/link)" in overview
    assert ":red[red] :material/home: $x^2$ **bold**" in overview
    assert NAME in overview  # the uploaded file's name, as text
    _check(page, server, "Overview")
    page.locator(".st-key-cursor_last button").click()
    settle(page)
    for label in PAGES[1:]:
        goto_page(page, label, TITLES.get(label))
        _check(page, server, label)
        text = shown(main)
        if label == "Autograd graph":
            assert f"graph {PAYLOAD} {FONT}" in text  # the snapshot's label, in the note
            page.get_by_text("Plain autograd (torchviz)", exact=True).click()
            settle(page)
            _check(page, server, "Autograd graph (torchviz)")
            assert page.locator("img.ckpt-graph").count() == 1
        if label == "Debugger":
            assert f"message {PAYLOAD}" in text  # the error's message, in its story
            assert "evil.py:1 " + IMAGE + "`" in text  # the site, whole: it did not break out of a code span
        if label == "Events":  # the event at the cursor, every field, as text
            assert f"message=message {PAYLOAD}" in text and f"where=where {PAYLOAD}" in text
        if label == "Handles":  # the region's name, in the handle picker
            picker = main.locator('[data-testid="stSelectbox"]').first.locator("input").input_value()
            assert f"{IMAGE} {HTML} {FONT}" in picker, picker
    goto_page(page, "Overview")
    _check(page, server, "Overview again")
