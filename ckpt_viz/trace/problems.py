"""What is wrong with a trace document, in words: `InvalidDocument`, the tips, and `show` for a value.

Shared by `ckpt_viz.trace.schema`, `ckpt_viz.trace.ranges`, `ckpt_viz.trace.document` and
`ckpt_viz.trace.io` (which turn an `InvalidDocument` into a `TraceError`). Standard library only.
"""
from __future__ import annotations

from typing import Any

__all__ = ["TIP_REWRITE", "TIP_SAVE", "TIP_TRUNCATED", "InvalidDocument", "show"]

TIP_REWRITE = (
    "the file was not written by ckpt_viz.Trace.save, or was edited; record the run again, "
    "or restore the file from a copy"
)
TIP_TRUNCATED = (
    "the file was cut short (an interrupted copy or download, or a full disk); copy it again or record "
    "the run again. Trace.save itself writes atomically, so a file it finished is never cut short"
)
TIP_SAVE = (
    "a hand-built trace or a runtime hook put a wrong value there; events use the names and types of "
    "ckpt_viz.events (EVENT_KINDS, MODES, PHASES), memory samples the categories in "
    "ckpt_viz.trace.MEMORY_CATEGORIES"
)


class InvalidDocument(Exception):
    """One thing wrong with a trace document: `what` happened; `tip` (reading) or `save_tip` says what to do."""

    def __init__(self, what: str, tip: str = TIP_REWRITE, save_tip: str = TIP_SAVE) -> None:
        super().__init__(what)
        self.what = what
        self.tip = tip
        self.save_tip = save_tip


def show(value: Any) -> str:
    names = {dict: "an object", list: "a list", tuple: "a tuple", str: "a string", int: "an integer",
             float: "a number", bool: "a boolean"}
    if value is None:
        return "null"
    kind = names.get(type(value), f"a {type(value).__name__}")
    if type(value) in (dict, list, tuple):
        return kind
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"
