"""Column storage for a loaded trace: events and memory samples kept one list per field.

Standard library only. See the NOTE below; the record types are `ckpt_viz.trace.types`.

NOTE [ Rows stored as columns ]
  1. A recorded trace keeps `events` and `memory` as plain lists: the recorder appends.
  2. A loaded trace keeps them as `EventColumns` and `MemoryColumns`: one list per
     field. For events, kind, mode, phase, site and thread_id are stored together
     as an index into a small table of distinct "contexts", and tags as an index
     into a table of distinct tag dicts; data is a list of dicts, or (loaded from a
     schema 2 file) a `ckpt_viz.trace.packed.DataColumn` that builds each event's dict
     when it is read. Building a frozen dataclass costs about
     2 us on a slow CPU, so building a million of them would make opening a big
     file take seconds; the columns build a row object only when it is read.
  3. Both are full mutable sequences that compare equal to the lists they stand
     for. Each read builds a fresh object (equal, not identical, to the last one).
     The first write (append, extend, assignment, deletion) turns the columns into
     a plain list for good.
  4. The Trace queries (kinds, count, of_kind, for_handle, handle_ids; in
     `ckpt_viz.trace.model`) read the event columns directly, so they stay fast on
     a loaded million-event trace.
  5. A loaded trace keeps its events' t_ns as the differences the file stores (`Times`; read into an
     array of int64s by the load where the C speed-up is built, NOTE [ Checks in C ], rule 4):
     adding up a million of them makes a million new ints (60-70 ms), and only the
     schedule timeline reads them all. Iterating adds them up as it goes; reading one
     adds at most 4,095 to the start of its block of 4,096 (the block starts are summed
     on the first such read); a slice, or a read after 256 rows read one at a time
     (`Trace.of_kind` on a big trace reads thousands), builds the whole list and keeps it.
"""
from __future__ import annotations

import collections
import itertools
from array import array
from collections.abc import Callable, Iterable, Iterator, MutableSequence
from operator import attrgetter, eq, itemgetter
from typing import Any, overload

from ckpt_viz.events import Event
from ckpt_viz.trace.lazy import LazyColumn
from ckpt_viz.trace.types import CONTEXT_FIELDS, MemorySample

__all__ = ["PACKED", "EventColumns", "MemoryColumns", "Times", "events_as_columns"]

PACKED = "_packed"  # tables[PACKED]: column name -> (the column, its form in the file it was loaded from)


class _LazyRows(MutableSequence):
    """Rows kept as columns; see NOTE [ Rows stored as columns ], rule 3."""

    __slots__ = ("_list", "columns", "tables")
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
    def from_events(cls, events: Iterable[Event]) -> EventColumns:
        """Split events into columns (the inverse of iterating).

        A sequence with a `column(name)` method (a recording's `RecordedEvents`) is read field
        by field, without building the Events it still keeps as rows.
        """
        column = getattr(events, "column", None)
        if not isinstance(events, list) and callable(column):
            return cls._from_fields(column)
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

    @classmethod
    def _from_fields(cls, column: Callable[[str], list[Any]]) -> EventColumns:
        fields = {name: column(name) for name in ("seq", "t_ns", *CONTEXT_FIELDS, "handle_id", "session_id", "tags",
                                                  "data")}
        n = min(map(len, fields.values()))  # a recording still running appends; its first n events stay as they are
        fields = {name: values[:n] if len(values) > n else values for name, values in fields.items()}
        context, context_table = _intern(zip(*(fields[name] for name in CONTEXT_FIELDS)))
        all_tags = fields["tags"]
        tags, first_of_tags = _intern(map(id, all_tags), keep_positions=True)
        columns = {"seq": _as_range(fields["seq"]), "t_ns": fields["t_ns"], "context": context,
                   "handle_id": fields["handle_id"], "session_id": fields["session_id"], "tags": tags,
                   "data": fields["data"]}
        return cls(columns, {"context": context_table, "tags": [all_tags[i] for i in first_of_tags]})

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
    def from_samples(cls, samples: Iterable[MemorySample]) -> MemoryColumns:
        """Split samples into columns (the inverse of iterating).

        The samples of a long recording lie scattered in memory: they are read a piece at a time,
        every field of a piece while it is in the CPU cache, and each reading in one pass (all its
        categories at once).
        """
        samples = samples if isinstance(samples, list) else list(samples)
        seq, t_ns, allocated, readings, stages = fields = [[] for _ in _SAMPLE_FIELDS]
        names = tuple(samples[0].bytes_by_category) if samples else ()
        rows: list[list[Any]] | None = [[] for _ in names] if len(names) > 1 else None  # the usual case:
        # every sample measured the same categories
        for start in range(0, len(samples), _SAMPLE_PIECE):
            piece = samples[start:start + _SAMPLE_PIECE]
            for name, column in zip(_SAMPLE_FIELDS, fields):
                column.extend(map(attrgetter(name), piece))
            if rows is not None:
                piece_readings = readings[start:]
                try:
                    if set(map(len, piece_readings)) != {len(names)}:
                        raise KeyError(names)
                    for column, values in zip(rows, zip(*map(itemgetter(*names), piece_readings))):
                        column.extend(values)
                except (KeyError, TypeError):  # other categories (or not a dict: found and named by the caller)
                    rows = None
        by_category = dict(zip(names, rows)) if rows is not None else _by_category(readings)
        return cls({
            "seq": _as_range(seq),
            "t_ns": t_ns,
            "device_allocated": allocated,
            "by_stage": stages if any(stages) else None,
            "bytes_by_category": by_category,
        })

    def saved_columns(self) -> dict[str, Any]:
        """The columns as a save writes them (`ckpt_viz.trace.document`): by_stage kept as text is parsed."""
        columns = dict(self.columns)
        if isinstance(columns["by_stage"], LazyColumn):
            columns["by_stage"] = list(columns["by_stage"])
        return columns

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


_SAMPLE_FIELDS = ("seq", "t_ns", "device_allocated", "bytes_by_category", "by_stage")


class Times(LazyColumn):
    """Times in ns kept as their differences (the first time, then each next minus the last), read as the
    times; see NOTE [ Rows stored as columns ], rule 5."""

    __slots__ = ("_deltas", "_starts")

    def __init__(self, deltas: list[int] | array) -> None:
        super().__init__()
        self._deltas = deltas  # a list, or the array('q') the load read them into (ckpt_viz.trace.fastcheck)
        self._starts: list[int] | None = None

    @property
    def deltas(self) -> list[int]:
        """The differences, as a list (what a save writes again)."""
        if type(self._deltas) is not list:
            self._deltas = self._deltas.tolist()
        return self._deltas

    def __len__(self) -> int:
        return len(self._deltas)

    def _iterate(self) -> Iterator[int]:
        return itertools.accumulate(self._deltas)

    def _build(self) -> list[int]:
        return list(itertools.accumulate(self._deltas))

    def _row(self, i: int) -> int:
        deltas = self._deltas
        if self._starts is None:
            blocks = map(slice, range(0, len(deltas), _BLOCK), range(_BLOCK, len(deltas) + _BLOCK, _BLOCK))
            self._starts = [0, *itertools.accumulate(map(sum, map(deltas.__getitem__, blocks)))]  # sum before block b
        block = i // _BLOCK
        return self._starts[block] + sum(deltas[block * _BLOCK:i + 1])

    def __repr__(self) -> str:
        return f"Times({len(self)} values)"


_BLOCK = 4096


_SAMPLE_PIECE = 2048  # samples read at a time (from_samples)


def _by_category(readings: list[dict[str, int]]) -> dict[str, list[int | None]]:
    # category -> one value per reading (None: not measured), categories in first-seen order.
    categories = dict.fromkeys(c for r in readings for c in r)
    return {c: [r.get(c) for r in readings] for c in categories}


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


def _as_range(seq: list[int] | range) -> list[int] | range:
    # Sequence numbers are usually consecutive; a range stores them in O(1).
    if type(seq) is range:
        return seq
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



def events_as_columns(events: Any) -> EventColumns | None:
    """`events` itself when it is still stored as columns (never written to), else None."""
    if isinstance(events, EventColumns) and not events.materialized:
        return events
    return None
