"""A recording's events: cheap rows while the block runs, `Event` objects when read.

Standard library only. The row type is `ckpt_viz.events.EventRow`; the bus builds the
rows (`ckpt_viz.bus`, NOTE [ Cost with nobody listening ], rule 5).

NOTE [ Lazy events ]
  1. While a `record()` block runs, the bus hands the recording one `EventRow` per
     event (its seq, and one tuple of the other fields that every recording seeing
     the event shares) and the recording's `RecordedEvents` keeps it: no `Event` is
     built on the training step's hot path.
  2. Any read (index, iterate, slice, compare, `in`, ...) first builds, in order, the
     Event of every row not built yet and keeps it. Each event is built once: later
     reads return the same object, so a `RecordedEvents` reads like a plain list of
     Events that grows while the block runs. `len` and `column` read without building.
  3. Writes (append, insert, delete, assignment) act on the built Events; rows that
     arrive later are built and appended after them, as on a list the recorder
     appends to.
  4. Threads: the bus appends under its channel's lock (so rows arrive in seq order);
     building takes this container's own lock, so two readers never build a row twice.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, MutableSequence
from typing import Any, overload

from ckpt_viz.events import ROW_FIELDS, Event, EventRow, make_event
from ckpt_viz.trace.columns import EventColumns

__all__ = ["RecordedEvents"]

_VALUE_INDEX = {name: i for i, name in enumerate(ROW_FIELDS)}  # a row's values hold every field but seq


class RecordedEvents(MutableSequence):
    """The events of a recording, kept as rows until read; see NOTE [ Lazy events ]."""

    __slots__ = ("_built", "_lock", "_rows", "add_row")
    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._built: list[Event] = list(events)
        self._rows: list[EventRow] = []
        self._lock = threading.Lock()
        self.add_row: Callable[[EventRow], None] = self._rows.append
        """Keep one more row (the bus's sink; rule 1 of the NOTE)."""

    def _events(self) -> list[Event]:
        rows = self._rows
        if rows:  # rule 2: build what arrived since the last read, in order, once
            with self._lock:
                count = len(rows)
                if count:
                    pending = rows[:count]
                    del rows[:count]  # a row the bus appends meanwhile stays for the next read
                    self._built.extend([make_event(row[0], *row[1]) for row in pending])
        return self._built

    def column(self, name: str) -> list[Any]:
        """Field `name` of every event, in order, without building the Events still kept as rows."""
        with self._lock:
            built, rows = self._built[:], self._rows[:]
        if name == "seq":
            return [e.seq for e in built] + [r[0] for r in rows]
        at = _VALUE_INDEX[name]  # KeyError for a name that is no field, like getattr's AttributeError
        return [getattr(e, name) for e in built] + [r[1][at] for r in rows]

    @property
    def pending(self) -> int:
        """How many events are still kept as rows (not built yet)."""
        return len(self._rows)

    # ------------------------------------------------------------ the list protocol

    def __len__(self) -> int:
        with self._lock:
            return len(self._built) + len(self._rows)

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
