"""The passes of a run, defined once: which part of the step each event belongs to (forward, DX, DW or a
full backward), the spans those parts make, and the backward passes (one engine run each).

    step = passes(trace)
    step.of_event[i]   -> "F" | "DX" | "DW" | "B"        the part of the step event i belongs to
    step.spans         -> (Span("F", 0, 17), Span("DX", 17, 30), ...)
    step.backwards     -> (BackwardPass(start_seq=17, end_seq=29, phase="dx", ...), ...)
    step.aligned_x     -> x of every event on Compare's common axis: forward [0, 1), DX [1, 2), DW [2, 3]

Standard library only. The memory chart draws the spans as bands, Compare lines runs up by them, the
Routing page and the debugger read the backward passes.

NOTE [ Parts of a step ]
  1. Each event gets one of F, DX, DW, B. An event with phase "dx" or "dw" is DX or DW. A forward event
     (a checkpoint built, its forward run, a tensor packed, an excluded op saved) is F. Another handle event
     (a backward entered, a replay, an unpack, grads routed, a release) is B: a backward in phase "ordinary"
     or without a phase does DX and DW at once; so does a backward called right after a forward (a run with no
     checkpoint reached by it). Non-reentrant split runs set no phase: their DX activates a
     retaining session (`session_activated` with retain_on_unpack) and their DW the next session; phase-less
     events between stay in that part.
  2. A memory sample taken "at ... forward" is F; one taken "at ... backward" right after a forward starts a
     B (a run without checkpoints has only samples). Every other event (samples, errors, session events)
     belongs to the part before it; events before any part belong to the forward. A pipeline action's
     `action_started` starts the part of its action (torch's I is DX, W is DW); a B action's parts are
     those of its events (our executors run its DX, then its DW).
  3. A span is a run of consecutive events of one part: [start_seq, end_seq), the last one ending at the
     last seq. Pipeline runs interleave parts, so they have many short spans.

NOTE [ Backward passes ]
  1. A backward pass is a run of engine-side events, from the user's call (`backward_called`) on:
     backward_entered, replays triggered by a backward,
     tensor_unpacked, grads_routed, the releases and refusals they cause, errors raised in a backward.
  2. It ends at any forward-side or session event (phase_set, handle_created, session_*, prefired, an
     explicit release), when the phase, the call site or the stage/micro-batch/rank tags change, or when a
     handle enters a second time. memory_sampled and node_collected neither join nor end a pass.

NOTE [ Phase alignment ]
  1. Compare draws runs of different lengths on one axis: the forward on [0, 1), DX on [1, 2), DW on
     [2, 3]; a full backward (DX and DW at once) on [1, 3]. Inside a part of n events, the k-th has
     x = start + width * k / n (the part of the run's last event uses n - 1, so the run ends at 3).
  2. A part met again after another (pipelines) continues its own share of the axis.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Literal

import msgspec

from ckpt_viz.analysis._cache import derived
from ckpt_viz.events import Error, Event, MemorySampled, Released, ReplayFinished, ReplayStarted, SessionActivated
from ckpt_viz.trace import Trace

__all__ = ["AXIS", "PARTS", "BackwardPass", "Part", "Passes", "Span", "passes"]

Part = Literal["F", "DX", "DW", "B"]
PARTS: tuple[Part, ...] = ("F", "DX", "DW", "B")
# Where each part lies on Compare's common axis (NOTE [ Phase alignment ], rule 1).
AXIS: dict[Part, tuple[float, float]] = {"F": (0.0, 1.0), "DX": (1.0, 2.0), "DW": (2.0, 3.0), "B": (1.0, 3.0)}

_FORWARD_KINDS = frozenset(("handle_created", "forward_started", "forward_finished", "forward_failed",
                            "tensor_packed", "exclude_saved"))
_BACKWARD_KINDS = frozenset(("backward_entered", "replay_started", "replay_finished", "replay_failed",
                             "early_stopped", "replay_refused", "grads_routed", "released", "node_collected",
                             "tensor_unpacked", "exclude_reused", "prefired"))
_JOIN = frozenset(("backward_called", "backward_entered", "replay_started", "replay_finished", "replay_failed",
                   "early_stopped", "replay_refused", "grads_routed", "released", "tensor_unpacked", "exclude_reused",
                   "error"))
# an action_started opens its action's part; a B action's parts come from its events (DX then DW, or one backward)
_ACTION_PARTS: dict[str, Part] = {"F": "F", "DX": "DX", "I": "DX", "DW": "DW", "W": "DW"}
_NEUTRAL = frozenset(("memory_sampled", "node_collected"))
_BACKWARD_RELEASES = frozenset(("ordinary_backward_complete", "dw_complete", "backward_exception"))


# Span and BackwardPass are frozen msgspec Structs outside the cyclic collector: a 1M-event pipeline run has
# hundreds of thousands of each, which frozen dataclasses made and the collector walked (4 s of a 5 s build).
class Span(msgspec.Struct, frozen=True, gc=False):
    """Consecutive events of one part of the step: [start_seq, end_seq)."""

    part: Part
    start_seq: int
    end_seq: int


class BackwardPass(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One backward pass (NOTE [ Backward passes ]).

    Attributes:
        start_seq / end_seq: its first and last event.
        phase: "dx", "dw", "ordinary" or None (no handle said).
        site: the user's line that ran it, when known.
        stage / microbatch / rank: the pipeline tags of its events, or None.
        positions: the positions (indices in `trace.events`) of its events.
        replays: the handles it replayed (a `replay_started`; each handle once), as `routing_at` at its end
            counts them (replayed and still replaying).
        released: its `released` events, as `routing_at` at its end lists them.
    """

    start_seq: int
    end_seq: int
    phase: str | None
    site: str | None
    stage: object
    microbatch: object
    rank: object
    positions: tuple[int, ...]
    replays: int = 0
    released: int = 0


@dataclass(frozen=True)
class Passes:
    """The parts of a run's step and its backward passes; see the module docstring.

    `backwards`, `backward_starts` and `aligned_x` are computed at their first use, once: the Overview of a
    1M-event run needs only the parts (1.1 s of a 1.7 s build is the backward passes and the common axis).
    """

    seqs: tuple[int, ...]
    of_event: tuple[Part, ...]
    spans: tuple[Span, ...]
    _events: Sequence[Event] = field(repr=False, compare=False)

    @cached_property
    def backwards(self) -> tuple[BackwardPass, ...]:
        """The backward passes (NOTE [ Backward passes ]), in order."""
        return tuple(_backwards(self._events))

    @cached_property
    def backward_starts(self) -> tuple[int, ...]:
        """The first seq of each backward pass."""
        return tuple(b.start_seq for b in self.backwards)

    @cached_property
    def aligned_x(self) -> tuple[float, ...]:
        """The x of every event on Compare's common axis (NOTE [ Phase alignment ])."""
        return tuple(_aligned(self.of_event))

    def part_at(self, seq: int) -> Part | None:
        """The part of the step of the event at (or last before) `seq`; None before the first event."""
        i = bisect_right(self.seqs, seq) - 1
        return self.of_event[i] if i >= 0 else None

    def backward_at(self, seq: int) -> BackwardPass | None:
        """The backward pass containing `seq`, or the last one before it; None if none started by then."""
        i = bisect_right(self.backward_starts, seq) - 1
        return self.backwards[i] if i >= 0 else None

    def aligned_seq(self, x: float) -> int | None:
        """The seq of the event whose aligned x is nearest to `x` (the first such); None for an empty run."""
        if not self.seqs:
            return None
        order = sorted(range(len(self.aligned_x)), key=lambda i: (self.aligned_x[i], i))
        keys = [self.aligned_x[i] for i in order]
        at = bisect_left(keys, x)
        best = min((j for j in (at - 1, at) if 0 <= j < len(order)), key=lambda j: (abs(keys[j] - x), j))
        return self.seqs[order[best]]


def _parts(events: Sequence[Event]) -> list[Part]:
    current: Part = "F"
    out: list[Part] = []
    for e in events:
        kind, phase = e.kind, e.phase
        if phase == "dx":
            current = "DX"
        elif phase == "dw":
            current = "DW"
        elif kind in _FORWARD_KINDS:
            current = "F"
        elif kind == "action_started":
            current = _ACTION_PARTS.get(str(e.tags.get("action")), current)
        elif kind == "backward_called":
            if current == "F":
                current = "B"
        elif isinstance(e, SessionActivated):
            if e.retain_on_unpack:
                current = "DX"
            elif current == "DX":
                current = "DW"
        elif kind in _BACKWARD_KINDS and e.handle_id is not None and not (phase is None and current in ("DX", "DW")):
            current = "B"
        elif isinstance(e, MemorySampled):
            at = e.at or ""
            if at.endswith(" forward"):
                current = "F"
            elif at.endswith(" backward") and current == "F":
                current = "B"
        out.append(current)
    return out


def _spans(seqs: Sequence[int], parts: Sequence[Part]) -> list[Span]:
    spans: list[Span] = []
    if not parts:
        return spans
    part, first = parts[0], seqs[0]
    for i, p in enumerate(parts):
        if p != part:
            spans.append(Span(part, first, seqs[i]))
            part, first = p, seqs[i]
    spans.append(Span(part, first, seqs[-1]))
    return spans


def _joins(e: Event) -> bool:
    if e.kind not in _JOIN:
        return False
    if isinstance(e, (ReplayStarted, ReplayFinished)):
        return e.trigger != "prefire"
    if isinstance(e, Released):
        return e.reason in _BACKWARD_RELEASES
    if isinstance(e, Error):
        return e.where == "backward"
    return True


_NO_GROUP = (None, None, None)
_CHECKED = frozenset(("replay_started", "replay_finished", "released", "error"))  # kinds that join by a field


def _backwards(events: Sequence[Event]) -> list[BackwardPass]:
    found: list[BackwardPass] = []
    positions: list[int] | None = None  # the open pass's events; None while no pass is open
    start = end = 0
    phase: str | None = None
    site: str | None = None
    group: tuple[object, object, object] = _NO_GROUP
    entered: set[int | None] = set()
    replayed: set[int] = set()
    released = 0
    join, neutral, checked = _JOIN, _NEUTRAL, _CHECKED

    def close() -> None:
        assert positions is not None
        found.append(BackwardPass(start_seq=start, end_seq=end, phase=phase, site=site, stage=group[0],
                                  microbatch=group[1], rank=group[2], positions=tuple(positions),
                                  replays=len(replayed), released=released))

    for i, e in enumerate(events):
        kind = e.kind
        if kind not in join or (kind in checked and not _joins(e)):
            if positions is not None and kind not in neutral:
                close()
                positions = None
            continue
        e_phase = e.phase if kind != "tensor_unpacked" else None
        tags = e.tags
        e_group = (tags.get("stage"), tags.get("microbatch"), tags.get("rank")) if tags else _NO_GROUP
        e_site = e.site
        if (positions is None
                or (e_phase is not None and phase is not None and e_phase != phase)
                or (e_site is not None and site is not None and e_site != site)
                or e_group != group
                or kind == "backward_called"
                or (kind == "backward_entered" and e.handle_id in entered)):
            if positions is not None:
                close()
            positions, start, phase, site, group = [], e.seq, e_phase, e_site, e_group
            entered, replayed, released = set(), set(), 0
        positions.append(i)
        end = e.seq
        phase = phase or e_phase
        site = site or e_site
        if kind == "backward_entered":
            entered.add(e.handle_id)
        elif e.handle_id is not None:
            if kind == "replay_started":
                replayed.add(e.handle_id)
            elif kind == "released":
                released += 1
    if positions is not None:
        close()
    return found


def _aligned(parts: Sequence[Part]) -> list[float]:
    totals = Counter(parts)
    last = parts[-1] if parts else None
    step = {}
    for a, n in totals.items():
        lo, hi = AXIS[a]
        step[a] = (lo, hi - lo, n - 1 if a == last and n > 1 else n)  # the run's last event at its end
    seen = dict.fromkeys(totals, 0)
    xs: list[float] = []
    for a in parts:
        lo, width, n = step[a]
        k = seen[a]
        seen[a] = k + 1
        xs.append(lo + width * k / n)
    return xs


_SEQ = attrgetter("seq")


def passes(trace: Trace) -> Passes:
    """The parts and backward passes of `trace`, computed once per trace (the backward passes at first use)."""
    def build(t: Trace) -> Passes:
        events = tuple(t.events)  # as they are now: a recording still open may add more
        seqs = tuple(map(_SEQ, events))
        parts = _parts(events)
        return Passes(seqs=seqs, of_event=tuple(parts), spans=tuple(_spans(seqs, parts)), _events=events)
    return derived(trace, "passes", build)
