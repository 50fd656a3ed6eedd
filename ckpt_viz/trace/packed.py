"""Packed event columns of schema 2: runs of equal values, and event data stored by key.

Owns both encodings in all three directions: `pack_runs` / `pack_data` (save), `check_runs` /
`check_data` (load: raise `InvalidDocument` naming the event), and `unpack_runs` / `DataColumn`
(the columns a loaded trace reads). See NOTE [ Trace file format, schema 2 ] in
`ckpt_viz.trace.schema` for the layout and NOTE [ Packed columns ] below for why. Standard
library only; every pass over a column is a C-level map, never a Python loop per event.

NOTE [ Packed columns ]
  1. Why: parsing a million small `data` objects (and the cyclic GC's first pass over them
     afterwards) was most of the cost of loading a million-event trace; its keys were also
     half of the file. Stored by key, data is a few long lists of numbers and strings, which
     the parser reads at several times the speed, and which hold no container per event.
  2. Data: events whose data have the same keys share a "shape" (`keys[k]`); `shape` holds
     each event's shape, and `values[k][c]` the value of key c for each event of shape k, in
     event order. A loaded trace keeps it so (`DataColumn`) and builds an event's dict when
     the event is read: every value is checked on load, before anything can read it, so a
     lazily built dict is never an unchecked one.
  3. Usually the keys follow from the kind, so every event of one context (kind, mode, phase,
     site, thread) has the same keys: then `shape` is the string "context" (the shape of an
     event is its context index, `keys` has one entry per context) and costs nothing to
     store. Otherwise `shape` is a column of its own.
  4. Runs: a column whose value repeats (handle_id inside one handle's life, session_id,
     tags inside a tag() block, the shape of data) is stored as {"values": [...], "runs":
     [...]} when it has at most half as many runs as values; unpacking repeats the same
     objects. Only ints, strings, booleans and null are run-packed (never floats: 0.0 and
     -0.0 are equal and would merge), and never a column holding both integers and booleans
     (True == 1 would merge them).
  5. A writer falls back to the plain list of data objects (the schema 1 column) when some
     data key is not a string, or when the shapes are too many to pay (over 1 per 8 events).
  6. A loaded trace keeps its session_id and tags columns as their runs (`Runs`, when the
     file has them so): no reader of the first page reads them whole, and unpacking a million
     values costs 10-40 ms. Iterating repeats the values as it goes; one row is found by a
     bisection of the run ends; a slice, or a read after 256 rows read one at a time, builds
     the plain list and keeps it.
"""
from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Callable, Iterator, Sequence
from operator import is_not, itemgetter, ne, sub
from typing import Any

from ckpt_viz.trace import fastcheck
from ckpt_viz.trace.lazy import LazyColumn
from ckpt_viz.trace.problems import InvalidDocument, show
from ckpt_viz.trace.ranges import BYTES, I63, check_numbers, check_range, check_types

__all__ = ["DataColumn", "Runs", "by_context_limit", "check_data", "check_runs", "checked", "data_shape", "pack_data",
           "pack_runs", "unpack_runs"]

_NONE = type(None)
_RUN_TYPES = {int, str, bool, _NONE}
_count = itertools.count


# ---------------------------------------------------------------- runs

def pack_runs(column: Sequence[Any], indexes: bool = False, objects: bool = False) -> Any:
    """`column` as {"values", "runs"} when it has at most half as many runs as values, else `column`.

    indexes: the column holds only ints (indexes built by `EventColumns`), so its types need no look.
    objects: the column holds objects (tags dicts): a run is one object (equal dicts may differ in type:
        {"a": 1} == {"a": True}).
    """
    n = len(column)
    if n < 64:
        return column
    head = column[:1024]
    if sum(map(is_not if objects else ne, itertools.islice(head, 1, None), head)) > 512:  # a quick look
        return column
    if objects:
        starts = [0, *itertools.compress(range(1, n), map(is_not, itertools.islice(column, 1, None), column))]
        if len(starts) > n // 2:
            return column
        ends = [*itertools.islice(starts, 1, None), n]
        return {"values": list(map(column.__getitem__, starts)), "runs": list(map(sub, ends, starts))}
    values: list[Any] = []
    runs: list[int] = []
    keep_value, keep_run, limit = values.append, runs.append, n // 2
    for value, run in itertools.groupby(column):
        keep_value(value)
        keep_run(len(list(run)))
        if len(runs) > limit:
            return column
    if not (indexes or objects):
        # A run holds values equal to its first; only numbers of another type can be equal (True == 1 == 1.0,
        # 0.0 == -0.0), so the whole column is looked at only when a run holds a number.
        types = set(map(type, values))
        if not types <= _RUN_TYPES or (not types <= {str, _NONE} and not _runs_safe(set(map(type, column)))):
            return column
    return {"values": values, "runs": runs}


def _runs_safe(types: set[type]) -> bool:
    return types <= _RUN_TYPES and not {bool, int} <= types


def unpack_runs(column: Any) -> list[Any]:
    """The plain list a checked column stands for (itself when it is a list)."""
    if type(column) is dict:
        fast = fastcheck.unpack(column["values"], column["runs"])
        if fast is not None:
            return fast
        return list(itertools.chain.from_iterable(map(itertools.repeat, column["values"], column["runs"])))
    return column


class Runs(LazyColumn):
    """A checked run-packed column, read as the plain list it stands for: NOTE [ Packed columns ], rule 6."""

    __slots__ = ("_ends", "runs", "values")

    def __init__(self, values: list[Any], runs: list[int]) -> None:
        super().__init__()
        self.values, self.runs = values, runs
        self._ends: list[int] | None = None

    def __len__(self) -> int:
        if self._ends is None:
            self._ends = list(itertools.accumulate(self.runs))
        return self._ends[-1] if self._ends else 0

    def _iterate(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(map(itertools.repeat, self.values, self.runs))

    def _build(self) -> list[Any]:
        return list(self._iterate())

    def _row(self, i: int) -> Any:
        return self.values[bisect.bisect_right(self._ends, i)]  # type: ignore[arg-type]  # len() made _ends

    def __repr__(self) -> str:
        return f"Runs({len(self)} values in {len(self.runs)} runs)"


def check_runs(column: Any, count: int, name: str) -> None:
    """Raise InvalidDocument unless `column` is a list of `count` values or a valid {"values", "runs"} object."""
    if type(column) is list:
        if len(column) != count:
            raise InvalidDocument(f"field '{name}' has {len(column)} values but the count is {count}")
        return
    if type(column) is not dict or set(column) != {"values", "runs"}:
        raise InvalidDocument(f"field '{name}' is {show(column)}, expected a list or an object of \"values\" "
                              "and \"runs\"")
    values, runs = column["values"], column["runs"]
    if type(values) is not list or type(runs) is not list or len(values) != len(runs):
        raise InvalidDocument(f"field '{name}' has values and runs that are not two lists of one length")
    if fastcheck.runs(runs, count):  # NOTE [ Checks in C ] in ckpt_viz.trace.fastcheck: all the checks below pass
        return
    check_types(runs, {int}, f"{name}.runs[{{}}]", "a run length (an integer of 1 or more)")
    lengths = set(runs)  # few distinct lengths: the range is read off them (check_range names a bad one)
    if lengths and (min(lengths) < 1 or max(lengths) > count):
        check_range(runs, 1, count + 1, f"{name}.runs[{{}}]", f"a run length from 1 to the count, {count}")
    if sum(runs) != count:
        raise InvalidDocument(f"field '{name}' has runs adding up to {sum(runs)}, but the count is {count}")


def checked(column: Any, check: Callable[[list[Any]], None]) -> None:
    """Run `check` on the values of a run-packed column (fast), else on the plain list; a failure on the
    values is raised again from the unpacked column, so that it names the event."""
    if type(column) is not dict:
        check(column)
        return
    try:
        check(column["values"])
    except InvalidDocument:
        check(unpack_runs(column))
        raise


# ---------------------------------------------------------------- data

def pack_data(datas: list[Any], context: list[int], n_contexts: int) -> Any:
    """The packed form of one data dict per event (NOTE [ Packed columns ], rules 2 to 4), or `datas`.

    `context`: each event's index into a table of `n_contexts` entries (`EventColumns`' "context").
    None when some data is not a dict (the caller converts or refuses it).
    """
    n = len(datas)
    if n_contexts <= by_context_limit(n):
        by_context = _by_context(datas, context, n_contexts)
        if by_context is not None:
            return by_context
    if not set(map(type, datas)) <= {dict}:
        return None
    numbering: dict[tuple[str, ...], int] = collections.defaultdict(_count().__next__)
    shape = list(map(numbering.__getitem__, map(tuple, datas)))
    keys = [list(k) for k in numbering]
    if len(keys) > max(16, n // 8) or not _str_keys(keys):
        return datas
    groups = [[] for _ in keys]
    adders = [group.append for group in groups]
    for d, k in zip(datas, shape):
        adders[k](d)
    values = [[list(map(itemgetter(name), group)) for name in names] for names, group in zip(keys, groups)]
    return {"keys": keys, "shape": pack_runs(shape), "values": values}


_CHUNK = 16384  # events per piece: their data dicts stay in the CPU cache between the two passes over them


def by_context_limit(n: int) -> int:
    """The most contexts for which `pack_data` of `n` events tries storing data by context."""
    return min(_CHUNK // 4, max(16, n // 8))


def _by_context(datas: list[dict[str, Any]], context: list[int], n_contexts: int) -> dict[str, Any] | None:
    # NOTE [ Packed columns ], rule 3; None when some context's events have data with other keys, or not a dict.
    keys: list[list[Any] | None] = [None] * n_contexts
    values: list[list[list[Any]]] = [[] for _ in range(n_contexts)]
    for start in range(0, len(datas), _CHUNK):
        groups: list[list[Any]] = [[] for _ in range(n_contexts)]
        adders = [group.append for group in groups]
        for d, c in zip(datas[start:start + _CHUNK], context[start:start + _CHUNK]):
            adders[c](d)
        for c, group in enumerate(groups):
            if not group:
                continue
            if set(map(type, group)) != {dict}:
                return None
            names = keys[c]
            if names is None:
                names = keys[c] = list(group[0])
                values[c] = [[] for _ in names]
            # The same keys (as many, each found), in the same order (the first key decides for two keys).
            if set(map(len, group)) != {len(names)}:
                return None
            try:
                for name, column in zip(names, values[c]):
                    column.extend(map(itemgetter(name), group))
            except KeyError:
                return None
            if len(names) == 2:
                if not all(map(names[0].__eq__, map(next, map(iter, group)))):
                    return None
            elif len(names) > 2 and not all(map(tuple(names).__eq__, map(tuple, group))):
                return None
    keys = [names if names is not None else [] for names in keys]
    if not _str_keys(keys):
        return None
    return {"keys": keys, "shape": "context", "values": values}


def _str_keys(keys: list[list[Any]]) -> bool:
    return all(type(k) is str for k in itertools.chain.from_iterable(keys))


def data_shape(data: dict[str, Any], context: Any) -> list[int]:
    """Each event's shape: an index into data["keys"] (the event's context, or the packed "shape" column)."""
    return unpack_runs(context if data["shape"] == "context" else data["shape"])


def check_data(data: dict[str, Any], count: int, built_here: bool, context: Any, n_contexts: int,
               per_context: collections.Counter[int] | None = None) -> None:
    """Raise InvalidDocument for the first problem of a packed data column (of `count` events).

    context, n_contexts: the events' context column (checked) and the size of its table.
    per_context: the count of each index in `context` when the caller has it (a pass over the events less).
    built_here: made by `pack_data`, so only the values are checked (bytes fields), not the layout.
    """
    if built_here:
        for k, (names, columns) in enumerate(zip(data["keys"], data["values"])):
            for name, column in zip(names, columns):
                if name.endswith("bytes") and not fastcheck.ints(column, 0, I63, none_ok=True):
                    where: Any = _Where(data_shape(data, context), k, name)
                    check_types(column, {int, _NONE}, where, f"{BYTES} or null")
                    check_range(column, 0, I63, where, f"{BYTES} or null")
        return
    if set(data) != {"keys", "shape", "values"}:
        raise InvalidDocument(f"field 'events.columns.data' has the fields {sorted(map(str, data))}, expected "
                              "\"keys\", \"shape\" and \"values\" (or a list of objects)")
    keys, shape, values = data["keys"], data["shape"], data["values"]
    if type(keys) is not list or type(values) is not list or len(keys) != len(values):
        raise InvalidDocument("field 'events.columns.data' has keys and values that are not two lists of one length")
    if shape == "context":
        if len(keys) != n_contexts:
            raise InvalidDocument(f"field 'events.columns.data.keys' has {len(keys)} entries, but "
                                  f"events.tables.context has {n_contexts} (data stored by context)")
    else:
        check_runs(shape, count, "events.columns.data.shape")
        checked(shape, lambda col: fastcheck.ints(col, 0, len(keys)) or check_types(
            col, {int}, "events[{}].data (its shape)", "an index into events.columns.data.keys"))
        checked(shape, lambda col: fastcheck.ints(col, 0, len(keys)) or check_range(
            col, 0, len(keys), "events[{}].data (its shape)",
            f"an index into events.columns.data.keys ({len(keys)} entries)"))
    shape = data_shape(data, context)
    per_shape: Any = per_context if per_context is not None and data["shape"] == "context" else (
        fastcheck.index_counts(shape, len(keys)) or collections.Counter(shape))
    for k, (names, columns) in enumerate(zip(keys, values)):
        size = per_shape[k]
        if type(names) is not list or not all(type(n) is str for n in names) or len(set(names)) != len(names):
            raise InvalidDocument(f"events.columns.data.keys[{k}] is {show(names)}, expected a list of distinct "
                                  "strings")
        if type(columns) is not list or len(columns) != len(names) or not all(type(c) is list for c in columns):
            raise InvalidDocument(f"events.columns.data.values[{k}] is {show(columns)}, expected {len(names)} lists")
        for name, column in zip(names, columns):
            if len(column) != size:
                raise InvalidDocument(f"events.columns.data.values[{k}] has {len(column)} values of {name!r}, "
                                      f"but {size} events have that data shape")
            where = _Where(shape, k, name)
            if name.endswith("bytes") and not fastcheck.ints(column, 0, I63, none_ok=True):
                check_types(column, {int, _NONE}, where, f"{BYTES} or null")
                check_range(column, 0, I63, where, f"{BYTES} or null")
    # Finite numbers: the types of all the values at once (a list of types is built faster than a set, and
    # `in` finds a type by identity); only where some value is a float, each column, naming the event.
    every = itertools.chain.from_iterable(itertools.chain.from_iterable(values))
    if not all(map(fastcheck.finite, itertools.chain.from_iterable(values))) and float in list(map(type, every)):
        for k, (names, columns) in enumerate(zip(keys, values)):
            for name, column in zip(names, columns):
                check_numbers(column, _Where(shape, k, name))


class _Where:
    """The place of row j of one shape's column, for an error: `format(j)` is "events[i].data.<name>"."""

    __slots__ = ("_k", "_name", "_shape")

    def __init__(self, shape: list[int], k: int, name: str) -> None:
        self._shape, self._k, self._name = shape, k, name

    def format(self, j: int) -> str:
        i = next(itertools.islice((i for i, s in enumerate(self._shape) if s == self._k), j, None))
        return f"events[{i}].data.{self._name}"


def _dicts(names: list[str], columns: list[list[Any]], size: int) -> list[dict[str, Any]]:
    # The data of every event of one shape; a comprehension builds small dicts faster than dict(zip(...)).
    if not names:
        return [{} for _ in range(size)]
    if len(names) == 1:
        a = names[0]
        return [{a: x} for x in columns[0]]
    if len(names) == 2:
        a, b = names
        return [{a: x, b: y} for x, y in zip(*columns)]
    return list(map(dict, map(zip, itertools.repeat(names), zip(*columns))))


class DataColumn(Sequence):
    """The data of every event of a loaded trace, stored by key; builds each event's dict when read.

    A fresh dict on every read (equal, not identical, to the last one), like the rows of
    `ckpt_viz.trace.columns.EventColumns`. See NOTE [ Packed columns ], rule 2.
    """

    __slots__ = ("_positions", "keys", "shape", "values")

    def __init__(self, keys: list[list[str]], shape: list[int], values: list[list[list[Any]]]) -> None:
        self.keys, self.shape, self.values = keys, shape, values
        self._positions: list[int] | None = None

    def packed(self, context: list[int]) -> dict[str, Any]:
        """The document form (schema 2) for events whose context column is `context`."""
        shape = "context" if self.shape is context else pack_runs(self.shape)
        return {"keys": self.keys, "shape": shape, "values": self.values}

    def __len__(self) -> int:
        return len(self.shape)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        sizes = collections.Counter(self.shape) if not all(self.keys) else {}
        per_shape = [iter(_dicts(names, columns, sizes.get(k, 0)))
                     for k, (names, columns) in enumerate(zip(self.keys, self.values))]
        return map(next, map(per_shape.__getitem__, self.shape))

    def _row(self, i: int) -> dict[str, Any]:
        if self._positions is None:
            counters = [_count() for _ in self.keys]
            self._positions = list(map(next, map(counters.__getitem__, self.shape)))
        k, j = self.shape[i], self._positions[i]
        return dict(zip(self.keys[k], [column[j] for column in self.values[k]]))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._row(i) for i in range(len(self.shape))[index]]
        return self._row(range(len(self.shape))[index])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, DataColumn)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DataColumn({len(self)} events, {len(self.keys)} shapes)"
