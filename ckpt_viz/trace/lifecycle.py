"""The one lifecycle of every handle: its state transitions, derived from the events once per trace.

The index, the lanes, the handle tables, the graph's region colours, the CLI summary
and the diagnosis all read the states from here, so every view names the same state
for the same handle at the same cursor. Standard library only: never torch, a chart
library or a UI.

NOTE [ Handle states ]
  1. Before its first event a handle is "not_created". `handle_created` -> "recorded".
     A handle whose first event is something else existed before the recording: it is
     "recorded" from the trace's first seq (a transition with kind None).
  2. `phase_set` while waiting for a backward (recorded, phase_dx, phase_dw) -> "phase_dx"
     or "phase_dw" (back to "recorded" for phase "ordinary"); in any other state the new
     phase is only remembered.
  3. `replay_started` -> "replaying" (from any state: a non-reentrant frame is recomputed
     again by each new graph task). `replay_finished` -> "replayed" (a backward uses the
     replay now), or "retained" when it was a prefire. `replay_failed` -> back to waiting
     (rule 2's state for the remembered phase).
  4. "retained": the replay is kept after its use. After `grads_routed` with phase dx; after
     an ordinary or dw `grads_routed` that no `released` follows as the handle's next event
     (a retaining session: retained from the grads_routed seq); after an unpack that kept a
     non-reentrant recomputed tensor (consumed=False).
  5. `released` -> "released" with its data.reason. A non-reentrant frame has no release
     event: it counts the tensors its replays saved (replay_finished.saved_count) and is
     "released" (reason "consumed") at the unpack that consumed the last one, or (reason
     "session_cleared") when `session_cleared` lists it while replayed or retained.
  6. `node_collected` while waiting (before any replay) -> "collected" (spec §2, G: the R10
     case); a replayed, retained or released handle keeps its state.
  7. `replay_refused` changes no state: it is a mark ("refused", with data.reason) at the
     handle's state of the moment (released or collected).
  8. The state at seq s includes every transition with seq s; seq None means the end.

Example: split-reentrant mlp, h0: recorded -> phase_dx -> replaying -> replayed ->
retained (DX routed its grads) -> phase_dw is only remembered -> released (dw_complete).
"""
from __future__ import annotations

import gc
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from operator import itemgetter

from ckpt_viz.trace.cache import derived, event_column
from ckpt_viz.trace.lifecycle_runs import build_runs
from ckpt_viz.trace.model import Trace

__all__ = ["DERIVED_REASONS", "MARK_MEANINGS", "STATES", "STATE_MEANINGS", "Lifecycle", "Transition", "lifecycle"]

STATES: tuple[str, ...] = ("not_created", "recorded", "phase_dx", "phase_dw", "replaying", "replayed", "retained",
                           "released", "collected")

STATE_MEANINGS: dict[str, str] = {
    "not_created": "Not built yet: its checkpoint has not run at this point of the run.",
    "recorded": "The forward ran; only the checkpoint's inputs are kept, and it waits for a backward.",
    "phase_dx": "Recorded and set to phase dx: the next backward computes its input grads (dX).",
    "phase_dw": "Recorded and set to phase dw: the next backward computes its weight grads (dW).",
    "replaying": "Its forward is being re-run now, to rebuild the activations that were dropped.",
    "replayed": "Re-run: the backward that asked for it is using the rebuilt activations.",
    "retained": "Re-run and kept after use, for a later backward (DW, or a retaining session).",
    "released": "Its rebuilt activations are freed and it will not replay again; the reason says why.",
    "collected": "Its autograd node was garbage-collected before any replay (all outputs dropped): it cannot replay.",
}

MARK_MEANINGS: dict[str, str] = {
    "refused": "A backward asked for a replay after the handle was released or collected; the replay was refused.",
}

# Release reasons the lifecycle derives for non-reentrant frames (the runtime emits no `released` for them).
DERIVED_REASONS: dict[str, str] = {
    "consumed": "every tensor its recompute saved was read back once by the backward",
    "session_cleared": "its recompute session was cleared",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One change of a handle's state (or, for `Lifecycle.refusals`, a refused replay).

    Attributes:
        seq: the event seq where the new state starts.
        handle_id: the handle.
        state: one of `STATES`.
        kind: the event kind that caused it; None for a handle seen before the recording.
        reason: for "released", the release reason (see `DERIVED_REASONS`); for a refusal,
            its data.reason; else None.
    """

    seq: int
    handle_id: int
    state: str
    kind: str | None
    reason: str | None = None


class Lifecycle:
    """Every handle's transitions in one trace, with O(log n) state lookups at a seq.

    Attributes:
        handle_ids: handle ids in order of first appearance.
    """

    def __init__(self, trace: Trace) -> None:
        seqs = event_column(trace, "seq")
        self.handle_ids: list[int] = []
        self._first_position: dict[int, int] = {}
        # handle -> parallel lists: seqs, states, causing kinds, reasons
        self._seqs: dict[int, list[int]] = {}
        self._states: dict[int, list[str]] = {}
        self._kinds: dict[int, list[str | None]] = {}
        self._reasons: dict[int, list[str | None]] = {}
        self._replays: Counter[int] = Counter()
        self._refusals: dict[int, list[tuple[int, str | None]]] = {}
        self.end_seq: int | None = seqs[-1] if seqs else None
        # state -> seqs of the transitions into / out of it, in the order they were found (see `counts_at`)
        self._into: dict[str, list[int]] = {s: [] for s in STATES}
        self._out: dict[str, list[int]] = {s: [] for s in STATES}
        self._build(trace, seqs)
        seq_lists = list(map(self._seqs.__getitem__, self.handle_ids))
        state_lists = list(map(self._states.__getitem__, self.handle_ids))
        self._summary = list(zip(self.handle_ids, map(itemgetter(0), seq_lists), map(itemgetter(-1), seq_lists),
                                 map(itemgetter(-1), state_lists), seq_lists, state_lists))
        self._sorted = False  # `_into` and `_out` are sorted on the first `counts_at`

    # -- building: see NOTE [ Handle states ]

    def _build(self, trace: Trace, seqs: list[int]) -> None:
        # One pass over runs of the handle column, each run's result remembered by what decides it (NOTE
        # [ Runs remembered ] in `ckpt_viz.trace.lifecycle_runs`).
        self.handle_ids = list(handle_order(trace))
        built = build_runs(trace, seqs, self.handle_ids)
        first_position = built["first_position"]
        self._first_position = {h: first_position[h] for h in self.handle_ids}
        for s in STATES:
            self._into[s] = built["into"].get(s, [])
            self._out[s] = built["out"].get(s, [])
        self._replays.update(built["replays"])
        self._refusals = built["refusals"]
        self._seqs, self._states, self._kinds, self._reasons = built["lists"]

    # -- queries

    def _at(self, seq: int | None) -> int:
        if seq is None:
            return self.end_seq if self.end_seq is not None else 0
        return seq

    def transitions(self, handle_id: int) -> list[Transition]:
        """The handle's state changes, in order (empty for an unknown handle)."""
        seqs = self._seqs.get(handle_id, [])
        return [Transition(seq=s, handle_id=handle_id, state=st, kind=k, reason=r)
                for s, st, k, r in zip(seqs, self._states[handle_id], self._kinds[handle_id],
                                       self._reasons[handle_id])] if seqs else []

    def state_at(self, handle_id: int, seq: int | None) -> str:
        """One of `STATES` as of `seq` (inclusive; None: the end); "not_created" for an unknown handle."""
        seqs = self._seqs.get(handle_id)
        if not seqs:
            return "not_created"
        at = bisect_right(seqs, self._at(seq))
        return self._states[handle_id][at - 1] if at else "not_created"

    def states_at(self, seq: int | None) -> dict[int, str]:
        """The state of every handle as of `seq`, in order of first appearance."""
        c = self._at(seq)
        out: dict[int, str] = {}
        for h, first, last, final, seqs, states in self._summary:  # a bisect only while in flight
            if c < first:
                out[h] = "not_created"
            elif c >= last:
                out[h] = final
            else:
                out[h] = states[bisect_right(seqs, c) - 1]
        return out

    def counts_at(self, seq: int | None) -> dict[str, int]:
        """How many handles are in each state as of `seq`, in `STATES` order (states with none left out).

        O(log n) per state: a handle is in state s at c when its last transition at or before c
        entered s (each handle's transitions have non-decreasing seqs), so the count is the
        transitions into s at or before c less those out of s; every handle starts "not_created".
        """
        c = self._at(seq)
        if not self._sorted:  # found in event order but for a few deferred ones: sorting is fast
            for seqs in (*self._into.values(), *self._out.values()):
                seqs.sort()
            self._sorted = True
        counts = {s: bisect_right(self._into[s], c) - bisect_right(self._out[s], c) for s in STATES}
        counts["not_created"] += len(self.handle_ids)
        return {s: counts[s] for s in STATES if counts[s]}

    def reason_at(self, handle_id: int, seq: int | None) -> str | None:
        """The reason of the transition in force at `seq` (the release reason while released), or None."""
        seqs = self._seqs.get(handle_id)
        at = bisect_right(seqs, self._at(seq)) if seqs else 0
        return self._reasons[handle_id][at - 1] if at else None

    def _transition(self, handle_id: int, i: int) -> Transition:
        """The handle's i-th state change (`transitions(handle_id)[i]`, without building the others)."""
        return Transition(seq=self._seqs[handle_id][i], handle_id=handle_id, state=self._states[handle_id][i],
                          kind=self._kinds[handle_id][i], reason=self._reasons[handle_id][i])

    def released(self, handle_id: int) -> Transition | None:
        """The handle's first release (its reason says why), or None if it was never released."""
        states = self._states.get(handle_id) if self._seqs.get(handle_id) else None
        if not states or "released" not in states:  # list.index: the debugger asks this of every handle
            return None
        return self._transition(handle_id, states.index("released"))

    def releases(self, handle_id: int) -> list[Transition]:
        """Every release of the handle (a non-reentrant frame recomputed by a later backward is released again)."""
        states = self._states.get(handle_id) if self._seqs.get(handle_id) else None
        if not states or "released" not in states:
            return []
        return [self._transition(handle_id, i) for i, state in enumerate(states) if state == "released"]

    def released_reasons(self) -> Counter[str | None]:
        """reason -> how many handles are released at the end of the trace for it (`reason_at(h, None)` of
        every handle whose final state is "released"), read from each handle's last transition."""
        return Counter(self._reasons[h][-1] for h, _, _, final, _, _ in self._summary if final == "released")

    def replay_count(self) -> int:
        """How many times any handle's forward was re-run: `sum(map(self.replays, self.handle_ids))`."""
        return sum(self._replays.values())

    def replays(self, handle_id: int) -> int:
        """How many times the handle's forward was re-run (`replay_started` events)."""
        return self._replays[handle_id]

    def refusals(self, handle_id: int) -> list[Transition]:
        """The handle's refused replays: state is the handle's state then, reason the refusal's data.reason."""
        return [Transition(seq=s, handle_id=handle_id, state=self.state_at(handle_id, s), kind="replay_refused",
                           reason=r) for s, r in self._refusals.get(handle_id, [])]

    def first_position(self, handle_id: int) -> int:
        """The position (index in trace.events) of the first event that names the handle."""
        return self._first_position[handle_id]


def handle_order(trace: Trace) -> list[int]:
    """The handle ids of `trace` in order of first sight (`Lifecycle.handle_ids`, without the pass): once per trace,
    found in C (a dict of the handle column)."""
    def build(t: Trace) -> list[int]:
        order = dict.fromkeys(event_column(t, "handle_id"))
        order.pop(None, None)
        return list(order)
    return derived(trace, "handle_order", build)


def lifecycle(trace: Trace) -> Lifecycle:
    """The lifecycle of `trace`, built on first use and cached for as long as the trace lives unchanged."""
    return derived(trace, "lifecycle", _build_without_gc)


def _build_without_gc(trace: Trace) -> Lifecycle:
    """Build with the cyclic collector paused: it makes many small objects, none cyclic."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return Lifecycle(trace)
    finally:
        if enabled:
            gc.enable()
