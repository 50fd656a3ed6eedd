"""`diagnose(trace)`: every problem of a recorded run, each a `Finding` with its story and fix; `explain()`.

The debugger's entry point, read by `ckpt-viz explain`, the Overview, Handles and Debugger pages and the
lessons alike. It gathers the refused replays and leaked handles (NOTE [ Reading a cause from the trace ]
in findings.py), the problems that raise nothing (NOTE [ Silent problems ] in _silent.py), the replays
that did not reproduce their forward (NOTE [ Divergence findings ] in _divergence.py) and the facts of
the run as a whole (NOTE [ Nothing said clean that is not ]). Standard library only.

NOTE [ Nothing said clean that is not ]
  1. Every `error` event is part of a finding: the finding of its cause when one names it, else a finding
     of the error's own code (a code of the table), else `error_raised`, which says what raised, where,
     and what the run was doing then (the part of the step, the handle, the pipeline action).
  2. A run that stopped early (`meta["partial"]`) or lacks ranks (`meta["distributed"]["missing_ranks"]`)
     is a `run_partial` finding.
  3. So "no problem found" is said only of a run with no finding at all, errors and partial runs included.
"""
from __future__ import annotations

import sys
from typing import TextIO

from ckpt_viz.analysis._cache import derived
from ckpt_viz.analysis._divergence import divergence_findings
from ckpt_viz.analysis._silent import silent_findings
from ckpt_viz.analysis.findings import Facts, Finding, code_of, finding, handle_finding
from ckpt_viz.analysis.passes import passes
from ckpt_viz.codes import DIAGNOSIS_CODES
from ckpt_viz.errors import CkptVizError
from ckpt_viz.events import Error, Event
from ckpt_viz.trace import Trace

__all__ = ["diagnose", "diagnose_handle", "explain", "format_findings", "replay_checks_note"]

_PART_WORDS = {"F": "the forward", "DX": "the DX pass", "DW": "the DW pass", "B": "a full backward"}


def _order(d: Finding) -> tuple[int, int]:
    """In order: by the release, refusal or error, else by where the finding's story starts."""
    key = next((e for e in (d.release_event, d.refused_event, d.error_event) if e is not None), None)
    if key is None and d.events:
        key = d.events[0]
    return (key.seq if key is not None else -1, d.handle_id or 0)


def _doing(trace: Trace, e: Error, last_handle: int | None) -> str:
    """What the run was doing when `e` was raised: the part of the step, the handle, the pipeline action."""
    parts = []
    part = passes(trace).part_at(e.seq)
    if part is not None:
        parts.append(_PART_WORDS[part])
    h = e.handle_id if e.handle_id is not None else last_handle
    if h is not None:
        parts.append(f"h{h}")
    tags = e.tags or {}
    if tags.get("action") is not None:
        where = " ".join(f"{k} {tags[k]}" for k in ("rank", "stage", "microbatch") if tags.get(k) is not None)
        parts.append(f"action {tags['action']}" + (f" ({where})" if where else ""))
    return ", ".join(parts)


def _error_findings(trace: Trace, f: Facts, found: list[Finding]) -> list[Finding]:
    """NOTE [ Nothing said clean that is not ], rule 1: the errors no finding covers yet."""
    covered = {e.seq for d in found for e in (*d.events, d.error_event, d.refused_event) if e is not None}
    out = []
    for e in f.errors:
        if not isinstance(e, Error) or e.seq in covered:
            continue
        last_handle = f.handle_before(e.seq)
        code = code_of(e)
        code = code if code in DIAGNOSIS_CODES else "error_raised"
        h = e.handle_id
        where = f" ({e.site})" if e.site else ""
        doing = _doing(trace, e, last_handle)
        message = e.message.splitlines()[0][:200] if e.message else ""
        summary = f"{e.where} raised {e.type} at event #{e.seq}{where}" + (f", during {doing}" if doing else "") + "."
        extra = (f"{e.type}: {message}",) if message else ()
        story: tuple[Event, ...] = (*f.story_events(h, e, until=e.seq), ) if h is not None else (e,)
        out.append(finding(f, code, h, summary, site=e.site, error=e, events=story, extra=extra))
    return out


def _partial_finding(trace: Trace, f: Facts) -> list[Finding]:
    """NOTE [ Nothing said clean that is not ], rule 2."""
    meta = trace.meta
    named = meta.get("distributed")
    distributed = named if isinstance(named, dict) else {}
    missing = list(distributed.get("missing_ranks") or ())
    if not meta.get("partial") and not missing:
        return []
    why = []
    partial = meta.get("partial")
    if isinstance(partial, dict) and not partial.get("reason") and (partial.get("missing_ranks") or
                                                                    partial.get("ranks")):
        stopped = {r: p for r, p in (partial.get("ranks") or {}).items() if p}
        if stopped:
            why.append("ranks " + ", ".join(f"{r} ({_stop_words(p)})" for r, p in sorted(stopped.items()))
                       + " stopped early")
    elif partial:
        why.append(f"it stopped early ({meta.get('partial_reason') or _stop_words(partial)})")
    if missing:
        why.append(f"ranks {', '.join(map(str, missing))} left no trace file")
    last = trace.events[-1] if trace.events else None
    tail = (f" Its last event is #{last.seq} ({last.kind.replace('_', ' ')}"
            + (f", h{last.handle_id}" if last.handle_id is not None else "") + ")." if last is not None else "")
    return [finding(f, "run_partial", None, f"The trace is partial: {'; '.join(why)}.{tail}",
                    events=(last,) if last is not None else ())]


def _stop_words(partial: object) -> str:
    """Why a run stopped, from its `meta["partial"]` (a bool, or a rank's {reason, signal, error, step})."""
    if not isinstance(partial, dict):
        return "no reason recorded"
    parts = [str(partial.get("reason") or "stopped")]
    if partial.get("signal"):
        parts.append(f"signal {partial['signal']}")
    if partial.get("error"):
        parts.append(str(partial["error"]).splitlines()[0][:200])
    if partial.get("step") is not None:
        parts.append(f"at step {partial['step']}")
    return ", ".join(parts)


def _all(trace: Trace) -> list[Finding]:
    facts = _facts(trace)
    found = [handle_finding(facts, h) for h in facts.handles if facts.suspect(h)]
    problems = [d for d in found if not d.ok]
    leaked = {d.handle_id for d in problems if d.handle_id is not None}
    problems += silent_findings(facts, leaked)
    problems += divergence_findings(facts, facts.by_kind.get("replay_diverged", ()))
    problems += _error_findings(trace, facts, problems)
    problems += _partial_finding(trace, facts)
    return sorted(problems, key=_order)


def diagnose(trace: Trace, handle: int | None = None) -> list[Finding]:
    """Every problem in `trace`, one `Finding` each, in the order they happened.

    Args:
        trace: a recorded or loaded trace.
        handle: only the findings about this handle id.

    Example:
        for finding in ckpt_viz.diagnose(trace):
            print(finding.explanation)
    """
    found = derived(trace, "diagnose", _all)
    return list(found) if handle is None else [d for d in found if d.handle_id == handle]


def diagnose_handle(trace: Trace, handle_id: int) -> Finding:
    """The refusal or leak of one handle, as a `Finding`; code "ok" when it shows none."""
    return handle_finding(_facts(trace), handle_id)


def _facts(trace: Trace) -> Facts:
    return derived(trace, "facts", Facts)


def format_findings(findings: list[Finding], *, title: str = "") -> str:
    """The findings as text: a count, then each explanation."""
    head = f"{title}: " if title else ""
    if not findings:
        return f"{head}no problem found."
    parts = [f"{head}{len(findings)} problem{'s' if len(findings) != 1 else ''} found."]
    for i, d in enumerate(findings, 1):
        parts.append(f"\n[{i}] {d.code}\n{d.explanation}")
    return "\n".join(parts)


def replay_checks_note(trace: Trace) -> str | None:
    """How many checkpointed runs the replay-divergence checks skipped, in words; None if none
    (NOTE [ Divergence findings ], rule 3, in ckpt_viz/analysis/_divergence.py)."""
    counts = trace.meta.get("replay_checks")
    if not isinstance(counts, dict):
        return None
    checked, skipped = int(counts.get("checked") or 0), int(counts.get("skipped") or 0)
    if skipped <= 0:
        return None
    regions = counts.get("skipped_regions") or {}
    named = sorted(regions.items(), key=lambda kv: (-int(kv[1]), str(kv[0])))
    shown = ", ".join(f"{name} {n}" for name, n in named[:4]) + (f", ... ({len(named) - 4} more)" if len(named) > 4
                                                                  else "")
    first = counts.get("first_checks")
    policy = (f"every region's first {first} runs, then a sample in a time budget" if counts.get("policy") == "sampled"
              else f"policy {counts.get('policy')!r}")
    return (f"Replay-divergence checks: {checked} of {checked + skipped} checkpointed runs checked ({policy}); "
            f"{skipped} not checked ({shown}), so no divergence was looked for in those replays.\n"
            "Tip: record with ckpt_viz.runtime.divergence.checks('all') (or CKPT_VIZ_REPLAY_CHECKS=all) to check "
            "every replay.")


def explain(trace: Trace | None = None, *, file: TextIO | None = None) -> str:
    """Print (and return) the findings of `trace`, by default the last run recorded in this process.

    Raises:
        CkptVizError: no trace given and nothing was recorded yet in this process.
    """
    if trace is None:
        from ckpt_viz.recording import last_trace

        trace = last_trace()
        if trace is None:
            raise CkptVizError("ckpt_viz.explain: no run was recorded in this process yet.\nTip: record one with "
                               "`with ckpt_viz.record() as rec: ...`, or pass a trace: explain(Trace.load(path)).")
    text = format_findings(diagnose(trace), title=str(trace.meta.get("model") or "this run"))
    note = replay_checks_note(trace)
    if note:
        text += "\n\n" + note
    print(text, file=file if file is not None else sys.stdout)
    return text
