"""`ckpt-viz explain trace.json`: print every finding of a saved trace, with its story and fix. Torch-free.

The findings are `ckpt_viz.analysis.diagnosis.diagnose(trace)`, the same ones `ckpt-viz info`, the
Overview, Handles and Debugger pages read; text from the trace is printed as it is.
"""
from __future__ import annotations

import argparse

from ckpt_viz.analysis.diagnosis import diagnose, format_findings, replay_checks_note
from ckpt_viz.trace import Trace

__all__ = ["explain_command"]


def explain_command(args: argparse.Namespace) -> int:
    """Print the findings (all, or those of `--handle`); exit status 1 with `--strict` when there are any."""
    trace = Trace.load(args.trace)
    findings = diagnose(trace, handle=args.handle)
    title = str(trace.meta.get("model") or args.trace)
    if args.handle is not None:
        title += f", h{args.handle}"
    print(format_findings(findings, title=title))
    note = replay_checks_note(trace)  # replays the divergence checks skipped: "no problem" says nothing of them
    if note:
        print(f"\n{note}")
    return 1 if findings and args.strict else 0
