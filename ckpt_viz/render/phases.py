"""The passes of a run: which events belong to the forward, the DX pass, the DW pass or a full backward.

Pure functions of the events; standard library only. The memory chart draws them as
bands, and Compare lines runs up by them (NOTE [ Phase alignment ]).

    phase_spans(trace) -> [{"action": "F", "start_seq": 0, "end_seq": 17}, {"action": "DX", ...}, ...]
    aligned_x(trace)   -> ([seq, ...], [x, ...])   forward on [0, 1), DX on [1, 2), DW on [2, 3]

NOTE [ Passes ]
  1. Each event gets one of `palette.ACTIONS` ("F", "DX", "DW", "B"). An event with
     phase "dx" or "dw" is DX or DW. A forward event (a checkpoint built, its forward
     run, a tensor packed or saved by an excluded op) is F. Another handle event (a
     backward entered, a replay, an unpack, grads routed, a release) is B: a backward
     in phase "ordinary" or without a phase does DX and DW at once. Non-reentrant split
     runs set no phase: their DX activates a retaining session (`session_activated`
     with retain_on_unpack) and their DW the next session; phase-less events between
     stay in that pass.
  2. A memory sample taken "at ... forward" is F; one taken "at ... backward" right
     after a forward starts a B (the run without checkpoint has only samples). Every
     other event (samples, errors, session events) belongs to the pass before it;
     events before any pass belong to the forward.
  3. A span is a run of consecutive events of one pass: [start_seq, end_seq), the
     last one ending at the last seq (the x axis ends where the run ends). Pipeline
     runs interleave passes, so they have many short spans.

NOTE [ Phase alignment ]
  1. Compare draws runs of different lengths on one axis of passes: the forward on
     [0, 1), DX on [1, 2), DW on [2, 3]; a full backward (DX and DW at once) on [1, 3].
     Inside a pass of n events, the k-th has x = start + width * k / n (the pass of
     the run's last event uses n - 1, so the run ends at 3): the ends of the forward
     line up across runs, and so do the ends of DX.
  2. A pass met again after another (pipelines) continues its own share of the axis:
     x orders events by (pass, position in the run), which is monotonic for one
     forward followed by one backward and stays within each pass's interval otherwise.
"""
from __future__ import annotations

import itertools
import operator
from bisect import bisect_left
from typing import Any

from ckpt_viz.trace import Trace
from ckpt_viz.trace.cache import derived, event_column, event_data

__all__ = ["AXIS", "action_at", "aligned_seq", "aligned_x", "event_actions", "phase_span_count", "phase_spans",
           "phase_spans_more_than"]

_FORWARD_KINDS = frozenset(("handle_created", "forward_started", "forward_finished", "forward_failed",
                            "tensor_packed", "exclude_saved"))
_BACKWARD_KINDS = frozenset(("backward_entered", "replay_started", "replay_finished", "replay_failed",
                             "early_stopped", "replay_refused", "grads_routed", "released", "node_collected",
                             "tensor_unpacked", "exclude_reused", "prefired"))
# Where each pass lies on Compare's common axis (NOTE [ Phase alignment ], rule 1).
AXIS: dict[str, tuple[float, float]] = {"F": (0.0, 1.0), "DX": (1.0, 2.0), "DW": (2.0, 3.0), "B": (1.0, 3.0)}


def event_actions(trace: Trace) -> list[str]:
    """The pass of every event, in order (see NOTE [ Passes ]); computed once per trace."""
    return derived(trace, "phases:actions", lambda t: _actions(t, 0, len(t.events), "F"))


def _actions(trace: Trace, start: int, stop: int, current: str) -> list[str]:
    """The passes of events start..stop-1, `current` being the pass before event `start`."""
    kinds, phases = event_column(trace, "kind"), event_column(trace, "phase")
    handles, data = event_column(trace, "handle_id"), event_data(trace)  # data: two kinds read one key each
    if (start, stop) != (0, len(kinds)):
        kinds, phases, handles = kinds[start:stop], phases[start:stop], handles[start:stop]
    out: list[str] = []
    for i, kind, phase, handle in zip(range(start, stop), kinds, phases, handles):
        if phase == "dx":
            current = "DX"
        elif phase == "dw":
            current = "DW"
        elif kind in _FORWARD_KINDS:
            current = "F"
        elif kind == "session_activated":
            if data(i, "retain_on_unpack"):
                current = "DX"
            elif current == "DX":
                current = "DW"
        elif kind in _BACKWARD_KINDS and handle is not None and not (phase is None and current in ("DX", "DW")):
            current = "B"
        elif kind == "memory_sampled":
            at = str(data(i, "at", ""))
            if at.endswith(" forward"):
                current = "F"
            elif at.endswith(" backward") and current == "F":
                current = "B"
        out.append(current)
    return out


_WALK = 512  # events `action_at` looks back for one whose pass does not depend on the pass before it


def action_at(trace: Trace, position: int) -> str:
    """`event_actions(trace)[position]`, found from the events just before it: the last one whose pass does not
    depend on the pass before (a phase dx or dw, a forward kind, a retaining session, a backward event in a
    phase, a forward sample), then NOTE [ Passes ] from there. A chart's tooltips name a few hundred events'
    passes: they need not wait for the pass of every event. Falls back to `event_actions` after `_WALK` events."""
    kinds, phases = event_column(trace, "kind"), event_column(trace, "phase")
    handles, data = event_column(trace, "handle_id"), event_data(trace)
    for start in range(position, max(position - _WALK, -1), -1):
        kind, phase = kinds[start], phases[start]
        if phase in ("dx", "dw") or kind in _FORWARD_KINDS \
                or (kind == "session_activated" and data(start, "retain_on_unpack")) \
                or (kind in _BACKWARD_KINDS and handles[start] is not None and phase is not None) \
                or (kind == "memory_sampled" and str(data(start, "at", "")).endswith(" forward")):
            return _actions(trace, start, position + 1, "F")[-1]  # `start` sets its pass whatever came before
    if position < _WALK:
        return _actions(trace, 0, position + 1, "F")[-1]
    return event_actions(trace)[position]


def phase_spans_more_than(trace: Trace, limit: int) -> bool:
    """phase_span_count(trace) > limit. Found without the pass of every event when the events in phase dx
    or dw alone change pass more than `limit` times (each change is a span boundary: a pipeline's or a long
    run's many passes); computed in C."""
    phases = event_column(trace, "phase")
    size = 4096
    while True:  # a prefix's changes are a prefix of the whole's: a long run shows more than `limit` early
        head = phases[:size] if size < len(phases) else phases
        split = list(itertools.compress(head, map(_SPLIT_PHASES.__contains__, head)))
        if split and 1 + sum(map(operator.ne, split[1:], split)) > limit:
            return True
        if head is phases:
            break
        size *= 16
    return phase_span_count(trace) > limit


_SPLIT_PHASES = frozenset(("dx", "dw"))


def _span_starts(trace: Trace) -> list[int]:
    """The positions where a pass starts (the first event's and each change of pass), once per trace; found
    without a Python step per event (a million events: a few ms)."""
    def build(t: Trace) -> list[int]:
        actions = event_actions(t)
        return [0, *itertools.compress(range(1, len(actions)), map(operator.ne, actions[1:], actions))] \
            if actions else []
    return derived(trace, "phases:starts", build)


def phase_span_count(trace: Trace) -> int:
    """len(phase_spans(trace)), without building the spans."""
    return len(_span_starts(trace))


def phase_spans(trace: Trace) -> list[dict[str, Any]]:
    """Runs of consecutive events of one pass: {action, start_seq, end_seq} (NOTE [ Passes ], rule 3)."""
    def build(t: Trace) -> list[dict[str, Any]]:
        seqs, actions, starts = event_column(t, "seq"), event_actions(t), _span_starts(t)
        ends = [seqs[i] for i in starts[1:]] + seqs[-1:]
        return [{"action": actions[i], "start_seq": seqs[i], "end_seq": end} for i, end in zip(starts, ends)]
    return [dict(s) for s in derived(trace, "phases:spans", build)]


def aligned_x(trace: Trace) -> tuple[list[int], list[float]]:
    """(event seqs, their x on the common axis of passes), both in event order (NOTE [ Phase alignment ])."""
    def build(t: Trace) -> tuple[list[int], list[float]]:
        seqs, actions = event_column(t, "seq"), event_actions(t)
        totals: dict[str, int] = {}
        for a in actions:
            totals[a] = totals.get(a, 0) + 1
        seen: dict[str, int] = {}
        xs: list[float] = []
        last = actions[-1] if actions else None
        for a in actions:
            lo, hi = AXIS[a]
            n = totals[a] - 1 if a == last and totals[a] > 1 else totals[a]  # the run's last event at its end
            xs.append(lo + (hi - lo) * seen.get(a, 0) / n)
            seen[a] = seen.get(a, 0) + 1
        return list(seqs), xs
    return derived(trace, "phases:aligned", build)


def aligned_seq(trace: Trace, x: float) -> int | None:
    """The seq of the event whose aligned x is nearest to `x` (the first such); None for an empty trace."""
    seqs, xs = aligned_x(trace)
    if not seqs:
        return None
    order = derived(trace, "phases:aligned_order", lambda t: sorted(range(len(xs)), key=lambda i: (xs[i], i)))
    keys = [xs[i] for i in order]
    at = bisect_left(keys, x)
    best = min((j for j in (at - 1, at) if 0 <= j < len(order)), key=lambda j: (abs(keys[j] - x), j))
    return seqs[order[best]]
