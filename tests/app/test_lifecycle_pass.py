"""The lifecycle's pass over runs of the handle column (each run's result remembered by its entry state, kinds,
phases and data values, NOTE [ Runs remembered ] in ckpt_viz/trace/lifecycle_runs.py) gives exactly the
transitions of the plain pass over every event, kept here as the oracle: on every built-in model in every mode,
pipeline schedules, every broken and divergent run, those traces saved and loaded (the packed data column),
synthetic traces (the 1M-event benchmark's generator among them), random event streams, random streams of
repeated per-step patterns (so that runs hit the memo) and hand-built special cases."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, BUILTIN_MODEL_NAMES, MODES
from ckpt_viz.events import Event
from ckpt_viz.trace import Trace
from ckpt_viz.trace import lifecycle as lifecycle_module
from ckpt_viz.trace.cache import event_column, event_data
from ckpt_viz.trace.lifecycle import Lifecycle
from ckpt_viz.trace.lifecycle_runs import _KEPT, _WAITING, _WAITING_FOR_PHASE
from ckpt_viz.trace.lifecycle_runs import ACTIVE as _ACTIVE

(_CREATED, _PHASE_SET, _REPLAY_STARTED, _REPLAY_FINISHED, _REPLAY_FAILED, _ROUTED, _RELEASED, _COLLECTED, _UNPACKED,
 _REFUSED) = range(10)


class PlainLifecycle(Lifecycle):
    """The pass before the fast one: one step per event, every event visited."""

    def _build(self, trace: Trace, seqs: list[int]) -> None:
        kinds, handle_ids = event_column(trace, "kind"), event_column(trace, "handle_id")
        data, phase_at = event_data(trace), event_column(trace, "phase")
        state: dict[int, str] = {}
        phase: dict[int, str] = {}
        unconsumed: dict[int, int] = {}
        routed: dict[int, int] = {}
        first_seq = seqs[0] if seqs else 0
        lists: dict[int, tuple[list, list, list, list]] = {}

        def move(h, seq, new, kind, reason=None):
            if state[h] != new:
                self._out[state[h]].append(seq)
                self._into[new].append(seq)
                state[h] = new
                for values, value in zip(lists[h], (seq, new, kind, reason)):
                    values.append(value)

        def first(h, i, kind):
            self.handle_ids.append(h)
            self._first_position[h] = i
            lists[h] = ([], [], [], [])
            state[h] = "not_created"
            if kind != "handle_created":
                move(h, first_seq, "recorded", None)

        for i, kind, h, seq in zip(range(len(kinds)), kinds, handle_ids, seqs):
            if h is None:
                if kind == "session_cleared":
                    for frame in data(i, "frames", ()):
                        if frame in routed:
                            move(frame, routed.pop(frame), "retained", "grads_routed")
                        if state.get(frame) in _KEPT:
                            unconsumed[frame] = 0
                            move(frame, seq, "released", kind, "session_cleared")
                continue
            code = _ACTIVE.get(kind)
            if h not in state:
                first(h, i, kind)
            if h in routed and code != _RELEASED:
                move(h, routed.pop(h), "retained", "grads_routed")
            if code is None:
                continue
            current = state[h]
            new = reason = None
            if code == _CREATED:
                new = "recorded"
            elif code == _PHASE_SET:
                phase[h] = value = data(i, "new", "")
                if current in _WAITING:
                    new = _WAITING_FOR_PHASE.get(value, "recorded")
            elif code == _REPLAY_STARTED:
                self._replays[h] += 1
                new = "replaying"
            elif code == _REPLAY_FINISHED:
                unconsumed[h] = unconsumed.get(h, 0) + int(data(i, "saved_count") or 0)
                new = "retained" if data(i, "trigger") == "prefire" else "replayed"
            elif code == _REPLAY_FAILED:
                new = _WAITING_FOR_PHASE.get(phase.get(h, ""), "recorded")
            elif code == _ROUTED:
                if phase_at[i] == "dx":
                    new = "retained"
                else:
                    routed[h] = seq
            elif code == _RELEASED:
                routed.pop(h, None)
                new, reason = "released", data(i, "reason")
            elif code == _COLLECTED:
                if current in _WAITING:
                    new = "collected"
            elif code == _UNPACKED:
                if current in _KEPT:
                    if data(i, "consumed"):
                        unconsumed[h] = unconsumed.get(h, 0) - 1
                        if unconsumed[h] <= 0:
                            unconsumed[h] = 0
                            new, reason = "released", "consumed"
                    else:
                        new = "retained"
            else:
                self._refusals.setdefault(h, []).append((seq, data(i, "reason")))
            if new is not None:
                move(h, seq, new, kind, reason)
        for h, seq in routed.items():
            move(h, seq, "retained", "grads_routed")
        for h, (at, states, causes, reasons) in lists.items():
            self._seqs[h], self._states[h], self._kinds[h], self._reasons[h] = at, states, causes, reasons


def assert_same(trace: Trace) -> None:
    fast, plain = lifecycle_module.lifecycle(trace), PlainLifecycle(trace)
    assert fast.handle_ids == plain.handle_ids
    for h in plain.handle_ids:
        assert fast.transitions(h) == plain.transitions(h), h
        assert fast.first_position(h) == plain.first_position(h)
        assert fast.replays(h) == plain.replays(h) and fast.refusals(h) == plain.refusals(h)
    seqs = event_column(trace, "seq")
    for seq in {*seqs[:: max(len(seqs) // 50, 1)], *seqs[-3:], None}:
        assert fast.counts_at(seq) == plain.counts_at(seq)
        assert fast.states_at(seq) == plain.states_at(seq)
    assert fast.released_reasons() == plain.released_reasons()


def _loaded(trace: Trace, folder: Path, name: str) -> Trace:
    path = folder / f"{name}.json"
    trace.save(path)
    return Trace.load(path)


@pytest.mark.parametrize("model", BUILTIN_MODEL_NAMES)
def test_every_builtin_model_and_mode(model: str, tmp_path: Path) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    for mode in MODES:
        if mode == "pipeline" and model != "pipeline":
            continue  # only the built-in model 'pipeline' has stages
        trace = run_scenario(build_builtin(model), mode, memory=False, graphs=False)
        assert_same(trace)
        assert_same(_loaded(trace, tmp_path, f"{model}-{mode}"))


def test_every_broken_run(tmp_path: Path) -> None:
    from ckpt_viz.run.broken import record_broken

    for name in BROKEN_SCENARIO_NAMES:
        trace = record_broken(name)
        assert_same(trace)
        assert_same(_loaded(trace, tmp_path, name))


def test_synthetic_traces(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from traces import nonreentrant_trace, refused_trace, split_trace, synthetic_trace

    for trace in (split_trace(), refused_trace(), nonreentrant_trace(), synthetic_trace(20_000)):
        assert_same(trace)
        assert_same(_loaded(trace, tmp_path, "synthetic"))


_KINDS = (*_ACTIVE, "session_cleared", "backward_entered", "memory_sampled", "forward_started")


def _random_trace(seed: int) -> Trace:
    rng = random.Random(seed)
    events = []
    for seq in range(rng.randrange(1, 300)):
        kind = rng.choice(_KINDS)
        handle = None if (kind == "session_cleared" and rng.random() < 0.8) or rng.random() < 0.05 \
            else rng.randrange(6)
        data: dict = {}
        if kind == "phase_set":
            data["new"] = rng.choice(("dx", "dw", "ordinary"))
        elif kind == "replay_finished":
            data = {"saved_count": rng.randrange(3), "trigger": rng.choice(("backward", "prefire"))}
        elif kind in ("released", "replay_refused"):
            data["reason"] = rng.choice(("dw_complete", "backward_exception"))
        elif kind == "tensor_unpacked":
            data["consumed"] = rng.random() < 0.7
        elif kind == "session_cleared":
            data["frames"] = rng.sample(range(6), rng.randrange(4))
        events.append(Event(seq=seq * 2, t_ns=seq, kind=kind, handle_id=handle,
                            phase=rng.choice(("dx", "dw", "ordinary", None)), data=data))
    return Trace(events=events)


def test_random_event_streams(tmp_path: Path) -> None:
    for seed in range(300):
        trace = _random_trace(seed)
        assert_same(trace)
        if seed % 10 == 0:
            assert_same(_loaded(trace, tmp_path, f"random{seed}"))


def test_the_index_builds_the_lifecycle_on_first_use() -> None:
    from ckpt_viz.trace.index import TraceIndex

    for seed in range(20):
        trace = _random_trace(seed)
        index = TraceIndex(trace)
        assert index._lifecycle is None  # the first page of a big trace draws before the pass over its events
        assert index.handles == lifecycle_module.lifecycle(trace).handle_ids
        assert index.lifecycle is lifecycle_module.lifecycle(trace)


def test_the_index_says_when_the_lifecycle_is_built() -> None:
    from ckpt_viz.trace.index import TraceIndex

    trace = _random_trace(1)
    index = TraceIndex(trace)
    assert not index.lifecycle_built
    lifecycle_module.lifecycle(trace)  # built by another view, not through the index
    assert index.lifecycle_built and index.lifecycle is lifecycle_module.lifecycle(trace)
    assert PlainLifecycle(trace).replay_count() == sum(map(index.lifecycle.replays, index.handles))


def test_an_index_that_outlives_its_trace_still_has_the_lifecycle() -> None:
    from ckpt_viz.trace.index import TraceIndex

    expected = [PlainLifecycle(_random_trace(2)).transitions(h) for h in range(6)]
    index = TraceIndex(_random_trace(2))  # the trace is dropped at once
    assert [index.lifecycle.transitions(h) for h in range(6)] == expected


def test_pipeline_schedules(tmp_path: Path) -> None:
    from ckpt_viz.run.pipeline import run_pipeline
    from ckpt_viz.run.zoo import build_builtin

    for schedule in ("GPipe", "1F1B", "ZB-H1"):
        for microbatches in (2, 4):
            trace = run_pipeline(build_builtin("pipeline"), schedule=schedule, microbatches=microbatches)
            assert_same(trace)
            assert_same(_loaded(trace, tmp_path, f"pipeline-{schedule}-{microbatches}"))


def test_the_benchmark_trace(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_trace_io import build_trace

    for n in (16 * 40, 16 * 40 + 7, 3_001):  # whole handles, and a trace cut inside a handle's life
        trace = build_trace(n)
        assert_same(trace)
        assert_same(_loaded(trace, tmp_path, f"bench{n}"))


def _events(rows: list[tuple]) -> Trace:
    """(kind, handle, phase, data) rows as a trace, seqs 10, 20, ..."""
    return Trace(events=[Event(seq=10 * (i + 1), t_ns=i, kind=kind, handle_id=h, phase=phase, data=data)
                         for i, (kind, h, phase, data) in enumerate(rows)])


def _life(h: int, dw_next: str, *, refuse: bool = False) -> list[tuple]:
    rows = [("handle_created", h, "ordinary", {}), ("phase_set", h, "dx", {"new": "dx"}),
            ("replay_started", h, "dx", {}), ("replay_finished", h, "dx", {"saved_count": 2}),
            ("grads_routed", h, "dx", {}), ("phase_set", h, "dw", {"new": "dw"}), ("grads_routed", h, "dw", {})]
    if dw_next:
        rows.append((dw_next, h, "dw", {"reason": "dw_complete"}))
    if refuse:
        rows.append(("replay_refused", h, "dw", {"reason": "released"}))
    return rows


def test_a_grads_routed_that_ends_a_run() -> None:
    # 1. A dw grads_routed ends each handle's first run; the handle's next event, in a later run, is a release
    #    (no retained) or another kind (retained from the grads_routed), or there is none (retained).
    for after in ("released", "backward_entered"):
        rows = []
        for h in range(4):
            rows += _life(h, "")
        for h in range(4):
            rows.append((after, h, "dw", {"reason": "dw_complete"}))
        trace = _events(rows)
        assert_same(trace)
        states = [t.state for t in lifecycle_module.lifecycle(trace).transitions(3)]
        assert states[-1] == ("released" if after == "released" else "retained")
    trace = _events([row for h in range(3) for row in _life(h, "")])
    assert_same(trace)
    assert lifecycle_module.lifecycle(trace).state_at(2, None) == "retained"


def test_session_cleared_between_a_handles_runs() -> None:
    # 2. session_cleared (no handle) names frames whose dw grads_routed waits on a release in a later run, and
    #    frames kept after a replay: retained from the grads_routed, then released (session_cleared).
    rows = []
    for h in range(3):
        rows += _life(h, "")
    rows.append(("session_cleared", None, None, {"frames": [0, 1, 9]}))
    rows.append(("memory_sampled", None, None, {}))
    for h in range(3):
        rows.append(("released", h, "dw", {"reason": "dw_complete"}))
    rows += [("handle_created", 5, "ordinary", {}), ("replay_started", 5, None, {}),
             ("replay_finished", 5, None, {"saved_count": 1}), ("session_cleared", None, None, {"frames": [5]}),
             ("tensor_unpacked", 5, None, {"consumed": True})]
    trace = _events(rows)
    assert_same(trace)
    life = lifecycle_module.lifecycle(trace)
    assert [t.state for t in life.transitions(0)][-2:] == ["retained", "released"]
    assert life.released(0).reason == "session_cleared" and life.released(5).reason == "session_cleared"


def test_handles_split_into_several_runs() -> None:
    # 3. Handles interleaved event by event and in blocks (a pipeline's order), with refusals and a handle seen
    #    first by a kind other than handle_created (rule 1).
    lives = [_life(h, "released", refuse=h % 2 == 0) for h in range(6)]
    rows = [("phase_set", 7, "dx", {"new": "dx"}), ("replay_started", 7, "dx", {})]
    for step in range(max(map(len, lives))):
        for life in lives:
            rows += life[step:step + 1]
    for h in range(6, 9):
        rows += _life(h, "released")[:3] + _life(h + 3, "released") + _life(h, "released")[3:]
    trace = _events(rows)
    assert_same(trace)
    assert lifecycle_module.lifecycle(trace).transitions(7)[0].kind is None


def _pattern_trace(seed: int) -> Trace:
    """Random per-step patterns repeated over many handles, in runs of random lengths: most runs hit the memo."""
    rng = random.Random(seed)
    patterns = []
    for _ in range(rng.randrange(1, 4)):
        one = _random_trace(rng.randrange(10_000))
        patterns.append([(e.kind, e.phase, e.data) for e in one.events if e.handle_id is not None][:12])
    events, seq = [], 0
    open_lives: list[tuple[int, list]] = []
    for h in range(rng.randrange(5, 60)):
        open_lives.append((h, list(rng.choice(patterns))))
        while open_lives and (len(open_lives) > rng.randrange(1, 4) or rng.random() < 0.3):
            k = rng.randrange(len(open_lives))
            handle, life = open_lives[k]
            for kind, phase, data in life[:rng.randrange(1, 6)]:
                events.append(Event(seq=seq, t_ns=seq, kind=kind, handle_id=handle, phase=phase, data=data))
                seq += 1
            del life[:5]
            if rng.random() < 0.1:
                frames = [x for x, _ in rng.sample(open_lives, min(2, len(open_lives)))]
                events.append(Event(seq=seq, t_ns=seq, kind="session_cleared", data={"frames": frames}))
                seq += 1
            if not life:
                del open_lives[k]
    return Trace(events=events)


def test_repeated_patterns(tmp_path: Path) -> None:
    for seed in range(200):
        trace = _pattern_trace(seed)
        if len(trace.events):
            assert_same(trace)
            if seed % 10 == 0:
                assert_same(_loaded(trace, tmp_path, f"pattern{seed}"))


def test_values_that_cannot_be_keyed_or_compare_equal(tmp_path: Path) -> None:
    # 4. Data values that are not hashable (a list trigger: no run is a hit, the same result), and reasons 1 and
    #    True (equal as keys, kept apart: each release keeps the reason it was given).
    rows = []
    for h in range(6):
        rows += [("handle_created", h, "ordinary", {}), ("replay_started", h, None, {}),
                 ("replay_finished", h, None, {"saved_count": 1, "trigger": [("backward", "prefire")[h % 2]]}),
                 ("tensor_unpacked", h, None, {"consumed": [h % 3]})]
    assert_same(_events(rows))
    reasons = (1, True)
    rows = []
    for h in range(6):
        rows += [*_life(h, "")[:-1], ("released", h, "dx", {"reason": reasons[h % 2]})]
    trace = _events(rows)
    assert_same(trace)
    assert_same(_loaded(trace, tmp_path, "equal-reasons"))
    assert [type(lifecycle_module.lifecycle(trace).released(h).reason) for h in range(2)] == [int, bool]
