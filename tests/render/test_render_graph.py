"""render_graph / render_torchviz_view / dot_svg: DOT text of hand-built snapshots (clusters, labels, colours,
collapse, refused and highlighted handles, excluded regions) and the SVG the `dot` binary draws of it.

The DOT is checked as text and then laid out by Graphviz (`dot -Tsvg` through the
graphviz package) to prove it is valid.
"""
from __future__ import annotations

import re

import graphviz
import pytest

from ckpt_viz.render import palette
from ckpt_viz.render.graph import (
    EDGE_COLOURS,
    EXCLUDED_FILL,
    GRAPH_LEGEND,
    NODE_COLOURS,
    REGION_FILLS,
    TORCHVIZ_LEGEND,
    collapse_runs,
    refused_handles,
    render_graph,
    render_torchviz_view,
)
from ckpt_viz.render.svg import dot_svg
from ckpt_viz.trace import GraphSnapshot
from traces import block_snapshot, refused_trace, split_trace


def _svg(dot: str) -> str:
    return graphviz.Source(dot).pipe(format="svg", encoding="utf-8")


def _node_lines(dot: str) -> list[str]:
    return [line.strip() for line in dot.splitlines() if re.match(r"\s*(n\d+|block\d+) \[", line)]


def _cluster(dot: str, h: int) -> str:
    start = dot.index(f"subgraph cluster_h{h} {{")
    return dot[start:dot.index("  }", start)]


def test_regions_become_clusters_labelled_with_their_state() -> None:
    dot = render_graph(block_snapshot(2, replay=True), states={0: "replayed", 1: "released"})
    assert "subgraph cluster_h0 {" in dot and "subgraph cluster_h1 {" in dot
    h0, h1 = _cluster(dot, 0), _cluster(dot, 1)
    assert 'label="h0 · replayed"' in h0 and f'fillcolor="{REGION_FILLS["replayed"]}"' in h0
    assert 'label="h1 · released"' in h1 and 'style="filled,dashed"' in h1
    # Inside h0: its checkpoint node and its retained replay; its trigger and dummy input stay outside.
    assert 'label="_CheckpointBackward\\nh0 · dx"' in h0
    assert 'label="blocks.0.weight\\n(4, 4)"' in h0 and "AddmmBackward0" in h0
    assert "trigger h0" not in h0 and "trigger h0" in dot
    assert "<svg" in _svg(dot)


def test_without_states_the_checkpoint_flags_give_the_state() -> None:
    assert 'label="h0 · recorded"' in render_graph(block_snapshot(1))
    assert 'label="h0 · replayed"' in render_graph(block_snapshot(1, replay=True))
    assert 'label="h0 · released"' in render_graph(block_snapshot(1, replay=True, released=True))


def test_node_kinds_are_told_apart_by_shape_and_colour() -> None:
    dot = render_graph(block_snapshot(1, replay=True))
    lines = {line.split(" [")[0]: line for line in _node_lines(dot)}
    by_label = {re.search(r'label="([^"]*)"', line).group(1): line for line in lines.values()}
    assert f'shape="box", fillcolor="{NODE_COLOURS["backward"]}"' in by_label["SumBackward0"]
    assert f'fillcolor="{NODE_COLOURS["leaf"]}"' in by_label["head.weight\\n(4, 4)"]
    assert 'shape="ellipse"' in by_label["input\\n(2, 4)"]
    assert 'shape="ellipse"' in by_label["dummy\\n(0)"]  # the zero-size input of the checkpoint
    assert f'shape="diamond", fillcolor="{NODE_COLOURS["trigger"]}"' in by_label["trigger h0"]
    assert f'shape="box3d", fillcolor="{NODE_COLOURS["checkpoint"]}"' in by_label["_CheckpointBackward\\nh0 · dx"]


def test_edges_are_coloured_by_the_pass_that_reaches_them() -> None:
    dot = render_graph(block_snapshot(1, replay=True))
    # Node indexes: 0 SumBackward0, 1 head.weight, 2 input, 3 checkpoint h0, 4 dummy, 5 trigger, 6.. replay.
    edges = dict(re.findall(r"(n\d+ -> n\d+) \[color=\"(#[0-9a-f]+)\"", dot))
    assert edges["n0 -> n3"] == EDGE_COLOURS["both"]  # loss -> checkpoint: both passes
    assert edges["n3 -> n2"] == EDGE_COLOURS["dx"]  # checkpoint -> input: DX only
    assert edges["n3 -> n5"] == EDGE_COLOURS["dw"]  # checkpoint -> trigger: DW only
    assert edges["n0 -> n1"] == EDGE_COLOURS["dw"]  # loss -> head.weight
    assert edges["n3 -> n6"] == EDGE_COLOURS["none"]  # into the retained replay: neither outer pass


def test_legend_is_the_docstring_and_names_every_colour_role() -> None:
    assert GRAPH_LEGEND in "\n".join(line.strip() for line in render_graph.__doc__.splitlines())
    for word in ("White box", "Grey box", "Teal oval", "Orange diamond", "Yellow 3-D box", "DX", "DW", "purple",
                 "released", "Block xN", "dark red border", "magenta border", "excluded region"):
        assert word in GRAPH_LEGEND


def test_twelve_identical_blocks_collapse_to_one_node() -> None:
    snapshot = block_snapshot(12, replay=True)
    full = render_graph(snapshot, collapse=False)
    collapsed = render_graph(snapshot, collapse_above=10)
    assert len(_node_lines(full)) == 3 + 12 * 6
    assert full.count("subgraph cluster_h") == 12
    block = [line for line in _node_lines(collapsed) if line.startswith("block0 ")]
    assert len(block) == 1 and "Block x12" in block[0] and "h0 – h11 · replayed" in block[0]
    # What remains: the loss, the head weight, the model input and the block.
    assert len(_node_lines(collapsed)) == 4
    assert "cluster_h" not in collapsed
    assert re.search(r"n0 -> block0 \[color=\"" + EDGE_COLOURS["both"], collapsed)
    assert re.search(r"block0 -> n2 \[color=\"" + EDGE_COLOURS["dx"], collapsed)
    assert "<svg" in _svg(collapsed)


def test_small_graphs_and_collapse_false_stay_expanded() -> None:
    snapshot = block_snapshot(12, replay=True)  # 75 nodes: under the default threshold of 100
    assert "block0" not in render_graph(snapshot)
    assert "block0" not in render_graph(block_snapshot(40, replay=True), collapse=False)
    assert "Block x40" in render_graph(block_snapshot(40, replay=True))


def test_different_states_break_a_run_of_blocks() -> None:
    states = {h: "released" if h >= 8 else "replayed" for h in range(12)}
    dot = render_graph(block_snapshot(12, replay=True), states=states, collapse_above=10)
    labels = re.findall(r'label="(Block x\d+\\nh\d+ – h\d+ · \w+)', dot)
    assert labels == ["Block x8\\nh0 – h7 · replayed", "Block x4\\nh8 – h11 · released"]
    # A run shorter than min_repeat stays as clusters.
    states[5] = "replaying"
    dot = render_graph(block_snapshot(12, replay=True), states=states, collapse_above=10, min_repeat=3)
    assert "subgraph cluster_h5 {" in dot and "Block x5\\nh0 – h4" in dot and "Block x2\\nh6 – h7" not in dot


def test_thousands_of_nodes_render_and_collapse() -> None:
    # How fast: benchmarks/bench_views.py (both renders < 5 s).
    snapshot = block_snapshot(850, replay=True)  # 5,103 nodes
    assert len(snapshot.nodes) > 5000
    full = render_graph(snapshot, collapse=False)
    collapsed = render_graph(snapshot)
    assert len(_node_lines(full)) == len(snapshot.nodes)
    assert len(_node_lines(collapsed)) == 4 and "Block x850" in collapsed
    assert "<svg" in _svg(collapsed)


def test_non_string_and_odd_names_are_quoted() -> None:
    snapshot = GraphSnapshot(seq=0, label='say "hi"', nodes=[
        {"id": "a", "name": 'Weird"Backward\\', "kind": "backward", "handle_id": None, "dx_reached": False,
         "dw_reached": False, "shape": None},
        {"id": "b", "name": "x", "kind": "leaf", "handle_id": None, "dx_reached": False, "dw_reached": False,
         "shape": [3]},
    ], edges=[["a", "b"], ["a", "missing"]])
    dot = render_graph(snapshot)
    assert 'label="Weird\\"Backward\\\\"' in dot and 'label="say \\"hi\\""' in dot
    assert "<svg" in _svg(dot)


_MAKE_DOT = """digraph {
\tnode [align=left fontname=monospace fontsize=10 height=0.2 ranksep=0.1 shape=box style=filled]
\tn0 [label="
 (2, 4)" fillcolor=darkolivegreen1]
\tn1 [label=SumBackward0]
\tn2 -> n1
\tn2 [label="head.weight
 (4, 4)" fillcolor=lightblue]
\tn1 -> n0
}
"""


def test_torchviz_view_is_make_dots_stored_drawing_in_the_chosen_direction() -> None:
    snapshot = GraphSnapshot(seq=3, label="before backward", nodes=[], edges=[], torchviz=_MAKE_DOT)
    for rankdir in ("TB", "LR"):
        dot = render_torchviz_view(snapshot, rankdir=rankdir)
        assert dot.startswith("digraph {\n\tgraph [rankdir=\"" + rankdir + '", label="before backward"')
        assert dot.endswith(_MAKE_DOT.split("{", 1)[1])  # make_dot's own nodes and edges, untouched
        assert "<svg" in _svg(dot)
    assert "lightblue" not in GRAPH_LEGEND and "blue box" in TORCHVIZ_LEGEND and "make_dot" in TORCHVIZ_LEGEND


def test_torchviz_view_of_an_old_trace_is_none() -> None:
    assert render_torchviz_view(block_snapshot(2, replay=True)) is None


def test_a_refused_handle_gets_a_red_border_and_says_so() -> None:
    dot = render_graph(block_snapshot(3), refused=[1, 7])  # 7 is not in the graph: ignored
    h1 = _cluster(dot, 1)
    assert 'label="h1 · recorded · replay refused"' in h1
    assert f'color="{palette.MARK_COLOURS["refused"]}", penwidth="3"' in h1
    assert "refused" not in _cluster(dot, 0) and "refused" not in _cluster(dot, 2)
    assert "<svg" in _svg(dot)


def test_the_highlighted_handle_gets_the_magenta_border_and_is_never_collapsed() -> None:
    dot = render_graph(block_snapshot(12, replay=True), collapse_above=10, highlight=5)
    h5 = _cluster(dot, 5)
    assert 'label="▶ h5 · replayed"' in h5 and f'color="{palette.CURSOR_COLOUR}", penwidth="3"' in h5
    labels = re.findall(r'label="(Block x\d+\\nh\d+ – h\d+)', dot)
    assert labels == ["Block x5\\nh0 – h4", "Block x6\\nh6 – h11"]
    assert collapse_runs(block_snapshot(12, replay=True), keep=[5]) == [list(range(5)), list(range(6, 12))]


def test_collapse_runs_tells_what_collapses_at_any_size() -> None:
    assert collapse_runs(block_snapshot(3, replay=True)) == [[0, 1, 2]]
    assert collapse_runs(block_snapshot(2, replay=True)) == []  # under min_repeat
    assert collapse_runs(block_snapshot(3), states={0: "recorded", 1: "replayed", 2: "recorded"}) == []
    assert "Block x3" in render_graph(block_snapshot(3, replay=True), collapse_above=0)


def _excluded_snapshot() -> GraphSnapshot:
    node = {"kind": "backward", "handle_id": 0, "dx_reached": True, "dw_reached": True, "shape": None}
    return GraphSnapshot(seq=0, label="excluded", nodes=[
        {**node, "id": 0, "name": "AddBackward0"},
        {**node, "id": 1, "name": "NativeLayerNormBackward0", "exclude": 4},
        {**node, "id": 2, "name": "AddmmBackward0"},
        {**node, "id": 3, "name": "input", "kind": "input", "handle_id": None, "shape": [2, 4]},
    ], edges=[[0, 1], [1, 2], [2, 3]])


def test_an_excluded_region_is_its_own_box_inside_its_checkpoint_region() -> None:
    dot = render_graph(_excluded_snapshot())
    h0 = dot[dot.index("subgraph cluster_h0 {"):]
    inner = h0[h0.index("subgraph cluster_x4_h0 {"):]
    assert 'label="excluded region 4 · kept, not recomputed"' in inner and f'fillcolor="{EXCLUDED_FILL}"' in inner
    assert "NativeLayerNormBackward0" in inner[:inner.index("}")] and "AddmmBackward0" not in inner[:inner.index("}")]
    svg = _svg(dot)
    assert "excluded region 4" in svg and f'fill="{EXCLUDED_FILL}"' in svg


def test_refused_handles_as_of_the_cursor() -> None:
    trace = refused_trace()  # seq 9: h0's replay is refused
    assert refused_handles(trace, 8) == [] and refused_handles(trace, 9) == [0] and refused_handles(trace, None) == [0]
    assert refused_handles(split_trace(), None) == []


def test_dot_svg_is_an_inline_element_at_a_fixed_scale() -> None:
    dot = render_graph(block_snapshot(2, replay=True))
    svg = dot_svg(dot)
    assert svg.startswith("<svg ") and "<?xml" not in svg and "<!--" not in svg
    width, height = (float(v) for v in re.match(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups())
    half = re.match(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', dot_svg(dot, 0.5)).groups()
    assert abs(float(half[0]) - width / 2) <= 1 and abs(float(half[1]) - height / 2) <= 1
    # A label's font size is Graphviz's, whatever the graph's size: no stretching to the page.
    assert 'font-size="10.00"' in svg and 'font-size="10.00"' in dot_svg(render_graph(block_snapshot(40)))


@pytest.mark.parametrize("rankdir", ["TB", "LR"])
def test_rankdir_is_passed_through(rankdir: str) -> None:
    assert f'rankdir="{rankdir}"' in render_graph(block_snapshot(1), rankdir=rankdir)


def test_every_lifecycle_state_has_a_region_colour_and_the_legend_names_it() -> None:
    from ckpt_viz.trace.lifecycle import STATES

    assert tuple(REGION_FILLS) == STATES and REGION_FILLS == palette.STATE_FILLS
    for state in STATES[1:]:
        assert palette.state_word(state) in GRAPH_LEGEND
    dot = render_graph(block_snapshot(2, replay=True), states={0: "retained", 1: "collected"})
    assert f'fillcolor="{REGION_FILLS["retained"]}"' in dot and 'label="h1 · collected"' in dot
    assert 'style="filled,dashed"' in dot[dot.index("subgraph cluster_h1 {"):]
