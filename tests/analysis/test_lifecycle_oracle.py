"""The lifecycle (ckpt_viz.analysis.lifecycle) against the plain reference of tests/oracle.py, at every seq.

On every built-in model in every mode, pipeline schedules, every broken and divergent run, those traces saved and
loaded, the hand-built and synthetic traces, random event streams, random streams of repeated per-step patterns
and hand-built special cases of rule 4 (a grads_routed waiting for its handle's next event).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, BUILTIN_MODEL_NAMES, MODES
from ckpt_viz.trace import Trace
from oracle import assert_lifecycle_is_the_reference
from traces import nonreentrant_trace, refused_trace, split_trace, synthetic_trace, typed_event


def _loaded(trace: Trace, folder: Path, name: str) -> Trace:
    path = folder / f"{name}.json.gz"
    trace.save(path)
    return Trace.load(path)


@pytest.mark.parametrize("model", BUILTIN_MODEL_NAMES)
def test_every_builtin_model_and_mode(model: str, tmp_path: Path) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    ran = 0
    for mode in MODES:
        if mode == "pipeline" and not build_builtin(model).stages:
            continue  # only a model with stages runs as a pipeline
        trace = run_scenario(build_builtin(model), mode)
        ref = assert_lifecycle_is_the_reference(trace)
        assert bool(ref.order) == (mode != "none")
        assert_lifecycle_is_the_reference(_loaded(trace, tmp_path, f"{model}-{mode}"))
        ran += 1
    assert ran >= len(MODES) - 1


def test_every_broken_run(tmp_path: Path) -> None:
    from ckpt_viz.run.broken import record_broken

    for name in BROKEN_SCENARIO_NAMES:
        trace = record_broken(name)
        assert_lifecycle_is_the_reference(trace)
        assert_lifecycle_is_the_reference(_loaded(trace, tmp_path, name))


def test_pipeline_schedules(tmp_path: Path) -> None:
    from ckpt_viz.run.pipeline import run_pipeline
    from ckpt_viz.run.zoo import build_builtin

    for schedule in ("GPipe", "1F1B", "ZB-H1"):
        for microbatches in (2, 4):
            trace = run_pipeline(build_builtin("pipeline"), schedule=schedule, microbatches=microbatches)
            assert_lifecycle_is_the_reference(trace)
            assert_lifecycle_is_the_reference(_loaded(trace, tmp_path, f"pipeline-{schedule}-{microbatches}"))


def test_hand_built_and_synthetic_traces(tmp_path: Path) -> None:
    for trace in (split_trace(), refused_trace(), nonreentrant_trace(), synthetic_trace(20_000)):
        assert_lifecycle_is_the_reference(trace, every_seq=len(trace.events) < 1000)
        assert_lifecycle_is_the_reference(_loaded(trace, tmp_path, "synthetic"), every_seq=len(trace.events) < 1000)


# ------------------------------------------------------------------ random event streams

_STREAM_KINDS = ("handle_created", "phase_set", "replay_started", "replay_finished", "replay_failed", "grads_routed",
                 "released", "node_collected", "tensor_unpacked", "replay_refused", "session_cleared",
                 "backward_entered", "memory_sampled", "forward_started", "error")
_PHASES = ("dx", "dw", "ordinary", None)


def _fields(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == "phase_set":
        return {"old": rng.choice(_PHASES[:3]), "new": rng.choice(_PHASES[:3])}
    if kind in ("replay_started", "replay_finished"):
        fields = {"trigger": rng.choice(("backward", "prefire"))}
        if kind == "replay_finished" and rng.random() < 0.8:
            fields["saved_count"] = rng.randrange(3)
        return fields
    if kind == "replay_failed":
        return {"type": "ValueError"}
    if kind == "released":
        return {"reason": rng.choice(("dw_complete", "backward_exception", "ordinary_backward_complete",
                                      "session_cleared"))}
    if kind == "replay_refused":
        return {"reason": rng.choice(("released", "node_collected"))}
    if kind == "tensor_unpacked":
        return {"index": 0, "key_source": "session", "retain": False, "consumed": rng.random() < 0.7}
    if kind == "session_cleared":
        return {"frames": rng.sample(range(6), rng.randrange(4)), "handles": rng.sample(range(6), rng.randrange(2))}
    if kind == "error":
        return {"where": "backward", "type": "RuntimeError"}
    return {}


def _random_trace(seed: int) -> Trace:
    rng = random.Random(seed)
    events = []
    seq = rng.randrange(0, 5)  # a recording need not start at 0 in a test's hands
    for _ in range(rng.randrange(1, 300)):
        kind = rng.choice(_STREAM_KINDS)
        handle = None if (kind == "session_cleared" and rng.random() < 0.8) or rng.random() < 0.05 \
            else rng.randrange(6)
        events.append(typed_event(kind, seq=seq, t_ns=seq, handle_id=handle, phase=rng.choice(_PHASES),
                                  **_fields(rng, kind)))
        seq += rng.randrange(1, 3)
    return Trace(events=events)


def test_random_event_streams(tmp_path: Path) -> None:
    for seed in range(300):
        trace = _random_trace(seed)
        assert_lifecycle_is_the_reference(trace)
        if seed % 10 == 0:
            assert_lifecycle_is_the_reference(_loaded(trace, tmp_path, f"random{seed}"))


def _pattern_trace(seed: int) -> Trace:
    """Random per-step patterns repeated over many handles, interleaved in runs of random lengths."""
    rng = random.Random(seed)
    patterns = []
    for _ in range(rng.randrange(1, 4)):
        one = _random_trace(rng.randrange(10_000))
        patterns.append([e for e in one.events if e.handle_id is not None][:12])
    events: list[Any] = []
    open_lives: list[tuple[int, list]] = []
    for h in range(rng.randrange(5, 60)):
        open_lives.append((h, list(rng.choice(patterns))))
        while open_lives and (len(open_lives) > rng.randrange(1, 4) or rng.random() < 0.3):
            k = rng.randrange(len(open_lives))
            handle, life = open_lives[k]
            for e in life[:rng.randrange(1, 6)]:
                events.append(type(e)(**{**_own_fields(e), "seq": len(events), "t_ns": len(events),
                                         "handle_id": handle}))
            del life[:5]
            if rng.random() < 0.1:
                frames = [x for x, _ in rng.sample(open_lives, min(2, len(open_lives)))]
                events.append(typed_event("session_cleared", seq=len(events), t_ns=len(events), frames=frames))
            if not life:
                del open_lives[k]
    return Trace(events=events)


def _own_fields(e: Any) -> dict[str, Any]:
    return {name: getattr(e, name) for name in e.__struct_fields__}


def test_repeated_patterns(tmp_path: Path) -> None:
    checked = 0
    for seed in range(200):
        trace = _pattern_trace(seed)
        if len(trace.events):
            assert_lifecycle_is_the_reference(trace)
            checked += 1
            if seed % 10 == 0:
                assert_lifecycle_is_the_reference(_loaded(trace, tmp_path, f"pattern{seed}"))
    assert checked > 150


# ------------------------------------------------------------------ rule 4 and session clears, by hand

def _events(rows: list[tuple]) -> Trace:
    """(kind, handle, phase, fields) rows as a trace, seqs 10, 20, ..."""
    return Trace(events=[typed_event(kind, seq=10 * (i + 1), t_ns=i, handle_id=h, phase=phase, **fields)
                         for i, (kind, h, phase, fields) in enumerate(rows)])


def _life(h: int, dw_next: str, *, refuse: bool = False) -> list[tuple]:
    rows = [("handle_created", h, "ordinary", {}), ("phase_set", h, "dx", {"old": "ordinary", "new": "dx"}),
            ("replay_started", h, "dx", {"trigger": "backward"}),
            ("replay_finished", h, "dx", {"trigger": "backward", "saved_count": 2}),
            ("grads_routed", h, "dx", {}), ("phase_set", h, "dw", {"old": "dx", "new": "dw"}),
            ("grads_routed", h, "dw", {})]
    if dw_next == "released":
        rows.append(("released", h, "dw", {"reason": "dw_complete"}))
    elif dw_next:
        rows.append((dw_next, h, "dw", {}))
    if refuse:
        rows.append(("replay_refused", h, "dw", {"reason": "released"}))
    return rows


def test_a_grads_routed_waits_for_the_handles_next_event() -> None:
    # A dw grads_routed; the handle's next event is a release (never retained), another kind (retained from the
    # grads_routed), or there is none (retained).
    for after in ("released", "backward_entered"):
        rows = []
        for h in range(4):
            rows += _life(h, "")
        for h in range(4):
            rows += _life(h, after)[-1:]
        trace = _events(rows)
        assert_lifecycle_is_the_reference(trace)
        states = [t.state for t in lifecycle(trace).transitions(3)]
        assert states[-1] == ("released" if after == "released" else "retained")
    trace = _events([row for h in range(3) for row in _life(h, "")])
    assert_lifecycle_is_the_reference(trace)
    assert lifecycle(trace).state_at(2, None) == "retained"


def test_session_cleared_between_a_handles_events() -> None:
    # session_cleared (no handle) names frames whose dw grads_routed waits on a release, and frames kept after a
    # replay: retained from the grads_routed, then released (session_cleared).
    rows = []
    for h in range(3):
        rows += _life(h, "")
    rows.append(("session_cleared", None, None, {"frames": [0, 1, 9]}))
    rows.append(("memory_sampled", None, None, {}))
    for h in range(3):
        rows.append(("released", h, "dw", {"reason": "dw_complete"}))
    rows += [("handle_created", 5, "ordinary", {}), ("replay_started", 5, None, {"trigger": "backward"}),
             ("replay_finished", 5, None, {"trigger": "backward", "saved_count": 1}),
             ("session_cleared", None, None, {"frames": [5]}),
             ("tensor_unpacked", 5, None, {"index": 0, "key_source": "session", "retain": False, "consumed": True})]
    trace = _events(rows)
    assert_lifecycle_is_the_reference(trace)
    life = lifecycle(trace)
    assert [t.state for t in life.transitions(0)][-2:] == ["retained", "released"]
    assert life.released(0).reason == "session_cleared" and life.released(5).reason == "session_cleared"
    assert life.state_at(2, None) == "released" and life.released(2).reason == "dw_complete"


def test_handles_interleaved_with_refusals_and_a_handle_seen_first_by_another_kind() -> None:
    lives = [_life(h, "released", refuse=h % 2 == 0) for h in range(6)]
    rows = [("phase_set", 7, "dx", {"old": "ordinary", "new": "dx"}), ("replay_started", 7, "dx",
                                                                       {"trigger": "backward"})]
    for step in range(max(map(len, lives))):
        for life in lives:
            rows += life[step:step + 1]
    for h in range(6, 9):
        rows += _life(h, "released")[:3] + _life(h + 3, "released") + _life(h, "released")[3:]
    trace = _events(rows)
    assert_lifecycle_is_the_reference(trace)
    first = lifecycle(trace).transitions(7)[0]
    assert (first.seq, first.state, first.kind) == (10, "recorded", None)
    assert [len(lifecycle(trace).refusals(h)) for h in range(6)] == [1, 0, 1, 0, 1, 0]
