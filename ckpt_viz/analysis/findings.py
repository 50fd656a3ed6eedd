"""Why was a handle's replay refused, or why did it leak? The `Finding` record, read from the trace alone.

Owns the mapping from recorded facts to the causes of refused replays and leaked
handles (the codes of `ckpt_viz.codes.DIAGNOSIS_CODES`, which also give each cause,
fix and release reason). A handle's first release, its collection and its refused
replays come from the one lifecycle (`ckpt_viz.analysis.lifecycle`); the evidence beside
them is read from event kinds, release reasons, recorded facts and the codes that
`error` events store (`Error.code`, see `ckpt_viz.errors`), never from message text.

NOTE [ Reading a cause from the trace ]
  1. The symptom: the handle's first `replay_refused`, or an `error` about it
     whose code is a refusal's (a refused set_phase or replay carries the plain code
     of the release reason; a dead node outputs_dropped_before_replay). A refusal
     for reason "node_collected", or with code outputs_dropped_before_replay, is
     outputs_dropped_before_replay; its "release" is the `node_collected` event.
  2. Otherwise the handle's `released` event names the cause by its reason, read
     through `CODE_FOR_REASON`: dw_complete, ordinary_backward_complete (rule 3),
     backward_exception (phase_not_set after an error with that code),
     forward_exception, session_cleared, explicit_release. A refusal that came from
     a prefire (a `prefired` event between the release and the refusal) after an
     ordinary or DW release is prefire_after_release.
  3. An ordinary release is read against the session open at its seq: none bound
     and a retaining session open -> session_never_bound; bound to another id while
     a retaining session was open -> session_mismatch; bound, but the session was
     left or not retaining -> session_not_retaining; no session involved ->
     released_by_ordinary_backward.
  4. Without a symptom: a backward_exception or forward_exception release is still
     reported; an error with code session_mismatch (bind_session under another id)
     is session_mismatch; a split handle set to "dw" that DW never entered and
     nothing released is a leak: dx_without_retain_graph when its `phase_set` to dw
     recorded `outer_graph_freed` (a backward without retain_graph had freed the
     checkpoint's saved inputs), or, in traces without that fact, when torch's
     "backward through the graph a second time" followed; else
     trigger_missing_in_dw (DW's inputs lacked the trigger).
  5. `site` is the user's file:line of the faulty call: the releasing action (the
     release event's site); a missing trigger the DW call that skipped the handle (the
     first `backward_called` after its `set_phase("dw")`), a DX without retain_graph
     the DX call, a mismatch by a refused binding the bind_session call; outputs
     dropped None (dropping outputs emits nothing).
  6. Known blind spot: a binding made before the recording started is invisible,
     so a session mismatch then reads as session_never_bound.
"""
from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from ckpt_viz.analysis._story import explanation
from ckpt_viz.analysis.handles import created_events, handle_label
from ckpt_viz.analysis.lifecycle import Transition, lifecycle
from ckpt_viz.analysis.passes import passes
from ckpt_viz.codes import CODE_FOR_REASON, DIAGNOSIS_CODES
from ckpt_viz.events import (
    Error,
    Event,
    ForwardFailed,
    PhaseSet,
    Released,
    ReplayRefused,
    SessionActivated,
    SessionCleared,
)
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import Kind

__all__ = ["STORY_KINDS", "Facts", "Finding", "code_of", "finding", "handle_finding"]

_OK_FIX = "Nothing to fix."
# The codes a refusal error carries: the plain code of the release reason, or these two.
_REFUSAL_CODES = {*CODE_FOR_REASON.values(), "handle_released", "outputs_dropped_before_replay"}
_SECOND_BACKWARD = "second_backward_through_graph"
# Codes of an error that is itself the cause of a backward_exception release (the release is its consequence).
_BACKWARD_ERROR_CODES = frozenset(("torch_reentrant_with_grad",))  # torch's error, classified where record() caught it
# The events a story shows: the user's actions on the handle and what the runtime did to it.
STORY_KINDS = frozenset({"handle_created", "phase_set", "backward_entered", "session_bound", "prefired", "released",
                         "node_collected", "replay_refused", "error", "session_cleared"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One problem in a trace: what went wrong, the events that show it, the story and the one next step.

    Attributes:
        code: a key of `ckpt_viz.codes.DIAGNOSIS_CODES`, or "ok" (only from the per-handle form).
        handle_id: the handle concerned, or None for a problem of no one handle.
        events: the events that caused it, in order: the release (with its reason), the refusal,
            the user's actions (set_phase, backward, clear_recompute_session, prefire, release).
        explanation: what happened, in order, with the user's file:line and its recorded code
            (NOTE [ The story of a finding ] in story.py); at most 25 lines.
        fix: one next step.
        cause: the code's cause in plain words ("" when ok).
        summary: one sentence with the events and lines involved.
        site: the user's file:line of the releasing action, or None.
        release_event: the `released` event (outputs dropped: the `node_collected` event), or None.
        refused_event: the `replay_refused` event, or the error that reported the refusal, or None.
        error_event: the error behind the problem, or None.
    """

    code: str
    handle_id: int | None
    events: tuple[Event, ...] = ()
    explanation: str = ""
    fix: str = ""
    cause: str = ""
    summary: str = ""
    site: str | None = None
    release_event: Event | None = None
    refused_event: Event | None = None
    error_event: Event | None = None

    @property
    def ok(self) -> bool:
        return self.code == "ok"

    @property
    def reason(self) -> str | None:
        """The release reason, "node_collected" for dropped outputs, or None."""
        if self.release_event is None:
            return None
        if isinstance(self.release_event, Released):
            return self.release_event.reason
        return "node_collected"

    @property
    def seq(self) -> int | None:
        """Where the cursor goes: the releasing event, else the refusal or error, else the last event (the symptom)."""
        for event in (self.release_event, self.refused_event, self.error_event):
            if event is not None:
                return event.seq
        return self.events[-1].seq if self.events else None


class Facts:
    """Handle states from the one lifecycle; one pass over the events for the evidence beside them.

    Kept in the trace's own cache of derived results, so it holds the trace weakly: a strong reference would make
    a cycle, and a trace the app no longer shows would wait for the cyclic collector instead of going at once.
    """

    def __init__(self, trace: Trace) -> None:
        self._trace = weakref.ref(trace)
        sources = trace.meta.get("sources")
        self.sources: dict[str, Any] = sources if isinstance(sources, dict) else {}
        self.lifecycle = lifecycle(trace)
        self.handles: list[int] = self.lifecycle.handle_ids  # in order of first appearance
        self.by_kind: dict[str, list[Event]] = {}  # the few kinds the findings read apart from handles'
        self.handle_errors: dict[int, list[Error]] = {}
        self.activations: list[dict[str, Any]] = []
        self.errors: list[Error] = []
        self.cleared: list[SessionCleared] = []
        open_by_sid: dict[Any, dict[str, Any]] = {}
        by_kind, read = self.by_kind, _READ_KINDS
        for e in trace.of_kind(*read):
            by_kind.setdefault(e.kind, []).append(e)
        self.errors = [e for e in by_kind.get("error", ()) if isinstance(e, Error)]
        self.cleared = [e for e in by_kind.get("session_cleared", ()) if isinstance(e, SessionCleared)]
        for error in self.errors:
            if error.handle_id is not None:
                self.handle_errors.setdefault(error.handle_id, []).append(error)
        for e in sorted([*by_kind.get("session_activated", ()), *by_kind.get("session_deactivated", ())],
                        key=lambda e: e.seq):
            if isinstance(e, SessionActivated):
                act = {"start": e.seq, "end": None, "sid": e.session_id, "event": e,
                       "retain": e.retain_on_unpack, "handles": list(e.handles)}
                self.activations.append(act)
                open_by_sid[e.session_id] = act
            elif e.session_id in open_by_sid:
                open_by_sid.pop(e.session_id)["end"] = e.seq

    @property
    def trace(self) -> Trace:
        """The trace these facts are of (alive while they are used: they live in its cache)."""
        trace = self._trace()
        assert trace is not None, "Facts outlived its trace"
        return trace

    @cached_property
    def by_handle(self) -> dict[int, list[Event]]:
        """handle -> its events, in order. Built at the first finding that tells a handle's story: a clean run (a
        1M-event one has 60k handles) is diagnosed from the lifecycle and `by_kind` without it."""
        by_handle: dict[int, list[Event]] = {}
        for e in self.trace.events:
            h = e.handle_id
            if h is not None:
                events = by_handle.get(h)
                if events is None:
                    events = by_handle[h] = []
                events.append(e)
        return by_handle

    def _event(self, h: int, transition: Transition | None) -> Event | None:
        if transition is None:
            return None
        return _first(self.by_handle.get(h, ()), lambda e: e.seq == transition.seq and e.kind == transition.kind)

    def release(self, h: int) -> Event | None:
        """The `released` event of the handle's first release by the runtime (not a derived one), or None."""
        return self._event(h, next((t for t in self.lifecycle.releases(h) if t.kind == "released"), None))

    def collected(self, h: int) -> Event | None:
        """The `node_collected` event that made the handle "collected" (before any replay), or None."""
        return self._event(h, next((t for t in self.lifecycle.transitions(h) if t.state == "collected"), None))

    def refusal(self, h: int) -> Event | None:
        """The first refused replay: a `replay_refused` event, or an error that carries a refusal's code."""
        marks = self.lifecycle.refusals(h)
        refused = self._event(h, marks[0]) if marks else None
        error = _first(self.handle_errors.get(h, ()), lambda e: code_of(e) in _REFUSAL_CODES)
        if refused is None or (error is not None and error.seq < refused.seq):
            return error
        return refused

    def active_at(self, seq: int) -> dict[str, Any] | None:
        found = None
        for act in self.activations:
            if act["start"] < seq and (act["end"] is None or act["end"] > seq):
                found = act
        return found

    def story_events(self, h: int, *key: Event | None, until: int | None = None) -> tuple[Event, ...]:
        """The handle's events a story shows (STORY_KINDS, the session clears that named it), up to `until`."""
        chosen = {e.seq: e for e in self.by_handle.get(h, ()) if e.kind in STORY_KINDS}
        chosen.update((e.seq, e) for e in self.cleared if h in e.handles)
        chosen.update((e.seq, e) for e in key if e is not None)
        last = until if until is not None else max((e.seq for e in key if e is not None), default=None)
        return tuple(chosen[s] for s in sorted(chosen) if last is None or s <= last)

    def suspect(self, h: int) -> bool:
        """Whether handle `h` can have a finding of `handle_finding` at all: an error names it, a replay was refused,
        a failing pass released it, or it was set to phase dw and never released (a leak). A clean handle (nearly
        every handle of a long run) is ruled out here without reading its events."""
        return h in self._suspects

    @cached_property
    def _suspects(self) -> set[int]:
        """Every handle `suspect` names, found from the lifecycle's results for all handles at once."""
        life = self.lifecycle
        out = {*self.handle_errors, *life.refused(), *life.with_reason("backward_exception", "forward_exception")}
        out.update(h for h, end in life.final_states().items() if end != "released" and life.last_phase(h) == "dw")
        return out

    def call_after(self, seq: int) -> Event | None:
        """The first backward the user's code called after `seq` (`backward_called`), or None."""
        return next((e for e in self.by_kind.get("backward_called", ()) if e.seq > seq), None)

    def handle_before(self, seq: int) -> int | None:
        """The handle of the last event before `seq` that names one and is no error (what the run was working on
        when something raised), or None; looks back at most 4096 events."""
        seqs = passes(self.trace).seqs
        events = self.trace.events
        i = bisect_left(seqs, seq) - 1
        for j in range(i, max(i - 4096, -1), -1):
            if events[j].handle_id is not None and events[j].kind != "error":
                return events[j].handle_id
        return None

    def block(self, h: int) -> str | None:
        return handle_label(created_events(self.trace).get(h)) or None


_READ_KINDS: frozenset[Kind] = frozenset((
    "error", "session_cleared", "session_activated", "session_deactivated", "session_bound", "prefired",
    "replay_diverged", "backward_entered", "unasked_grads_accumulated", "backward_called", "grads_routed",
    "replay_started"))


def code_of(event: Event) -> str | None:
    """The code an `error` event stores (see ckpt_viz.errors); None for other events."""
    return event.code if isinstance(event, Error) else None


_E = TypeVar("_E", bound=Event)


def _first(events: Iterable[_E], test: Callable[[_E], bool]) -> _E | None:
    return next((e for e in events if test(e)), None)


def _where(event: Event | None) -> str:
    return f" ({event.site})" if event is not None and event.site else ""


def _refusal(refused: Event) -> str:
    what = refused.where if isinstance(refused, Error) else "the replay"
    return f"{what} at event #{refused.seq}{_where(refused)} was refused"


def finding(f: Facts, code: str, h: int | None, summary: str, *, release: Event | None = None,
            refused: Event | None = None, site: str | None = None, error: Event | None = None,
            events: tuple[Event, ...] | None = None, extra: tuple[str, ...] = ()) -> Finding:
    """A `Finding` of `code` with its story (the handle's story events up to the last key event by default)."""
    entry = DIAGNOSIS_CODES.get(code)
    cause = entry.cause if entry else ""
    fix = entry.fix if entry else _OK_FIX
    if events is None:
        events = f.story_events(h, release, refused, error) if h is not None else ()
    who = "" if h is None else f"h{h}" + (f" ({f.block(h)})" if f.block(h) else "")
    head = f"{who}: {cause}" if who and cause else (cause or summary)
    story = explanation(head, events, f.sources, fix, extra) if code != "ok" else ""
    return Finding(code=code, handle_id=h, events=events, explanation=story, fix=fix, cause=cause, summary=summary,
                   site=site, release_event=release, refused_event=refused, error_event=error)


def _ordinary_code(f: Facts, events: list[Event], release: Event) -> tuple[str, str]:
    """See NOTE [ Reading a cause from the trace ], rule 3; returns (code, detail)."""
    bound = {e.session_id for e in events if e.kind in ("session_bound", "prefired") and e.seq < release.seq}
    active = f.active_at(release.seq)
    retaining = active if active is not None and active["retain"] else None
    if not bound:
        if retaining is not None:
            return "session_never_bound", (f"inside session {retaining['sid']!r} (retain_on_unpack=True), which never "
                                           "had the handle bound")
        return "released_by_ordinary_backward", "by an ordinary backward outside any retaining session"
    names = ", ".join(repr(s) for s in sorted(bound, key=repr))
    if retaining is not None and retaining["sid"] not in bound:
        return "session_mismatch", f"inside session {retaining['sid']!r} while the handle is bound to {names}"
    if active is None:
        return "session_not_retaining", f"outside its session {names} (the session was left before this backward)"
    return "session_not_retaining", f"inside session {active['sid']!r} with retain_on_unpack=False"


def _from_release(f: Facts, h: int, events: list[Event], release: Event, refused: Event | None,
                  refusal_error: Event | None) -> Finding:
    reason = release.reason if isinstance(release, Released) else None
    code = CODE_FOR_REASON.get(reason or "", "released_explicitly")
    head = f"h{h} was released at event #{release.seq}{_where(release)} with reason {reason}"
    error = refusal_error
    detail = ""
    prefired = refused is not None and any(
        e.kind == "prefired" and release.seq < e.seq <= refused.seq for e in events)
    if prefired and reason in ("ordinary_backward_complete", "dw_complete"):
        code = "prefire_after_release"
        detail = ", before the prefire"
    elif reason == "ordinary_backward_complete":
        code, detail = _ordinary_code(f, events, release)
        detail = f", {detail}"
    elif reason == "backward_exception":
        cause = next((e for e in reversed(events) if e.seq <= release.seq and isinstance(e, Error)), None)
        if cause is None:  # raised outside the handle (torch's own checkpoint, the engine): the error that ended it
            cause = _first(f.errors, lambda e: release.seq < e.seq <= release.seq + 64)
        error = cause or error
        carried = code_of(cause) if cause is not None else None
        if carried == "phase_not_set":
            code, detail = "phase_not_set", ": the backward reached it while its phase was still 'ordinary'"
        elif carried in _BACKWARD_ERROR_CODES and cause is not None:  # carried is cause's code
            code, detail = carried, f": {cause.type} in the backward"
        elif isinstance(cause, Error):
            detail = f": {cause.type} in the backward"
    elif reason == "forward_exception":
        failed = next((e for e in events if isinstance(e, ForwardFailed)), None)
        error = _first(events, lambda e: e.kind == "error" and e.seq > release.seq) or error
        if failed is not None:
            detail = f": the forward raised {failed.type}"
    tail = "." if refused is None else f"; {_refusal(refused)}."
    return finding(f, code, h, head + detail + tail, release=release, refused=refused, site=release.site, error=error)


def _leak(f: Facts, h: int, events: list[Event]) -> Finding | None:
    """A split handle set to DW that DW never entered and nothing released (NOTE rule 4)."""
    if f.lifecycle.released(h) is not None:
        return None
    dw = [e for e in events if isinstance(e, PhaseSet) and e.new == "dw"]
    if not dw:
        return None
    mark = dw[-1]
    if any(e.kind == "backward_entered" and e.seq > mark.seq for e in events):
        return None
    torch_error = _first(f.errors, lambda e: e.seq > mark.seq and code_of(e) == _SECOND_BACKWARD)
    freed = mark.outer_graph_freed
    if freed or (freed is None and torch_error is not None):
        dx = [e for e in events if e.kind == "backward_entered" and e.phase == "dx" and e.seq < mark.seq]
        site = dx[-1].site if dx else mark.site
        failed = (f"DW failed at event #{torch_error.seq} with \"Trying to backward through the graph a second "
                  "time\"" if torch_error is not None else "DW could not reach it")
        return finding(f, "dx_without_retain_graph", h,
                       f"h{h} was never released: {failed} because DX{_where(dx[-1] if dx else None)} ran without "
                       "retain_graph=True.", site=site, error=torch_error,
                       events=f.story_events(h, mark, torch_error, until=torch_error.seq if torch_error else mark.seq))
    call = f.call_after(mark.seq)  # the DW call that skipped it: the faulty line (NOTE rule 5)
    story = f.story_events(h, mark, until=mark.seq) + ((call,) if call is not None else ())
    said = f", and the DW call at event #{call.seq}{_where(call)} did not reach it" if call is not None else ""
    return finding(f, "trigger_missing_in_dw", h,
                   f"h{h} was set to phase dw at event #{mark.seq}{_where(mark)}{said}; it was never released: DW's "
                   "inputs lacked its backward_trigger.", site=call.site if call is not None else mark.site,
                   events=story)


def handle_finding(f: Facts, h: int) -> Finding:
    """The refusal or leak of handle `h` (NOTE [ Reading a cause from the trace ]); code "ok" when none."""
    events = f.by_handle.get(h, [])
    release = f.release(h)
    refused = f.refusal(h)
    refusal_error = None
    if refused is not None:
        refusal_error = refused if refused.kind == "error" else _first(
            events, lambda e: e.kind == "error" and e.seq > refused.seq)
        collected_refusal = ((isinstance(refused, ReplayRefused) and refused.reason == "node_collected")
                             or code_of(refused) == "outputs_dropped_before_replay")
        if collected_refusal:
            collected = f.collected(h)
            when = f" at event #{collected.seq}" if collected is not None else ""
            return finding(f, "outputs_dropped_before_replay", h,
                           f"h{h}'s autograd node was garbage-collected{when} before any replay (every output was "
                           f"dropped); {_refusal(refused)}.",
                           release=collected, refused=refused, site=collected.site if collected else None,
                           error=refusal_error)
        if release is None:  # released before the recording started: the refusal still names the reason
            reason = refused.last_release_reason if isinstance(refused, ReplayRefused) else None
            carried = code_of(refused)
            code = CODE_FOR_REASON.get(reason or "") or (
                carried if carried in DIAGNOSIS_CODES else "released_explicitly")
            return finding(f, code, h, f"h{h} was released before the recording (reason {reason}); "
                                       f"{_refusal(refused)}.", refused=refused, error=refusal_error)
        return _from_release(f, h, events, release, refused, refusal_error)
    if isinstance(release, Released) and release.reason in ("backward_exception", "forward_exception"):
        return _from_release(f, h, events, release, None, None)
    mismatch = _first(events, lambda e: e.kind == "error" and code_of(e) == "session_mismatch")
    if mismatch is not None:
        return finding(f, "session_mismatch", h, f"h{h} could not be bound at event #{mismatch.seq}"
                                                 f"{_where(mismatch)}: another session id was active.",
                       site=mismatch.site, error=mismatch)
    leak = _leak(f, h, events)
    if leak is not None:
        return leak
    state = f"released ({release.reason})" if isinstance(release, Released) else "never refused a replay"
    return finding(f, "ok", h, f"h{h}: no problem found; {state}.", release=release,
                   site=release.site if release is not None else None, events=())
