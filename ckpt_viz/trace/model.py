"""`Trace`: what a recorded run leaves behind: events, memory samples, graph snapshots and meta.

Owns the trace data types and the queries renderers ask of them. Standard library
only, so the app can open a saved trace without torch. The file format lives in
`ckpt_viz.trace.io` (bytes, gzip, atomic writes), `ckpt_viz.trace.document` (Trace <->
document) and `ckpt_viz.trace.schema` (validation); `Trace.save` and `Trace.load` call them.

NOTE [ Rows stored as columns ]
  1. A recorded trace keeps `events` and `memory` as plain lists: the recorder appends.
  2. A loaded trace keeps them as `EventColumns` and `MemoryColumns`: one list per
     field. For events, kind, mode, phase, site and thread_id are stored together
     as an index into a small table of distinct "contexts", and tags as an index
     into a table of distinct tag dicts. Building a frozen dataclass costs about
     2 us on a slow CPU, so building a million of them would make opening a big
     file take seconds; the columns build a row object only when it is read.
  3. Both are full mutable sequences that compare equal to the lists they stand
     for. Each read builds a fresh object (equal, not identical, to the last one).
     The first write (append, extend, assignment, deletion) turns the columns into
     a plain list for good.
  4. The Trace queries (kinds, count, of_kind, for_handle, handle_ids) read the
     event columns directly, so they stay fast on a loaded million-event trace.
"""
from __future__ import annotations

import collections
import itertools
import sys
from collections import Counter
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from operator import attrgetter, eq
from os import PathLike
from typing import Any, Iterable, Iterator, overload

from ckpt_viz.events import Event

__all__ = [
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

MEMORY_CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "activations",
    "checkpoint_inputs",
    "replay_activations",
    "excluded_outputs",
    "other",
)
NODE_KINDS: tuple[str, ...] = ("backward", "leaf", "checkpoint", "trigger", "input")
# The Event fields an EventColumns stores together, as one index into tables["context"].
CONTEXT_FIELDS: tuple[str, ...] = ("kind", "mode", "phase", "site", "thread_id")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySample:
    """Bytes held, by category, right after event `seq`.

    Attributes:
        seq: the event this reading belongs to.
        t_ns: monotonic nanoseconds of the reading.
        bytes_by_category: bytes per category in `MEMORY_CATEGORIES`; a category
            that was not measured is absent.
        device_allocated: the allocator's own total (e.g. `torch.cuda.memory_allocated()`), or None.
        by_stage: pipeline stage (as a string) -> bytes by category, for tensors
            made under `tag(stage=...)`; empty outside pipelines.
    """

    seq: int
    t_ns: int
    bytes_by_category: dict[str, int] = field(default_factory=dict)
    device_allocated: int | None = None
    by_stage: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def total_nbytes(self) -> int:
        """The sum over the categories."""
        return sum(self.bytes_by_category.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSnapshot:
    """The autograd graph as plain data at one point of the run.

    Attributes:
        seq: the event this snapshot belongs to.
        label: what the UI shows, e.g. "after forward".
        nodes: dicts with keys id (int or str), name, kind (one of `NODE_KINDS`),
            handle_id (int or None), dx_reached (bool), dw_reached (bool) and
            shape (list of ints or None). Extra keys are kept.
        edges: [src, dst] node-id pairs, in the direction gradients flow.

    JSON has no tuples: a tuple shape or edge comes back from a file as a list.
    """

    seq: int
    label: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    edges: list[list[Any]] = field(default_factory=list)


class _LazyRows(MutableSequence):
    """Rows kept as columns; see NOTE [ Rows stored as columns ], rule 3."""

    __slots__ = ("columns", "tables", "_list")
    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __init__(self, columns: dict[str, Any], tables: dict[str, Any] | None = None) -> None:
        self.columns = columns
        self.tables = tables if tables is not None else {}
        self._list: list[Any] | None = None

    def _count(self) -> int:
        return len(self.columns["seq"])

    def _row(self, i: int) -> Any:
        raise NotImplementedError

    def _iter_rows(self) -> Iterator[Any]:
        raise NotImplementedError

    @property
    def materialized(self) -> bool:
        """True once a write turned the columns into a plain list."""
        return self._list is not None

    def _materialize(self) -> list[Any]:
        if self._list is None:
            self._list = list(self._iter_rows())
            self.columns, self.tables = {}, {}
        return self._list

    def _rows(self, rows: Iterable[int]) -> list[Any]:
        return [self._row(i) for i in rows]

    def __len__(self) -> int:
        return len(self._list) if self._list is not None else self._count()

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if self._list is not None:
            return self._list[index]
        rows = range(self._count())
        if isinstance(index, slice):
            return self._rows(rows[index])
        return self._row(rows[index])

    def __iter__(self) -> Iterator[Any]:
        return iter(self._list) if self._list is not None else self._iter_rows()

    def __setitem__(self, index: Any, value: Any) -> None:
        self._materialize()[index] = value

    def __delitem__(self, index: Any) -> None:
        del self._materialize()[index]

    def insert(self, index: int, value: Any) -> None:
        self._materialize().insert(index, value)

    def append(self, value: Any) -> None:
        self._materialize().append(value)

    def extend(self, values: Iterable[Any]) -> None:
        self._materialize().extend(values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, _LazyRows)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __add__(self, other: Iterable[Any]) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Iterable[Any]) -> list[Any]:
        return [*other, *self]

    def copy(self) -> list[Any]:
        """A plain list of the rows, like `list.copy`."""
        return list(self)

    def __repr__(self) -> str:
        state = "list" if self._list is not None else "columns"
        return f"{type(self).__name__}({len(self)} rows, {state})"


class EventColumns(_LazyRows):
    """Events stored one list per field; builds each `Event` when it is read.

    `columns` holds one value per event for "seq" (a list, or a range when
    consecutive), "t_ns", "handle_id", "session_id" and "data", and two indexes:
    "context" into `tables["context"]` (rows of `CONTEXT_FIELDS`) and "tags" into
    `tables["tags"]`. See NOTE [ Rows stored as columns ].
    """

    __slots__ = ()

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> "EventColumns":
        """Split events into columns (the inverse of iterating)."""
        events = events if isinstance(events, list) else list(events)
        context, context_table = _intern(map(_CONTEXT_OF, events))
        tags, first_of_tags = _intern(map(id, map(_TAGS_OF, events)), keep_positions=True)
        tags_table = [events[i].tags for i in first_of_tags]
        columns = {  # map(attrgetter) is the fastest field extraction CPython offers for 1M slots objects
            "seq": _as_range(list(map(_SEQ_OF, events))),
            "t_ns": list(map(_T_NS_OF, events)),
            "context": context,
            "handle_id": list(map(_HANDLE_OF, events)),
            "session_id": list(map(_SESSION_OF, events)),
            "tags": tags,
            "data": list(map(_DATA_OF, events)),
        }
        return cls(columns, {"context": context_table, "tags": tags_table})

    def _context_columns(self) -> list[list[Any]]:
        rows = self.tables["context"]
        return [list(c) for c in zip(*rows)] if rows else [[] for _ in CONTEXT_FIELDS]

    def _context_ids(self, field_index: int, wanted: set[Any]) -> set[int]:
        return {i for i, row in enumerate(self.tables["context"]) if row[field_index] in wanted}

    def _iter_rows(self) -> Iterator[Event]:
        c = self.columns
        kinds, modes, phases, sites, threads = (t.__getitem__ for t in self._context_columns())
        ctx = c["context"]
        return map(Event, c["seq"], c["t_ns"], map(kinds, ctx), c["handle_id"], map(modes, ctx), map(phases, ctx),
                   c["session_id"], map(self.tables["tags"].__getitem__, c["tags"]), map(sites, ctx),
                   map(threads, ctx), c["data"])

    def _row(self, i: int) -> Event:
        c = self.columns
        kind, mode, phase, site, thread_id = self.tables["context"][c["context"][i]]
        return Event(c["seq"][i], c["t_ns"][i], kind, c["handle_id"][i], mode, phase, c["session_id"][i],
                     self.tables["tags"][c["tags"][i]], site, thread_id, c["data"][i])


class MemoryColumns(_LazyRows):
    """Memory samples stored one list per field; builds each `MemorySample` when it is read.

    `columns` holds "seq" (a list or a range), "t_ns", "device_allocated",
    "by_stage" (one dict per sample, or None when every sample's is empty) and
    "bytes_by_category": category -> one value per sample (None: not measured).
    """

    __slots__ = ()

    @classmethod
    def from_samples(cls, samples: Iterable[MemorySample]) -> "MemoryColumns":
        """Split samples into columns (the inverse of iterating)."""
        samples = samples if isinstance(samples, list) else list(samples)
        readings = [s.bytes_by_category for s in samples]
        key_orders = set(map(tuple, readings))
        if len(key_orders) == 1:  # the usual case: every sample measured the same categories, in one order
            by_category = dict(zip(next(iter(key_orders)), map(list, zip(*map(dict.values, readings)))))
        else:
            categories = dict.fromkeys(c for r in readings for c in r)
            by_category = {c: [r.get(c) for r in readings] for c in categories}
        stages = [s.by_stage for s in samples]
        return cls({
            "seq": _as_range([s.seq for s in samples]),
            "t_ns": [s.t_ns for s in samples],
            "device_allocated": [s.device_allocated for s in samples],
            "by_stage": stages if any(stages) else None,
            "bytes_by_category": by_category,
        })

    def _readings(self, rows: Iterable[int]) -> Iterator[dict[str, int]]:
        by_category = self.columns["bytes_by_category"]
        names = list(by_category)
        values = zip(*(map(col.__getitem__, rows) for col in by_category.values())) if names else (
            () for _ in rows)
        if self._has_gaps():
            return ({n: v for n, v in zip(names, row) if v is not None} for row in values)
        return map(dict, map(zip, itertools.repeat(names), values))

    def _has_gaps(self) -> bool:
        """Whether some category was not measured in some sample (computed once per column set)."""
        columns = self.columns["bytes_by_category"]
        cached = self.tables.get("_gaps")
        if cached is None or cached[0] is not columns:
            cached = (columns, any(None in col for col in columns.values()))
            self.tables["_gaps"] = cached
        return cached[1]

    def _samples(self, rows: range | list[int]) -> Iterator[MemorySample]:
        c = self.columns
        stages = c["by_stage"]
        return map(_memory_sample, map(c["seq"].__getitem__, rows), map(c["t_ns"].__getitem__, rows),
                   self._readings(rows), map(c["device_allocated"].__getitem__, rows),
                   map(stages.__getitem__, rows) if stages is not None else (None for _ in rows))

    def _iter_rows(self) -> Iterator[MemorySample]:
        return self._samples(range(self._count()))

    def _row(self, i: int) -> MemorySample:
        return next(self._samples([i]))

    def _rows(self, rows: Iterable[int]) -> list[MemorySample]:
        return list(self._samples(list(rows)))


def _memory_sample(seq: int, t_ns: int, reading: dict[str, int], allocated: int | None,
                   stages: dict[str, dict[str, int]] | None) -> MemorySample:
    return MemorySample(seq=seq, t_ns=t_ns, bytes_by_category=reading, device_allocated=allocated,
                        by_stage=stages if stages is not None else {})


_CONTEXT_OF = attrgetter(*CONTEXT_FIELDS)
# Tags are dicts (unhashable); the bus hands the same object to every event emitted
# inside one tag() block, so id() finds the repeats (all are alive while we look).
_TAGS_OF = attrgetter("tags")
_SEQ_OF = attrgetter("seq")
_T_NS_OF = attrgetter("t_ns")
_HANDLE_OF = attrgetter("handle_id")
_SESSION_OF = attrgetter("session_id")
_DATA_OF = attrgetter("data")


def _as_range(seq: list[int]) -> list[int] | range:
    # Sequence numbers are usually consecutive; a range stores them in O(1).
    if seq and type(seq[0]) is int and all(map(eq, seq, itertools.count(seq[0]))):
        return range(seq[0], seq[0] + len(seq))
    return seq


def _intern(values: Iterable[Any], keep_positions: bool = False) -> tuple[list[int], list[Any]]:
    """(index of each value in the table, the table of distinct values in first-seen order).

    One C-level pass: a defaultdict numbers each new value as it is first seen, so
    `values` is streamed and no list of a million temporary keys is built. With
    keep_positions the table holds first positions instead of values (for keys
    such as id(tags) that stand for an object).
    """
    numbering: dict[Any, int] = collections.defaultdict(itertools.count().__next__)
    indexes = list(map(numbering.__getitem__, values))
    if not keep_positions:
        return indexes, list(numbering)
    positions, start = [], 0
    for k in range(len(numbering)):  # first occurrences come in table order: one forward scan in total
        start = indexes.index(k, start)
        positions.append(start)
    return indexes, positions


def _columns_of(events: Any) -> EventColumns | None:
    if isinstance(events, EventColumns) and not events.materialized:
        return events
    return None


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
    def from_events(cls, events: Iterable[Event], **meta: Any) -> "Trace":
        """A trace holding `events` (copied into a list) and `meta`."""
        return cls(events=list(events), meta=dict(meta))

    # -- queries --

    def kinds(self) -> list[str]:
        """The kind of every event, in order."""
        cols = _columns_of(self.events)
        if cols is not None:
            return list(map(cols._context_columns()[0].__getitem__, cols.columns["context"]))
        return [e.kind for e in self.events]

    def of_kind(self, *kinds: str) -> list[Event]:
        """The events of the given kinds, in order."""
        cols = _columns_of(self.events)
        if cols is not None:
            ids = cols._context_ids(0, set(kinds))
            return cols._rows(i for i, c in enumerate(cols.columns["context"]) if c in ids)
        wanted = set(kinds)
        return [e for e in self.events if e.kind in wanted]

    def count(self, kind: str) -> int:
        """How many events of `kind` the trace holds."""
        cols = _columns_of(self.events)
        if cols is not None:
            per_context = Counter(cols.columns["context"])
            return sum(per_context[i] for i in cols._context_ids(0, {kind}))
        return sum(1 for e in self.events if e.kind == kind)

    def for_handle(self, handle_id: int) -> list[Event]:
        """The events about one handle, in order."""
        cols = _columns_of(self.events)
        if cols is not None:
            return cols._rows(i for i, h in enumerate(cols.columns["handle_id"]) if h == handle_id)
        return [e for e in self.events if e.handle_id == handle_id]

    def handle_ids(self) -> list[int]:
        """Handle ids in order of first appearance."""
        cols = _columns_of(self.events)
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
        from ckpt_viz.trace import io as trace_io

        return trace_io.to_dict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> "Trace":
        """Validate a document from `to_dict` (or `json.load` of a trace file) and build the trace.

        Raises:
            TraceError: it is not a trace, is too new, or has a missing or ill-typed field.
        """
        from ckpt_viz.trace import io as trace_io

        return trace_io.from_dict(doc)

    def save(self, path: str | PathLike[str]) -> None:
        """Write the trace as JSON (gzip when `path` ends with ".gz"), atomically.

        Raises:
            TraceError: the trace holds something a trace file cannot (a value that
                is not JSON, an unknown kind); nothing is written then.
        """
        from ckpt_viz.trace import io as trace_io

        trace_io.save(self, path)

    @classmethod
    def load(cls, path: str | PathLike[str]) -> "Trace":
        """Read a trace written by `save` (gzip or not; the content decides).

        Raises:
            TraceError: the file is missing, empty, truncated, not a trace, too new, or invalid.
        """
        from ckpt_viz.trace import io as trace_io

        return trace_io.load(path)


def run_meta(*, model: str, mode: str, schedule: str | None = None, **extra: Any) -> dict[str, Any]:
    """The `meta` dict of a run: what ran, how, and with which versions.

    torch's version is included only if torch is already imported (this module never imports it).
    """
    from ckpt_viz.trace.io import SCHEMA_VERSION, package_version

    versions = {"python": sys.version.split()[0], "ckpt_viz": package_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(getattr(torch, "__version__", "unknown"))
    return {"model": model, "mode": mode, "schedule": schedule, "versions": versions,
            "schema_version": SCHEMA_VERSION, **extra}

