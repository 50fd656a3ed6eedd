"""The routing of a backward pass on hand-built traces: pass boundaries (`analysis.passes`), the state as of the
cursor and the flow of DX from block to block (`analysis.routing`), words instead of raw lists, and the graph
`render_routing` draws of it."""
from __future__ import annotations

import re

from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.routing import handle_flow, input_words, pass_title, routing_at, routing_rows
from ckpt_viz.analysis.words import reason_word
from ckpt_viz.render.graph import EDGE_COLOURS
from ckpt_viz.render.routing import render_routing
from ckpt_viz.render.svg import dot_svg
from traces import Builder, block_snapshot, refused_trace, split_trace

_ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s\]]+)')


def _attrs(text: str) -> dict[str, str]:
    return {k: v[1:-1] if v.startswith('"') else v for k, v in _ATTR.findall(text)}


def _dot(trace, cursor) -> str:
    return render_routing(trace, cursor).source


def _statements(dot: str) -> dict[str, dict[str, str]]:
    """node id or "a -> b" -> its attributes."""
    return {m.group(1): _attrs(m.group(2)) for m in re.finditer(r"^\s*(\w+(?: -> \w+)?) \[(.*)\]$", dot, re.M)}


def _backwards(trace) -> list[tuple]:
    return [(b.start_seq, b.end_seq, b.phase, b.site) for b in passes(trace).backwards]


def test_passes_of_the_split_trace() -> None:
    assert _backwards(split_trace()) == [(8, 15, "dx", "train.py:21"), (18, 23, "dw", "train.py:23")]


def test_cursor_inside_dx_shows_the_handles_routed_so_far() -> None:
    r = routing_at(split_trace(), 12)
    assert (r.phase, r.start_seq, r.end_seq, r.complete) == ("dx", 8, 12, False)
    assert r.handles == (1, 0) and r.replayed == (1,) and r.replaying == ()
    assert r.targets == {1: (0,)} and r.explicit_params == {1: ()}
    assert r.released == () and r.stage is None


def test_cursor_after_a_pass_shows_the_whole_last_pass() -> None:
    r = routing_at(split_trace(), 16)  # phase_set dw: no pass contains it, DX was the last one
    assert r.phase == "dx" and r.complete is True
    assert r.replayed == (1, 0) and r.targets == {1: (0,), 0: (0,)}


def test_dw_pass_routes_captured_parameters_and_releases() -> None:
    r = routing_at(split_trace(), None)
    assert r.phase == "dw" and (r.start_seq, r.end_seq) == (18, 23)
    assert r.replayed == ()  # replayed in DX already
    assert r.targets == {1: (), 0: ()} and r.discarded == {1: (0,), 0: (0,)}
    assert r.captured == {1: ("blocks.1.weight",), 0: ("blocks.0.weight",)}
    assert r.captured_missed == {1: ("tensor(4,)",), 0: ("tensor(4,)",)}
    assert r.released == (1, 0) and r.release_reasons == {1: "dw_complete", 0: "dw_complete"}


def test_before_any_pass_everything_is_empty() -> None:
    r = routing_at(split_trace(), 5)
    assert r.phase is None and r.handles == () and r.targets == {} and r.waiting == "the forward"
    dot = _dot(split_trace(), 5)
    title = _attrs(re.search(r"graph \[(.*)\]", dot).group(1))["label"]
    assert title == "no backward pass yet (the forward is running)"
    assert _statements(dot)["empty"]["label"] == "no checkpoint reached"
    assert "<svg" in dot_svg(dot)


def test_a_second_backward_at_another_line_is_a_new_pass_with_the_refusal() -> None:
    trace = refused_trace()
    assert [b[:2] for b in _backwards(trace)] == [(3, 7), (8, 10)]
    r = routing_at(trace, None)
    assert r.refused == (0,) and r.handles == (0,) and r.replayed == ()
    assert routing_at(trace, 7).released == (0,)


def test_same_site_splits_on_tags_and_on_a_handle_entering_twice() -> None:
    b = Builder()
    for mb in (0, 1):
        for h in (2 * mb, 2 * mb + 1):
            b.ev("backward_entered", h, phase="dx", site="pipe.py:1", tags={"stage": 0, "microbatch": mb})
            b.ev("grads_routed", h, phase="dx", site="pipe.py:1", tags={"stage": 0, "microbatch": mb}, targets=[0])
    b.ev("memory_sampled")  # neutral
    for _ in range(2):  # a loop calling backward twice on one line
        b.ev("backward_entered", 9, phase="ordinary", site="loop.py:4")
        b.ev("grads_routed", 9, phase="ordinary", site="loop.py:4", targets=[0])
    found = passes(b.trace()).backwards
    assert [(p.start_seq, p.end_seq, p.stage, p.microbatch) for p in found] == [
        (0, 3, 0, 0), (4, 7, 0, 1), (9, 10, None, None), (11, 12, None, None)]
    assert routing_at(b.trace(), 6).microbatch == 1


def test_a_handle_is_replayed_only_once_its_replay_finished() -> None:
    r = routing_at(split_trace(), 9)  # seq 9: h1's replay_started
    assert r.replaying == (1,) and r.replayed == ()
    dot = _dot(split_trace(), 9)
    assert "replayed here" not in dot and _statements(dot)["h1"]["label"] == "h1 · Block.forward\\nreplaying"
    assert _statements(_dot(split_trace(), 10))["h1"]["label"] == "h1 · Block.forward\\nreplayed here"


def test_dx_flows_from_block_to_block() -> None:
    dot = _dot(split_trace(), 15)
    # The snapshot (two chained regions) says who feeds whom: loss -> h1 -> h0 -> the model input.
    edges = _statements(dot)
    for edge in ("loss -> h1", "h1 -> h0", "h0 -> input"):
        assert (edges[edge]["color"], edges[edge]["label"]) == (EDGE_COLOURS["dx"], "DX"), edge
        assert "style" not in edges[edge]  # from the graph: solid
    assert "DX pass (input grads) · events 8–15 · train.py:21" in dot
    assert "dX" not in dot and "[0]" not in dot and "input 0" not in dot
    assert "<svg" in dot_svg(dot)


def test_dw_routes_and_the_dropped_dx() -> None:
    dw = _dot(split_trace(), None)
    edges = _statements(dw)
    assert {k: edges["h1 -> h1_cap0"][k] for k in ("color", "style", "label")} == {
        "color": EDGE_COLOURS["dw"], "style": "dashed", "label": "DW: .grad"}
    assert {k: edges["h1 -> h0"][k] for k in ("color", "style", "label")} == {
        "color": EDGE_COLOURS["none"], "style": "dashed", "label": "DX dropped"}
    assert edges["h1"]["label"] == "h1 · Block.forward\\nreleased: DW finished"
    assert edges["h1_miss1"]["label"] == "tensor(4,) (no grad)" if "h1_miss1" in edges else \
        edges["h1_miss0"]["label"] == "tensor(4,) (no grad)"
    assert "dw_complete" not in dw and "<svg" in dot_svg(dw)


def test_without_a_snapshot_the_handles_chain_in_the_order_reached() -> None:
    assert handle_flow(None, [3, 2]) == [("loss", 3, False), (3, 2, False)]
    assert handle_flow(block_snapshot(2), [1, 0]) == [("loss", 1, True), (0, "input", True), (1, 0, True)]
    # A snapshot that does not hold the pass's handles (another stage's graph) falls back to the chain.
    assert handle_flow(block_snapshot(2), [5]) == [("loss", 5, False)]


def test_words_instead_of_raw_lists() -> None:
    b = Builder()
    tensor = {"dtype": "float32", "nbytes": 32}
    b.ev("handle_created", 0, function="blocks.0", inputs=[{"shape": [2, 4], **tensor}], param_input_mask=[False])
    b.ev("handle_created", 1, function="attn", inputs=[{"shape": [2, 4], **tensor}, {"shape": [4, 4], **tensor}],
         param_input_mask=[False, True])
    b.ev("backward_entered", 0, phase="dx", site="t.py:1")
    b.ev("grads_routed", 0, phase="dx", site="t.py:1", targets=[], explicit_params=[])
    trace = b.trace()
    assert input_words(trace, 0, 0) == "the block's input (2, 4)"
    assert input_words(trace, 1, 0) == "input 1 of 2 (2, 4)" and input_words(trace, 1, 1) == "parameter input 2 (4, 4)"
    assert reason_word("ordinary_backward_complete") == "its backward finished"
    dot = _dot(trace, None)
    assert "h0 · blocks.0" in dot and "no inputs got a gradient" in dot and "[]" not in dot


def test_pipeline_passes_say_their_stage_and_micro_batch() -> None:
    r = routing_at(split_trace(), 12)
    assert pass_title(r) == "DX pass (input grads) · events 8–12 (running) · train.py:21"
    b = Builder()
    b.ev("backward_entered", 0, phase="dx", site="pipe.py:1", tags={"stage": 1, "microbatch": 3})
    r = routing_at(b.trace(), None)
    assert pass_title(r) == "DX pass (input grads) · stage 1, micro-batch 3 · events 0–0 · pipe.py:1"
    dot = _dot(b.trace(), None)
    assert "stage 1, micro-batch 3" in dot and _statements(dot)["loss"]["label"] == "grad of the stage's output"


def test_explicit_parameter_inputs_get_dw_edges() -> None:
    b = Builder()
    b.ev("backward_entered", 0, phase="dw", site="t.py:1")
    b.ev("grads_routed", 0, phase="dw", site="t.py:1", targets=[1], explicit_params=[1],
         discarded_activations=[0])
    b.ev("released", 0, phase="dw", site="t.py:1", reason="dw_complete")
    dot = _dot(b.trace(), None)
    found = _statements(dot)
    assert {k: found["h0_in1"][k] for k in ("label", "shape", "style")} == {
        "label": "parameter input 2", "shape": "box", "style": "filled,rounded"}
    assert (found["h0 -> h0_in1"]["color"], found["h0 -> h0_in1"]["label"]) == (EDGE_COLOURS["dw"], "DW")
    assert "<svg" in dot_svg(dot)


def test_the_table_rows_say_where_dx_went_and_on_to_whom() -> None:
    rows = routing_rows(split_trace(), 15)
    assert [r["handle"] for r in rows] == ["h1", "h0"]
    assert rows[0]["in this pass"] == "replayed here"
    assert rows[0]["DX went to"] == "the block's input, on to h0"
    assert rows[1]["DX went to"] == "the block's input, on to the model input"
    dw = routing_rows(split_trace(), None)
    assert dw[0]["in this pass"] == "released: DW finished" and dw[0]["parameters given .grad"] == "blocks.1.weight"
    assert dw[0]["DX went to"] == "none (DW pass)" and dw[0]["DX dropped (DW pass)"] == "the block's input"
    assert routing_rows(split_trace(), 5) == []
    assert routing_rows(split_trace(), 9)[0]["DX went to"] == "not routed yet"  # replaying, not routed
    assert not [v for r in rows + dw for v in r.values() if "[" in v or "input 0" in v]


def test_a_loaded_trace_gives_the_same_passes_and_drawing(tmp_path) -> None:
    """A saved and loaded trace gives the same passes, routing and drawing as the one built, at every cursor."""
    from ckpt_viz.trace import Trace

    for i, trace in enumerate((split_trace(), refused_trace())):
        path = tmp_path / f"t{i}.json.gz"
        trace.save(path)
        loaded = Trace.load(path)
        assert passes(loaded).backwards == passes(trace).backwards != ()
        for cursor in range(0, len(trace), 3):
            assert routing_at(loaded, cursor) == routing_at(trace, cursor)
            assert _dot(loaded, cursor) == _dot(trace, cursor)


def test_trace_text_in_a_pass_is_drawn_as_its_characters() -> None:
    b = Builder()
    evil = '<<FONT FACE="x">f</FONT>> "q" \\N ![](http://127.0.0.2/x)'
    b.ev("handle_created", 0, function=evil, label=evil)
    b.ev("backward_entered", 0, phase="dw", site=evil)
    b.ev("grads_routed", 0, phase="dw", site=evil,
         captured=[{"name": evil, "shape": [4], "accumulated": True}])
    dot = _dot(b.trace(), None)
    assert "=<" not in dot  # no value is an HTML-like label: each is a quoted string
    svg = dot_svg(dot)
    import html

    texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    assert f"h0 · {evil}" in texts and evil in texts
    assert "<a " not in svg and "127.0.0.2" in "".join(texts) and 'font-family="x"' not in svg
