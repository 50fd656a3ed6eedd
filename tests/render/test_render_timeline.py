"""The schedule timeline: boxes per action from the recorded tags (`ckpt_viz.analysis.actions`), replays nested, the
cursor, the plan, bytes per stage."""
from __future__ import annotations

import dataclasses
import os

from ckpt_viz.analysis.actions import actions, planned_vs_executed
from ckpt_viz.render import palette
from ckpt_viz.render.timeline import render_bubbles, render_stage_memory, render_timeline, stage_memory_rows
from ckpt_viz.trace import MemorySample
from traces import Builder


def timeline_actions(trace) -> list[dict]:
    """The analysis's actions as plain rows."""
    return [dataclasses.asdict(a) for a in actions(trace)]

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "distributed")


def _two_rank_trace():
    """rank 0 stage 0 and rank 1 stage 1, one micro-batch: F0 F1, then I1 (a replay inside), I0, W1, W0.

    Seqs: 0-1 0F0, 2-3 1F0, 4-7 1I0 (replay 5-6), 8 0I0, 9-10 1W0, 11-12 0W0 (replay 11-12).
    """
    b = Builder()

    def tags(rank, stage, action):
        return {"rank": rank, "stage": stage, "microbatch": 0, "action": action, "step": 0}
    for rank in (0, 1):
        b.ev("handle_created", rank, mode="reentrant", tags=tags(rank, rank, "F"))
        b.ev("forward_started", rank, mode="reentrant", tags=tags(rank, rank, "F"))
    b.ev("backward_entered", 1, phase="dx", mode="reentrant", tags=tags(1, 1, "I"))
    b.ev("replay_started", 1, phase="dx", mode="reentrant", tags=tags(1, 1, "I"), trigger="backward")
    b.ev("replay_finished", 1, phase="dx", mode="reentrant", tags=tags(1, 1, "I"), trigger="backward")
    b.ev("grads_routed", 1, phase="dx", mode="reentrant", tags=tags(1, 1, "I"))
    b.ev("phase_set", 0, phase="dx", mode="reentrant", tags=tags(0, 0, "I"), old="ordinary", new="dx")
    b.ev("backward_entered", 1, phase="dw", mode="reentrant", tags=tags(1, 1, "W"))
    b.ev("released", 1, phase="dw", mode="reentrant", tags=tags(1, 1, "W"), reason="dw_complete")
    b.ev("replay_started", 0, phase="dw", mode="reentrant", tags=tags(0, 0, "W"), trigger="backward")
    b.ev("replay_finished", 0, phase="dw", mode="reentrant", tags=tags(0, 0, "W"), trigger="backward")
    b.memory.append(MemorySample(seq=12, t_ns=12_000, bytes_by_category={"activations": 10},
                                 by_stage={"0": {"activations": 4}, "1": {"activations": 6}}))
    planned = {"0": ["0F0", "0I0", "0W0"], "1": ["1F0", "1W0", "1I0"]}  # rank 1's plan differs on purpose
    return b.trace(schedule="ZBV", distributed={"planned_order": planned})


def test_one_box_per_action_with_torch_names_as_dx_and_dw() -> None:
    rows = timeline_actions(_two_rank_trace())
    got = [(r["lane"], r["action"], r["torch_action"], r["start_seq"], r["end_seq"], r["replays"]) for r in rows]
    assert got == [("rank 0 · stage 0", "F", "F", 0, 1, 0), ("rank 1 · stage 1", "F", "F", 2, 3, 0),
                   ("rank 1 · stage 1", "DX", "I", 4, 7, 1), ("rank 0 · stage 0", "DX", "I", 8, 8, 0),
                   ("rank 1 · stage 1", "DW", "W", 9, 10, 0), ("rank 0 · stage 0", "DW", "W", 11, 12, 1)]
    assert [s[1:3] for s in rows[2]["replay_spans"]] == [(5, 6)]


def test_planned_against_executed_order() -> None:
    plan = planned_vs_executed(_two_rank_trace())
    assert dataclasses.astuple(plan[0]) == ("rank 0", "0F0 0DX0 0DW0", "0F0 0DX0 0DW0", True, None)
    assert plan[1].same is False and plan[1].first_difference == 1


def test_chart_colours_actions_nests_replays_and_marks_the_cursor() -> None:
    trace = _two_rank_trace()
    spec = render_timeline(trace, cursor=5, x="events").to_dict()
    boxes, _text, replays, cursor = spec["layer"]
    assert boxes["data"] == _text["data"]  # the labels read the boxes' rows
    colour = boxes["encoding"]["color"]["scale"]
    assert dict(zip(colour["domain"], colour["range"])) == palette.ACTION_COLOURS
    box_rows = boxes["data"]["values"]
    assert [(r["lane"], r["x0"], r["x1"], r["label"]) for r in box_rows][2] == ("rank 1 · stage 1", 4.0, 8.0, "DX0")
    replay_rows = replays["data"]["values"]
    assert [(r["lane"], r["x0"], r["x1"]) for r in replay_rows] == [("rank 1 · stage 1", 5.0, 7.0),
                                                                    ("rank 0 · stage 0", 11.0, 13.0)]
    for r in replay_rows:  # inside a box of the same lane
        assert any(b["lane"] == r["lane"] and b["x0"] <= r["x0"] and r["x1"] <= b["x1"] for b in box_rows)
    assert cursor["mark"]["color"] == palette.CURSOR_COLOUR and cursor["data"]["values"][0]["x"] == 5.0
    timed = render_timeline(trace, cursor=5, x="time").to_dict()["layer"][-1]["data"]["values"][0]["x"]
    assert timed == 5.0  # µs: the Builder's events are 1 µs apart


def test_stage_memory_on_the_timelines_axis_in_kib() -> None:
    trace = _two_rank_trace()
    # the sample at seq 12 was taken 12 µs after the first event: x is the timeline's time, not the seq
    assert [(r["x"], r["seq"], r["stage"], r["bytes"], r["size"]) for r in stage_memory_rows(trace, "time")] == [
        (12.0, 12, "stage 0", 4, "4 B"), (12.0, 12, "stage 1", 6, "6 B")]
    assert [r["x"] for r in stage_memory_rows(trace, "events")] == [12.0, 12.0]
    layers = render_stage_memory(trace, cursor=3, x="time").to_dict()["layer"]
    assert layers[-1]["data"]["values"] == [{"x": 3.0}]  # the cursor's event, 3 µs in
    line = layers[0]["encoding"]
    timeline = render_timeline(trace, x="time").to_dict()["layer"][0]["encoding"]
    assert line["x"]["scale"]["domain"] == timeline["x"]["scale"]["domain"] == [0.0, 12.0]  # one x for both
    assert line["y"]["axis"]["minExtent"] == timeline["y"]["axis"]["minExtent"]  # plots of one width
    big = Builder()
    big.ev("phase_set", 0, tags={"stage": 0, "microbatch": 0, "action": "F"}, old="ordinary", new="dx")
    big.memory.append(MemorySample(seq=0, t_ns=0, bytes_by_category={}, by_stage={"0": {"activations": 3 << 20}}))
    axis = render_stage_memory(big.trace(), x="time").to_dict()["layer"][0]["encoding"]["y"]["axis"]
    assert "MiB" in axis["labelExpr"]  # KiB/MiB, never raw bytes


def test_an_in_process_pipeline_run_draws_by_tick() -> None:
    b = Builder()
    for kind, stage, mb in (("F", 0, 0), ("F", 1, 0), ("B", 1, 0), ("B", 0, 0)):
        b.ev("phase_set", 0, tags={"stage": stage, "microbatch": mb, "action": kind}, old="ordinary", new="ordinary")
    trace = b.trace(actions=[["F", 0, 0, 0], ["F", 1, 0, 1], ["B", 1, 0, 2], ["B", 0, 0, 4]])
    spec = render_timeline(trace).to_dict()  # x defaults to ticks here
    rows = spec["layer"][0].get("data", spec.get("data"))["values"]
    assert [(r["lane"], r["x0"], r["x1"]) for r in rows] == [("stage 0", 0.0, 1.0), ("stage 1", 1.0, 2.0),
                                                             ("stage 1", 2.0, 4.0), ("stage 0", 4.0, 6.0)]
    assert [p.same for p in planned_vs_executed(trace)] == [True, True]
    assert [r["x"] for r in stage_memory_rows(trace, "tick")] == []  # no samples here


def test_a_merged_real_run() -> None:
    from ckpt_viz.cli.merge import merge_run

    merged, _ = merge_run(DATA)
    rows = timeline_actions(merged)
    assert {r["lane"] for r in rows} == {"rank 0 · stage 0", "rank 0 · stage 3", "rank 1 · stage 1",
                                         "rank 1 · stage 2"}
    assert {r["action"] for r in rows} == {"F", "DX", "DW"}
    assert sum(r["replays"] for r in rows) == merged.count("replay_started") - sum(
        1 for e in merged if e.kind == "replay_started" and e.tags.get("action") == "META")
    render_timeline(merged, cursor=len(merged) // 2).to_dict()


def test_a_loaded_trace_gives_the_same_actions_as_its_events(tmp_path) -> None:
    """A saved and loaded trace gives the same actions as the one recorded, replays and their spans included, on a
    merged real run and on a hand-built two-rank run."""
    from ckpt_viz.cli.merge import merge_run
    from ckpt_viz.trace import Trace

    merged, _ = merge_run(DATA)
    assert any(r["replay_spans"] for r in timeline_actions(merged))
    traces = [merged, _two_rank_trace()]
    for i, trace in enumerate(traces):
        path = tmp_path / f"t{i}.json.gz"
        trace.save(path)
        expected = timeline_actions(trace)
        loaded = Trace.load(path)
        assert timeline_actions(loaded) == expected
        assert expected


def test_bubble_chart_draws_busy_then_idle_per_rank_and_stage() -> None:
    from ckpt_viz.analysis.actions import bubbles

    trace = _two_rank_trace()
    spec = render_bubbles(trace).to_dict()
    bars = spec["layer"][0]
    rows = bars.get("data", spec.get("data"))["values"]
    step = bubbles(trace).steps[0]
    by_lane = {(r["lane"], r["part"]): r["amount"] for r in rows}
    for word, group in (("rank", step.by_rank), ("stage", step.by_stage)):
        for key, b in group.items():
            assert by_lane[f"{word} {key}", "busy"] == b.busy and by_lane[f"{word} {key}", "idle"] == b.idle
    assert bars["encoding"]["y"]["sort"] == ["rank 0", "rank 1", "stage 0", "stage 1"]
    colour = bars["encoding"]["color"]["scale"]
    assert dict(zip(colour["domain"], colour["range"])) == palette.BUBBLE_COLOURS
    assert spec["title"] == "step 0: busy and idle time per rank and stage"
    labels = spec["layer"][1]
    assert labels["mark"]["type"] == "text" and labels["encoding"]["text"]["field"] == "share"
