"""A column a loaded trace keeps in its file's compact form and reads as the plain list it stands for.

Standard library only. `columns.Times` (t_ns as differences) and `packed.Runs` (a run-packed column) are the two
forms; this is what they share: a row is computed from the compact form while few rows are read one at a time
(`_row`), and the whole list is built once (`_build`) at a slice or after `READS` single reads, so a reader that
goes row by row through a big trace pays the build once, not a computed row each time. Iteration needs no list
(`_iterate`). Equal to a list, or another lazy column, with the same values in the same order. A third form,
`JSONColumn`, is a column still in its file's JSON text, checked at load, parsed whole at its first read.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import eq
from typing import Any

__all__ = ["READS", "JSONColumn", "LazyColumn"]

READS = 256  # rows read one at a time (a few microseconds each) before the whole list is built instead


class LazyColumn(Sequence):
    """The shared part of a compact column read as a list; subclasses give `_row`, `_build`, `_iterate`,
    `__len__` and `__repr__`."""

    __slots__ = ("_list", "_reads")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self) -> None:
        self._list: list[Any] | None = None
        self._reads = 0

    def _row(self, i: int) -> Any:  # the value at non-negative position i, from the compact form
        raise NotImplementedError

    def _build(self) -> list[Any]:  # every value, as a list
        raise NotImplementedError

    def _iterate(self) -> Iterator[Any]:  # every value, in order, without a list
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        return iter(self._list) if self._list is not None else self._iterate()

    def __getitem__(self, index: Any) -> Any:
        if self._list is None and (isinstance(index, slice) or self._reads > READS):
            self._list = self._build()
        if self._list is not None:
            return self._list[index]
        i = range(len(self))[index]  # an IndexError or TypeError as a list gives
        self._reads += 1
        return self._row(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, LazyColumn)):
            return NotImplemented
        return len(self) == len(other) and all(map(eq, self, other))


class JSONColumn(LazyColumn):
    """A column kept as the JSON text of its list until a row is read, then parsed whole (once): memory's by_stage,
    which the load checks in that text (NOTE [ Checks in C ], rule 5, in ckpt_viz.trace.fastcheck)."""

    __slots__ = ("_count", "_loads", "checked", "text")

    def __init__(self, text: bytes, count: int, loads: Callable[[bytes], Any], checked: bool) -> None:
        super().__init__()
        self.text, self._count, self._loads, self.checked = text, count, loads, checked

    def __len__(self) -> int:
        return self._count if self._list is None else len(self._list)

    def _build(self) -> list[Any]:
        if self._list is not None:
            return self._list
        rows = self._loads(self.text)
        self.text = b""  # parsed: the list is kept instead (LazyColumn uses it from now on)
        return rows

    def _row(self, i: int) -> Any:
        self._list = self._build()
        return self._list[i]

    def _iterate(self) -> Iterator[Any]:
        self._list = self._build()
        return iter(self._list)

    def __repr__(self) -> str:
        return f"JSONColumn({self._count} rows, {len(self.text):,} bytes)"
