"""`diagnose(trace)`: every problem of a recorded run, each a `Finding` with its story and fix; `explain()`.

The entry point of the debugger (`ckpt_viz.debug`): refused replays and leaked handles
(NOTE [ Reading a cause from the trace ] in debug/findings.py), the problems that
raise nothing (NOTE [ Silent problems ] in debug/silent.py) and replays that did not
reproduce their forward (NOTE [ Divergence findings ] in debug/divergence.py), each under a code of
`ckpt_viz.events.DIAGNOSIS_CODES`. Pure and standard library only: it never imports
torch, the runtime or a UI, so the app and `ckpt-viz explain` read a saved trace.
"""
from __future__ import annotations

import sys
from typing import TextIO

from ckpt_viz.debug.divergence import divergence_findings, replay_checks_note
from ckpt_viz.debug.findings import Facts, Finding, handle_finding
from ckpt_viz.debug.silent import silent_findings
from ckpt_viz.errors import CkptVizError
from ckpt_viz.trace import Trace

__all__ = ["Diagnosis", "Finding", "diagnose", "diagnose_all", "diagnose_handle", "explain", "format_findings"]

Diagnosis = Finding  # the name of a finding before the debugger had silent problems


def _all(trace: Trace) -> list[Finding]:
    facts = Facts(trace, trace.events)
    found = [handle_finding(facts, h) for h in facts.by_handle]
    problems = [d for d in found if not d.ok]
    leaked = {d.handle_id for d in problems if d.handle_id is not None}
    problems += silent_findings(facts, trace.events, leaked)
    problems += divergence_findings(facts, trace.events)  # replays that did not reproduce their forward
    return sorted(problems, key=_order)


def _order(d: Finding) -> tuple[int, int]:
    """In order: by the release, refusal or error, else by where the finding's story starts (the handle's creation)."""
    key = next((e for e in (d.release_event, d.refused_event, d.error_event) if e is not None), None)
    if key is None and d.events:
        key = d.events[0]
    return (key.seq if key is not None else -1, d.handle_id or 0)


def diagnose(trace: Trace, handle: int | None = None) -> list[Finding]:
    """Every problem in `trace`, one `Finding` each, in the order they happened.

    Args:
        trace: a recorded or loaded trace.
        handle: only the findings about this handle id.

    Example:
        for finding in ckpt_viz.diagnose(trace):
            print(finding.explanation)
    """
    found = _all(trace)
    return found if handle is None else [d for d in found if d.handle_id == handle]


def diagnose_all(trace: Trace) -> list[Finding]:
    """The same as `diagnose(trace)`."""
    return _all(trace)


def diagnose_handle(trace: Trace, handle_id: int) -> Finding:
    """The refusal or leak of one handle, as a `Finding`; code "ok" when it shows none."""
    return handle_finding(Facts(trace, trace.events), handle_id)


def diagnose_handle_in(trace: Trace, events: list, handle_id: int) -> Finding:
    """`diagnose_handle`'s finding read from `events` only: the handle's own events and the run's errors and session
    events, which is all it reads (app/ui/runs.py gives it those instead of every event of a big trace)."""
    return handle_finding(Facts(trace, events), handle_id)


def format_findings(findings: list[Finding], *, title: str = "") -> str:
    """The findings as text: a count, then each explanation."""
    head = f"{title}: " if title else ""
    if not findings:
        return f"{head}no problem found."
    parts = [f"{head}{len(findings)} problem{'s' if len(findings) != 1 else ''} found."]
    for i, d in enumerate(findings, 1):
        parts.append(f"\n[{i}] {d.code}\n{d.explanation}")
    return "\n".join(parts)


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
    note = replay_checks_note(trace)  # replays the divergence checks skipped (NOTE [ Divergence findings ], rule 3)
    if note:
        text += "\n\n" + note
    print(text, file=file if file is not None else sys.stdout)
    return text
