"""lifecycle_intervals / render_lifecycles on hand-built traces: exact intervals, refusals, lane order, chart; the
lanes are the lifecycle's transitions (`ckpt_viz.analysis.lifecycle`), named by `analysis.handles`, in words."""
from __future__ import annotations

from itertools import pairwise

from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.render import palette
from ckpt_viz.render.swimlane import LIFECYCLE_COLOURS, lane_label, lifecycle_intervals, render_lifecycles
from ckpt_viz.vocabulary import STATES
from traces import Builder, nonreentrant_trace, refused_trace, split_trace, synthetic_trace


def _bars(rows: list[dict], h: int) -> list[tuple]:
    return [(r["state"], r["start_seq"], r["end_seq"], r.get("reason"))
            for r in rows if r["kind"] == "interval" and r["handle_id"] == h]


def test_split_trace_lanes() -> None:
    rows = lifecycle_intervals(split_trace())
    assert _bars(rows, 0) == [("recorded", 0, 6, None), ("phase_dx", 6, 13, None), ("replaying", 13, 14, None),
                              ("replayed", 14, 15, None), ("retained", 15, 23, None),
                              ("released", 23, 26, "dw_complete")]
    assert _bars(rows, 1) == [("recorded", 3, 7, None), ("phase_dx", 7, 9, None), ("replaying", 9, 10, None),
                              ("replayed", 10, 11, None), ("retained", 11, 20, None),
                              ("released", 20, 26, "dw_complete")]
    assert {r["lane"] for r in rows if r["handle_id"] == 1} == {"h1 Block.forward · stage 0 · mb 1"}
    assert {r["state"] for r in rows} <= set(STATES) - {"not_created"}


def test_refused_replay_is_a_point_row_after_the_release() -> None:
    rows = lifecycle_intervals(refused_trace())
    assert _bars(rows, 0) == [("recorded", 0, 4, None), ("replaying", 4, 5, None), ("replayed", 5, 7, None),
                              ("released", 7, 11, "ordinary_backward_complete")]
    assert [r for r in rows if r["kind"] == "refused"] == [
        {"kind": "refused", "handle_id": 0, "lane": "h0 mlp", "seq": 9, "reason": "released",
         "because": "replay refused: it was already released"}]
    released = next(r for r in rows if r["state"] == "released")
    assert (released["what"], released["because"]) == ("released", "its backward finished")


def test_phase_dw_before_any_replay_and_retained_ordinary_and_prefire() -> None:
    b = Builder()
    b.ev("handle_created", 0, function="f")                        # 0
    b.ev("phase_set", 0, phase="dx", old="ordinary", new="dx")     # 1 first stage: DX skipped ...
    b.ev("phase_set", 0, phase="dw", old="dx", new="dw")           # 2
    b.ev("backward_entered", 0, phase="dw")                        # 3
    b.ev("replay_started", 0, phase="dw", trigger="backward")      # 4 ... DW replays
    b.ev("replay_finished", 0, phase="dw", trigger="backward")     # 5
    b.ev("grads_routed", 0, phase="dw", targets=[])                # 6
    b.ev("released", 0, phase="dw", reason="dw_complete")          # 7
    b.ev("handle_created", 1, phase="ordinary")                    # 8
    b.ev("replay_started", 1, phase="ordinary", trigger="prefire")  # 9
    b.ev("replay_finished", 1, phase="ordinary", trigger="prefire")  # 10 prefire keeps the replay
    b.ev("backward_entered", 1, phase="ordinary")                  # 11
    b.ev("grads_routed", 1, phase="ordinary", targets=[0])         # 12 a retaining session: no release
    b.ev("backward_entered", 1, phase="ordinary")                  # 13
    rows = lifecycle_intervals(b.trace())
    assert _bars(rows, 0) == [("recorded", 0, 1, None), ("phase_dx", 1, 2, None), ("phase_dw", 2, 4, None),
                              ("replaying", 4, 5, None), ("replayed", 5, 7, None), ("released", 7, 14, "dw_complete")]
    assert _bars(rows, 1) == [("recorded", 8, 9, None), ("replaying", 9, 10, None), ("retained", 10, 14, None)]


def test_nonreentrant_frames_are_released_by_consumption_or_session_clear() -> None:
    rows = lifecycle_intervals(nonreentrant_trace())
    assert _bars(rows, 0) == [("recorded", 0, 6, None), ("replaying", 6, 7, None), ("replayed", 7, 8, None),
                              ("retained", 8, 13, None), ("released", 13, 21, "consumed")]
    assert _bars(rows, 1) == [("recorded", 16, 17, None), ("replaying", 17, 18, None), ("replayed", 18, 19, None),
                              ("retained", 19, 20, None), ("released", 20, 21, "session_cleared")]


def test_lanes_are_grouped_by_stage_then_microbatch() -> None:
    b = Builder()
    b.ev("handle_created", 5, tags={"stage": 1, "microbatch": 0})
    b.ev("handle_created", 6, tags={"stage": 0, "microbatch": 1})
    b.ev("handle_created", 7, tags={"stage": 0, "microbatch": 0})
    b.ev("handle_created", 8)
    rows = lifecycle_intervals(b.trace())
    assert [r["lane"] for r in rows] == [
        "h7 · stage 0 · mb 0", "h6 · stage 0 · mb 1", "h5 · stage 1 · mb 0", "h8"]
    assert lane_label(3, {"stage": 2}) == "h3 · stage 2"
    assert lane_label(3, {"microbatch": 1}, "transformer.h.2") == "h3 transformer.h.2 · mb 1"


def test_lanes_of_a_recorded_run_carry_the_blocks_qualified_names() -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    trace = run_scenario(build_builtin("mlp"), "split-reentrant", memory=False, graphs=False)
    names = {r["handle_id"]: r["lane"] for r in lifecycle_intervals(trace)}
    created = {e.handle_id: e.label or e.function for e in trace.of_kind("handle_created")}
    assert list(created.values()) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert names == {h: f"h{h} {n}" for h, n in created.items()}


def test_chart_layers_bars_refusals_and_cursor() -> None:
    trace = refused_trace()
    chart = render_lifecycles(trace, cursor=8)
    spec = chart.to_dict()
    bars, crosses, rule = chart.layer
    assert bars.mark.type == "bar" and crosses.mark.type == "point" and rule.mark.type == "rule"
    assert bars.data.values == [r for r in lifecycle_intervals(trace) if r["kind"] == "interval"]
    assert crosses.data.values[0]["seq"] == 9
    assert rule.data.values == [{"seq": 8}]
    colour = spec["layer"][0]["encoding"]["color"]["scale"]
    assert colour["domain"] == list(STATES)
    assert colour["range"] == [LIFECYCLE_COLOURS[s] for s in STATES] == [palette.STATE_COLOURS[s] for s in STATES]
    assert rule.mark.color == palette.CURSOR_COLOUR and crosses.mark.color == palette.MARK_COLOURS["refused"]
    assert "'phase_dx': 'waiting for DX'" in spec["layer"][0]["encoding"]["color"]["legend"]["labelExpr"]


def test_chart_without_refusals_or_cursor() -> None:
    chart = render_lifecycles(split_trace())
    assert len(chart.layer) == 1
    assert chart.to_dict()["layer"][0]["encoding"]["y"]["sort"] == ["h0 Block.forward · stage 0 · mb 0",
                                                                    "h1 Block.forward · stage 0 · mb 1"]


def test_lanes_are_the_lifecycle_transitions_laid_end_to_end() -> None:
    for trace in (split_trace(), refused_trace(), nonreentrant_trace()):
        life = lifecycle(trace)
        rows = lifecycle_intervals(trace)
        for h in life.handle_ids:
            bars = [r for r in rows if r["kind"] == "interval" and r["handle_id"] == h]
            assert [(r["start_seq"], r["state"]) for r in bars] == [(t.seq, t.state) for t in life.transitions(h)]
            assert all(a["end_seq"] == b["start_seq"] for a, b in pairwise(bars))


def test_a_window_keeps_the_handles_with_events_in_it_clipped_with_the_whole_trace_states() -> None:
    trace = split_trace()
    rows = lifecycle_intervals(trace, start=10, stop=16)
    assert _bars(rows, 0) == [("phase_dx", 10, 13, None), ("replaying", 13, 14, None), ("replayed", 14, 15, None),
                              ("retained", 15, 16, None)]
    assert _bars(rows, 1) == [("replayed", 10, 11, None), ("retained", 11, 16, None)]
    # Only h1 has an event in [8, 12): h0 waits in phase_dx without one, so its lane is left out.
    assert {r["handle_id"] for r in lifecycle_intervals(trace, start=8, stop=12)} == {1}
    refused = lifecycle_intervals(refused_trace(), start=8, stop=11)
    assert [(r["seq"], r["reason"]) for r in refused if r["kind"] == "refused"] == [(9, "released")]
    assert _bars(refused, 0) == [("released", 8, 11, "ordinary_backward_complete")]
    assert render_lifecycles(trace, cursor=12, start=10, stop=16).layer[0].data.values == [
        r for r in rows if r["kind"] == "interval"]


def test_a_handle_collected_before_any_replay_shows_collected_then_the_refusal() -> None:
    b = Builder()
    b.ev("handle_created", 0)                                   # 0
    b.ev("node_collected", 0, was_replayed=False, released=False)  # 1 R10
    b.ev("replay_refused", 0, reason="node_collected")           # 2
    rows = lifecycle_intervals(b.trace())
    assert _bars(rows, 0) == [("recorded", 0, 1, None), ("collected", 1, 3, None)]
    assert [(r["seq"], r["reason"]) for r in rows if r["kind"] == "refused"] == [(2, "node_collected")]


def test_a_window_on_a_long_trace_shows_the_same_states_as_the_lifecycle_at_the_cursor() -> None:
    trace = synthetic_trace(39_000)  # 3 waves of 1,000 handles, 13 steps each
    life = lifecycle(trace)
    for cursor in (6_500, 20_000, 38_999):
        rows = lifecycle_intervals(trace, start=cursor - 600, stop=cursor + 601)
        at = {r["handle_id"]: r["state"] for r in rows
              if r["kind"] == "interval" and r["start_seq"] <= cursor < r["end_seq"]}
        assert len(at) >= 601  # every handle with an event within 600 events of the cursor
        assert at == {h: life.state_at(h, cursor) for h in at}
    # Events 20,000..20,999 are step 7 (grads_routed, dx) of wave 1's handles 1,000..1,999: each is replayed
    # until its own event, retained after it; none is drawn "recorded" at the window's start.
    rows = lifecycle_intervals(trace, start=20_000, stop=21_000)
    assert {r["handle_id"] for r in rows} == set(range(1_000, 2_000))
    assert {r["state"] for r in rows} == {"replayed", "retained"}
    assert {r["state"] for r in rows if r["end_seq"] == 21_000} == {"retained"}


def test_one_handles_lane_keeps_the_whole_runs_states() -> None:
    trace = split_trace()
    rows = lifecycle_intervals(trace, handles=(1,))
    assert {r["handle_id"] for r in rows} == {1} and _bars(rows, 1) == _bars(lifecycle_intervals(trace), 1)
    chart = render_lifecycles(trace, handles=(0,), cursor=3)
    assert {r["handle_id"] for r in chart.layer[0].data.values} == {0}
