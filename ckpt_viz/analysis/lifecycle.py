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


class _Walk:
    """The running state of every handle while the pass walks the events, in flat lists indexed by the handle's
    order of first appearance (few objects for the cyclic collector, however many handles); the transitions are
    appended to flat parallel lists in the order they are found."""

    __slots__ = ("created", "index", "pending", "phase", "refusals", "replays", "state", "t_handle", "t_kind",
                 "t_reason", "t_seq", "t_state", "unconsumed")

    def __init__(self) -> None:
        self.index: dict[int, int] = {}  # handle id -> its position
        self.state: list[State] = []
        self.phase: list[str | None] = []
        self.unconsumed: list[int] = []
        self.pending: list[int | None] = []  # seq of an ordinary/dw grads_routed waiting for its next event (rule 4)
        self.replays: list[int] = []
        self.created: dict[int, HandleCreated] = {}  # handle id -> its first handle_created event
        self.refusals: dict[int, list[tuple[int, str | None]]] = {}
        self.t_handle: list[int] = []
        self.t_seq: list[int] = []
        self.t_state: list[State] = []
        self.t_kind: list[str | None] = []
        self.t_reason: list[str | None] = []

    def add(self, handle_id: int) -> int:
        i = self.index[handle_id] = len(self.state)
        self.state.append("not_created")
        self.phase.append(None)
        self.unconsumed.append(0)
        self.pending.append(None)
        self.replays.append(0)
        return i

    def move(self, i: int, seq: int, new: State, kind: str | None, reason: str | None = None) -> None:
        if new != self.state[i]:
            self.t_handle.append(i)
            self.t_seq.append(seq)
            self.t_state.append(new)
            self.t_kind.append(kind)
            self.t_reason.append(reason)
            self.state[i] = new

    def resolve(self, i: int) -> None:
        """Rule 4: a pending ordinary/dw grads_routed not followed by a release is retained from its seq."""
        seq = self.pending[i]
        if seq is not None:
            self.pending[i] = None
            self.move(i, seq, "retained", "grads_routed")


def _phase_set(w: _Walk, i: int, e: PhaseSet) -> None:
    w.phase[i] = e.new
    if w.state[i] in _WAITING:
        w.move(i, e.seq, _WAITING_FOR_PHASE.get(e.new, "recorded"), "phase_set")


def _created(w: _Walk, i: int, e: HandleCreated) -> None:
    w.created.setdefault(e.handle_id, e)  # type: ignore[arg-type]  # (a handle's event has its id)
    w.move(i, e.seq, "recorded", "handle_created")


def _replay_started(w: _Walk, i: int, e: ReplayStarted) -> None:
    w.replays[i] += 1
    w.move(i, e.seq, "replaying", "replay_started")


def _replay_finished(w: _Walk, i: int, e: ReplayFinished) -> None:
    w.unconsumed[i] += e.saved_count or 0
    w.move(i, e.seq, "retained" if e.trigger == "prefire" else "replayed", "replay_finished")


def _routed(w: _Walk, i: int, e: GradsRouted) -> None:
    if e.phase == "dx":
        w.move(i, e.seq, "retained", "grads_routed")
    else:
        w.pending[i] = e.seq


def _released(w: _Walk, i: int, e: Released) -> None:
    w.pending[i] = None
    w.move(i, e.seq, "released", "released", e.reason)


def _failed(w: _Walk, i: int, e: ReplayFailed) -> None:
    w.move(i, e.seq, _WAITING_FOR_PHASE.get(w.phase[i], "recorded"), "replay_failed")


def _collected(w: _Walk, i: int, e: NodeCollected) -> None:
    if w.state[i] in _WAITING:
        w.move(i, e.seq, "collected", "node_collected")


def _unpacked(w: _Walk, i: int, e: TensorUnpacked) -> None:
    if w.state[i] in _KEPT:
        if e.consumed:
            left = w.unconsumed[i] - 1
            if left <= 0:
                w.unconsumed[i] = 0
                w.move(i, e.seq, "released", "tensor_unpacked", "consumed")
            else:
                w.unconsumed[i] = left
        else:
            w.move(i, e.seq, "retained", "tensor_unpacked")


def _refused(w: _Walk, i: int, e: ReplayRefused) -> None:
    w.refusals.setdefault(e.handle_id, []).append((e.seq, e.reason))  # type: ignore[arg-type]


# NOTE [ Handle states ]: what each kind does to its handle (a kind not here does nothing)
# (each step takes the event of its own type, hence `Any` for the event)
_STEPS: dict[type[EventBase], Callable[[_Walk, int, Any], None]] = {
    PhaseSet: _phase_set, HandleCreated: _created, ReplayStarted: _replay_started, ReplayFinished: _replay_finished,
    GradsRouted: _routed, Released: _released, ReplayFailed: _failed, NodeCollected: _collected,
    TensorUnpacked: _unpacked, ReplayRefused: _refused}


class Lifecycle:
    """Every handle's transitions in one trace (NOTE [ Handle states ]), with O(log n) lookups at a seq.

    The transitions are kept in four flat parallel lists (`_seqs`, `_states`, `_kinds`, `_reasons`), each
    handle's in one run of them (`_span`), so a trace of a million events leaves a handful of objects for the
    cyclic collector to walk, not several per handle.

    Attributes:
        handle_ids: handle ids in order of first appearance.
        end_seq: the seq of the trace's last event (None for an empty trace).
    """

    def __init__(self, events: list[Event]) -> None:
        self.end_seq: int | None = events[-1].seq if events else None
        w = _Walk()
        index, pending, steps = w.index, w.pending, _STEPS
        first_seq = events[0].seq if events else 0
        for event in events:
            h = event.handle_id
            kind = type(event)
            if h is not None:
                i = index.get(h)
                if i is None:
                    i = w.add(h)
                    if kind is not HandleCreated:  # rule 1: existed before the recording
                        w.move(i, first_seq, "recorded", None)
                if pending[i] is not None and kind is not Released:
                    w.resolve(i)
                step = steps.get(kind)
                if step is not None:
                    step(w, i, event)
            elif type(event) is SessionCleared:  # (narrows `event` for the type checker)
                for frame in event.frames:
                    i = index.get(frame)
                    if i is not None:
                        w.resolve(i)
                        if w.state[i] in _KEPT:
                            w.unconsumed[i] = 0
                            w.move(i, event.seq, "released", "session_cleared", "session_cleared")
        for i in range(len(w.state)):
            w.resolve(i)
        self.handle_ids: list[int] = list(index)
        self._index = index
        self._phase, self._replays, self._created, self._refusals = w.phase, w.replays, w.created, w.refusals
        # each handle's transitions together, in the order found (a stable sort by handle)
        order = sorted(range(len(w.t_handle)), key=w.t_handle.__getitem__)
        self._seqs = list(map(w.t_seq.__getitem__, order))
        self._states = list(map(w.t_state.__getitem__, order))
        self._kinds = list(map(w.t_kind.__getitem__, order))
        self._reasons = list(map(w.t_reason.__getitem__, order))
        counts = Counter(w.t_handle)
        self._lo: list[int] = []
        at = 0
        for i in range(len(index)):
            self._lo.append(at)
            at += counts[i]
        self._lo.append(at)
        into: dict[str, list[int]] = {s: [] for s in STATES}
        out: dict[str, list[int]] = {s: [] for s in STATES}
        for i in range(len(index)):
            previous: str = "not_created"
            for k in range(self._lo[i], self._lo[i + 1]):
                new = self._states[k]
                out[previous].append(self._seqs[k])
                into[new].append(self._seqs[k])
                previous = new
        for seqs in (*into.values(), *out.values()):
            seqs.sort()
        self._into, self._out = into, out

    def _span(self, handle_id: int) -> range:
        """The positions of the handle's transitions in the flat lists (empty for an unknown handle)."""
        i = self._index.get(handle_id)
        return range(self._lo[i], self._lo[i + 1]) if i is not None else range(0)

    def _transition(self, h: int, k: int) -> Transition:
        return Transition(seq=self._seqs[k], handle_id=h, state=self._states[k], kind=self._kinds[k],
                          reason=self._reasons[k])

    # -- queries

    def _at(self, seq: int | None) -> int:
        if seq is None:
            return self.end_seq if self.end_seq is not None else 0
        return seq

    def transitions(self, handle_id: int) -> list[Transition]:
        """The handle's state changes, in order (empty for an unknown handle)."""
        return [self._transition(handle_id, k) for k in self._span(handle_id)]

    def state_at(self, handle_id: int, seq: int | None) -> State:
        """One of `STATES` as of `seq` (inclusive; None: the end); "not_created" for an unknown handle."""
        span = self._span(handle_id)
        at = bisect_right(self._seqs, self._at(seq), span.start, span.stop)
        return self._states[at - 1] if at > span.start else "not_created"

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
        span = self._span(handle_id)
        at = bisect_right(self._seqs, self._at(seq), span.start, span.stop)
        return self._reasons[at - 1] if at > span.start else None

    def _released_at(self, handle_id: int) -> list[int]:
        if not self.was_released(handle_id):  # (a slice searched in C first: most handles are released once)
            return []
        return [k for k in self._span(handle_id) if self._states[k] == "released"]

    def released(self, handle_id: int) -> Transition | None:
        """The handle's first release (its reason says why), or None if it was never released."""
        ks = self._released_at(handle_id)
        return self._transition(handle_id, ks[0]) if ks else None

    def created_events(self) -> dict[int, HandleCreated]:
        """handle -> its first `handle_created` event (handles created before the recording are absent)."""
        return dict(self._created)

    def was_released(self, handle_id: int) -> bool:
        """Whether the handle was ever released (`released` without building its transition)."""
        span = self._span(handle_id)
        return "released" in self._states[span.start:span.stop]

    def releases(self, handle_id: int) -> list[Transition]:
        """Every release of the handle (a non-reentrant frame recomputed by a later backward is released again)."""
        return [self._transition(handle_id, k) for k in self._released_at(handle_id)]

    def released_reasons(self) -> Counter[str | None]:
        """reason -> how many handles are released at the end of the trace for it."""
        return Counter(self._reasons[k] for k in self._lasts().values()
                       if k is not None and self._states[k] == "released")

    def _lasts(self) -> dict[int, int | None]:
        """handle -> the position of its last transition (None: it has none)."""
        lo = self._lo
        return {h: lo[i + 1] - 1 if lo[i + 1] > lo[i] else None for i, h in enumerate(self.handle_ids)}

    def final_states(self) -> dict[int, State]:
        """handle -> its state at the end of the trace, for every handle at once."""
        return {h: self._states[k] if k is not None else "not_created" for h, k in self._lasts().items()}

    def with_reason(self, *reasons: str) -> set[int]:
        """The handles with a transition for one of `reasons` (such as "backward_exception"), at any time."""
        wanted = set(reasons)
        return {self.handle_ids[bisect_right(self._lo, k) - 1] for k, r in enumerate(self._reasons) if r in wanted}

    def refused(self) -> list[int]:
        """The handles with a refused replay (rule 7), in order of first appearance."""
        return [h for h in self.handle_ids if h in self._refusals]

    def reasons(self, handle_id: int) -> tuple[str | None, ...]:
        """The reasons of the handle's transitions, in order (a release's reason where it is one)."""
        span = self._span(handle_id)
        return tuple(self._reasons[span.start:span.stop])

    def last_phase(self, handle_id: int) -> str | None:
        """The last phase a `phase_set` gave the handle, or None."""
        i = self._index.get(handle_id)
        return self._phase[i] if i is not None else None

    def replay_count(self) -> int:
        """How many times any handle's forward was re-run."""
        return sum(self._replays)

    def replays(self, handle_id: int) -> int:
        """How many times the handle's forward was re-run (`replay_started` events)."""
        i = self._index.get(handle_id)
        return self._replays[i] if i is not None else 0

    def refusals(self, handle_id: int) -> list[Transition]:
        """The handle's refused replays: state is the handle's state then, reason the refusal's reason."""
        return [Transition(seq=seq, handle_id=handle_id, state=self.state_at(handle_id, seq), kind="replay_refused",
                           reason=r) for seq, r in self._refusals.get(handle_id, ())]


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
        seqs, states = life._seqs, life._states  # the transitions' flat lists, read in place
        for h in life.handle_ids:
            held = False
            for k in life._span(h):
                now = states[k] in HELD_STATES
                if now != held:
                    changes[seqs[k]] = changes.get(seqs[k], 0) + (1 if now else -1)
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
