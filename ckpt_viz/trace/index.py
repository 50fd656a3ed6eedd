"""`TraceIndex`: answers "what was true at event seq N?" in O(log n), for every cursor-driven view.

Handle states come from `ckpt_viz.trace.lifecycle` (see NOTE [ Handle states ] there):
the index only adds cursor lookups of memory samples, graph snapshots and positions.
`derived` and `event_column` (from `ckpt_viz.trace.cache`) are re-exported here.
Standard library only: never torch, streamlit or the runtime.
"""
from __future__ import annotations

import gc
import weakref
from bisect import bisect_right
from collections import Counter
from typing import Any

from ckpt_viz.events import Event
from ckpt_viz.trace.cache import derived, event_column, is_derived
from ckpt_viz.trace.columnpass import identity_counts
from ckpt_viz.trace.lifecycle import STATES, Lifecycle, handle_order, lifecycle
from ckpt_viz.trace.model import GraphSnapshot, MemoryColumns, MemorySample, Trace

__all__ = ["STATES", "TraceIndex", "derived", "event_column", "event_counts"]


def event_counts(trace: Trace, name: str) -> Counter[Any]:
    """How many events hold each value of the field `name` (`Counter(event_column(trace, name))`, counted in C
    where it can be: NOTE [ Column passes ] in ckpt_viz/trace/columnpass.py); once per trace and field."""
    return derived(trace, f"counts:{name}", lambda t: identity_counts(event_column(t, name)))


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
        lifecycle: the handles' `Lifecycle`, built on first use (a pass over the events).
    """

    def __init__(self, trace: Trace) -> None:
        # The lists, not the trace: `TraceIndex.of` caches the index for as long as the trace lives.
        self._events, self._memory, self._graphs = trace.events, trace.memory, trace.graphs
        self.seqs: list[int] = list(event_column(trace, "seq"))
        self._mem_seqs = _memory_seqs(trace.memory)
        self._graph_seqs = [g.seq for g in trace.graphs]
        self.handles: list[int] = list(handle_order(trace))  # as the lifecycle has them, without its pass
        self._trace_ref = weakref.ref(trace)
        self._lifecycle: Lifecycle | None = None

    @property
    def lifecycle(self) -> Lifecycle:
        """The handles' lifecycle (`ckpt_viz.trace.lifecycle`), built on first use: a page that shows no handle
        state (or shows it after the rest, as the Overview does) does not wait for its pass over the events."""
        if self._lifecycle is None:
            trace = self._trace_ref()  # its lifecycle is cached on it, for the other views: shared
            if trace is None:  # the index outlived its trace: the same events, in a trace of their own
                trace = Trace(events=self._events, memory=self._memory, graphs=self._graphs)
            self._lifecycle = lifecycle(trace)
        return self._lifecycle

    @property
    def lifecycle_built(self) -> bool:
        """Whether `lifecycle` is built already (reading it costs nothing then)."""
        trace = self._trace_ref()
        return self._lifecycle is not None or (trace is not None and is_derived(trace, "lifecycle"))

    @classmethod
    def of(cls, trace: Trace) -> TraceIndex:
        """The index of `trace`, built on first use and cached (see `derived`)."""
        return derived(trace, "TraceIndex", _build_without_gc)

    # -- queries

    def _cursor(self, cursor: int | None) -> int:
        if cursor is None:
            return self.seqs[-1] if self.seqs else 0
        return cursor

    def handle_state(self, handle_id: int, cursor: int | None) -> str:
        """One of `STATES` as of `cursor` (inclusive); "not_created" for an unknown handle."""
        return self.lifecycle.state_at(handle_id, self._cursor(cursor))

    def handle_states(self, cursor: int | None) -> dict[int, str]:
        """The state of every handle as of `cursor`, in order of first appearance."""
        return self.lifecycle.states_at(self._cursor(cursor))

    def transitions(self, handle_id: int) -> list[tuple[int, str]]:
        """(seq, new state) pairs of one handle, in order (`Lifecycle.transitions` has kinds and reasons)."""
        return [(t.seq, t.state) for t in self.lifecycle.transitions(handle_id)]

    def first_event(self, handle_id: int) -> Event:
        """The first event that names `handle_id` (its tags give the stage and micro-batch)."""
        return self._events[self.lifecycle.first_position(handle_id)]

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
