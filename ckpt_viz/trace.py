"""`Trace`: what a recorded run leaves behind: events, memory samples, graph snapshots and meta.

Owns the trace data types and the queries renderers ask of them. Standard library
only, so the app can open a saved trace without torch. The file format (JSON, gzip,
validation) lives in `ckpt_viz.trace_io`; `Trace.save` and `Trace.load` call it.

NOTE [ Events stored as columns ]
  1. A recorded trace keeps `events` as a plain list: the recorder appends to it.
  2. A loaded trace keeps `events` as an `EventColumns`: one list per Event field,
     with kind, mode, phase, site, thread_id and tags stored as indexes into small
     tables. Building a frozen Event costs about 2 us on a slow CPU, so building a
     million of them would make opening a big file take seconds; the columns build
     an Event only when one is read.
  3. `EventColumns` is a full mutable sequence that compares equal to the list it
     stands for. Each read builds a fresh Event (equal, not identical, to the last
     one). The first write (append, extend, assignment, deletion) turns it into a
     plain list for good.
  4. The Trace queries (kinds, count, of_kind, for_handle, handle_ids) read the
     columns directly, so they stay fast on a loaded million-event trace.
"""
from __future__ import annotations

import sys
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Iterable, Iterator, Literal, overload

from ckpt_viz.events import Event

__all__ = [
    "EVENT_FIELDS",
    "INTERNED_FIELDS",
    "MEMORY_CATEGORIES",
    "NODE_KINDS",
    "EventColumns",
    "GraphSnapshot",
    "MemorySample",
    "Trace",
    "run_meta",
]

# The Event fields in constructor order, and the ones stored as indexes into a table.
EVENT_FIELDS: tuple[str, ...] = (
    "seq", "t_ns", "kind", "handle_id", "mode", "phase", "session_id", "tags", "site", "thread_id", "data",
)
INTERNED_FIELDS: tuple[str, ...] = ("kind", "mode", "phase", "site", "thread_id", "tags")

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

NodeKind = Literal["backward", "leaf", "checkpoint", "trigger", "input"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySample:
    """Bytes held, by category, right after event `seq`.

    Attributes:
        seq: the event this reading belongs to.
        t_ns: monotonic nanoseconds of the reading.
        bytes_by_category: bytes per category in `MEMORY_CATEGORIES`; a category
            that was not measured is absent.
        device_allocated: the allocator's own total (e.g. `torch.cuda.memory_allocated()`), or None.
    """

    seq: int
    t_ns: int
    bytes_by_category: dict[str, int] = field(default_factory=dict)
    device_allocated: int | None = None

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


class EventColumns(MutableSequence):
    """A sequence of events stored one list per field; builds each Event when read.

    See NOTE [ Events stored as columns ]. `columns` maps every name in
    `EVENT_FIELDS` to a list of one value per event; for the names in
    `INTERNED_FIELDS` the value is an index into `tables[name]`.
    """

    __slots__ = ("columns", "tables", "_list")
    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __init__(self, columns: dict[str, list[Any]], tables: dict[str, list[Any]]) -> None:
        self.columns = columns
        self.tables = tables
        self._list: list[Event] | None = None

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> "EventColumns":
        """Split events into columns (the inverse of iterating)."""
        events = events if isinstance(events, list) else list(events)
        columns: dict[str, list[Any]] = {}
        tables: dict[str, list[Any]] = {}
        for name in EVENT_FIELDS:
            values = _column(events, name)
            if name == "tags":
                columns[name], tables[name] = _intern_by_identity(values)
            elif name in INTERNED_FIELDS:
                columns[name], tables[name] = _intern(values)
            else:
                columns[name] = values
        return cls(columns, tables)

    @property
    def materialized(self) -> bool:
        """True once a write turned the columns into a plain list."""
        return self._list is not None

    def _materialize(self) -> list[Event]:
        if self._list is None:
            self._list = list(self._iter_columns())
            self.columns, self.tables = {}, {}
        return self._list

    def _iter_columns(self) -> Iterator[Event]:
        cols, tables = self.columns, self.tables
        fields = [
            map(tables[name].__getitem__, cols[name]) if name in INTERNED_FIELDS else cols[name]
            for name in EVENT_FIELDS
        ]
        return map(Event, *fields)

    def _row(self, i: int) -> Event:
        cols, tables = self.columns, self.tables
        return Event(*(
            tables[name][cols[name][i]] if name in INTERNED_FIELDS else cols[name][i] for name in EVENT_FIELDS
        ))

    def __len__(self) -> int:
        if self._list is not None:
            return len(self._list)
        return len(self.columns["seq"])

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if self._list is not None:
            return self._list[index]
        rows = range(len(self))
        if isinstance(index, slice):
            return [self._row(i) for i in rows[index]]
        return self._row(rows[index])

    def __iter__(self) -> Iterator[Event]:
        if self._list is not None:
            return iter(self._list)
        return self._iter_columns()

    def __setitem__(self, index: Any, value: Any) -> None:
        self._materialize()[index] = value

    def __delitem__(self, index: Any) -> None:
        del self._materialize()[index]

    def insert(self, index: int, value: Event) -> None:
        self._materialize().insert(index, value)

    def append(self, value: Event) -> None:
        self._materialize().append(value)

    def extend(self, values: Iterable[Event]) -> None:
        self._materialize().extend(values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, tuple, EventColumns)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        state = "list" if self._list is not None else "columns"
        return f"EventColumns({len(self)} events, {state})"

    # -- column queries used by Trace (only while not materialized) --

    def _kind_ids(self, kinds: Iterable[str]) -> set[int]:
        wanted = set(kinds)
        return {i for i, kind in enumerate(self.tables["kind"]) if kind in wanted}

    def _rows(self, rows: Iterable[int]) -> list[Event]:
        return [self._row(i) for i in rows]


def _column(events: list[Event], name: str) -> list[Any]:
    getter = getattr(Event, name).__get__  # the slot descriptor: faster than getattr per event
    return [getter(e) for e in events]


def _intern(values: list[Any]) -> tuple[list[int], list[Any]]:
    table = list(dict.fromkeys(values))
    index = {value: i for i, value in enumerate(table)}
    return list(map(index.__getitem__, values)), table


def _intern_by_identity(values: list[Any]) -> tuple[list[int], list[Any]]:
    # Tags are dicts (unhashable); the bus hands the same object to every event
    # emitted inside one tag() block, so identity finds the repeats.
    ids = list(map(id, values))
    first = dict(zip(reversed(ids), reversed(values)))
    order = list(dict.fromkeys(ids))
    index = {key: i for i, key in enumerate(order)}
    return list(map(index.__getitem__, ids)), [first[key] for key in order]


def _columns_of(events: Any) -> EventColumns | None:
    if isinstance(events, EventColumns) and not events.materialized:
        return events
    return None


@dataclass
class Trace:
    """A recorded run.

    Attributes:
        events: every event in emission order (a list, or an `EventColumns` after `load`).
        memory: memory readings by category, in order.
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
            return list(map(cols.tables["kind"].__getitem__, cols.columns["kind"]))
        return [e.kind for e in self.events]

    def of_kind(self, *kinds: str) -> list[Event]:
        """The events of the given kinds, in order."""
        cols = _columns_of(self.events)
        if cols is not None:
            ids = cols._kind_ids(kinds)
            return cols._rows(i for i, k in enumerate(cols.columns["kind"]) if k in ids)
        wanted = set(kinds)
        return [e for e in self.events if e.kind in wanted]

    def count(self, kind: str) -> int:
        """How many events of `kind` the trace holds."""
        cols = _columns_of(self.events)
        if cols is not None:
            column = cols.columns["kind"]
            return sum(column.count(i) for i in cols._kind_ids((kind,)))
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

    # -- files (see ckpt_viz.trace_io) --

    def save(self, path: str | PathLike[str]) -> None:
        """Write the trace as JSON (gzip when `path` ends with ".gz"), atomically.

        Raises:
            TraceError: the trace holds something a trace file cannot (a value that
                is not JSON, an unknown kind); nothing is written then.
        """
        from ckpt_viz import trace_io

        trace_io.save(self, path)

    @classmethod
    def load(cls, path: str | PathLike[str]) -> "Trace":
        """Read a trace written by `save` (gzip or not; the content decides).

        Raises:
            TraceError: the file is missing, empty, truncated, not a trace, too new, or invalid.
        """
        from ckpt_viz import trace_io

        return trace_io.load(path)


def run_meta(*, model: str, mode: str, schedule: str | None = None, **extra: Any) -> dict[str, Any]:
    """The `meta` dict of a run: what ran, how, and with which versions.

    torch's version is included only if torch is already imported (this module never imports it).
    """
    from ckpt_viz.trace_io import SCHEMA_VERSION, package_version

    versions = {"python": sys.version.split()[0], "ckpt_viz": package_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(getattr(torch, "__version__", "unknown"))
    return {"model": model, "mode": mode, "schedule": schedule, "versions": versions,
            "schema_version": SCHEMA_VERSION, **extra}

