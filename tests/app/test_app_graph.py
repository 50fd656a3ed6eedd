"""The graph page headless (AppTest): which snapshot it says it shows and where it was taken relative to the
cursor, torchviz's own view, big graphs collapsed by default (expand on request), zoom (Fit by default), a trace
without make_dot's drawing, and the excluded model's excluded regions; each graph an inert SVG image."""
from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.run.obtain import RunRequest, obtain_trace

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _graph_page(**state: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    at.switch_page("views/graph.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _svg(at: AppTest) -> str:
    """The page's one graph: an <img> whose source is the SVG as a data: URL (NOTE [ A graph is an image ])."""
    images = [(m.group(1), m.group(2), m.group(3)) for element in at.get("html")
              for m in re.finditer(r'<img class="ckpt-graph"[^>]*data-zoom="([^"]+)"[^>]*'
                                   r'src="data:image/svg\+xml;base64,([^"]+)" style="([^"]*)"', element.proto.body)]
    assert len(images) == 1 and not at.get("iframe")
    zoom, data, style = images[0]
    svg = base64.b64decode(data).decode("utf-8")
    width, height = _size(svg)
    if zoom == "fit":  # the whole graph in its frame: the browser shrinks it, never grows it
        assert "width:auto;height:auto;max-width:100%;max-height:" in style, style
    else:  # the image keeps the SVG's own size: 1 pt is 4/3 px
        assert f"width:{width * 4 / 3:.0f}px;height:{height * 4 / 3:.0f}px" in style, style
    assert "<script" not in svg and "<a " not in svg and "href" not in svg
    return svg


def _captions(at: AppTest) -> str:
    """The captions as the browser shows them: trace text written by `ui.text.md`, unescaped."""
    text = "\n".join(c.value for c in at.caption)
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text).replace("\u2060", "")


def _size(svg: str) -> tuple[float, float]:
    w, h = re.search(r'<svg [^>]*width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups()
    return float(w), float(h)


def test_the_page_says_which_snapshot_it_shows_and_zooms() -> None:
    trace = obtain_trace(RunRequest("builtin", "mlp", mode="split-reentrant"))
    first, last = trace.graphs[0], trace.graphs[-1]
    at = _graph_page()
    at.slider(key="cursor_slider").set_value(0).run()
    assert (f"Showing snapshot **{first.label}** ({len(first.nodes)} nodes), taken at seq {first.seq}, "
            f"{first.seq} seqs after the cursor (seq 0): none was taken by then. The regions are drawn in their "
            "states at the cursor (seq 0).") in _captions(at)
    at.button(key="cursor_last").click().run()
    end = trace.events[-1].seq
    assert (f"Showing snapshot **{last.label}** ({len(last.nodes)} nodes), taken at seq {last.seq}, "
            f"{end - last.seq} seqs before the cursor (seq {end}): the last one by then.") in _captions(at)
    assert at.select_slider(key="graph_zoom").value == "Fit"  # the default: the whole graph in its frame
    _svg(at)
    at.select_slider(key="graph_zoom").set_value(100).run()
    full = _size(_svg(at))
    at.select_slider(key="graph_zoom").set_value(50).run()
    half = _size(_svg(at))
    assert abs(half[0] - full[0] / 2) <= 1 and abs(half[1] - full[1] / 2) <= 1


def test_torchviz_view_is_make_dots_drawing_with_direction_and_its_own_legend() -> None:
    at = _graph_page()
    at.radio(key="graph_view").set_value("Plain autograd (torchviz)").run()
    svg = _svg(at)
    assert "AccumulateGrad" in svg and 'fill="lightblue"' in svg and "cluster" not in svg
    assert "torchviz.make_dot's style" in _captions(at) and "Region h<id>" not in _captions(at)
    assert "White box" not in _captions(at)
    assert not [t for t in at.toggle if t.key == "graph_expand"]  # Collapse is hidden, and says why
    assert "Collapse applies to the checkpoint view only" in _captions(at)
    tall = _size(svg)
    at.radio(key="graph_rankdir").set_value("LR").run()
    wide = _size(_svg(at))
    assert tall[1] > tall[0] and wide[0] > wide[1]


def test_a_big_graph_opens_collapsed_says_what_it_collapsed_and_expands_on_request() -> None:
    from ckpt_viz.render.graph import COLLAPSE_ABOVE, COLLAPSE_REGIONS_ABOVE, collapse_runs

    trace = obtain_trace(RunRequest("builtin", "transformer", mode="split-reentrant"))
    assert len(trace.graphs[-1].nodes) > COLLAPSE_ABOVE  # the snapshot before DW: every replay retained
    runs = collapse_runs(trace, None, collapse_above=COLLAPSE_ABOVE, collapse_regions_above=COLLAPSE_REGIONS_ABOVE)
    assert runs == [[1, 2]]  # h0 drawn in full, h1 and h2 as one node
    at = _graph_page(src_model="transformer")
    at.button(key="cursor_last").click().run()
    assert "Collapsed: h1–h2 (blocks.1 – blocks.2), 2 regions identical to h0, as one node." in _captions(at)
    svg = _svg(at)
    assert "Block x2" in svg and re.findall(r"<title>(cluster_h\d+)</title>", svg) == ["cluster_h0"]
    at.toggle(key="graph_expand").set_value(True).run()
    assert "Collapsed:" not in _captions(at)
    svg = _svg(at)
    assert "Block x" not in svg and len(re.findall(r"<title>cluster_h\d+</title>", svg)) == 3
    # A small graph is never collapsed: the same run's first snapshot (before DX).
    at.toggle(key="graph_expand").set_value(False).run()
    at.button(key="cursor_first").click().run()
    assert "Collapsed:" not in _captions(at) and "Block x" not in _svg(at)


def test_a_trace_without_make_dots_drawing_still_opens(tmp_path: Path) -> None:
    trace = obtain_trace(RunRequest("builtin", "mlp", mode="split-reentrant"))
    old = type(trace)(events=list(trace.events), memory=list(trace.memory), meta=dict(trace.meta),
                      graphs=[type(g)(seq=g.seq, label=g.label, nodes=g.nodes, edges=g.edges) for g in trace.graphs])
    path = tmp_path / "old.json"
    old.save(path)
    assert '"torchviz"' not in path.read_text()
    at = _graph_page(src_kind="Saved trace", src_trace_how="Path", src_trace_path=str(path))
    assert re.search(r"<title>cluster_h\d+</title>", _svg(at))  # the checkpoint view needs no make_dot
    at.radio(key="graph_view").set_value("Plain autograd (torchviz)").run()
    assert any("does not store torchviz's drawing" in i.value for i in at.info)
    assert not at.exception


def test_the_excluded_models_excluded_regions_are_drawn() -> None:
    """Default mode (split-reentrant): an excluded region is part of the retained replay, so it shows in the
    snapshot before DW, each LayerNorm boxed in its handle's region."""
    at = _graph_page(src_model="excluded")
    at.slider(key="cursor_slider").set_value(0).run()  # the snapshot before DX: no replay retained yet
    assert "This run has excluded regions, but none is in this snapshot" in _captions(at)
    at.button(key="cursor_last").click().run()
    assert "none is in this snapshot" not in _captions(at)
    svg = _svg(at)
    assert svg.count(">NativeLayerNormBackward0</text>") == 3  # one drawn node per region
    for region in range(3):
        assert f"excluded region {region} · kept, not recomputed" in svg


def test_a_refused_replay_is_marked_on_the_graph_from_its_refusal_on() -> None:
    """Broken run "second-backward": h0's replay is refused by the second backward; its region says so after that
    event, not before."""
    trace = obtain_trace(RunRequest("broken", "second-backward"))
    refusal = trace.of_kind("replay_refused")[0]
    at = _graph_page(src_kind="Broken runs to explore", src_broken="second-backward")
    at.button(key="cursor_last").click().run()
    assert len(re.findall(r">released · replay refused<", _svg(at))) == 1
    before = [i for i, e in enumerate(trace.events) if e.seq < refusal.seq][-1]
    at.slider(key="cursor_slider").set_value(before).run()
    assert "replay refused" not in _svg(at)
