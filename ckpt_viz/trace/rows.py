"""A recording's events: flat field values while the block runs, `Event` objects when read.

Standard library only. The bus hands the fields over (`ckpt_viz.bus`, NOTE [ Cost with
nobody listening ], rule 5).

NOTE [ Lazy events ]
  1. While a `record()` block runs, the bus hands the recording each event as the
     tuple of its fields after seq (`events.ROW_FIELDS`, one tuple that every
     recording seeing the event shares) and the recording's `RecordedEvents` extends
     one flat list with them: no `Event` is built on the training step's hot path, and
     keeping an event allocates no object the garbage collector tracks (an Event per
     event, or a tuple per event, would: a training step that allocates a few hundred
     tracked objects more runs a generation-0 collection more, which traverses every
     young tensor and its autograd graph). An event's seq is its position: a
     recording's channel numbers its events 0, 1, 2, ... in the order it keeps them.
  2. Any read (index, iterate, slice, compare, `in`, ...) first builds, in order, the
     Event of every event not built yet and keeps it. Each event is built once: later
     reads return the same object, so a `RecordedEvents` reads like a plain list of
     Events that grows while the block runs. `len`, `column`, `fields` and `packed` (a
     save's: NOTE [ Saving fast ] in ckpt_viz.trace.document) read without building.
  3. Writes (append, insert, delete, assignment) act on the built Events; events that
     arrive later are built and appended after them, as on a list the recorder
     appends to.
  4. Threads: the bus keeps each event with one `list.extend` of its tuple, which the
     GIL makes atomic, so threads keeping events at once never interleave their fields
     and an event's position is its seq; the bus takes no lock for it. `seq_of(values)`
     finds a kept event's seq afterwards by the identity of its `t_ns` object (unique
     among live objects), from the end. Building takes this container's own lock, so
     two readers never build an event twice.
  5. Memory: a recording's samples arrive once per change of reading (never per event
     with the native log: its probe hands them over when the block closes) and go
     straight into columns (`RecordedMemory.keep`), the form a save writes, so no
     `MemorySample` is built unless the samples are read, and a save does not turn
     samples into columns (NOTE [ Saving fast ] in ckpt_viz.trace.document). The values
     are checked on save like any others: they come from a probe, nothing here proves
     their types.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, MutableSequence
from operator import attrgetter
from typing import Any, overload

from ckpt_viz.events import ROW_FIELDS, Event, make_event
from ckpt_viz.trace.columns import EventColumns, MemoryColumns, _as_range
from ckpt_viz.trace.types import MemorySample

__all__ = ["RecordedEvents", "RecordedMemory"]

_WIDTH = len(ROW_FIELDS)  # values kept per event: every field but seq
_VALUE_INDEX = {name: i for i, name in enumerate(ROW_FIELDS)}
_ROW_VALUES = attrgetter(*ROW_FIELDS)  # an Event's fields after seq, as the bus keeps them


class RecordedEvents(MutableSequence):
    """The events of a recording, kept as flat field values until read; see NOTE [ Lazy events ]."""

    __slots__ = ("_built", "_flat", "_lock", "_next_seq", "keep")
    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._built: list[Event] = list(events)
        self._flat: list[Any] = []  # the fields after seq of each event not built yet, one after another
        self._next_seq = 0  # the seq of the first event not built yet
        self._lock = threading.Lock()
        self.keep: Callable[[tuple[Any, ...]], None] = self._flat.extend
        """Keep the next event, given as its fields after seq (the bus's sink; rule 1 of the NOTE)."""

    def _events(self) -> list[Event]:
        flat = self._flat
        if flat:  # rule 2: build what arrived since the last read, in order, once
            with self._lock:
                size = len(flat)
                if size:
                    pending = flat[:size]
                    del flat[:size]  # an event the bus keeps meanwhile stays for the next read
                    first = self._next_seq
                    self._next_seq = first + size // _WIDTH
                    columns = [pending[i::_WIDTH] for i in range(_WIDTH)]
                    self._built.extend(map(make_event, range(first, self._next_seq), *columns))
        return self._built

    def column(self, name: str) -> list[Any]:
        """Field `name` of every event, in order, without building the Events not built yet."""
        at = None if name == "seq" else _VALUE_INDEX[name]  # KeyError for no field, like getattr's AttributeError
        with self._lock:  # slice here, not a copy of all the fields first (FILES: Trace.save reads 11 columns)
            built, first, flat = self._built[:], self._next_seq, self._flat
            size = len(flat) - len(flat) % _WIDTH
            values = flat[at:size:_WIDTH] if at is not None else []
        if at is None:
            return [e.seq for e in built] + list(range(first, first + size // _WIDTH))
        return [getattr(e, name) for e in built] + values

    def fields(self) -> dict[str, Any]:
        """Every field of every event, one list per field ("seq" a range while no Event is built), at one
        moment, without building the Events not built yet (FILES: what Trace.save reads)."""
        with self._lock:
            built, first, flat = self._built[:], self._next_seq, self._flat
            size = len(flat) - len(flat) % _WIDTH
            values = [flat[at:size:_WIDTH] for at in range(_WIDTH)]
        seqs = range(first, first + size // _WIDTH)
        if not built:
            return {"seq": seqs, **dict(zip(ROW_FIELDS, values))}
        return {"seq": [*map(attrgetter("seq"), built), *seqs],
                **{name: [*map(attrgetter(name), built), *v] for name, v in zip(ROW_FIELDS, values)}}

    def packed(self, pack: Callable[[list[Any], list[Any], int], Any]) -> tuple[list[int] | range, Any] | None:
        """(the seqs, `pack(head, flat, size)`) of the events kept so far, at one moment, without building the
        Events not built yet: `pack` reads the fields after seq of the Events built already (`head`, one flat
        list, as the bus keeps them), then the first `size` values of the flat list, under this container's
        lock (the bus only appends meanwhile). None where a built one is not an Event (written through the
        list protocol), or where `pack` returns None."""
        with self._lock:
            built, first, flat = self._built, self._next_seq, self._flat
            if not set(map(type, built)) <= {Event}:
                return None
            head = list(itertools.chain.from_iterable(map(_ROW_VALUES, built)))
            size = len(flat) - len(flat) % _WIDTH
            packed = pack(head, flat, size)
            seqs = range(first, first + size // _WIDTH)
            if built:
                seqs = [*map(attrgetter("seq"), built), *seqs]
        return None if packed is None else (seqs, packed)

    def seq_of(self, values: tuple[Any, ...]) -> int | None:
        """The seq of the kept event whose fields after seq are `values` (NOTE rule 4), None if it is gone."""
        t_ns = values[0]
        with self._lock:
            flat = self._flat
            last = len(flat) - _WIDTH
            if last >= 0 and flat[last] is t_ns:  # the usual: the last one kept
                return self._next_seq + last // _WIDTH
            for at in range(last - _WIDTH, -1, -_WIDTH):
                if flat[at] is t_ns:
                    return self._next_seq + at // _WIDTH
            built = self._built
            for at in range(len(built) - 1, -1, -1):
                if built[at].t_ns is t_ns:
                    return built[at].seq
        return None

    @property
    def pending(self) -> int:
        """How many events are not built yet."""
        return len(self._flat) // _WIDTH

    # ------------------------------------------------------------ the list protocol

    def __len__(self) -> int:
        with self._lock:
            return len(self._built) + len(self._flat) // _WIDTH

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        return self._events()[index]

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events())

    def __reversed__(self) -> Iterator[Event]:
        return reversed(self._events())

    def __contains__(self, value: object) -> bool:
        return value in self._events()

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        events = self._events()
        return events.index(value, start, len(events) if stop is None else stop)

    def count(self, value: Any) -> int:
        return self._events().count(value)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._events()[index] = value

    def __delitem__(self, index: Any) -> None:
        del self._events()[index]

    def insert(self, index: int, value: Event) -> None:
        self._events().insert(index, value)

    def append(self, value: Event) -> None:
        self._events().append(value)

    def extend(self, values: Iterable[Event]) -> None:
        self._events().extend(values)

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        self._events().sort(key=key, reverse=reverse)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordedEvents):
            other = other._events()
        if not isinstance(other, (list, EventColumns)):
            return NotImplemented  # like a list: equal to a list, or a loaded trace's columns, of equal events
        return self._events() == list(other)

    def __add__(self, other: Iterable[Event]) -> list[Event]:
        return [*self._events(), *other]

    def __radd__(self, other: Iterable[Event]) -> list[Event]:
        return [*other, *self._events()]

    def copy(self) -> list[Event]:
        """A plain list of the events, like `list.copy`."""
        return self._events().copy()

    def __reduce__(self) -> tuple[Any, ...]:  # a copy or a pickle is a plain list of Events
        return (list, (self._events().copy(),))

    def __repr__(self) -> str:
        return f"RecordedEvents({len(self)} events, {self.pending} not built yet)"


class RecordedMemory(MemoryColumns):
    """A recording's memory samples, kept as columns as they arrive; see NOTE [ Lazy events ], rule 5.

    Reads like the list of `MemorySample`s (a `MemoryColumns`: each read builds the sample); a write
    through the list protocol turns it into that list, and later samples are appended to it.
    """

    __slots__ = ("_gaps",)

    def __init__(self, samples: Iterable[MemorySample] = ()) -> None:
        super().__init__({"seq": [], "t_ns": [], "device_allocated": [], "by_stage": [], "bytes_by_category": {}})
        self._gaps = False  # some sample lacks a category another one has
        for s in samples:
            self.keep(s.seq, s.t_ns, s.bytes_by_category, s.device_allocated, s.by_stage)

    def keep(self, seq: int, t_ns: int, totals: dict[str, int], device: int | None,
             by_stage: dict[str, dict[str, int]]) -> None:
        """Keep the next sample: bytes by category `totals` right after event `seq` (a probe's reading)."""
        if self._list is not None:  # written to through the list protocol: a plain list from then on
            self._list.append(MemorySample(seq=seq, t_ns=t_ns, bytes_by_category=totals, device_allocated=device,
                                           by_stage=by_stage))
            return
        c = self.columns
        c["seq"].append(seq)
        c["t_ns"].append(t_ns)
        c["device_allocated"].append(device)
        c["by_stage"].append(by_stage)
        by_category = c["bytes_by_category"]
        if totals.keys() == by_category.keys():  # the usual case: the same categories as the last sample
            for name, column in by_category.items():
                column.append(totals[name])
            return
        n = len(c["seq"]) - 1
        for name in totals:
            if name not in by_category:  # a category first measured now
                by_category[name] = [None] * n
                self._gaps = self._gaps or n > 0
        for name, column in by_category.items():
            value = totals.get(name)
            self._gaps = self._gaps or value is None
            column.append(value)

    def saved_columns(self) -> dict[str, Any]:
        """The columns as a save writes them, at one moment (a sample kept meanwhile is left out)."""
        c = self.columns
        by_category = list(c["bytes_by_category"].values())
        n = min(len(c["seq"]), len(c["t_ns"]), len(c["device_allocated"]), len(c["by_stage"]), *map(len, by_category))
        columns = {name: c[name][:n] for name in ("seq", "t_ns", "device_allocated", "by_stage")}
        columns["seq"] = _as_range(columns["seq"])
        if not any(columns["by_stage"]):
            columns["by_stage"] = None
        columns["bytes_by_category"] = {name: column[:n] for name, column in list(c["bytes_by_category"].items())}
        return columns

    def _has_gaps(self) -> bool:
        return self._gaps

    def __reduce__(self) -> tuple[Any, ...]:  # a copy or a pickle is a plain list of samples
        return (list, (list(self),))
