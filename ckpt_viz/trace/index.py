"""`TraceIndex`: answers "what was true at event seq N?" in O(log n), for every cursor-driven view.

Owns the per-handle state machine the views share (see NOTE [ Handle states ]), the
column reader that avoids building a million `Event` objects, and `derived`, a small
cache that lets every renderer compute its per-trace data once. Standard library
only: never torch, streamlit or the runtime.

NOTE [ Handle states ]
  1. A handle (reentrant handle or non-reentrant frame) is "not_created" before its
     `handle_created` event, "recorded" after it (a handle whose first event is
     something else existed before the recording: "recorded" from the start).
  2. replay_started -> "replaying"; replay_finished -> "replayed" (the replay is kept:
     a retained reentrant replay, or non-reentrant recomputed tensors);
     replay_failed -> "recorded" again (spec §2, S2 -> S1).
  3. released -> "released", terminal for a reentrant handle.
  4. node_collected -> "node_collected" only while "recorded" (spec §2, G before any
     replay: the R10 case); a replayed or released handle keeps its state.
  5. A non-reentrant frame has no release event: it counts the tensors its replay
     saved (replay_finished.saved_count) and becomes "released" when every one was
     unpacked with consumed=True, or when `session_cleared` lists it. A later
     recompute (a new graph task) makes it "replaying" again.
  6. The state at cursor c includes the event with seq c; cursor None means the end.

Example: split-reentrant mlp, h3: recorded (seq 12) -> replaying (23) -> replayed (24)
-> released (49).
"""
from __future__ import annotations

import gc

import weakref
from bisect import bisect_right
from typing import Any, Callable

from ckpt_viz.events import Event
from ckpt_viz.trace.model import EventColumns, GraphSnapshot, MemoryColumns, MemorySample, Trace

__all__ = ["HANDLE_STATES", "TraceIndex", "derived", "event_column"]

HANDLE_STATES: tuple[str, ...] = ("not_created", "recorded", "replaying", "replayed", "released", "node_collected")

# ------------------------------------------------------------------ per-trace cache

_DERIVED: dict[int, tuple[Any, tuple[int, int, int], dict[str, Any]]] = {}


def derived(trace: Trace, name: str, build: Callable[[Trace], Any]) -> Any:
    """`build(trace)`, computed once per trace object and name.

    The result is dropped when the trace is garbage-collected or grows (a recording
    still appending). Renderers call this so a cursor move never rescans the trace.
    A result must not refer to the trace itself, or the trace would never be collected.
    """
    key = id(trace)
    stamp = (len(trace.events), len(trace.memory), len(trace.graphs))
    entry = _DERIVED.get(key)
    if entry is None or entry[0]() is not trace or entry[1] != stamp:
        ref = weakref.ref(trace, lambda _ref, key=key, cache=_DERIVED: cache.pop(key, None))
        entry = (ref, stamp, {})
        _DERIVED[key] = entry
    cache = entry[2]
    if name not in cache:
        cache[name] = build(trace)
    return cache[name]


# ------------------------------------------------------------------ columns

_CONTEXT_FIELD = {"kind": 0, "mode": 1, "phase": 2, "site": 3, "thread_id": 4}


def event_column(trace: Trace, name: str) -> list[Any]:
    """One Event field for every event, as a list (read from the columns of a loaded trace).

    Args:
        name: an `Event` field: seq, kind, handle_id, mode, phase, session_id, tags, site, data.
    """
    return derived(trace, f"column:{name}", lambda t: _read_column(t.events, name))


def _read_column(events: Any, name: str) -> list[Any]:
    if isinstance(events, EventColumns) and not events.materialized:
        cols = events.columns
        if name in _CONTEXT_FIELD:
            table = [row[_CONTEXT_FIELD[name]] for row in events.tables["context"]]
            return list(map(table.__getitem__, cols["context"]))
        if name == "tags":
            return list(map(events.tables["tags"].__getitem__, cols["tags"]))
        return list(cols[name])
    return [getattr(e, name) for e in events]


def _memory_seqs(memory: Any) -> list[int]:
    if isinstance(memory, MemoryColumns) and not memory.materialized:
        return list(memory.columns["seq"])
    return [s.seq for s in memory]


# ------------------------------------------------------------------ the index


class TraceIndex:
    """Cursor queries over one trace, built once in O(n).

    Attributes:
        seqs: event seqs in order.
        handles: handle ids in order of first appearance.
    """

    def __init__(self, trace: Trace) -> None:
        # The lists, not the trace: `TraceIndex.of` caches the index for as long as the trace lives.
        self._events, self._memory, self._graphs = trace.events, trace.memory, trace.graphs
        self.seqs: list[int] = list(event_column(trace, "seq"))
        kinds = event_column(trace, "kind")
        handle_ids = event_column(trace, "handle_id")
        self._mem_seqs = _memory_seqs(trace.memory)
        self._graph_seqs = [g.seq for g in trace.graphs]
        self._first: dict[int, int] = {}  # handle -> position of its first event
        self._initial: dict[int, str] = {}
        self._changes: dict[int, tuple[list[int], list[str]]] = {}
        self._build_states(trace, kinds, handle_ids)
        self.handles: list[int] = list(self._first)
        # Per handle: (id, first change, last change, initial, final, changes); see handle_states.
        self._summary = [(h, seqs[0], seqs[-1], self._initial[h], states[-1], seqs, states) if seqs
                         else (h, None, None, self._initial[h], self._initial[h], seqs, states)
                         for h, (seqs, states) in self._changes.items()]

    @classmethod
    def of(cls, trace: Trace) -> "TraceIndex":
        """The index of `trace`, built on first use and cached (see `derived`)."""
        return derived(trace, "TraceIndex", _build_without_gc)

    # -- building

    def _build_states(self, trace: Trace, kinds: list[str], handle_ids: list[int | None]) -> None:
        # See NOTE [ Handle states ].
        datas = None
        seqs = self.seqs
        state: dict[int, str] = {}
        pending: dict[int, int] = {}
        first, initial, changes = self._first, self._initial, self._changes

        def move(h: int, seq: int, new: str) -> None:
            if state.get(h) != new:
                state[h] = new
                seq_list, state_list = changes[h]
                seq_list.append(seq)
                state_list.append(new)

        for i, (kind, h) in enumerate(zip(kinds, handle_ids)):
            if h is None:
                if kind == "session_cleared":
                    datas = datas if datas is not None else event_column(trace, "data")
                    for frame in datas[i].get("frames", ()):
                        if state.get(frame) == "replayed":
                            pending[frame] = 0
                            move(frame, seqs[i], "released")
                continue
            if h not in first:
                first[h] = i
                initial[h] = "not_created" if kind == "handle_created" else "recorded"
                state[h] = initial[h]
                changes[h] = ([], [])
            if kind == "handle_created":
                move(h, seqs[i], "recorded")
            elif kind == "replay_started":
                move(h, seqs[i], "replaying")
            elif kind == "replay_finished":
                datas = datas if datas is not None else event_column(trace, "data")
                pending[h] = pending.get(h, 0) + int(datas[i].get("saved_count") or 0)
                move(h, seqs[i], "replayed")
            elif kind == "replay_failed":
                move(h, seqs[i], "recorded")
            elif kind == "released":
                move(h, seqs[i], "released")
            elif kind == "node_collected":
                if state[h] == "recorded":
                    move(h, seqs[i], "node_collected")
            elif kind == "tensor_unpacked":
                datas = datas if datas is not None else event_column(trace, "data")
                if datas[i].get("consumed") and state[h] == "replayed":
                    pending[h] = pending.get(h, 0) - 1
                    if pending[h] <= 0:
                        pending[h] = 0
                        move(h, seqs[i], "released")

    # -- queries

    def _cursor(self, cursor: int | None) -> int:
        if cursor is None:
            return self.seqs[-1] if self.seqs else 0
        return cursor

    def handle_state(self, handle_id: int, cursor: int | None) -> str:
        """One of `HANDLE_STATES` as of `cursor` (inclusive); "not_created" for an unknown handle."""
        changes = self._changes.get(handle_id)
        if changes is None:
            return "not_created"
        seq_list, state_list = changes
        at = bisect_right(seq_list, self._cursor(cursor))
        return state_list[at - 1] if at else self._initial[handle_id]

    def handle_states(self, cursor: int | None) -> dict[int, str]:
        """The state of every handle as of `cursor`, in order of first appearance."""
        c = self._cursor(cursor)
        out: dict[int, str] = {}
        for h, first, last, initial, final, seqs, states in self._summary:  # a bisect only while in flight
            if first is None or c < first:
                out[h] = initial
            elif c >= last:
                out[h] = final
            else:
                out[h] = states[bisect_right(seqs, c) - 1]
        return out

    def transitions(self, handle_id: int) -> list[tuple[int, str]]:
        """(seq, new state) pairs of one handle, in order."""
        seq_list, state_list = self._changes.get(handle_id, ([], []))
        return list(zip(seq_list, state_list))

    def first_event(self, handle_id: int) -> Event:
        """The first event that names `handle_id` (its tags give the stage and micro-batch)."""
        return self._events[self._first[handle_id]]

    def memory_at(self, cursor: int | None) -> MemorySample | None:
        """The last memory sample with seq <= cursor, or None."""
        if not self._mem_seqs:
            return None
        at = bisect_right(self._mem_seqs, self._cursor(cursor))
        return self._memory[at - 1] if at else None

    def snapshot_at(self, cursor: int | None) -> GraphSnapshot | None:
        """The last graph snapshot with seq <= cursor; the first one when cursor is before them all."""
        if not self._graph_seqs:
            return None
        at = bisect_right(self._graph_seqs, self._cursor(cursor))
        return self._graphs[at - 1] if at else self._graphs[0]

    def position(self, cursor: int | None) -> int:
        """The index of the event with seq `cursor` (or of the last one before it); -1 if the trace is empty."""
        if not self.seqs:
            return -1
        if cursor is None:
            return len(self.seqs) - 1
        return max(bisect_right(self.seqs, cursor) - 1, 0)

    def seq_at(self, position: int) -> int:
        """The seq of the event at `position` (clamped to the trace)."""
        return self.seqs[min(max(position, 0), len(self.seqs) - 1)]

    def window(self, start: int | None, stop: int | None) -> range:
        """Positions of the events with start <= seq < stop (None: unbounded)."""
        lo = 0 if start is None else bisect_right(self.seqs, start - 1)
        hi = len(self.seqs) if stop is None else bisect_right(self.seqs, stop - 1)
        return range(lo, max(lo, hi))


def _build_without_gc(trace: Trace) -> TraceIndex:
    """Build an index with the cyclic collector paused: it makes millions of small objects, none cyclic."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return TraceIndex(trace)
    finally:
        if enabled:
            gc.enable()
