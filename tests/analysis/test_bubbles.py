"""Step time and bubbles (`ckpt_viz.analysis.actions`): action boxes from their start and end events, the bubble
per rank and stage, the in-process schedule's ticks, and the words `ckpt-viz info` and the timeline print."""
from __future__ import annotations

import os

import pytest

from ckpt_viz import bus
from ckpt_viz.analysis.actions import actions, bubble_lines, bubble_rows, bubbles, tick_at
from ckpt_viz.events import ActionFinished, ActionStarted
from ckpt_viz.trace import Trace
from traces import event_of

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "distributed")


def _timed(*rows: tuple) -> Trace:
    """Events from (kind, t_us, tags[, fields]) rows, seqs in order."""
    events = []
    for seq, (kind, t_us, tags, *fields) in enumerate(rows):
        events.append(event_of(kind, seq=seq, t_ns=int(t_us * 1000), tags=tags, **(fields[0] if fields else {})))
    return Trace(events=events, meta={"distributed": {"merged": True}})


def _tags(rank: int, action: str, mb: int = 0, step: int | None = 0) -> dict:
    return {"rank": rank, "stage": rank, "microbatch": mb, "action": action, **({} if step is None else {"step": step})}


def test_a_bounded_box_covers_work_outside_checkpoint_events() -> None:
    """rank 0: F from 0 to 10 µs, its only checkpoint event at 5 µs; rank 1: F from 20 to 40 µs (events at 25, 30)."""
    trace = _timed(("action_started", 0, _tags(0, "F")), ("forward_started", 5, _tags(0, "F")),
                   ("action_finished", 10, _tags(0, "F")),
                   ("action_started", 20, _tags(1, "F")), ("forward_started", 25, _tags(1, "F")),
                   ("forward_finished", 30, _tags(1, "F")), ("action_finished", 40, _tags(1, "F")))
    first, second = actions(trace)
    assert (first.start_us, first.end_us, first.bounded) == (0.0, 10.0, True)
    assert (second.start_us, second.end_us, second.start_seq, second.end_seq) == (20.0, 40.0, 3, 6)
    found = bubbles(trace)
    assert found.unit == "µs" and found.exact
    (step,) = found.steps
    assert (step.step, step.start, step.end, step.length) == (0, 0.0, 40.0, 40.0)
    assert (step.by_rank[0].busy, step.by_rank[0].idle, step.by_rank[0].bubble) == (10.0, 30.0, 0.75)
    assert (step.by_rank[1].busy, step.by_rank[1].bubble) == (20.0, 0.5)
    assert step.bubble == (30.0 + 20.0) / (2 * 40.0)
    assert bubble_lines(trace) == ["step 0: 40 µs; bubble 62% (rank 0 75%, rank 1 50%)"]
    assert bubble_rows(trace) == [
        {"": "rank 0", "busy": "10 µs", "idle": "30 µs", "bubble": "75%", "actions": 1},
        {"": "rank 1", "busy": "20 µs", "idle": "20 µs", "bubble": "50%", "actions": 1},
        {"": "stage 0", "busy": "10 µs", "idle": "30 µs", "bubble": "75%", "actions": 1},
        {"": "stage 1", "busy": "20 µs", "idle": "20 µs", "bubble": "50%", "actions": 1}]


def test_without_boundaries_a_box_spans_its_events_and_the_bubble_is_an_upper_bound() -> None:
    trace = _timed(("forward_started", 5, _tags(0, "F")), ("forward_finished", 8, _tags(0, "F")),
                   ("forward_started", 25, _tags(1, "F")), ("forward_finished", 30, _tags(1, "F")))
    # microseconds from the trace's first event (at 5 µs)
    assert [(a.start_us, a.end_us, a.bounded) for a in actions(trace)] == [(0.0, 3.0, False), (20.0, 25.0, False)]
    found = bubbles(trace)
    assert not found.exact and found.steps[0].length == 25.0
    assert found.steps[0].by_rank[0].bubble == pytest.approx(22 / 25)
    assert bubble_lines(trace)[0].endswith("an upper bound: actions without start and end events")


def test_overlapping_actions_of_one_rank_count_once_and_a_repeated_start_is_a_new_action() -> None:
    trace = _timed(("action_started", 0, _tags(0, "F", 0, None)), ("action_started", 2, _tags(0, "F", 1, None)),
                   ("action_finished", 6, _tags(0, "F", 0, None)), ("action_finished", 8, _tags(0, "F", 1, None)),
                   ("action_started", 10, _tags(0, "F", 0, None)), ("action_finished", 12, _tags(0, "F", 0, None)))
    done = actions(trace)
    assert [(a.microbatch, a.start_us, a.end_us) for a in done] == [(0, 0.0, 6.0), (1, 2.0, 8.0), (0, 10.0, 12.0)]
    (step,) = bubbles(trace).steps
    assert step.step is None and step.length == 12.0 and step.by_rank[0].busy == 10.0  # 0-8 and 10-12


def test_a_finished_box_is_not_stretched_by_a_late_event_of_its_tags() -> None:
    trace = _timed(("action_started", 0, _tags(0, "B")), ("action_finished", 4, _tags(0, "B")),
                   ("node_collected", 9, _tags(0, "B"), {"handle_id": 0}))
    (a,) = actions(trace)
    assert (a.start_us, a.end_us, a.end_seq) == (0.0, 4.0, 1)


@pytest.mark.parametrize(("schedule", "ticks", "bubble"), [("GPipe", 15, 3 / 15), ("1F1B", 15, 3 / 15),
                                                             ("ZB-H1", 13, 1 / 13)])
def test_an_in_process_run_counts_in_the_schedules_ticks(schedule: str, ticks: int, bubble: float) -> None:
    """2 stages, 4 micro-batches: GPipe's and 1F1B's bubble is (S - 1) / (M + S - 1) of the F + B step (B two
    ticks); ZB-H1 fills all but one tick."""
    from ckpt_viz.run.pipeline import run_pipeline
    from ckpt_viz.run.zoo import build_builtin

    trace = run_pipeline(build_builtin("pipeline"), schedule=schedule, microbatches=4)
    done = actions(trace)
    assert done and all(a.bounded for a in done)
    assert trace.count("action_started") == trace.count("action_finished") == len(done)
    assert [[a.action, a.stage, a.microbatch, a.tick] for a in sorted(done, key=lambda a: a.start_seq)] == \
        [list(item) for item in trace.meta["actions"]]
    found = bubbles(trace)
    (step,) = found.steps
    assert found.unit == "tick" and step.length == ticks and not step.by_rank
    assert {s: b.bubble for s, b in step.by_stage.items()} == {0: pytest.approx(bubble), 1: pytest.approx(bubble)}
    assert step.wall_us > 0
    first = done[0]
    assert tick_at(trace, first.start_seq) == first.tick and tick_at(trace, done[-1].end_seq + 1) == ticks


def test_a_merged_two_rank_run_has_exact_bubbles_per_rank_and_stage() -> None:
    from ckpt_viz.cli.merge import merge_run

    merged, _ = merge_run(DATA)
    done = actions(merged)
    assert done and all(a.bounded for a in done)
    found = bubbles(merged)
    assert found.unit == "µs" and found.exact and [s.step for s in found.steps] == [0]
    (step,) = found.steps
    assert set(step.by_rank) == {0, 1} and set(step.by_stage) == {0, 1, 2, 3}
    for b in (*step.by_rank.values(), *step.by_stage.values()):
        assert 0 < b.busy < step.length and b.busy + b.idle == pytest.approx(step.length)
    # a rank is busy at least as long as each of its stages, and at most as long as both together
    for rank, stages in ((0, (0, 3)), (1, (1, 2))):
        parts = [step.by_stage[s].busy for s in stages]
        assert max(parts) <= step.by_rank[rank].busy <= sum(parts) + 1e-6
    assert step.length == pytest.approx(max(a.end_us for a in done) - min(a.start_us for a in done))


def test_bus_action_marks_start_and_end_also_when_the_block_raises() -> None:
    seen = []
    unsubscribe = bus.subscribe(seen.append)
    try:
        with pytest.raises(ValueError), bus.action(stage=1, microbatch=2, action="DW"):
            raise ValueError("boom")
    finally:
        unsubscribe()
    assert [type(e) for e in seen] == [ActionStarted, ActionFinished]
    assert all(e.tags == {"stage": 1, "microbatch": 2, "action": "DW"} and e.site is None for e in seen)
    with bus.action(stage=0, microbatch=0, action="F"):  # nobody listening: nothing is built
        assert bus.enabled is False
