"""render_graph / render_torchviz_view / collapse_runs / dot_svg: the graphs of hand-built snapshots (clusters,
labels, colours, collapse, refused and highlighted handles, excluded regions), the states as the trace's lifecycle
gives them at the cursor, trace text drawn as its characters, and the SVG the `dot` binary draws of it.

The DOT is checked as text and then laid out by Graphviz (`dot -Tsvg`) to prove it is valid.
"""
from __future__ import annotations

import re
from xml.etree import ElementTree

import pytest

from ckpt_viz.analysis.lifecycle import refused_handles, region_states
from ckpt_viz.analysis.words import state_word
from ckpt_viz.render import palette
from ckpt_viz.render.graph import (
    EDGE_COLOURS,
    EXCLUDED_FILL,
    GRAPH_LEGEND,
    NODE_COLOURS,
    REGION_FILLS,
    TORCHVIZ_LEGEND,
    collapse_runs,
    render_graph,
    render_torchviz_view,
)
from ckpt_viz.render.svg import dot_svg
from ckpt_viz.trace import GraphSnapshot, TorchvizEdge, TorchvizGraph, TorchvizNode, Trace
from ckpt_viz.vocabulary import STATES
from traces import block_snapshot, refused_trace, snapshot_of, split_trace, with_states

_ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s\]]+)')


def _attrs(text: str) -> dict[str, str]:
    """A DOT attribute list's values, unquoted (escapes kept)."""
    return {k: v[1:-1] if v.startswith('"') else v for k, v in _ATTR.findall(text)}


def _nodes(dot: str) -> dict[str, dict[str, str]]:
    """node id -> its attributes, for every node statement (`n3 [...]`, `block0 [...]`)."""
    return {m.group(1): _attrs(m.group(2)) for m in re.finditer(r"^\s*(n\d+|block\d+) \[(.*)\]$", dot, re.M)}


def _edges(dot: str) -> dict[str, dict[str, str]]:
    return {m.group(1): _attrs(m.group(2)) for m in re.finditer(r"^\s*(\w+ -> \w+) \[(.*)\]$", dot, re.M)}


def _cluster(dot: str, name: str) -> str:
    """The text of `subgraph <name> {...}` (its nested subgraphs included)."""
    start = dot.index(f"subgraph {name} {{")
    depth, i = 0, start
    while True:
        if dot[i] == "{":
            depth += 1
        elif dot[i] == "}":
            depth -= 1
            if depth == 0:
                return dot[start:i + 1]
        i += 1


def _cluster_attrs(dot: str, name: str) -> dict[str, str]:
    return _attrs(_cluster(dot, name).splitlines()[1])


def _svg(dot: str) -> str:
    return dot_svg(dot)


def _graph(snapshot: GraphSnapshot, states: dict[int, str] | None = None, *, refused: tuple[int, ...] = (),
           seq: int | None = None, **options) -> str:
    trace = with_states(snapshot, states or {}, refused=refused) if states or refused else Trace(graphs=[snapshot])
    return render_graph(trace, seq, **options).source


def test_regions_become_clusters_labelled_with_their_state() -> None:
    dot = _graph(block_snapshot(2, replay=True), {0: "replayed", 1: "released"})
    h0, h1 = _cluster_attrs(dot, "cluster_h0"), _cluster_attrs(dot, "cluster_h1")
    # Each region is named by its handle and what it checkpointed (analysis.handles.handle_labels), over its state.
    assert h0["label"] == "h0 · Block.forward\\nreplayed" and h0["fillcolor"] == REGION_FILLS["replayed"]
    assert h1["label"] == "h1 · Block.forward\\nreleased" and h1["style"] == "filled,dashed"
    # Inside h0: its checkpoint node and its retained replay; its trigger and dummy input stay outside.
    inside = _nodes(_cluster(dot, "cluster_h0"))
    labels = {a["label"] for a in inside.values()}
    assert "_CheckpointBackward\\nh0 · DX" in labels and "blocks.0.weight\\n(4, 4)" in labels
    assert "AddmmBackward0" in labels and "trigger h0" not in labels
    assert "trigger h0" in {a["label"] for a in _nodes(dot).values()}
    assert "<svg" in _svg(dot)


def test_the_states_are_the_lifecycles_at_the_cursor() -> None:
    snapshot = block_snapshot(2, replay=True)
    trace = with_states(snapshot, {0: "released", 1: "retained"})
    assert region_states(trace, snapshot, None) == {1: "retained", 0: "released"}
    assert region_states(trace, snapshot, 0) == {1: "not_created", 0: "recorded"}
    early = render_graph(trace, 0).source
    assert _cluster_attrs(early, "cluster_h0")["label"] == "h0 · Block.forward\\nrecorded"
    assert _cluster_attrs(early, "cluster_h1")["label"] == "h1 · Block.forward\\nnot created yet"


def test_without_events_a_region_existed_before_the_recording() -> None:
    assert _cluster_attrs(_graph(block_snapshot(1)), "cluster_h0")["label"] == "h0\\nrecorded"  # no name known
    assert _cluster_attrs(_graph(block_snapshot(1, replay=True)), "cluster_h0")["label"] == "h0\\nretained"


def test_node_kinds_are_told_apart_by_shape_and_colour() -> None:
    by_label = {a["label"]: a for a in _nodes(_graph(block_snapshot(1, replay=True))).values()}
    loss = by_label["SumBackward0"]
    assert (loss["shape"], loss["fillcolor"]) == ("box", NODE_COLOURS["backward"])
    assert by_label["head.weight\\n(4, 4)"]["fillcolor"] == NODE_COLOURS["leaf"]
    assert by_label["input\\n(2, 4)"]["shape"] == "ellipse"
    assert by_label["dummy\\n(0)"]["shape"] == "ellipse"  # the zero-size input of the checkpoint
    trigger = by_label["trigger h0"]
    assert (trigger["shape"], trigger["fillcolor"]) == ("diamond", NODE_COLOURS["trigger"])
    checkpoint = by_label["_CheckpointBackward\\nh0 · DX"]
    assert (checkpoint["shape"], checkpoint["fillcolor"]) == ("box3d", NODE_COLOURS["checkpoint"])


def test_edges_are_coloured_by_the_pass_that_reaches_them() -> None:
    edges = _edges(_graph(block_snapshot(1, replay=True)))
    # Node indexes: 0 SumBackward0, 1 head.weight, 2 input, 3 checkpoint h0, 4 dummy, 5 trigger, 6.. replay.
    assert edges["n0 -> n3"]["color"] == EDGE_COLOURS["both"]  # loss -> checkpoint: both passes
    assert edges["n3 -> n2"]["color"] == EDGE_COLOURS["dx"]  # checkpoint -> input: DX only
    assert edges["n3 -> n5"]["color"] == EDGE_COLOURS["dw"]  # checkpoint -> trigger: DW only
    assert edges["n0 -> n1"]["color"] == EDGE_COLOURS["dw"]  # loss -> head.weight
    assert edges["n3 -> n6"]["color"] == EDGE_COLOURS["none"]  # into the retained replay: neither outer pass


def test_legend_is_the_docstring_and_names_every_colour_role() -> None:
    assert GRAPH_LEGEND in "\n".join(line.strip() for line in render_graph.__doc__.splitlines())
    for word in ("White box", "Grey box", "Teal oval", "Orange diamond", "Yellow 3-D box", "DX", "DW", "purple",
                 "released", "Block xN", "dark red border", "magenta border", "excluded region"):
        assert word in GRAPH_LEGEND


def test_twelve_identical_blocks_collapse_to_one_region_and_one_node() -> None:
    snapshot = block_snapshot(12, replay=True)
    full = _graph(snapshot, collapse=False)
    collapsed = _graph(snapshot, collapse_above=10)
    assert len(_nodes(full)) == 3 + 12 * 6
    assert full.count("subgraph cluster_h") == 12
    # The first region stays drawn in full (what the run repeats); the other eleven are one node.
    assert "Block x11" in _nodes(collapsed)["block0"]["label"]
    assert "h1 – h11 · retained" in _nodes(collapsed)["block0"]["label"]
    assert "like h0" in _nodes(collapsed)["block0"]["label"]
    # What remains: the loss, the head weight, the model input, h0's region (6 nodes) and the block.
    assert len(_nodes(collapsed)) == 3 + 6 + 1
    assert re.findall(r"subgraph (cluster_h\d+)", collapsed) == ["cluster_h0"]
    edges = _edges(collapsed)
    assert edges["n0 -> block0"]["color"] == EDGE_COLOURS["both"]
    h0 = 3 + 11 * 6  # h0's checkpoint node, the last region of the chain: between the block and the input
    assert edges[f"block0 -> n{h0}"]["color"] == EDGE_COLOURS["both"]
    assert edges[f"n{h0} -> n2"]["color"] == EDGE_COLOURS["dx"]
    assert collapse_runs(Trace(graphs=[snapshot]), min_repeat=3) == [list(range(1, 12))]
    assert "<svg" in _svg(collapsed)


def test_small_graphs_and_collapse_false_stay_expanded() -> None:
    assert "block0" not in _graph(block_snapshot(8, replay=True))  # 51 nodes, 8 regions: under both thresholds
    assert "block0" not in _graph(block_snapshot(40, replay=True), collapse=False)
    assert "Block x39" in _graph(block_snapshot(40, replay=True))


def test_many_regions_collapse_though_the_graph_has_few_nodes() -> None:
    # A deep model checkpointed layer by layer draws few nodes per region before backward; 9 regions is big.
    dot = _graph(block_snapshot(9, replay=True))
    assert len(snapshot_nodes := block_snapshot(9, replay=True).nodes) < 100, len(snapshot_nodes)
    assert "Block x8" in dot and "subgraph cluster_h0 {" in dot
    assert "block0" not in _graph(block_snapshot(9, replay=True), collapse_regions_above=9)


def test_different_states_break_a_run_of_blocks() -> None:
    states = {h: "released" if h >= 8 else "replayed" for h in range(12)}
    dot = _graph(block_snapshot(12, replay=True), states, collapse_above=10)
    labels = re.findall(r'label="(Block x\d+\\nh\d+ – h\d+ · \w+)', dot)
    assert labels == ["Block x7\\nh1 – h7 · replayed", "Block x3\\nh9 – h11 · released"]
    assert "subgraph cluster_h0 {" in dot and "subgraph cluster_h8 {" in dot
    # A run shorter than min_repeat stays as clusters.
    states[5] = "replaying"
    dot = _graph(block_snapshot(12, replay=True), states, collapse_above=10, min_repeat=3)
    assert "subgraph cluster_h5 {" in dot and "Block x4\\nh1 – h4" in dot and "h7 – h7" not in dot
    assert "subgraph cluster_h6 {" in dot and "subgraph cluster_h7 {" in dot


def test_thousands_of_nodes_render_and_collapse() -> None:
    # How fast: benchmarks/bench_views.py.
    snapshot = block_snapshot(850, replay=True)  # 5,103 nodes
    assert len(snapshot.nodes) > 5000
    assert len(_nodes(_graph(snapshot, collapse=False))) == len(snapshot.nodes)
    collapsed = _graph(snapshot)
    assert len(_nodes(collapsed)) == 3 + 6 + 1 and "Block x849" in collapsed
    assert "<svg" in _svg(collapsed)


def test_the_title_says_which_snapshot_is_shown_relative_to_the_cursor() -> None:
    snapshot = block_snapshot(2, replay=True)  # taken at seq 0
    trace = with_states(snapshot, {0: "released", 1: "retained"})
    late = _attrs(re.search(r"^\s*graph \[(.*)\]$", render_graph(trace, 5).source, re.M).group(1))["label"]
    assert late == ("snapshot\\nsnapshot taken at seq 0, 5 seqs before the cursor (seq 5): the last one by then; "
                    "handle states at seq 5"), late
    at = _attrs(re.search(r"^\s*graph \[(.*)\]$", render_graph(trace, snapshot.seq).source, re.M).group(1))
    assert at["label"] == "snapshot\\nsnapshot taken at seq 0, at the cursor; handle states at seq 0"


HOSTILE = ['say "hi"', 'Weird"Backward\\', "<b>bold</b>", "<<FONT FACE=\"x\" POINT-SIZE=\"99\">face</FONT>>",
           "<img src=x onerror=alert(1)>", "\\N \\G \\L", "![](http://127.0.0.2/x)", "a]; n9 [label=evil"]


def test_odd_names_and_labels_are_drawn_as_their_characters() -> None:
    nodes = [{"id": i, "name": name, "kind": "backward"} for i, name in enumerate(HOSTILE)]
    nodes.append({"id": "leaf", "name": "x", "kind": "leaf", "shape": [3]})
    snapshot = snapshot_of(seq=0, label=HOSTILE[3], nodes=nodes, edges=[[0, 1], [0, "leaf"], [0, "missing"]])
    dot = _graph(snapshot)
    assert "=<" not in dot  # no label is an HTML-like one: every label is a quoted string
    svg = _svg(dot)
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    import html

    shown = [html.unescape(t) for t in texts]
    for name in HOSTILE:  # each drawn whole, as text
        assert name in shown, (name, shown)
    tags = {t.rpartition("}")[2] for t in (e.tag for e in ElementTree.fromstring(svg).iter())}
    assert tags <= {"svg", "g", "title", "polygon", "ellipse", "text", "path", "polyline"}, tags  # no <img>, <font>
    assert set(re.findall(r'font-family="([^"]*)"', svg)) == {"Helvetica,sans-Serif"}
    assert len(_nodes(dot)) == len(nodes)  # the node named "a]; n9 [label=evil" made no node of its own


_TORCHVIZ = TorchvizGraph(
    nodes=(TorchvizNode("n0", "\n (2, 4)", "darkolivegreen1"), TorchvizNode("n1", "SumBackward0"),
           TorchvizNode("n2", "head.weight\n (4, 4)", "lightblue"), TorchvizNode("n3", "<<B>Evil</B>>"),
           TorchvizNode("n4", "saved\n (4)", "orange")),
    edges=(TorchvizEdge("n2", "n1"), TorchvizEdge("n1", "n0"), TorchvizEdge("n3", "n1", "dotted"),
           TorchvizEdge("n4", "n1", "undirected"), TorchvizEdge("n9", "n1")))


def test_torchviz_view_is_rebuilt_from_make_dots_drawing_in_the_chosen_direction() -> None:
    snapshot = GraphSnapshot(seq=3, label="before backward", torchviz=_TORCHVIZ)
    trace = Trace(graphs=[snapshot])
    for rankdir in ("TB", "LR"):
        dot = render_torchviz_view(trace, rankdir=rankdir).source
        graph = _attrs(re.search(r"graph \[(.*)\]", dot).group(1))
        assert graph["rankdir"] == rankdir and graph["label"] == "before backward"
        nodes = {m.group(1): _attrs(m.group(2)) for m in re.finditer(r"^\s*(n\d+) \[(.*)\]$", dot, re.M)}
        assert nodes["n2"] == {"label": "head.weight\\n (4, 4)", "fillcolor": "lightblue"}
        assert nodes["n0"]["fillcolor"] == "darkolivegreen1" and "fillcolor" not in nodes["n1"]
        assert nodes["n3"]["label"] == "<<B>Evil</B>>"  # a quoted string: drawn as text, not as an HTML label
        edges = _edges(dot)
        assert edges["n3 -> n1"] == {"style": "dotted"} and edges["n4 -> n1"] == {"dir": "none"}
        assert "n2 -> n1" in dot and "n9" not in dot  # an edge to a node the drawing lacks is left out
        svg = _svg(dot)
        assert "&lt;&lt;B&gt;Evil&lt;/B&gt;&gt;" in svg and "<B>" not in svg
    assert "lightblue" not in GRAPH_LEGEND and "blue box" in TORCHVIZ_LEGEND and "make_dot" in TORCHVIZ_LEGEND


def test_torchviz_view_of_a_snapshot_without_make_dots_drawing_is_none() -> None:
    assert render_torchviz_view(Trace(graphs=[block_snapshot(2, replay=True)])) is None
    assert render_torchviz_view(Trace()) is None and render_graph(Trace()) is None


def test_a_refused_handle_gets_a_red_border_and_says_so() -> None:
    snapshot = block_snapshot(3)
    dot = _graph(snapshot, {0: "recorded", 2: "recorded"}, refused=(1, 7))  # 7 is not in the graph: ignored
    h1 = _cluster_attrs(dot, "cluster_h1")
    assert h1["label"] == "h1 · Block.forward\\nreleased · replay refused"
    assert (h1["color"], h1["penwidth"]) == (palette.MARK_COLOURS["refused"], "3")
    assert "refused" not in _cluster(dot, "cluster_h0") and "refused" not in _cluster(dot, "cluster_h2")
    assert "<svg" in _svg(dot)


def test_the_highlighted_handle_gets_the_magenta_border_and_is_never_collapsed() -> None:
    snapshot = block_snapshot(12, replay=True)
    dot = _graph(snapshot, collapse_above=10, highlight=5)
    h5 = _cluster_attrs(dot, "cluster_h5")
    assert h5["label"] == "▶ h5\\nretained" and (h5["color"], h5["penwidth"]) == (palette.CURSOR_COLOUR, "3")
    labels = re.findall(r'label="(Block x\d+\\nh\d+ – h\d+)', dot)
    assert labels == ["Block x4\\nh1 – h4", "Block x5\\nh7 – h11"]  # h0 and h6 drawn: the first of each run
    assert collapse_runs(Trace(graphs=[snapshot]), keep=[5]) == [list(range(1, 5)), list(range(7, 12))]


def test_collapse_runs_tells_what_collapses_at_any_size() -> None:
    assert collapse_runs(Trace(graphs=[block_snapshot(3, replay=True)])) == [[1, 2]]  # h0 stays drawn
    assert collapse_runs(Trace(graphs=[block_snapshot(2, replay=True)])) == []  # under min_repeat
    assert collapse_runs(with_states(block_snapshot(3), {0: "recorded", 1: "replayed", 2: "recorded"})) == []
    assert collapse_runs(with_states(block_snapshot(4), {}, refused=(1,))) == []  # a refused handle breaks the run
    assert "Block x2" in _graph(block_snapshot(3, replay=True), collapse_above=0)


def _excluded_snapshot() -> GraphSnapshot:
    node = {"kind": "backward", "handle_id": 0, "dx_reached": True, "dw_reached": True}
    return snapshot_of(seq=0, label="excluded", nodes=[
        {**node, "id": 0, "name": "AddBackward0"},
        {**node, "id": 1, "name": "NativeLayerNormBackward0", "exclude": 4},
        {**node, "id": 2, "name": "AddmmBackward0"},
        {**node, "id": 3, "name": "input", "kind": "input", "handle_id": None, "shape": [2, 4]},
    ], edges=[[0, 1], [1, 2], [2, 3]])


def test_an_excluded_region_is_its_own_box_inside_its_checkpoint_region() -> None:
    dot = _graph(_excluded_snapshot())
    inner = _cluster(_cluster(dot, "cluster_h0"), "cluster_x4_h0")
    assert _attrs(inner.splitlines()[1]) == {
        "color": palette.CATEGORY_COLOURS["excluded_outputs"], "fillcolor": EXCLUDED_FILL,
        "fontcolor": palette.CATEGORY_COLOURS["excluded_outputs"], "label": "excluded region 4 · kept, not recomputed",
        "penwidth": "2", "style": "filled,dashed"}
    assert "NativeLayerNormBackward0" in inner and "AddmmBackward0" not in inner
    svg = _svg(dot)
    assert "excluded region 4" in svg and f'fill="{EXCLUDED_FILL}"' in svg


def test_refused_handles_as_of_the_cursor() -> None:
    trace = refused_trace()  # seq 9: h0's replay is refused
    assert refused_handles(trace, 8) == [] and refused_handles(trace, 9) == [0] and refused_handles(trace, None) == [0]
    assert refused_handles(split_trace(), None) == []


def test_the_graph_at_the_cursor_is_the_last_snapshot_before_it() -> None:
    trace = split_trace()  # one snapshot, at seq 6, handles 0 and 1 waiting for DX there
    early, late = render_graph(trace, 2).source, render_graph(trace, 25).source
    # The first one, taken after the cursor, drawn in the states at the cursor; its title says so.
    assert _attrs(re.search(r"graph \[(.*)\]", early).group(1))["label"] == (
        "before DX\\nsnapshot taken at seq 6, 4 seqs after the cursor (seq 2): none was taken by then; handle states "
        "at seq 2")
    assert _cluster_attrs(early, "cluster_h0")["label"] == "h0 · Block.forward\\nrecorded"
    assert _cluster_attrs(render_graph(trace, 7).source, "cluster_h0")["label"] == "h0 · Block.forward\\nwaiting for DX"
    assert _cluster_attrs(late, "cluster_h0")["label"] == "h0 · Block.forward\\nreleased"


def test_dot_svg_is_an_inline_element_at_a_fixed_scale() -> None:
    dot = _graph(block_snapshot(2, replay=True))
    svg = dot_svg(dot)
    assert svg.startswith("<svg ") and "<?xml" not in svg and "<!--" not in svg
    size = re.compile(r'width="([\d.]+)pt" height="([\d.]+)pt"')
    width, height = (float(v) for v in size.search(svg).groups())
    half = size.search(dot_svg(dot, 0.5)).groups()
    assert abs(float(half[0]) - width / 2) <= 1 and abs(float(half[1]) - height / 2) <= 1
    # A label's font size is Graphviz's, whatever the graph's size: no stretching to the page.
    assert 'font-size="10.00"' in svg and 'font-size="10.00"' in dot_svg(_graph(block_snapshot(40)))


@pytest.mark.parametrize("rankdir", ["TB", "LR"])
def test_rankdir_is_passed_through(rankdir: str) -> None:
    assert f"rankdir={rankdir}" in _graph(block_snapshot(1), rankdir=rankdir)


def test_every_lifecycle_state_has_a_region_colour_and_the_legend_names_it() -> None:
    assert tuple(REGION_FILLS) == STATES and REGION_FILLS == palette.STATE_FILLS
    for state in STATES[1:]:
        assert state_word(state) in GRAPH_LEGEND
    dot = _graph(block_snapshot(2, replay=True), {0: "retained", 1: "collected"})
    assert _cluster_attrs(dot, "cluster_h0")["fillcolor"] == REGION_FILLS["retained"]
    h1 = _cluster_attrs(dot, "cluster_h1")
    assert h1["label"] == "h1 · Block.forward\\ncollected" and h1["style"] == "filled,dashed"
