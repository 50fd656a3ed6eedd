"""Replays that did not reproduce their forward, read from the trace: one `Finding` per `replay_diverged` event.

The runtime records the facts while recording (NOTE [ Replay divergence checks ] in
ckpt_viz/runtime/divergence.py); this module only reads them, so a saved trace explains
itself. Standard library only: never torch, the runtime or a UI.

NOTE [ Divergence findings ]
  1. Each `replay_diverged` event is one finding: its code is `data.code` (a key of
     DIAGNOSIS_CODES), its handle the event's, its events the handle's story up to
     the replay and the event itself.
  2. The summary names the region (the checkpointed block), what differed
     (`data.details`, at most six lines, and how many more) and where the block was
     called (the `handle_created` site), which is also the finding's `site`.
  3. Runs not checked: under the default policy a recording checks every region's
     first runs and then a sample (NOTE [ Sampled replay checks ] in
     ckpt_viz/runtime/divergence_sampling.py) and counts, in
     `meta["replay_checks"]`, the runs checked and skipped. `replay_checks_note`
     (`ckpt_viz.analysis.diagnosis`) says how many were not checked and how to check them all, so the debugger never
     says "no divergence" of a replay nobody looked at; None when every run was
     checked (or the trace has no counts: older traces, checks off).
"""
from __future__ import annotations

from collections.abc import Iterable

from ckpt_viz.analysis.findings import Facts, Finding, finding
from ckpt_viz.codes import DIAGNOSIS_CODES
from ckpt_viz.events import Event, ReplayDiverged

__all__ = ["DIVERGENCE_CODES", "divergence_findings"]

# divergence kind (data.divergence) -> code; the runtime writes the same pairs (tests check they agree).
DIVERGENCE_CODES: dict[str, str] = {
    "gradient_lost": "replay_lost_gradient",
    "input_mutated": "replay_input_mutated",
    "outputs_differ": "replay_outputs_differ",
    "buffers_updated": "replay_updated_buffers",
}

_WHAT = {
    "gradient_lost": "gave no gradient to parameters its forward used",
    "input_mutated": "ran on an input object whose state had changed since the forward",
    "outputs_differ": "computed other values than its forward",
    "buffers_updated": "updated its forward's buffers again",
}


def _created(f: Facts, h: int | None) -> Event | None:
    return next((e for e in f.by_handle.get(h, ()) if e.kind == "handle_created"), None) if h is not None else None


def _read(e: ReplayDiverged) -> tuple[str, ...]:
    """What the replay read that can explain a lost gradient, from the event's facts (a cache only when there is
    one)."""
    if e.divergence != "gradient_lost":
        return ()
    if e.mutable_inputs:
        return (f"The block was handed {', '.join(e.mutable_inputs)}: a replay that reads values its forward left "
                "there (a KV cache filled by the forward) does not recompute them, so no gradient reaches the "
                "parameters that made them.",)
    return ("The block was handed no mutable input: the replay's graph does not reach these parameters (values taken "
            "from outside the block's inputs, a detached tensor or a no_grad region inside it), or a backward that "
            "asked for other gradients only (autograd.grad on its inputs) ran through it.",)


def divergence_findings(f: Facts, events: Iterable[Event]) -> list[Finding]:
    """One finding per `replay_diverged` event (NOTE [ Divergence findings ])."""
    found = []
    for e in events:
        if not isinstance(e, ReplayDiverged):
            continue
        code = e.code if e.code in DIAGNOSIS_CODES else DIVERGENCE_CODES.get(e.divergence)
        if code not in DIAGNOSIS_CODES:
            continue
        h = e.handle_id
        details = list(e.details)
        more = max(e.count - len(details), 0)
        created = _created(f, h)
        site = created.site if created is not None else e.site
        region = e.region or (f.block(h) if h is not None else None) or "a checkpointed block"
        what = _WHAT.get(e.divergence, "did not reproduce its forward")
        called = f", called at {site}" if site else ""
        summary = f"the replay of {region} (h{h}) at event #{e.seq} {what}{called}: {'; '.join(details[:2])}" + (
            f" and {len(details) + more - 2} more" if len(details) + more > 2 else "") + "."
        extra = (f"The replay of {region} {what}:", *(f"  {d}" for d in details),
                 *((f"  ... and {more} more",) if more > 0 else ()), *_read(e))
        story = f.story_events(h, e, until=e.seq) if h is not None else ()
        ordered = tuple({x.seq: x for x in sorted((*story, e), key=lambda x: x.seq)}.values())
        found.append(finding(f, code, h, summary, site=site, events=ordered, extra=extra))
    return found
