"""The lifecycle pass over runs of the handle column: each run's result remembered by what decides it.

`ckpt_viz.trace.lifecycle.Lifecycle` builds its transitions here. Standard library only.

NOTE [ Runs remembered ]
  1. A run is a maximal stretch of consecutive events that name the same handle. The rules
     of NOTE [ Handle states ] read, for one handle's event, only that handle's own state
     (state, remembered phase, unconsumed count, a pending grads_routed), the event's kind
     and phase, a few data values (new, saved_count, trigger, reason, consumed) and, for an
     ordinary/dw grads_routed, the kind of the handle's next event (rule 4).
  2. So a run's result (its transitions as offsets into the run, the handle's state after
     it, its replays and refusals) is a function of: the entry state, the run's kinds and
     phases (a loaded trace's context ids, which hold both; else (kind, phase) pairs), the
     run's data values (one id per distinct combination within a data shape, `_value_ids`)
     and, when the run ends with an ordinary/dw grads_routed, whether the handle's next
     event (in a later run) is a release. The pass
     computes it once per distinct key (`_simulate`, one step per event) and replays it
     with the run's seqs for every other run with that key: a training run repeats the
     same per-step pattern, so nearly every run is a hit.
  3. Events that name no handle change no state but for `session_cleared` (rule 5: it
     names frames), interpreted event by event between runs, in order. A handle whose
     transitions come from more than one part (several runs, a session_cleared, rule 1's
     seed, a grads_routed still pending at the end) has its lists rebuilt in order (`_walk`).
  4. Values that cannot be keyed (a data value that is not hashable) get one id per
     event: no run is then a hit, and the result is the same.
  5. The result must equal the plain pass exactly; tests/app/test_lifecycle_pass.py keeps
     it as the oracle.
"""
from __future__ import annotations

import itertools
from collections import Counter
from operator import add, itemgetter
from typing import Any

from ckpt_viz.trace import columnpass
from ckpt_viz.trace.cache import _data_rows, event_column, event_data_key
from ckpt_viz.trace.columns import EventColumns
from ckpt_viz.trace.model import Trace

__all__ = ["build_runs"]

_WAITING = frozenset(("recorded", "phase_dx", "phase_dw"))
_KEPT = frozenset(("replayed", "retained"))
_WAITING_FOR_PHASE = {"dx": "phase_dx", "dw": "phase_dw"}
(_CREATED, _PHASE_SET, _REPLAY_STARTED, _REPLAY_FINISHED, _REPLAY_FAILED, _ROUTED, _RELEASED, _COLLECTED, _UNPACKED,
 _REFUSED) = range(10)
ACTIVE = {"handle_created": _CREATED, "phase_set": _PHASE_SET, "replay_started": _REPLAY_STARTED,
          "replay_finished": _REPLAY_FINISHED, "replay_failed": _REPLAY_FAILED, "grads_routed": _ROUTED,
          "released": _RELEASED, "node_collected": _COLLECTED, "tensor_unpacked": _UNPACKED,
          "replay_refused": _REFUSED}
# The data keys the rules read, with the default each is read with.
_KEYS = (("new", ""), ("saved_count", None), ("trigger", None), ("reason", None), ("consumed", None))


class _Run:
    """One remembered run result (NOTE [ Runs remembered ], rule 2)."""

    __slots__ = ("exit", "handles", "kinds", "offsets", "prev", "reasons", "refusals", "replays", "routed_at",
                 "starts", "states", "tail")

    def __init__(self) -> None:
        self.handles: list[int] = []  # the runs it was used for: handle, position of the run's first event
        self.starts: list[int] = []
        self.tail: dict[bool, _Run] | None = None  # set when the result depends on the next run (rule 4)


def _context_ids(trace: Trace, kinds: list[Any], phases: list[Any]) -> list[Any]:
    """One id per event that decides its kind and phase: a loaded trace's context ids, else (kind, phase)."""
    events = trace.events
    if isinstance(events, EventColumns) and not events.materialized:
        return events.columns["context"]
    return list(zip(kinds, phases))


def _value_ids(trace: Trace) -> list[Any] | None:
    """One id per event for the combination of the data values the rules read (NOTE rule 2); None: unhashable."""
    columns = [event_data_key(trace, key, default) for key, default in _KEYS]
    shape, rows = columns[0][1], columns[0][2]
    if any(c[1] is not shape or c[2] is not rows for c in columns):  # not one packed column: read them alike
        if _data_rows(trace) is not None:
            return None
    numbers = itertools.count(1)  # one numbering for every shape: an id names one shape's values
    zeros = bytes(len(shape) + 1)
    by_shape: list[Any] = []
    for s in range(len(columns[0][0])):
        present = [c[0][s] for c in columns if c[0][s] is not None]  # a key the shape lacks reads its default
        if not present:
            by_shape.append(zeros)
            continue
        reasons = columns[3][0][s]
        if reasons is not None and not set(map(type, reasons)) <= {str, type(None)}:
            present.append(list(map(type, reasons)))  # a reason is kept as given: tell apart 1 and True
        ids: dict[Any, int] = {}
        try:
            by_shape.append(list(map(ids.setdefault, present[0] if len(present) == 1 else zip(*present), numbers)))
        except TypeError:
            return None
    return columnpass.gather(by_shape, shape, rows)


def build_runs(trace: Trace, seqs: list[int], handle_order: list[int]) -> dict[str, Any]:
    """Every handle's transitions (NOTE [ Handle states ]), by runs (NOTE [ Runs remembered ]).

    Returns a dict: "lists" (four dicts, handle -> seqs, states, kinds, reasons), "into" and "out" (state ->
    seqs, unsorted), "replays" (handle -> count), "refusals" (handle -> [(seq, reason)]), "first_position".
    """
    kinds = event_column(trace, "kind")
    handle_ids = event_column(trace, "handle_id")
    phase_at = event_column(trace, "phase")
    n = len(kinds)
    starts = columnpass.run_starts(handle_ids)
    ends = [*starts[1:], n] if starts else []
    run_handles = list(map(handle_ids.__getitem__, starts))
    first_position = dict(zip(reversed(run_handles), reversed(starts)))
    first_position.pop(None, None)
    contexts = _context_ids(trace, kinds, phase_at)
    values = _value_ids(trace)
    if values is None:  # NOTE rule 4
        values = range(1, n + 1)
    value_of = _Reader(trace)
    frames_by, shape, rows = event_data_key(trace, "frames", ())

    first_seq = seqs[0] if seqs else 0
    into: dict[str, list[int]] = {}
    out: dict[str, list[int]] = {}
    # handle -> (state, remembered phase, unconsumed, pending routed): NOTE rule 2's entry state
    entry: dict[int, tuple[str, Any, int, bool]] = dict.fromkeys(handle_order, ("not_created", None, 0, False))
    routed_seq: dict[int, int] = {}  # handle -> seq of its pending grads_routed
    first_kinds = map(kinds.__getitem__, map(first_position.__getitem__, handle_order))
    seeded = list(itertools.compress(handle_order, map("handle_created".__ne__, first_kinds)))
    if seeded:  # rule 1: existed before the recording
        entry.update(dict.fromkeys(seeded, ("recorded", None, 0, False)))
        into["recorded"] = [first_seq] * len(seeded)
        out["not_created"] = [first_seq] * len(seeded)
    # each run's kinds, phases and data values as one number, found in C
    signature = columnpass.run_signatures(starts, n, contexts, values)
    memo: dict[Any, _Run] = {}
    used: list[Any] = []  # per run: its _Run, or for a run of no handle the moves its session_cleared made
    cleared: list[list[tuple[Any, ...]]] = []  # those moves, where there are some
    for h, a, b, sig in zip(run_handles, starts, ends, signature):
        if h is None:
            moves: list[tuple[Any, ...]] = []
            if "session_cleared" in kinds[a:b]:
                for i in range(a, b):
                    if kinds[i] == "session_cleared":
                        _session_cleared(i, seqs[i], frames_by, shape, rows, entry, routed_seq, moves)
                for _, seq, new, _, _, old in moves:
                    _count_move(into, out, old, new, seq)
                cleared.append(moves)
            used.append(moves)
            continue
        e = entry[h]
        r = memo.get((e, sig))
        if r is None:
            r = memo[e, sig] = _simulate(e, a, b, kinds, phase_at, value_of)
        if r.tail is not None:  # rule 4 across runs: is the handle's next event a release?
            try:
                following = handle_ids.index(h, b)
            except ValueError:
                following = -1
            r = r.tail[following >= 0 and kinds[following] == "released"]
        used.append(r)
        r.handles.append(h)
        r.starts.append(a)
        entry[h] = r.exit
        if r.routed_at is not None:
            routed_seq[h] = seqs[a + r.routed_at]
    # the pending grads_routed left at the end: retained from its seq (rule 4)
    last = [(h, at, "retained", "grads_routed", None) for h, at in routed_seq.items()
            if entry[h][3] and entry[h][0] != "retained"]  # a stale seq: its release came
    for h, at, *_ in last:
        _count_move(into, out, entry[h][0], "retained", at)
    lists, replays, refusals = _assemble(memo, _positions_to_seqs(trace, seqs), into, out)
    multi = set(seeded)
    multi.update(h for h, *_ in last)
    multi.update(h for moves in cleared for h, *_ in moves)
    counts = Counter(run_handles)
    if len(counts) < len(run_handles):
        multi.update(h for h, c in counts.items() if c > 1 and h is not None)
    if multi:  # several parts: walk the runs in order
        _walk(multi, first_seq, seeded, run_handles, starts, used, last, seqs, lists, replays, refusals)
    return {"lists": lists, "into": into, "out": out, "replays": replays, "refusals": refusals,
            "first_position": first_position}


def _positions_to_seqs(trace: Trace, seqs: Any) -> Any:
    """`seqs`, or for a loaded trace whose seqs are consecutive the number to add to a position (no lookup)."""
    events = trace.events
    raw = events.columns.get("seq") if isinstance(events, EventColumns) and not events.materialized else None
    return raw.start if isinstance(raw, range) and raw.step == 1 else seqs


def _count_move(into: dict, out: dict, old: str, new: str, seq: int) -> None:
    out.setdefault(old, []).append(seq)
    into.setdefault(new, []).append(seq)


class _Reader:
    """`value(i, key)`: events[i].data.get(key, default) for the keys of `_KEYS`."""

    def __init__(self, trace: Trace) -> None:
        self.by_key = {key: event_data_key(trace, key, default) for key, default in _KEYS}
        self.defaults = dict(_KEYS)

    def __call__(self, i: int, key: str) -> Any:
        by_shape, shape, rows = self.by_key[key]
        values = by_shape[shape[i]]
        return self.defaults[key] if values is None else values[rows[i]]


def _session_cleared(i: int, seq: int, frames_by: Any, shape: Any, rows: Any, entry: dict, routed_seq: dict,
                     moves: list[tuple[Any, ...]]) -> None:
    """Rule 5's session_cleared (no handle): its frames' pending grads_routed resolved, kept frames released."""
    frames = frames_by[shape[i]]
    for frame in (frames[rows[i]] if frames is not None else ()) or ():
        e = entry.get(frame)
        if e is None:
            continue
        state, phase, unconsumed, pending = e
        if pending:
            at = routed_seq.pop(frame)
            if state != "retained":
                moves.append((frame, at, "retained", "grads_routed", None, state))
                state = "retained"
            pending = False
        if state in _KEPT:
            unconsumed = 0
            moves.append((frame, seq, "released", "session_cleared", "session_cleared", state))
            state = "released"
        entry[frame] = (state, phase, unconsumed, pending)


def _simulate(e: tuple[str, Any, int, bool], a: int, b: int, kinds: list[Any], phase_at: list[Any], value: _Reader,
              tail: bool | None = None) -> _Run:
    """One run's result, one step per event (NOTE [ Handle states ]); offsets are from the run's first event."""
    state, phase, unconsumed, pending = e
    r = _Run()
    if tail is None and kinds[b - 1] == "grads_routed" and phase_at[b - 1] != "dx":
        r.tail = {t: _simulate(e, a, b, kinds, phase_at, value, t) for t in (False, True)}
        return r
    offsets: list[int] = []
    states: list[str] = []
    causes: list[str | None] = []
    reasons: list[str | None] = []
    prev: list[str] = []
    replays, refusals, routed_at = 0, [], None
    for i in range(a, b):
        kind = kinds[i]
        code = ACTIVE.get(kind)
        if code is None:
            continue
        new = reason = None
        if code == _PHASE_SET:
            phase = v = value(i, "new")
            if state in _WAITING:
                new = _WAITING_FOR_PHASE.get(v, "recorded")
        elif code == _CREATED:
            new = "recorded"
        elif code == _REPLAY_STARTED:
            replays += 1
            new = "replaying"
        elif code == _REPLAY_FINISHED:
            unconsumed = unconsumed + int(value(i, "saved_count") or 0)
            new = "retained" if value(i, "trigger") == "prefire" else "replayed"
        elif code == _ROUTED:
            if phase_at[i] == "dx":
                new = "retained"
            elif (kinds[i + 1] == "released") if i + 1 < b else tail:  # rule 4
                pending, routed_at = True, i - a
            else:
                new = "retained"
        elif code == _RELEASED:
            pending, routed_at = False, None
            new, reason = "released", value(i, "reason")
        elif code == _REPLAY_FAILED:
            new = _WAITING_FOR_PHASE.get(phase if phase is not None else "", "recorded")
        elif code == _COLLECTED:
            if state in _WAITING:
                new = "collected"
        elif code == _UNPACKED:
            if state in _KEPT:
                if value(i, "consumed"):
                    unconsumed -= 1
                    if unconsumed <= 0:
                        unconsumed = 0
                        new, reason = "released", "consumed"
                else:
                    new = "retained"
        else:  # replay_refused
            refusals.append((i - a, value(i, "reason")))
        if new is not None and new != state:
            offsets.append(i - a)
            states.append(new)
            causes.append(kind)
            reasons.append(reason)
            prev.append(state)
            state = new
    r.exit = (state, phase, unconsumed, pending)
    r.offsets, r.states, r.kinds, r.reasons, r.prev = offsets, tuple(states), tuple(causes), tuple(reasons), prev
    r.replays, r.refusals, r.routed_at = replays, refusals, routed_at
    return r


def _assemble(memo: dict[Any, _Run], seqs: Any, into: dict, out: dict) -> tuple[tuple[dict, ...], dict, dict]:
    """Expand the remembered results with each run's seqs, mostly in C (NOTE rule 2): every handle as if it had
    one run (`_walk` redoes those with more). `seqs` may be the number that turns a position into its seq."""
    lists: tuple[dict[int, Any], ...] = ({}, {}, {}, {})  # handle -> seqs, states, kinds, reasons
    replays: dict[int, int] = {}
    refusals: dict[int, list[tuple[int, Any]]] = {}
    results = [t for r in memo.values() for t in ((r,) if r.tail is None else r.tail.values())]
    for r in results:
        if not r.starts:
            continue
        if isinstance(seqs, int):
            picked = [columnpass.shifted(r.starts, o + seqs) for o in r.offsets]
        else:
            picked = [list(map(seqs.__getitem__, map(add, r.starts, itertools.repeat(o)))) for o in r.offsets]
        for state, column in zip(r.states, picked):
            into.setdefault(state, []).extend(column)
        for state, column in zip(r.prev, picked):
            out.setdefault(state, []).extend(column)
        lists[0].update(zip(r.handles, zip(*picked) if picked else itertools.repeat(())))
        for values, shared in zip(lists[1:], (r.states, r.kinds, r.reasons)):
            values.update(zip(r.handles, itertools.repeat(shared)))
        if r.replays:
            replays.update(zip(r.handles, itertools.repeat(r.replays)))
        if r.refusals:
            for h, a in zip(r.handles, r.starts):
                refusals[h] = [(a + o + seqs if isinstance(seqs, int) else seqs[a + o], why) for o, why in r.refusals]
    return lists, replays, refusals


def _walk(multi: set[int], first_seq: int, seeded: list[int], run_handles: list[Any], starts: list[int],
          used: list[Any], last: list[tuple[Any, ...]], seqs: Any, lists: dict, replays: dict,
          refusals: dict) -> None:
    """The lists, replays and refusals of the handles with several parts, in the order the plain pass finds them."""
    acc: dict[int, tuple[list, list, list, list]] = {h: ([], [], [], []) for h in multi}
    for h in multi:
        replays.pop(h, None)
        refusals.pop(h, None)
    for h in seeded:
        for values, value in zip(acc[h], (first_seq, "recorded", None, None)):
            values.append(value)
    for h, a, r in zip(run_handles, starts, used):
        if h is None:
            for frame, seq, state, kind, reason, _ in r:
                for values, value in zip(acc[frame], (seq, state, kind, reason)):
                    values.append(value)
        elif h in acc:
            at, states, causes, reasons = acc[h]
            at.extend(seqs[a + o] for o in r.offsets)
            states.extend(r.states)
            causes.extend(r.kinds)
            reasons.extend(r.reasons)
            if r.replays:
                replays[h] = replays.get(h, 0) + r.replays
            if r.refusals:
                refusals.setdefault(h, []).extend((seqs[a + o], why) for o, why in r.refusals)
    for h, seq, state, kind, reason in last:
        for values, value in zip(acc[h], (seq, state, kind, reason)):
            values.append(value)
    for values, i in zip(lists, range(4)):
        values.update(zip(acc, map(itemgetter(i), acc.values())))
