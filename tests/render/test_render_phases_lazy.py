"""The memory chart's pass words without the pass of every event: `action_at(trace, p)` equals
`event_actions(trace)[p]` at every position, and `phase_spans_more_than(trace, k)` equals
`phase_span_count(trace) > k`, on every built-in model in every mode, saved and loaded, and on random streams."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from ckpt_viz.catalog import BUILTIN_MODEL_NAMES, MODES
from ckpt_viz.events import Event
from ckpt_viz.render import phases
from ckpt_viz.render.phases import action_at, event_actions, phase_span_count, phase_spans_more_than
from ckpt_viz.trace import Trace
from traces import nonreentrant_trace, refused_trace, split_trace, synthetic_trace


def assert_same(trace: Trace) -> None:
    actions = event_actions(trace)
    assert [action_at(trace, p) for p in range(len(actions))] == actions
    count = phase_span_count(trace)
    for limit in {0, 1, 2, count - 1, count, count + 1, 60}:
        assert phase_spans_more_than(trace, limit) == (count > limit), limit


@pytest.mark.parametrize("model", BUILTIN_MODEL_NAMES)
def test_every_builtin_model_and_mode(model: str, tmp_path: Path) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    for mode in MODES:
        if mode == "pipeline" and model != "pipeline":
            continue  # only the built-in model 'pipeline' has stages
        trace = run_scenario(build_builtin(model), mode, memory=True, graphs=False)
        assert_same(trace)
        trace.save(tmp_path / "t.json")
        assert_same(Trace.load(tmp_path / "t.json"))


def test_hand_built_and_synthetic_traces() -> None:
    for trace in (split_trace(), refused_trace(), nonreentrant_trace(), synthetic_trace(5_000), Trace()):
        assert_same(trace)


_KINDS = ("handle_created", "forward_started", "backward_entered", "replay_started", "released", "grads_routed",
          "session_activated", "memory_sampled", "session_cleared", "error")


def _random_trace(seed: int) -> Trace:
    rng = random.Random(seed)
    events = []
    for seq in range(rng.randrange(1, 400)):
        kind = rng.choice(_KINDS)
        data: dict = {}
        if kind == "session_activated":
            data["retain_on_unpack"] = rng.random() < 0.3
        elif kind == "memory_sampled":
            data["at"] = rng.choice(("blocks.0 forward", "blocks.1 backward", "loss", "end"))
        events.append(Event(seq=seq, t_ns=seq, kind=kind, handle_id=rng.choice((None, 0, 1)),
                            phase=rng.choice(("dx", "dw", "ordinary", None, None, None)), data=data))
    return Trace(events=events)


def test_random_event_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in range(200):
        assert_same(_random_trace(seed))
    monkeypatch.setattr(phases, "_WALK", 3)  # the fallback to every event's pass, past the walk
    for seed in range(20):
        assert_same(_random_trace(seed))


def test_more_than_on_long_traces_read_by_prefix() -> None:
    # 1. Many passes early (found from the first 4,096 events); 2. few early and many after 70,000 events
    #    (found from a longer prefix); 3. few anywhere (the whole count).
    def trace_of(column: list) -> Trace:
        return Trace(events=[Event(seq=i, t_ns=i, kind="grads_routed", handle_id=0, phase=p)
                             for i, p in enumerate(column)])

    alternating = ["dx", "dw", None] * 40
    for column in (alternating * 200, ["dx"] * 70_000 + alternating * 10, ["dx"] * 50_000 + ["dw"] * 50_000):
        trace = trace_of(column)
        count = phase_span_count(trace)
        for limit in (0, 1, 60, count - 1, count):
            assert phase_spans_more_than(trace, limit) == (count > limit), (limit, count)
