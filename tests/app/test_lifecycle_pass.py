"""The lifecycle's fast pass (events that change no state skipped in C, data keys read inline, a pending
grads_routed resolved by the handle's next event) gives exactly the transitions of the plain pass over every
event that it replaced, kept here as the oracle: on every built-in model in every mode, every broken run,
those traces saved and loaded (the packed data column), synthetic traces and random event streams."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, BUILTIN_MODEL_NAMES, MODES
from ckpt_viz.events import Event
from ckpt_viz.trace import Trace
from ckpt_viz.trace import lifecycle as lifecycle_module
from ckpt_viz.trace.cache import event_column, event_data
from ckpt_viz.trace.lifecycle import _ACTIVE, _KEPT, _WAITING, _WAITING_FOR_PHASE, Lifecycle

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
