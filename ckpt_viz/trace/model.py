"""`Trace`: what a recorded run leaves behind: events, memory samples, graph snapshots and meta.

Owns the `Trace` class, the queries renderers ask of it, and `run_meta`. Standard
library only, so the app can open a saved trace without torch. The record types are
`ckpt_viz.trace.types`, the column storage of a loaded trace `ckpt_viz.trace.columns`
(see NOTE [ Rows stored as columns ]). The file format lives in `ckpt_viz.trace.io`
(bytes, gzip, atomic writes), `ckpt_viz.trace.document` (parts <-> document) and
`ckpt_viz.trace.schema` (validation). Those work on a trace's parts and never import
this module: `Trace.save`/`Trace.load`/`to_dict`/`from_dict` call them, one way only.
"""
from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

from ckpt_viz.events import Event
from ckpt_viz.trace import io as trace_io
from ckpt_viz.trace.columns import EventColumns, MemoryColumns, events_as_columns
from ckpt_viz.trace.types import CONTEXT_FIELDS, MEMORY_CATEGORIES, NODE_KINDS, GraphSnapshot, MemorySample

__all__ = [  # the record types and columns are re-exported for older imports of ckpt_viz.trace.model
    "CONTEXT_FIELDS",
    "MEMORY_CATEGORIES",
    "NODE_KINDS",
    "EventColumns",
    "GraphSnapshot",
    "MemoryColumns",
    "MemorySample",
    "Trace",
    "run_meta",
]


@dataclass
class Trace:
    """A recorded run.

    Attributes:
        events: every event in emission order (a list, or an `EventColumns` after `load`).
        memory: memory readings by category, in order (a list, or a `MemoryColumns` after `load`).
        graphs: autograd graph snapshots, in order.
        meta: facts about the run: model, mode, schedule, versions, schema_version (see `run_meta`).
    """

    events: list[Event] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    graphs: list[GraphSnapshot] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_events(cls, events: Iterable[Event], **meta: Any) -> Trace:
        """A trace holding `events` (copied into a list) and `meta`."""
        return cls(events=list(events), meta=dict(meta))

    # -- queries --

    def kinds(self) -> list[str]:
        """The kind of every event, in order."""
        cols = events_as_columns(self.events)
        if cols is not None:
            return list(map(cols._context_columns()[0].__getitem__, cols.columns["context"]))
        return [e.kind for e in self.events]

    def of_kind(self, *kinds: str) -> list[Event]:
        """The events of the given kinds, in order."""
        cols = events_as_columns(self.events)
        if cols is not None:
            ids = cols._context_ids(0, set(kinds))
            return cols._rows(i for i, c in enumerate(cols.columns["context"]) if c in ids)
        wanted = set(kinds)
        return [e for e in self.events if e.kind in wanted]

    def count(self, kind: str) -> int:
        """How many events of `kind` the trace holds."""
        cols = events_as_columns(self.events)
        if cols is not None:
            per_context = Counter(cols.columns["context"])
            return sum(per_context[i] for i in cols._context_ids(0, {kind}))
        return sum(1 for e in self.events if e.kind == kind)

    def for_handle(self, handle_id: int) -> list[Event]:
        """The events about one handle, in order."""
        cols = events_as_columns(self.events)
        if cols is not None:
            return cols._rows(i for i, h in enumerate(cols.columns["handle_id"]) if h == handle_id)
        return [e for e in self.events if e.handle_id == handle_id]

    def handle_ids(self) -> list[int]:
        """Handle ids in order of first appearance."""
        cols = events_as_columns(self.events)
        handles: Iterable[int | None] = cols.columns["handle_id"] if cols is not None else (
            e.handle_id for e in self.events
        )
        return [h for h in dict.fromkeys(handles) if h is not None]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def extend(self, events: Iterable[Event]) -> None:
        self.events.extend(events)

    # -- files and documents (see ckpt_viz.trace.io) --

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of this trace (what `save` writes); it shares lists with the trace."""
        return trace_io.to_dict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> Trace:
        """Validate a document from `to_dict` (or `json.load` of a trace file) and build the trace.

        Raises:
            TraceError: it is not a trace, is too new, or has a missing or ill-typed field.
        """
        return cls(**trace_io.parts_from_dict(doc))

    def save(self, path: str | PathLike[str]) -> None:
        """Write the trace as JSON (gzip when `path` ends with ".gz"), atomically.

        Raises:
            TraceError: the trace holds something a trace file cannot (a value that
                is not JSON, an unknown kind); nothing is written then. Also when the
                file cannot be written (a TraceFileError, also an OSError, naming `path`).
        """
        trace_io.save(self, path)

    @classmethod
    def load(cls, path: str | PathLike[str], *, max_bytes: int | None = None,
             max_events: int | None = None) -> Trace:
        """Read a trace written by `save` (gzip or not; the content decides).

        Reads only a regular file, at most `max_bytes` of JSON (after gzip; default 1 GiB, or
        the environment variable CKPT_VIZ_TRACE_MAX_BYTES) with at most `max_events` events
        (default 5,000,000, or CKPT_VIZ_TRACE_MAX_EVENTS).

        Raises:
            TraceError: the file is missing, not a regular file, over a cap, empty, truncated,
                not a trace, too new, or invalid.
        """
        return cls(**trace_io.load_parts(path, max_bytes=max_bytes, max_events=max_events))


def run_meta(*, model: str, mode: str, schedule: str | None = None, **extra: Any) -> dict[str, Any]:
    """The `meta` dict of a run: what ran, how, and with which versions.

    torch's version is included only if torch is already imported (this module never imports it).
    """
    versions = {"python": sys.version.split()[0], "ckpt_viz": trace_io.package_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(getattr(torch, "__version__", "unknown"))
    return {"model": model, "mode": mode, "schedule": schedule, "versions": versions,
            "schema_version": trace_io.SCHEMA_VERSION, **extra}
