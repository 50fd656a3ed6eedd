"""A finding's explanation: what happened to the handle, in order, at the user's lines, then why and the fix.

NOTE [ The story of a finding ]
  1. Head line: the handle (and its block) and the cause in plain words.
  2. Steps: the finding's events in order, grouped while they share one site (one
     line of the user's code: "#3-#8 train.py:120: phase set to dw; released
     (reason dw_complete)"), each followed by that line's code as recorded in the
     trace (`meta["sources"]`, see NOTE [ What a recording captures ], rule 7, in ckpt_viz/recording.py), never
     read from the file now. At most MAX_STEPS steps: the first and the last ones
     are kept, the middle is summed up in one line.
  3. "Fix: ..." closes it. The whole is at most MAX_LINES lines.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_viz.events import (
    BackwardCalled,
    BackwardEntered,
    Error,
    Event,
    PhaseSet,
    Released,
    ReplayRefused,
    ReplayStarted,
    SessionActivated,
)

__all__ = ["MAX_LINES", "describe", "explanation"]

MAX_STEPS = 7
MAX_LINES = 25
_CODE_CHARS = 110


def describe(event: Event) -> str:
    """One event as a short phrase of what happened."""
    if event.kind == "handle_created":
        return "checkpointed (the handle was created)"
    if isinstance(event, PhaseSet):
        return f"phase set to {event.new}"
    if isinstance(event, BackwardEntered):
        return f"reached by the {event.phase} backward" if event.phase not in (None, "ordinary") else \
            "reached by an ordinary backward"
    if isinstance(event, Released):
        return f"released (reason {event.reason})"
    if isinstance(event, ReplayRefused):
        return "its replay was refused (it was released)" if event.reason == "released" else \
            "its replay was refused (its autograd node was gone)"
    if event.kind == "node_collected":
        return "its outputs were dropped (autograd node garbage-collected)"
    if event.kind == "session_bound":
        return f"bound to session {event.session_id!r}"
    if isinstance(event, SessionActivated):
        retain = "retaining" if event.retain_on_unpack else "not retaining"
        return f"session {event.session_id!r} entered ({retain})"
    if event.kind == "session_cleared":
        return f"session {event.session_id!r} cleared"
    if event.kind == "prefired":
        return f"prefired in session {event.session_id!r}"
    if isinstance(event, BackwardCalled):
        asked = "" if event.inputs is None else f" for {event.inputs} input{'s' if event.inputs != 1 else ''}"
        return f"{event.api} called{asked}"
    if isinstance(event, ReplayStarted):
        return f"replayed ({event.trigger}, replay {event.replay_index})"
    if isinstance(event, Error):
        return f"{event.where or 'the run'} raised {event.type}"
    return event.kind.replace("_", " ")


def _source(sources: Mapping[str, Any], site: str | None) -> str | None:
    text = sources.get(site) if site else None
    if not isinstance(text, str) or not text:
        return None
    return text if len(text) <= _CODE_CHARS else text[:_CODE_CHARS - 3] + "..."


def _steps(events: Sequence[Event]) -> list[tuple[int, int, str | None, list[str]]]:
    """Consecutive events at one site as (first seq, last seq, site, phrases); a repeated phrase once."""
    steps: list[tuple[int, int, str | None, list[str]]] = []
    for e in events:
        phrase = describe(e)
        if steps and steps[-1][2] == e.site:
            first, _, site, phrases = steps[-1]
            if phrase not in phrases:
                phrases.append(phrase)
            steps[-1] = (first, e.seq, site, phrases)
        else:
            steps.append((e.seq, e.seq, e.site, [phrase]))
    return steps


def explanation(head: str, events: Sequence[Event], sources: Mapping[str, Any], fix: str,
                extra: Sequence[str] = ()) -> str:
    """The story of NOTE [ The story of a finding ]: head, steps with their code, extra lines, fix."""
    lines = [head]
    steps = _steps(events)
    if len(steps) > MAX_STEPS:
        keep_head = MAX_STEPS // 2
        hidden = steps[keep_head:len(steps) - (MAX_STEPS - keep_head - 1)]
        marker = (hidden[0][0], hidden[-1][1], None, [f"... {len(hidden)} more steps"])
        steps = [*steps[:keep_head], marker, *steps[len(steps) - (MAX_STEPS - keep_head - 1):]]
    for first, last, site, phrases in steps:
        seqs = f"#{first}" if first == last else f"#{first}-#{last}"
        where = f" {site}" if site else ""
        lines.append(f"  {seqs}{where}: {'; '.join(phrases)}")
        code = _source(sources, site)
        if code is not None:
            lines.append(f"      {code}")
    lines.extend(extra)
    lines.append(f"Fix: {fix}")
    return "\n".join(lines[:MAX_LINES])
