"""Problems that raise nothing, read from the trace: each a code of `ckpt_viz.codes.DIAGNOSIS_CODES`.

NOTE [ Silent problems ]
  1. dw_skipped_handles: a split reentrant handle that a DX backward reached and that
     was never released, never set to dw and never reached again: DW skipped it
     (handles left out of `backward_weight(..., handles=...)`). Handles set to dw
     and left are the leaks of findings.py (trigger_missing_in_dw /
     dx_without_retain_graph). One finding per DW pass that skipped handles: the
     pass is the first DW backward after the skipped handle's DX (none: "no DW ran").
  2. params_without_grad: a `grads_routed` event whose captured parameters include
     one with `accumulated` false: the replay reached no gradient for it.
  3. session_never_cleared: a session id that handles were bound to (`session_bound`,
     `prefired`) and that no `session_cleared` followed: its members and replayed
     tensors stay alive.
  4. replayed_more_than_once: a handle with more than one `replay_started` under one
     micro-batch tag (or in a run without micro-batch tags).
  5. Errors that name their cause by code (ERROR_CODES, non-reentrant misuse): one
     finding per such `error` event; its handle is the error's, else that of the last
     handle event before it.
  6. unasked_grads_accumulated: one finding for the run's `unasked_grads_accumulated`
     events (NOTE [ Unasked accumulation ] in ckpt_viz/runtime/unasked.py), naming the
     handles, the parameters and the pipeline stage class the rank headers record.
"""
from __future__ import annotations

from collections import Counter
from operator import attrgetter

from ckpt_viz.analysis.findings import Facts, Finding, code_of, finding
from ckpt_viz.events import Event, GradsRouted, PhaseSet, UnaskedGradsAccumulated

_ACCUMULATED = attrgetter("accumulated")

__all__ = ["ERROR_CODES", "silent_findings"]

# Codes an `error` event carries that are a finding by themselves (NOTE rule 5).
ERROR_CODES: tuple[str, ...] = ("unpacked_twice_in_session", "saved_count_mismatch", "metadata_mismatch")


def _ordered(events: tuple[Event, ...]) -> tuple[Event, ...]:
    """`events` once each (by seq), in order."""
    return tuple({e.seq: e for e in sorted(events, key=lambda e: e.seq)}.values())


def _dw_skipped(f: Facts, leaked: set[int]) -> list[Finding]:
    skipped: dict[int | None, list[tuple[int, Event]]] = {}
    entered = f.by_kind.get("backward_entered", ())
    dw_passes = [e for e in entered if e.phase == "dw"]
    with_dx = {e.handle_id for e in entered if e.phase == "dx" and e.mode == "reentrant"}
    life = f.lifecycle
    for h in f.handles:
        # (nearly every handle of a long run is ruled out here, without its events)
        if h not in with_dx or h in leaked or life.was_released(h):
            continue
        events = f.by_handle[h]
        dx = [e for e in events if e.kind == "backward_entered" and e.phase == "dx" and e.mode == "reentrant"]
        if any(isinstance(e, PhaseSet) and e.new == "dw" for e in events):  # (a `released` event: was_released)
            continue
        if any(e.kind == "backward_entered" and e.seq > dx[-1].seq for e in events):
            continue
        later = next((e for e in dw_passes if e.seq > dx[-1].seq), None)
        skipped.setdefault(later.seq if later is not None else None, []).append((h, dx[-1]))
    found = []
    for pass_seq, items in skipped.items():
        dw = next((e for e in dw_passes if e.seq == pass_seq), None)
        hs = ", ".join(f"h{h}" for h, _ in items)
        first, last_dx = items[0]
        if dw is not None:
            where = f" ({dw.site})" if dw.site else ""
            summary = f"the DW pass at event #{dw.seq}{where} reached h{dw.handle_id} but skipped {hs}."
            extra = (f"DW reached h{dw.handle_id} at event #{dw.seq}; it never reached {hs}.",)
            story = (*f.story_events(first, last_dx, until=last_dx.seq), dw)
        else:
            call = f.call_after(last_dx.seq)  # the DW call (it reached no handle of the micro-batch), if one came
            if call is not None:
                summary = (f"the backward called at event #{call.seq}{f' ({call.site})' if call.site else ''} after "
                           f"DX reached none of {hs}: never released, their parameters got no weight gradient.")
                extra = (f"The backward at event #{call.seq} reached none of {hs}; it was not given their handles.",)
                story = (*f.story_events(first, last_dx, until=last_dx.seq), call)
            else:
                summary = f"no DW ran after DX reached {hs}: never released, their parameters got no weight gradient."
                extra = (f"No DW pass reached {hs} after its DX.",)
                story = f.story_events(first, last_dx, until=last_dx.seq)
        site = dw.site if dw is not None else (call.site if call is not None else last_dx.site)
        found.append(finding(f, "dw_skipped_handles", first, summary, site=site, events=_ordered(story),
                             extra=extra))
    return found


def _params_without_grad(f: Facts) -> list[Finding]:
    first: dict[int, GradsRouted] = {}  # each handle's first routing that left a parameter without a gradient
    for e in f.by_kind.get("grads_routed", ()):
        if (isinstance(e, GradsRouted) and e.handle_id is not None and e.handle_id not in first
                and not all(map(_ACCUMULATED, e.captured))):
            first[e.handle_id] = e
    found = []
    for h in f.handles:
        routed = first.get(h)
        if routed is None:
            continue
        missing = [c.name or f"a parameter of shape {tuple(c.shape)}" for c in routed.captured if not c.accumulated]
        names = ", ".join(str(m) for m in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        found.append(finding(f, "params_without_grad", h,
                             f"h{h}'s {routed.phase or 'ordinary'} backward at event #{routed.seq} gave no gradient "
                             f"to {names}.", site=routed.site,
                             events=_ordered((*f.story_events(h, until=routed.seq), routed)),
                             extra=(f"No gradient reached: {names}.",)))
    return found


def _sessions_never_cleared(f: Facts) -> list[Finding]:
    bound: dict[str, Event] = {}
    members: dict[str, list[int]] = {}
    kinds = f.by_kind
    events = sorted([*kinds.get("session_bound", ()), *kinds.get("prefired", ()), *kinds.get("session_cleared", ())],
                    key=lambda e: e.seq)
    for e in events:
        key = repr(e.session_id)
        if e.kind in ("session_bound", "prefired") and e.session_id is not None:
            bound.setdefault(key, e)
            members.setdefault(key, [])
            if e.handle_id is not None and e.handle_id not in members[key]:
                members[key].append(e.handle_id)
        elif e.kind == "session_cleared":
            bound.pop(key, None)
    found = []
    for key, first in bound.items():
        hs = ", ".join(f"h{h}" for h in members[key])
        found.append(finding(f, "session_never_cleared", first.handle_id,
                             f"session {first.session_id!r} (members {hs}) was never cleared.", site=first.site,
                             events=(first,), extra=(f"No clear_recompute_session({first.session_id!r}) followed; "
                                                     f"its members {hs} stay alive.",)))
    return found


def _replayed_twice(f: Facts) -> list[Finding]:
    started = f.by_kind.get("replay_started", ())
    again = {h for h, n in Counter(e.handle_id for e in started).items() if n > 1 and h is not None}
    by_handle: dict[int, list[Event]] = {}  # the replays of handles replayed more than once
    for e in started:
        if e.handle_id in again:
            by_handle.setdefault(e.handle_id, []).append(e)
    found = []
    for h in f.handles:
        replays = by_handle.get(h)
        if replays is None or len(replays) < 2:
            continue
        counts = Counter(e.tags.get("microbatch") for e in replays)
        mb, n = next(((m, c) for m, c in counts.items() if c > 1), (None, 0))
        if n < 2:
            continue
        twice = [e for e in replays if e.tags.get("microbatch") == mb]
        within = "" if mb is None else f" in micro-batch {mb}"
        found.append(finding(f, "replayed_more_than_once", h,
                             f"h{h} was replayed {n} times{within} (events {', '.join(f'#{e.seq}' for e in twice)}).",
                             site=twice[1].site, events=_ordered((*f.story_events(h, until=twice[-1].seq), *twice)),
                             extra=(f"Replayed {n} times{within}: the forward's work ran again each time.",)))
    return found


def _error_findings(f: Facts) -> list[Finding]:
    found = []
    for e in f.errors:
        code = code_of(e)
        if code not in ERROR_CODES:
            continue
        h = e.handle_id if e.handle_id is not None else f.handle_before(e.seq)
        story = f.story_events(h, e, until=e.seq) if h is not None else (e,)
        found.append(finding(f, code, h, f"{e.where or 'the run'} raised {e.type} at event "
                                         f"#{e.seq}{f' ({e.site})' if e.site else ''}.",
                             site=e.site, error=e, events=_ordered((*story, e))))
    return found


def _stage_classes(f: Facts) -> list[str]:
    """The pipeline stage classes the run's rank headers name (a distributed recording), in order."""
    dist = f.trace.meta.get("distributed")
    if not isinstance(dist, dict):
        return []
    named = dist.get("headers")
    headers = named if isinstance(named, dict) else {"": dist}
    found = [c for h in headers.values() if isinstance(h, dict) for c in (h.get("stage_classes") or ())]
    return list(dict.fromkeys(str(c) for c in found))


def _unasked(f: Facts) -> list[Finding]:
    """NOTE [ Silent problems ], rule 6: one finding for every unasked accumulation of the run."""
    events = [e for e in f.by_kind.get("unasked_grads_accumulated", ()) if isinstance(e, UnaskedGradsAccumulated)]
    if not events:
        return []
    first = events[0]
    handles = list(dict.fromkeys(e.handle_id for e in events if e.handle_id is not None))
    params = list(dict.fromkeys(p for e in events for p in e.params if p))
    hs = ", ".join(f"h{h}" for h in handles[:6]) + (f" and {len(handles) - 6} more" if len(handles) > 6 else "")
    named = ", ".join(params[:4]) + (f" and {len(params) - 4} more" if len(params) > 4 else "")
    classes = _stage_classes(f)
    stage = f" The run's pipeline stage is {', '.join(classes)}." if classes else ""
    stock = any(c.startswith("torch.distributed.pipelining.") for c in classes)
    extra = (f"{len(events)} backward pass{'es' if len(events) != 1 else ''} through {hs} wrote .grad of "
             f"{named or 'parameters'} without asking for them.{stage}",
             *(("torch's stock PipelineStage computes input gradients with autograd.grad, which reaches ckpt_viz's "
                "reentrant checkpoint as an ordinary (unsplit) backward.",) if stock else ()))
    where = f" ({first.site})" if first.site else ""
    return [finding(f, "unasked_grads_accumulated", first.handle_id,
                    f"h{first.handle_id}'s replay at event #{first.seq}{where} accumulated into .grad of parameters "
                    f"the backward did not ask for ({len(events)} time{'s' if len(events) != 1 else ''}).",
                    site=first.site, events=(first,), extra=extra)]


def silent_findings(f: Facts, leaked: set[int]) -> list[Finding]:
    """Every silent problem of NOTE [ Silent problems ] (handles in `leaked` already have a finding)."""
    return [*_dw_skipped(f, leaked), *_params_without_grad(f), *_sessions_never_cleared(f),
            *_replayed_twice(f), *_error_findings(f), *_unasked(f)]
