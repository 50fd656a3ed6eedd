"""lifecycle_intervals / render_lifecycles on hand-built traces: exact intervals, refusals, lane order, chart."""
from __future__ import annotations

from traces import Builder, nonreentrant_trace, refused_trace, split_trace

from ckpt_viz.render.swimlane import LIFECYCLE_STATES, lane_label, lifecycle_intervals, render_lifecycles


def _bars(rows: list[dict], h: int) -> list[tuple]:
    return [(r["state"], r["start_seq"], r["end_seq"], r.get("reason"))
            for r in rows if r["kind"] == "interval" and r["handle_id"] == h]


def test_split_trace_lanes() -> None:
    rows = lifecycle_intervals(split_trace())
    assert _bars(rows, 0) == [("recorded", 0, 6, None), ("phase_dx", 6, 13, None), ("replayed", 13, 15, None),
                              ("retained", 15, 23, None), ("released", 23, 26, "dw_complete")]
    assert _bars(rows, 1) == [("recorded", 3, 7, None), ("phase_dx", 7, 9, None), ("replayed", 9, 11, None),
                              ("retained", 11, 20, None), ("released", 20, 26, "dw_complete")]
    assert {r["lane"] for r in rows if r["handle_id"] == 1} == {"h1 · stage 0 · mb 1"}
    assert {r["state"] for r in rows} <= set(LIFECYCLE_STATES)


def test_refused_replay_is_a_point_row_after_the_release() -> None:
    rows = lifecycle_intervals(refused_trace())
    assert _bars(rows, 0) == [("recorded", 0, 4, None), ("replayed", 4, 7, None),
                              ("released", 7, 11, "ordinary_backward_complete")]
    assert [r for r in rows if r["kind"] == "refused"] == [
        {"kind": "refused", "handle_id": 0, "lane": "h0", "seq": 9, "reason": "released"}]


def test_phase_dw_before_any_replay_and_retained_ordinary_and_prefire() -> None:
    b = Builder()
    b.ev("handle_created", 0)                                      # 0
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
                              ("replayed", 4, 7, None), ("released", 7, 14, "dw_complete")]
    assert _bars(rows, 1) == [("recorded", 8, 9, None), ("replayed", 9, 10, None), ("retained", 10, 14, None)]


def test_nonreentrant_frames_are_released_by_consumption_or_session_clear() -> None:
    rows = lifecycle_intervals(nonreentrant_trace())
    assert _bars(rows, 0) == [("recorded", 0, 6, None), ("replayed", 6, 8, None), ("retained", 8, 13, None),
                              ("released", 13, 21, "consumed")]
    assert _bars(rows, 1) == [("recorded", 16, 17, None), ("replayed", 17, 19, None), ("retained", 19, 20, None),
                              ("released", 20, 21, "session_cleared")]


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
    assert colour["domain"] == list(LIFECYCLE_STATES)


def test_chart_without_refusals_or_cursor() -> None:
    chart = render_lifecycles(split_trace())
    assert len(chart.layer) == 1
    assert chart.to_dict()["layer"][0]["encoding"]["y"]["sort"] == ["h0 · stage 0 · mb 0", "h1 · stage 0 · mb 1"]
