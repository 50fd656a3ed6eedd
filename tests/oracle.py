"""A plain reference of NOTE [ Handle states ] (ckpt_viz/analysis/lifecycle.py), written apart from it.

`reference(events)` walks the events once with dicts and if-chains, the rules read straight from the NOTE, and
returns every handle's transitions, replays and refusals; `states_at` scans them linearly. The tests compare
`ckpt_viz.analysis.lifecycle` with it on recorded runs, loaded traces and random event streams
(tests/analysis/test_lifecycle_oracle.py, tests/run/test_lifecycle_agreement.py).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ckpt_viz.vocabulary import STATES

WAITING = ("recorded", "phase_dx", "phase_dw")
KEPT = ("replayed", "retained")


def _waiting_for(phase: Any) -> str:
    return {"dx": "phase_dx", "dw": "phase_dw"}.get(phase, "recorded")


@dataclass
class Reference:
    """What the reference found: handle -> [(seq, state, kind, reason)], replays, refusals [(seq, reason)]."""

    order: list[int] = field(default_factory=list)
    transitions: dict[int, list[tuple[int, str, str | None, str | None]]] = field(default_factory=dict)
    replays: dict[int, int] = field(default_factory=dict)
    refusals: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    end: int | None = None

    def state_at(self, h: int, seq: int | None) -> str:
        at = self.end if seq is None else seq
        state = "not_created"
        for t_seq, new, _, _ in self.transitions.get(h, []):
            if at is not None and t_seq <= at:
                state = new
        return state

    def states_at(self, seq: int | None) -> dict[int, str]:
        return {h: self.state_at(h, seq) for h in self.order}

    def counts_at(self, seq: int | None) -> dict[str, int]:
        counts = Counter(self.states_at(seq).values())
        return {s: counts[s] for s in STATES if counts[s]}

    def released_reasons(self) -> Counter:
        return Counter(t[-1][3] for t in self.transitions.values() if t and t[-1][1] == "released")


def reference(events: list[Any]) -> Reference:
    """NOTE [ Handle states ], rule by rule, over `events` (typed events, in seq order)."""
    ref = Reference(end=events[-1].seq if events else None)
    state: dict[int, str] = {}
    phase: dict[int, Any] = {}
    saved: dict[int, int] = {}
    waiting_release: dict[int, int] = {}  # rule 4: an ordinary/dw grads_routed, until the handle's next event
    first_seq = events[0].seq if events else 0

    def move(h: int, seq: int, new: str, kind: str | None, reason: str | None = None) -> None:
        if state[h] == new:
            return
        state[h] = new
        ref.transitions[h].append((seq, new, kind, reason))

    def settle(h: int) -> None:
        if h in waiting_release:
            move(h, waiting_release.pop(h), "retained", "grads_routed")

    for e in events:
        kind, h = e.kind, e.handle_id
        if h is None:
            if kind == "session_cleared":  # rule 5: frames whose kept replays it drops
                for frame in e.frames:
                    if frame not in state:
                        continue
                    settle(frame)
                    if state[frame] in KEPT:
                        saved[frame] = 0
                        move(frame, e.seq, "released", "session_cleared", "session_cleared")
            continue
        if h not in state:  # rule 1
            ref.order.append(h)
            state[h] = "not_created"
            ref.transitions[h] = []
            ref.replays[h] = 0
            ref.refusals[h] = []
            if kind != "handle_created":
                move(h, first_seq, "recorded", None)
        if kind != "released":
            settle(h)
        now = state[h]
        if kind == "handle_created":
            move(h, e.seq, "recorded", kind)
        elif kind == "phase_set":  # rule 2
            phase[h] = e.new
            if now in WAITING:
                move(h, e.seq, _waiting_for(e.new), kind)
        elif kind == "replay_started":  # rule 3
            ref.replays[h] += 1
            move(h, e.seq, "replaying", kind)
        elif kind == "replay_finished":
            saved[h] = saved.get(h, 0) + (e.saved_count or 0)
            move(h, e.seq, "retained" if e.trigger == "prefire" else "replayed", kind)
        elif kind == "replay_failed":
            move(h, e.seq, _waiting_for(phase.get(h)), kind)
        elif kind == "grads_routed":  # rule 4
            if e.phase == "dx":
                move(h, e.seq, "retained", kind)
            else:
                waiting_release[h] = e.seq
        elif kind == "released":  # rule 5
            waiting_release.pop(h, None)
            move(h, e.seq, "released", kind, e.reason)
        elif kind == "tensor_unpacked" and now in KEPT:
            if not e.consumed:
                move(h, e.seq, "retained", kind)
            else:
                saved[h] = saved.get(h, 0) - 1
                if saved[h] <= 0:
                    saved[h] = 0
                    move(h, e.seq, "released", kind, "consumed")
        elif kind == "node_collected" and now in WAITING:  # rule 6
            move(h, e.seq, "collected", kind)
        elif kind == "replay_refused":  # rule 7
            ref.refusals[h].append((e.seq, e.reason))
    for h in list(waiting_release):
        settle(h)
    return ref


def assert_lifecycle_is_the_reference(trace: Any, *, every_seq: bool = True) -> Reference:
    """`ckpt_viz.analysis.lifecycle.lifecycle(trace)` says what the reference says, at every seq (or 60 of them)."""
    from ckpt_viz.analysis.lifecycle import lifecycle

    life, ref = lifecycle(trace), reference(trace.events)
    assert life.handle_ids == ref.order
    for h in ref.order:
        assert [(t.seq, t.state, t.kind, t.reason) for t in life.transitions(h)] == ref.transitions[h], h
        assert life.replays(h) == ref.replays[h]
        assert [(t.seq, t.reason) for t in life.refusals(h)] == ref.refusals[h]
        assert [t.state for t in life.refusals(h)] == [ref.state_at(h, s) for s, _ in ref.refusals[h]]
        releases = [t for t in ref.transitions[h] if t[1] == "released"]
        assert [(t.seq, t.reason) for t in life.releases(h)] == [(t[0], t[3]) for t in releases]
        first = life.released(h)
        assert (first.seq, first.reason) == (releases[0][0], releases[0][3]) if releases else first is None
    seqs = [e.seq for e in trace.events]
    if not every_seq:
        seqs = sorted({*seqs[:: max(len(seqs) // 60, 1)], *seqs[-3:]})
    for seq in [*seqs, None]:
        assert life.states_at(seq) == ref.states_at(seq), seq
        assert life.counts_at(seq) == ref.counts_at(seq), seq
    assert life.released_reasons() == ref.released_reasons()
    assert life.replay_count() == sum(ref.replays.values())
    # the queries for every handle at once say what the reference says of each handle
    assert life.final_states() == ref.states_at(None)
    assert life.refused() == [h for h in ref.order if ref.refusals[h]]
    for reason in ("backward_exception", "forward_exception", "dw_complete", "consumed", "session_cleared"):
        assert life.with_reason(reason) == {h for h in ref.order if any(t[3] == reason for t in ref.transitions[h])}
    return ref
