"""`diagnose`: why was a handle's replay refused, or why did it leak? Read from the trace alone.

Owns the mapping from recorded facts to the causes of spec §4.2 (the codes of
`ckpt_viz.events.DIAGNOSIS_CODES`, which also give each cause, fix and release
reason). A handle's first release, its collection and its refused replays come from
the one lifecycle (`ckpt_viz.trace.lifecycle`); the evidence beside them is read from
event kinds, release reasons and the codes that `error` events store (`data.code`,
see `ckpt_viz.errors`), never from message text. Pure and standard
library only: it never imports torch, the runtime or a UI, so the app can diagnose
a saved trace.

NOTE [ Reading a cause from the trace ]
  1. The symptom: the handle's first `replay_refused`, or an `error` about it
     whose code is a refusal's (E6/E7 carry the plain code of the release reason,
     E8 outputs_dropped_before_replay; E6 on set_phase has no replay_refused). A
     refusal for reason "node_collected", or with code
     outputs_dropped_before_replay, is R10; its "release" is the `node_collected` event.
  2. Otherwise the handle's `released` event names the cause by its reason, read
     through `CODE_FOR_REASON`: dw_complete R1, ordinary_backward_complete R2 or
     R3/R4/R14 (rule 3), backward_exception R6, or R5 after an error with code
     phase_not_set, forward_exception R7, session_cleared R8, explicit_release R9.
     A refusal that came from a prefire (a `prefired` event between the release
     and the refusal) after an ordinary or DW release is R15.
  3. An ordinary release is read against the session open at its seq: none bound
     and a retaining session open -> R3; bound to another id while a retaining
     session was open -> R14; bound, but the session was left or not retaining
     -> R4; no session involved -> R2.
  4. Without a symptom: a backward_exception or forward_exception release is still
     R5/R6/R7; an error with code session_mismatch (E10 on bind_session) is R14; a
     split handle set to "dw" that DW never entered and nothing released is a leak:
     R13 when an error with code second_backward_through_graph followed (torch's
     "backward through the graph a second time": DX ran without retain_graph),
     else R12 (DW's inputs lacked the trigger).
  5. `site` is the user's file:line of the releasing action (the release event's
     site). Without one: R10 None (dropping outputs emits nothing), R12 the
     `set_phase("dw")` call, R13 the DX call, R14 by E10 the bind_session call.
  6. Known blind spot: a binding made before the recording started is invisible,
     so R14 then reads as R3.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ckpt_viz.events import CODE_FOR_REASON, DIAGNOSIS_CODES, Event
from ckpt_viz.trace import Trace
from ckpt_viz.trace.lifecycle import Transition, lifecycle

__all__ = ["Diagnosis", "diagnose", "diagnose_all"]

_OK_FIX = "Nothing to fix."
# The codes a refusal error (E6/E7 HandleReleasedError, E8 GraphReleasedError) carries: the plain
# code of the release reason, or these two.
_REFUSAL_CODES = {*CODE_FOR_REASON.values(), "handle_released", "outputs_dropped_before_replay"}
_SECOND_BACKWARD = "second_backward_through_graph"  # torch's E14, classified where record() caught it


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    """What went wrong with one handle, and the one next step.

    Attributes:
        code: a key of `ckpt_viz.events.DIAGNOSIS_CODES`, or "ok".
        cause: that code's cause in plain words ("" when ok).
        summary: one sentence with the events and lines involved.
        release_event: the `released` event (R10: the `node_collected` event), or None.
        refused_event: the `replay_refused` event, or the error that reported the refusal, or None.
        site: the user's file:line of the releasing action (see NOTE rule 5).
        fix: one next step (the code's fix).
        handle_id: the handle diagnosed.
        error_event: the error behind the problem (E9, the failed replay, torch's error,
            E10), else the error that reported the refusal, or None.
    """

    code: str
    cause: str
    summary: str
    release_event: Event | None = None
    refused_event: Event | None = None
    site: str | None = None
    fix: str = ""
    handle_id: int | None = None
    error_event: Event | None = None

    @property
    def ok(self) -> bool:
        return self.code == "ok"

    @property
    def reason(self) -> str | None:
        """The release reason, "node_collected" for R10, or None."""
        if self.release_event is None:
            return None
        if self.release_event.kind == "node_collected":
            return "node_collected"
        return self.release_event.data.get("reason")


class _Facts:
    """Handle states from the one lifecycle (`ckpt_viz.trace.lifecycle`); one pass over the events for the
    evidence beside them: events per handle, session activations, errors."""

    def __init__(self, trace: Trace, events: Iterable[Event]) -> None:
        self.lifecycle = lifecycle(trace)
        self.by_handle: dict[int, list[Event]] = {}
        self.activations: list[dict[str, Any]] = []
        self.errors: list[Event] = []
        open_by_sid: dict[Any, dict[str, Any]] = {}
        for e in events:
            if e.handle_id is not None:
                self.by_handle.setdefault(e.handle_id, []).append(e)
            if e.kind == "error":
                self.errors.append(e)
            elif e.kind == "session_activated":
                act = {"start": e.seq, "end": None, "sid": e.session_id,
                       "retain": bool(e.data.get("retain_on_unpack")), "handles": list(e.data.get("handles", ()))}
                self.activations.append(act)
                open_by_sid[e.session_id] = act
            elif e.kind == "session_deactivated" and e.session_id in open_by_sid:
                open_by_sid.pop(e.session_id)["end"] = e.seq

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
        error = _first(self.by_handle.get(h, ()), lambda e: _code(e) in _REFUSAL_CODES)
        if refused is None or (error is not None and error.seq < refused.seq):
            return error
        return refused

    def active_at(self, seq: int) -> dict[str, Any] | None:
        found = None
        for act in self.activations:
            if act["start"] < seq and (act["end"] is None or act["end"] > seq):
                found = act
        return found


def _code(event: Event) -> str | None:
    """The code an `error` event stores (see ckpt_viz.errors); None for other events."""
    return event.data.get("code") if event.kind == "error" else None


def _first(events: Iterable[Event], test: Any) -> Event | None:
    return next((e for e in events if test(e)), None)


def _where(event: Event | None) -> str:
    return f" ({event.site})" if event is not None and event.site else ""


def _refusal(refused: Event) -> str:
    what = f"{refused.data.get('where')}" if refused.kind == "error" else "the replay"
    return f"{what} at event #{refused.seq}{_where(refused)} was refused"


def _make(code: str, h: int, summary: str, *, release: Event | None = None, refused: Event | None = None,
          site: str | None = None, error: Event | None = None) -> Diagnosis:
    entry = DIAGNOSIS_CODES.get(code)
    return Diagnosis(code=code, cause=entry.cause if entry else "", summary=summary, release_event=release,
                     refused_event=refused, site=site, fix=entry.fix if entry else _OK_FIX, handle_id=h,
                     error_event=error)


def _ordinary_code(f: _Facts, events: list[Event], release: Event) -> tuple[str, str]:
    """See NOTE [ Reading a cause from the trace ], rule 3; returns (code, detail)."""
    bound = {e.session_id for e in events if e.kind in ("session_bound", "prefired") and e.seq < release.seq}
    active = f.active_at(release.seq)
    retaining = active is not None and active["retain"]
    if not bound:
        if retaining:
            return "session_never_bound", (f"inside session {active['sid']!r} (retain_on_unpack=True), which never "
                                           "had the handle bound")
        return "released_by_ordinary_backward", "by an ordinary backward outside any retaining session"
    names = ", ".join(repr(s) for s in sorted(bound, key=repr))
    if retaining and active["sid"] not in bound:
        return "session_mismatch", f"inside session {active['sid']!r} while the handle is bound to {names}"
    if active is None:
        return "session_not_retaining", f"outside its session {names} (the session was left before this backward)"
    return "session_not_retaining", f"inside session {active['sid']!r} with retain_on_unpack=False"


def _from_release(f: _Facts, h: int, events: list[Event], release: Event, refused: Event | None,
                  refusal_error: Event | None) -> Diagnosis:
    reason = release.data.get("reason")
    code = CODE_FOR_REASON.get(reason, "released_explicitly")
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
        cause = _first(reversed([e for e in events if e.seq <= release.seq]), lambda e: e.kind == "error")
        error = cause or error
        if cause is not None and _code(cause) == "phase_not_set":
            code, detail = "phase_not_set", ": the backward reached it while its phase was still 'ordinary'"
        elif cause is not None:
            detail = f": {cause.data.get('type')} in the backward"
    elif reason == "forward_exception":
        failed = _first(events, lambda e: e.kind == "forward_failed")
        error = _first(events, lambda e: e.kind == "error" and e.seq > release.seq) or error
        if failed is not None:
            detail = f": the forward raised {failed.data.get('type')}"
    tail = "." if refused is None else f"; {_refusal(refused)}."
    return _make(code, h, head + detail + tail, release=release, refused=refused, site=release.site, error=error)


def _leak(f: _Facts, h: int, events: list[Event]) -> Diagnosis | None:
    """A split handle set to DW that DW never entered and nothing released (R12 / R13)."""
    if f.lifecycle.released(h) is not None:
        return None
    dw = [e for e in events if e.kind == "phase_set" and e.data.get("new") == "dw"]
    if not dw:
        return None
    mark = dw[-1]
    if any(e.kind == "backward_entered" and e.seq > mark.seq for e in events):
        return None
    torch_error = _first(f.errors, lambda e: e.seq > mark.seq and _code(e) == _SECOND_BACKWARD)
    if torch_error is not None:
        dx = [e for e in events if e.kind == "backward_entered" and e.phase == "dx" and e.seq < mark.seq]
        site = dx[-1].site if dx else mark.site
        return _make("dx_without_retain_graph", h,
                     f"h{h} was never released: DW failed at event #{torch_error.seq} with \"Trying to backward "
                     f"through the graph a second time\" because DX{_where(dx[-1] if dx else None)} ran without "
                     "retain_graph=True.", site=site, error=torch_error)
    return _make("trigger_missing_in_dw", h,
                 f"h{h} was set to phase dw at event #{mark.seq}{_where(mark)} but DW never reached it and it was "
                 "never released: DW's inputs lacked its backward_trigger.", site=mark.site)


def _diagnose(f: _Facts, h: int) -> Diagnosis:
    events = f.by_handle.get(h, [])
    release = f.release(h)
    refused = f.refusal(h)
    refusal_error = None
    if refused is not None:
        refusal_error = refused if refused.kind == "error" else _first(
            events, lambda e: e.kind == "error" and e.seq > refused.seq)
        collected_refusal = (refused.data.get("reason") == "node_collected"
                             or _code(refused) == "outputs_dropped_before_replay")
        if collected_refusal:
            collected = f.collected(h)
            when = f" at event #{collected.seq}" if collected is not None else ""
            return _make("outputs_dropped_before_replay", h,
                         f"h{h}'s autograd node was garbage-collected{when} before any replay (every output was "
                         f"dropped); {_refusal(refused)}.",
                         release=collected, refused=refused, site=collected.site if collected else None,
                         error=refusal_error)
        if release is None:  # released before the recording started: the refusal still names the reason
            reason = refused.data.get("last_release_reason")
            carried = _code(refused)
            code = CODE_FOR_REASON.get(reason) or (carried if carried in DIAGNOSIS_CODES else "released_explicitly")
            return _make(code, h, f"h{h} was released before the recording (reason {reason}); "
                                  f"{_refusal(refused)}.", refused=refused, error=refusal_error)
        return _from_release(f, h, events, release, refused, refusal_error)
    if release is not None and release.data.get("reason") in ("backward_exception", "forward_exception"):
        return _from_release(f, h, events, release, None, None)
    mismatch = _first(events, lambda e: e.kind == "error" and _code(e) == "session_mismatch")
    if mismatch is not None:
        return _make("session_mismatch", h, f"h{h} could not be bound at event #{mismatch.seq}{_where(mismatch)}: "
                                            "another session id was active.", site=mismatch.site, error=mismatch)
    leak = _leak(f, h, events)
    if leak is not None:
        return leak
    state = f"released ({release.data.get('reason')})" if release is not None else "never refused a replay"
    return _make("ok", h, f"h{h}: no problem found; {state}.", release=release,
                 site=release.site if release is not None else None)


def diagnose(trace: Trace, handle_id: int) -> Diagnosis:
    """Name the cause of a refused replay or a leak of `handle_id` (see NOTE [ Reading a cause from the trace ]).

    Returns:
        A `Diagnosis`; code "ok" when the handle shows no problem.
    """
    merged = {e.seq: e for e in trace.of_kind("session_activated", "session_deactivated", "error")}
    merged.update((e.seq, e) for e in trace.for_handle(handle_id))
    return _diagnose(_Facts(trace, (merged[seq] for seq in sorted(merged))), handle_id)


def diagnose_all(trace: Trace) -> list[Diagnosis]:
    """A diagnosis for every handle with a problem (refused replay, error release, leak after DW), in order."""
    facts = _Facts(trace, trace.events)
    found = (_diagnose(facts, h) for h in facts.by_handle)
    return [d for d in found if not d.ok]
