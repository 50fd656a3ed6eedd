"""The one lifecycle of every handle: its state transitions, derived from the events once per trace.

The lanes, the handle tables, the graph's region colours, the CLI summary, the debugger and the
lessons all read states from here, so every view names the same state for the same handle at the
same cursor. Standard library only.

NOTE [ Handle states ]
  1. Before its first event a handle is "not_created". `handle_created` -> "recorded". A handle whose
     first event is something else existed before the recording: it is "recorded" from the trace's
     first seq (a transition with kind None).
  2. `phase_set` while waiting for a backward (recorded, phase_dx, phase_dw) -> "phase_dx" or
     "phase_dw" (back to "recorded" for phase "ordinary"); in any other state the new phase is only
     remembered.
  3. `replay_started` -> "replaying" (from any state: a non-reentrant frame is recomputed again by each
     new graph task). `replay_finished` -> "replayed" (a backward uses the replay now), or "retained"
     when it was a prefire. `replay_failed` -> back to waiting (rule 2's state for the remembered phase).
  4. "retained": the replay is kept after its use. After `grads_routed` with phase dx; after an
     ordinary or dw `grads_routed` that no `released` follows as the handle's next event (a retaining
     session: retained from the grads_routed seq); after an unpack that kept a non-reentrant recomputed
     tensor (consumed=False).
  5. `released` -> "released" with its reason. A non-reentrant frame has no release event: it counts
     the tensors its replays saved (replay_finished.saved_count) and is "released" (reason "consumed")
     at the unpack that consumed the last one, or (reason "session_cleared") when `session_cleared`
     lists it in `frames` while replayed or retained.
  6. `node_collected` while waiting (before any replay) -> "collected" (the autograd node died before
     its first replay); a replayed, retained or released handle keeps its state.
  7. `replay_refused` changes no state: it is a mark ("refused", with its reason) at the handle's
     state of the moment (released or collected).
  8. The state at seq s includes every transition with seq s; seq None means the end.

Example: split-reentrant mlp, h0: recorded -> phase_dx -> replaying -> replayed -> retained (DX routed
its grads) -> phase_dw is only remembered -> released (dw_complete).
"""
from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_viz.analysis._cache import derived
from ckpt_viz.events import (
    Event,
    EventBase,
    GradsRouted,
    HandleCreated,
    NodeCollected,
    PhaseSet,
    Released,
    ReplayFailed,
    ReplayFinished,
    ReplayRefused,
    ReplayStarted,
    SessionCleared,
    TensorUnpacked,
)
from ckpt_viz.trace import GraphSnapshot, Trace
from ckpt_viz.vocabulary import STATES, State

__all__ = ["DERIVED_REASONS", "HELD_STATES", "MARK_MEANINGS", "HeldReplays", "Lifecycle", "RecomputeTime",
           "Transition", "held_replays", "lifecycle", "recompute_time", "refused_handles", "region_states"]

MARK_MEANINGS: dict[str, str] = {
    "refused": "A backward asked for a replay after the handle was released or collected; the replay was refused.",
}

# Release reasons the lifecycle derives for non-reentrant frames (the runtime emits no `released` for them).
DERIVED_REASONS: dict[str, str] = {
    "consumed": "every tensor its recompute saved was read back once by the backward",
    "session_cleared": "its recompute session was cleared",
}

_WAITING = frozenset(("recorded", "phase_dx", "phase_dw"))
_KEPT = frozenset(("replayed", "retained"))
_WAITING_FOR_PHASE: dict[str | None, State] = {"dx": "phase_dx", "dw": "phase_dw"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One change of a handle's state (or, for `Lifecycle.refusals`, a refused replay).

    Attributes:
        seq: the event seq where the new state starts.
        handle_id: the handle.
        state: one of `ckpt_viz.vocabulary.STATES`.
        kind: the event kind that caused it; None for a handle seen before the recording.
        reason: for "released", the release reason (see `DERIVED_REASONS`); for a refusal, its reason; else None.
    """

    seq: int
    handle_id: int
    state: State
    kind: str | None
    reason: str | None = None


class _Handle:
    """One handle's running state while the pass walks the events; transitions as parallel lists."""

    __slots__ = ("created", "kinds", "pending", "phase", "reasons", "refusals", "replays", "seqs", "state", "states",
                 "unconsumed")

    def __init__(self) -> None:
        self.state: State = "not_created"
        self.phase: str | None = None
        self.unconsumed = 0
        self.pending: int | None = None  # seq of an ordinary/dw grads_routed waiting for its next event (rule 4)
        self.replays = 0
        self.seqs: list[int] = []
        self.states: list[State] = []
        self.kinds: list[str | None] = []
        self.reasons: list[str | None] = []
        self.refusals: list[tuple[int, str | None]] = []
        self.created: HandleCreated | None = None  # its first handle_created event

    def move(self, seq: int, new: State, kind: str | None, reason: str | None = None) -> None:
        if new != self.state:
            self.seqs.append(seq)
            self.states.append(new)
            self.kinds.append(kind)
            self.reasons.append(reason)
            self.state = new

    def resolve(self) -> None:
        """Rule 4: a pending ordinary/dw grads_routed not followed by a release is retained from its seq."""
        if self.pending is not None:
            seq, self.pending = self.pending, None
            self.move(seq, "retained", "grads_routed")


def _phase_set(s: _Handle, e: PhaseSet) -> None:
    s.phase = e.new
    if s.state in _WAITING:
        s.move(e.seq, _WAITING_FOR_PHASE.get(e.new, "recorded"), "phase_set")


def _created(s: _Handle, e: HandleCreated) -> None:
    if s.created is None:
        s.created = e
    s.move(e.seq, "recorded", "handle_created")


def _replay_started(s: _Handle, e: ReplayStarted) -> None:
    s.replays += 1
    s.move(e.seq, "replaying", "replay_started")


def _replay_finished(s: _Handle, e: ReplayFinished) -> None:
    s.unconsumed += e.saved_count or 0
    s.move(e.seq, "retained" if e.trigger == "prefire" else "replayed", "replay_finished")


def _routed(s: _Handle, e: GradsRouted) -> None:
    if e.phase == "dx":
        s.move(e.seq, "retained", "grads_routed")
    else:
        s.pending = e.seq


def _released(s: _Handle, e: Released) -> None:
    s.pending = None
    s.move(e.seq, "released", "released", e.reason)


def _failed(s: _Handle, e: ReplayFailed) -> None:
    s.move(e.seq, _WAITING_FOR_PHASE.get(s.phase, "recorded"), "replay_failed")


def _collected(s: _Handle, e: NodeCollected) -> None:
    if s.state in _WAITING:
        s.move(e.seq, "collected", "node_collected")


def _unpacked(s: _Handle, e: TensorUnpacked) -> None:
    if s.state in _KEPT:
        if e.consumed:
            s.unconsumed -= 1
            if s.unconsumed <= 0:
                s.unconsumed = 0
                s.move(e.seq, "released", "tensor_unpacked", "consumed")
        else:
            s.move(e.seq, "retained", "tensor_unpacked")


def _refused(s: _Handle, e: ReplayRefused) -> None:
    s.refusals.append((e.seq, e.reason))


# NOTE [ Handle states ]: what each kind does to its handle (a kind not here does nothing)
# (each step takes the event of its own type, hence `Any` for the event)
_STEPS: dict[type[EventBase], Callable[[_Handle, Any], None]] = {
    PhaseSet: _phase_set, HandleCreated: _created, ReplayStarted: _replay_started, ReplayFinished: _replay_finished,
    GradsRouted: _routed, Released: _released, ReplayFailed: _failed, NodeCollected: _collected,
    TensorUnpacked: _unpacked, ReplayRefused: _refused}


class Lifecycle:
    """Every handle's transitions in one trace (NOTE [ Handle states ]), with O(log n) lookups at a seq.

    Attributes:
        handle_ids: handle ids in order of first appearance.
        end_seq: the seq of the trace's last event (None for an empty trace).
    """

    def __init__(self, events: list[Event]) -> None:
        self.end_seq: int | None = events[-1].seq if events else None
        handles: dict[int, _Handle] = {}
        first_seq = events[0].seq if events else 0
        steps = _STEPS
        for event in events:
            h = event.handle_id
            kind = type(event)
            if h is not None:
                state = handles.get(h)
                if state is None:
                    state = handles[h] = _Handle()
                    if kind is not HandleCreated:  # rule 1: existed before the recording
                        state.move(first_seq, "recorded", None)
                if state.pending is not None and kind is not Released:
                    state.resolve()
                step = steps.get(kind)
                if step is not None:
                    step(state, event)
            elif type(event) is SessionCleared:  # (narrows `event` for the type checker)
                for frame in event.frames:
                    state = handles.get(frame)
                    if state is not None:
                        state.resolve()
                        if state.state in _KEPT:
                            state.unconsumed = 0
                            state.move(event.seq, "released", "session_cleared", "session_cleared")
        for state in handles.values():
            state.resolve()
        self.handle_ids: list[int] = list(handles)
        self._handles = handles
        into: dict[str, list[int]] = {s: [] for s in STATES}
        out: dict[str, list[int]] = {s: [] for s in STATES}
        for state in handles.values():
            previous: str = "not_created"
            for seq, new in zip(state.seqs, state.states):
                out[previous].append(seq)
                into[new].append(seq)
                previous = new
        for seqs in (*into.values(), *out.values()):
            seqs.sort()
        self._into, self._out = into, out

    def _transition(self, h: int, i: int) -> Transition:
        s = self._handles[h]
        return Transition(seq=s.seqs[i], handle_id=h, state=s.states[i], kind=s.kinds[i], reason=s.reasons[i])

    # -- queries

    def _at(self, seq: int | None) -> int:
        if seq is None:
            return self.end_seq if self.end_seq is not None else 0
        return seq

    def transitions(self, handle_id: int) -> list[Transition]:
        """The handle's state changes, in order (empty for an unknown handle)."""
        s = self._handles.get(handle_id)
        return [self._transition(handle_id, i) for i in range(len(s.seqs))] if s is not None else []

    def state_at(self, handle_id: int, seq: int | None) -> State:
        """One of `STATES` as of `seq` (inclusive; None: the end); "not_created" for an unknown handle."""
        s = self._handles.get(handle_id)
        if s is None or not s.seqs:
            return "not_created"
        at = bisect_right(s.seqs, self._at(seq))
        return s.states[at - 1] if at else "not_created"

    def states_at(self, seq: int | None) -> dict[int, State]:
        """The state of every handle as of `seq`, in order of first appearance."""
        return {h: self.state_at(h, seq) for h in self.handle_ids}

    def counts_at(self, seq: int | None) -> dict[State, int]:
        """How many handles are in each state as of `seq`, in `STATES` order (states with none left out)."""
        c = self._at(seq)
        counts = {s: bisect_right(self._into[s], c) - bisect_right(self._out[s], c) for s in STATES}
        counts["not_created"] += len(self.handle_ids)
        return {s: counts[s] for s in STATES if counts[s]}

    def reason_at(self, handle_id: int, seq: int | None) -> str | None:
        """The reason of the transition in force at `seq` (the release reason while released), or None."""
        s = self._handles.get(handle_id)
        if s is None:
            return None
        at = bisect_right(s.seqs, self._at(seq))
        return s.reasons[at - 1] if at else None

    def released(self, handle_id: int) -> Transition | None:
        """The handle's first release (its reason says why), or None if it was never released."""
        s = self._handles.get(handle_id)
        if s is None or "released" not in s.states:
            return None
        return self._transition(handle_id, s.states.index("released"))

    def created_events(self) -> dict[int, HandleCreated]:
        """handle -> its first `handle_created` event (handles created before the recording are absent)."""
        return {h: s.created for h, s in self._handles.items() if s.created is not None}

    def was_released(self, handle_id: int) -> bool:
        """Whether the handle was ever released (`released` without building its transition)."""
        s = self._handles.get(handle_id)
        return s is not None and "released" in s.states

    def releases(self, handle_id: int) -> list[Transition]:
        """Every release of the handle (a non-reentrant frame recomputed by a later backward is released again)."""
        s = self._handles.get(handle_id)
        if s is None or "released" not in s.states:
            return []
        return [self._transition(handle_id, i) for i, state in enumerate(s.states) if state == "released"]

    def released_reasons(self) -> Counter[str | None]:
        """reason -> how many handles are released at the end of the trace for it."""
        return Counter(s.reasons[-1] for s in self._handles.values() if s.states and s.states[-1] == "released")

    def reasons(self, handle_id: int) -> tuple[str | None, ...]:
        """The reasons of the handle's transitions, in order (a release's reason where it is one)."""
        s = self._handles.get(handle_id)
        return tuple(s.reasons) if s is not None else ()

    def last_phase(self, handle_id: int) -> str | None:
        """The last phase a `phase_set` gave the handle, or None."""
        s = self._handles.get(handle_id)
        return s.phase if s is not None else None

    def replay_count(self) -> int:
        """How many times any handle's forward was re-run."""
        return sum(s.replays for s in self._handles.values())

    def replays(self, handle_id: int) -> int:
        """How many times the handle's forward was re-run (`replay_started` events)."""
        s = self._handles.get(handle_id)
        return s.replays if s is not None else 0

    def refusals(self, handle_id: int) -> list[Transition]:
        """The handle's refused replays: state is the handle's state then, reason the refusal's reason."""
        s = self._handles.get(handle_id)
        return [Transition(seq=seq, handle_id=handle_id, state=self.state_at(handle_id, seq), kind="replay_refused",
                           reason=r) for seq, r in (s.refusals if s is not None else ())]


def lifecycle(trace: Trace) -> Lifecycle:
    """The lifecycle of `trace`, built on first use and kept while the trace is unchanged."""
    return derived(trace, "lifecycle", lambda t: Lifecycle(t.events))


def region_states(trace: Trace, snapshot: GraphSnapshot, seq: int | None) -> dict[int, State]:
    """The state of each checkpoint region of a graph snapshot as of `seq` (None: the end), as the graph draws it.

    The lifecycle's state of the region's handle; a handle that no event of the trace names existed before the
    recording (rule 1): "retained" when the snapshot holds its retained replay, else "recorded".
    """
    life = lifecycle(trace)
    known = set(life.handle_ids)
    out: dict[int, State] = {}
    for node in snapshot.nodes:
        h = node.handle_id
        if h is None or node.kind == "trigger":
            continue
        if h in known:
            out[h] = life.state_at(h, seq)
        elif node.replay or out.get(h) == "retained":
            out[h] = "retained"
        else:
            out.setdefault(h, "recorded")
    return out


def refused_handles(trace: Trace, seq: int | None) -> list[int]:
    """The handles with a refused replay (rule 7) at or before `seq` (None: the end), in order of their first one."""
    life = lifecycle(trace)
    at = life.end_seq if seq is None else seq
    firsts = [(marks[0].seq, h) for h in life.handle_ids if (marks := life.refusals(h)) and at is not None
              and marks[0].seq <= at]
    return [h for _, h in sorted(firsts)]


# -- replays held at once (the claims of "one block at a time" and of the split modes' peak read this)

HELD_STATES: frozenset[str] = frozenset(("replaying", "replayed", "retained"))  # a replay's activations are live


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldReplays:
    """How many handles held a replay at once (`HELD_STATES`), at most over the run.

    Attributes:
        most: the largest number held at once (0: no replay ran).
        seq: the first seq where `most` were held (None when no replay ran).
        handles: the handles held then, in order of first appearance.
    """

    most: int
    seq: int | None
    handles: tuple[int, ...]

    def at(self, trace: Trace, seq: int | None) -> tuple[int, ...]:
        """The handles of `trace` that hold a replay as of `seq` (None: the end)."""
        life = lifecycle(trace)
        return tuple(h for h in life.handle_ids if life.state_at(h, seq) in HELD_STATES)


def held_replays(trace: Trace) -> HeldReplays:
    """The most replays held at once in `trace` and where (NOTE [ Handle states ]: "replaying", "replayed" and
    "retained" hold a replay's activations), computed once per trace.

    A run that recomputes one block at a time has `most == 1`; a split run whose DX keeps every replay for
    DW holds all of them at once.
    """
    def build(t: Trace) -> HeldReplays:
        life = lifecycle(t)
        changes: dict[int, int] = {}
        for s in life._handles.values():  # the transitions' parallel lists, read in place
            held = False
            for seq, state in zip(s.seqs, s.states):
                now = state in HELD_STATES
                if now != held:
                    changes[seq] = changes.get(seq, 0) + (1 if now else -1)
                    held = now
        most, where, count = 0, None, 0
        for seq in sorted(changes):
            count += changes[seq]
            if count > most:
                most, where = count, seq
        handles = tuple(h for h in life.handle_ids if life.state_at(h, where) in HELD_STATES) if where is not None \
            else ()
        return HeldReplays(most=most, seq=where, handles=handles)
    return derived(trace, "held_replays", build)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeTime:
    """What the replays of a run cost in time: the compute side of checkpointing's trade.

    Attributes:
        replays: how many replays ran (`replay_started` events).
        replay_ns: the time spent replaying, in nanoseconds: the union of every replay's span (from its
            `replay_started` to the handle's next `replay_finished` or `replay_failed`), so a replay nested
            in another one counts once.
        step_ns: the recorded span of the run, from its first event to its last.
        by_handle: handle -> nanoseconds of its own replays.
    """

    replays: int
    replay_ns: int
    step_ns: int
    by_handle: dict[int, int]

    @property
    def share(self) -> float:
        """`replay_ns` over `step_ns` (0 for a run without a span)."""
        return self.replay_ns / self.step_ns if self.step_ns > 0 else 0.0


def recompute_time(trace: Trace) -> RecomputeTime:
    """The time `trace`'s replays took (see `RecomputeTime`), computed once per trace.

    Times are the recorded clock: a run recorded with memory=True sends every op through Python, forward
    and replay alike, so compare replays with the forward of the same recording, not with an unrecorded run.
    """
    def build(t: Trace) -> RecomputeTime:
        open_at: dict[int, int] = {}
        spans: list[tuple[int, int]] = []
        by_handle: dict[int, int] = {}
        replays = 0
        for e in t.events:
            if type(e) is ReplayStarted and e.handle_id is not None:
                replays += 1
                open_at[e.handle_id] = e.t_ns
            elif type(e) in (ReplayFinished, ReplayFailed) and e.handle_id in open_at:
                start = open_at.pop(e.handle_id)
                spans.append((start, e.t_ns))
                by_handle[e.handle_id] = by_handle.get(e.handle_id, 0) + e.t_ns - start
        total, end = 0, None
        for a, b in sorted(spans):
            if end is not None and b <= end:
                continue
            total += b - (a if end is None else max(a, end))
            end = b
        step = t.events[-1].t_ns - t.events[0].t_ns if t.events else 0
        return RecomputeTime(replays=replays, replay_ns=total, step_ns=step, by_handle=by_handle)
    return derived(trace, "recompute_time", build)
