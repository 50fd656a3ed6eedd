"""routing_at / render_routing on hand-built traces: pass boundaries, state as of the cursor, the flow of DX
from block to block, words instead of raw lists, DOT edges."""
from __future__ import annotations

import re

import graphviz

from ckpt_viz.render.graph import EDGE_COLOURS
from ckpt_viz.render.routing import (
    backward_passes,
    handle_flow,
    input_words,
    pass_title,
    release_words,
    render_routing,
    routing_at,
)
from traces import Builder, block_snapshot, refused_trace, split_trace


def _svg(dot: str) -> str:
    return graphviz.Source(dot).pipe(format="svg", encoding="utf-8")


def test_passes_of_the_split_trace() -> None:
    passes = backward_passes(split_trace())
    assert [(p["start_seq"], p["end_seq"], p["phase"], p["site"]) for p in passes] == [
        (8, 15, "dx", "train.py:21"), (18, 23, "dw", "train.py:23")]


def test_cursor_inside_dx_shows_the_handles_routed_so_far() -> None:
    r = routing_at(split_trace(), 12)
    assert (r["phase"], r["start_seq"], r["end_seq"], r["complete"]) == ("dx", 8, 12, False)
    assert r["handles"] == [1, 0] and r["handles_replayed"] == [1] and r["handles_replaying"] == []
    assert r["targets"] == {1: [0]} and r["explicit_params"] == {1: []}
    assert r["released"] == [] and r["stage"] is None


def test_cursor_after_a_pass_shows_the_whole_last_pass() -> None:
    r = routing_at(split_trace(), 16)  # phase_set dw: no pass contains it, DX was the last one
    assert r["phase"] == "dx" and r["complete"] is True
    assert r["handles_replayed"] == [1, 0] and r["targets"] == {1: [0], 0: [0]}


def test_dw_pass_routes_captured_parameters_and_releases() -> None:
    r = routing_at(split_trace(), None)
    assert r["phase"] == "dw" and (r["start_seq"], r["end_seq"]) == (18, 23)
    assert r["handles_replayed"] == []  # replayed in DX already
    assert r["targets"] == {1: [], 0: []} and r["discarded"] == {1: [0], 0: [0]}
    assert r["captured"] == {1: ["blocks.1.weight"], 0: ["blocks.0.weight"]}
    assert r["captured_missed"] == {1: ["tensor(4,)"], 0: ["tensor(4,)"]}
    assert r["released"] == [1, 0] and r["release_reasons"] == {1: "dw_complete", 0: "dw_complete"}


def test_before_any_pass_everything_is_empty() -> None:
    r = routing_at(split_trace(), 5)
    assert r["phase"] is None and r["handles"] == [] and r["targets"] == {}
    dot = render_routing(split_trace(), 5)
    assert 'label="no backward pass yet"' in dot and 'label="no checkpoint reached"' in dot
    assert "<svg" in _svg(dot)


def test_a_second_backward_at_another_line_is_a_new_pass_with_the_refusal() -> None:
    trace = refused_trace()
    assert [(p["start_seq"], p["end_seq"]) for p in backward_passes(trace)] == [(3, 7), (8, 10)]
    r = routing_at(trace, None)
    assert r["refused"] == [0] and r["handles"] == [0] and r["handles_replayed"] == []
    assert routing_at(trace, 7)["released"] == [0]


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
    passes = backward_passes(b.trace())
    assert [(p["start_seq"], p["end_seq"], p["group"]) for p in passes] == [
        (0, 3, (0, 0)), (4, 7, (0, 1)), (9, 10, (None, None)), (11, 12, (None, None))]
    assert routing_at(b.trace(), 6)["microbatch"] == 1


def test_a_handle_is_replayed_only_once_its_replay_finished() -> None:
    r = routing_at(split_trace(), 9)  # seq 9: h1's replay_started
    assert r["handles_replaying"] == [1] and r["handles_replayed"] == []
    dot = render_routing(split_trace(), 9)
    assert "replayed here" not in dot and 'label="h1 · Block.forward\\nreplaying"' in dot
    assert 'label="h1 · Block.forward\\nreplayed here"' in render_routing(split_trace(), 10)


def test_dx_flows_from_block_to_block() -> None:
    dot = render_routing(split_trace(), 15)
    # The snapshot (two chained regions) says who feeds whom: loss -> h1 -> h0 -> the model input.
    for edge in ("loss -> h1", "h1 -> h0", "h0 -> input"):
        assert f'{edge} [color="{EDGE_COLOURS["dx"]}", label="DX"' in dot
    assert "DX pass (input grads) · events 8–15 · train.py:21" in dot
    assert "dX" not in dot and "[0]" not in dot and "input 0" not in dot
    assert "<svg" in _svg(dot)


def test_dw_routes_and_the_dropped_dx() -> None:
    dw = render_routing(split_trace(), None)
    assert f'h1 -> h1_cap0 [color="{EDGE_COLOURS["dw"]}", style="dashed", label="DW: .grad"' in dw
    assert f'h1 -> h0 [color="{EDGE_COLOURS["none"]}", style="dashed", label="DX dropped"' in dw
    assert 'label="h1 · Block.forward\\nreleased: DW is done"' in dw and 'label="tensor(4,) (no grad)"' in dw
    assert "dw_complete" not in dw and "<svg" in _svg(dw)


def test_without_a_snapshot_the_handles_chain_in_the_order_reached() -> None:
    assert handle_flow(None, [3, 2]) == [("loss", 3, False), (3, 2, False)]
    assert handle_flow(block_snapshot(2), [1, 0]) == [("loss", 1, True), (0, "input", True), (1, 0, True)]
    # A snapshot that does not hold the pass's handles (another stage's graph) falls back to the chain.
    assert handle_flow(block_snapshot(2), [5]) == [("loss", 5, False)]


def test_words_instead_of_raw_lists() -> None:
    b = Builder()
    b.ev("handle_created", 0, function="blocks.0", inputs=[{"shape": [2, 4]}], param_input_mask=[False])
    b.ev("handle_created", 1, function="attn", inputs=[{"shape": [2, 4]}, {"shape": [4, 4]}],
         param_input_mask=[False, True])
    b.ev("backward_entered", 0, phase="dx", site="t.py:1")
    b.ev("grads_routed", 0, phase="dx", site="t.py:1", targets=[], explicit_params=[])
    trace = b.trace()
    assert input_words(trace, 0, 0) == "the block's input (2, 4)"
    assert input_words(trace, 1, 0) == "input 1 of 2 (2, 4)" and input_words(trace, 1, 1) == "parameter input 2 (4, 4)"
    assert release_words("ordinary_backward_complete") == "its backward is done"
    dot = render_routing(trace, None)
    assert "h0 · blocks.0" in dot and "no inputs got a gradient" in dot and "[]" not in dot


def test_pipeline_passes_say_their_stage_and_micro_batch() -> None:
    r = routing_at(split_trace(), 12)
    assert pass_title(r) == "DX pass (input grads) · events 8–12 (running) · train.py:21"
    b = Builder()
    b.ev("backward_entered", 0, phase="dx", site="pipe.py:1", tags={"stage": 1, "microbatch": 3})
    r = routing_at(b.trace(), None)
    assert pass_title(r) == "DX pass (input grads) · stage 1, micro-batch 3 · events 0–0 · pipe.py:1"
    assert "stage 1, micro-batch 3" in render_routing(b.trace(), None)


def test_explicit_parameter_inputs_get_dw_edges() -> None:
    b = Builder()
    b.ev("backward_entered", 0, phase="dw", site="t.py:1")
    b.ev("grads_routed", 0, phase="dw", site="t.py:1", targets=[1], explicit_params=[1],
         discarded_activations=[0])
    b.ev("released", 0, phase="dw", site="t.py:1", reason="dw_complete")
    dot = render_routing(b.trace(), None)
    assert re.search(r'h0_in1 \[label="parameter input 2", shape="box", style="filled,rounded"', dot)
    assert f'h0 -> h0_in1 [color="{EDGE_COLOURS["dw"]}", label="DW"' in dot
    assert "<svg" in _svg(dot)


def test_the_table_rows_say_where_dx_went_and_on_to_whom() -> None:
    from ckpt_viz.render.routing_table import routing_rows

    rows = routing_rows(split_trace(), 15)
    assert [r["handle"] for r in rows] == ["h1", "h0"]
    assert rows[0]["in this pass"] == "replayed here"
    assert rows[0]["DX went to"] == "the block's input, on to h0"
    assert rows[1]["DX went to"] == "the block's input, on to the model input"
    dw = routing_rows(split_trace(), None)
    assert dw[0]["in this pass"] == "released: DW is done" and dw[0]["parameters given .grad"] == "blocks.1.weight"
    assert dw[0]["DX went to"] == "none (DW pass)" and dw[0]["DX dropped (DW pass)"] == "the block's input"
    assert routing_rows(split_trace(), 5) == []
    assert routing_rows(split_trace(), 9)[0]["DX went to"] == "not routed yet"  # replaying, not routed
    assert not [v for r in rows + dw for v in r.values() if "[" in v or "input 0" in v]


def test_a_loaded_trace_gives_the_same_passes_as_its_events(tmp_path) -> None:
    """Passes are read from the columns of a loaded trace (data read by key, tags groups looked up once per tags
    object): the same passes and routing as from the events, on the split, refused and pipeline-tagged traces."""
    from ckpt_viz.trace import Trace

    for i, trace in enumerate((split_trace(), refused_trace())):
        path = tmp_path / f"t{i}.json.gz"
        trace.save(path)
        loaded = Trace.load(path)
        assert backward_passes(loaded) == backward_passes(trace) != []
        for cursor in range(0, len(trace), 3):
            assert routing_at(loaded, cursor) == routing_at(trace, cursor)
        assert not loaded.events.materialized
