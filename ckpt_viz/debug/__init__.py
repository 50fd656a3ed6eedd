"""The debugger's reading of a trace: findings (what went wrong), their story, and the problems that raise nothing.

    findings  the `Finding` record and the causes of refused replays and leaked handles
    silent    problems that raise nothing (sessions never cleared, handles replayed twice, ...)
    story     a finding's explanation: what happened, in order, with the user's lines

`ckpt_viz.diagnose` is the entry point. Standard library only: never torch, the runtime or a UI.
"""
from __future__ import annotations

from ckpt_viz.debug.findings import Finding

__all__ = ["Finding"]
