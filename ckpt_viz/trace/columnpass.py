"""Passes over one column of every event (the app's first page reads a million events through these), in C where
`ckpt_viz.cext` can build `csrc/columnpass.c`, else in Python.

NOTE [ Column passes ]
  1. Each function here is the Python reference; the C twin (csrc/columnpass.c) must give the same result,
     and returns None on anything unusual (an argument that is not a list, a value that is not a small int,
     an index out of range, more distinct objects than it keeps), where the Python code runs instead: an
     error is always the Python one. tests/app/test_column_pass.py runs both on the same inputs.
  2. `CKPT_VIZ_CEXT=0` (or no compiler) leaves the Python code alone (NOTE [ C speed-ups ] in ckpt_viz/cext.py).
Standard library only.
"""
from __future__ import annotations

import itertools
from collections import Counter
from operator import add, getitem, itemgetter
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["gather", "identity_counts", "native", "rows", "run_signatures", "run_starts", "shifted", "take"]

_SOURCE = Path(__file__).parent / "csrc" / "columnpass.c"
_NATIVE: list[ModuleType | None] = []


def native() -> ModuleType | None:
    """The C module, built on first use; None where there is none."""
    if not _NATIVE:
        from ckpt_viz.cext import extension

        _NATIVE.append(extension(_SOURCE))
    return _NATIVE[0]


def _c(name: str) -> Any:
    module = native()
    return getattr(module, name) if module is not None else None


def rows(shape: list[int], shapes: int) -> list[int]:
    """i -> how many events before i have the shape `shape[i]` (event i's row within its shape); the ids are
    below `shapes`."""
    fast = _c("rows")
    result = fast(shape, shapes) if fast is not None else None
    if result is not None:
        return result
    counters = [itertools.count() for _ in range(shapes)]
    return list(map(next, map(counters.__getitem__, shape)))


def gather(tables: Any, keys: Any, where: Any) -> list[Any]:
    """i -> tables[keys[i]][where[i]]."""
    fast = _c("gather")
    result = fast(tables, keys, where) if fast is not None else None
    if result is not None:
        return result
    return list(map(getitem, map(tables.__getitem__, keys), where))


def take(table: Any, where: Any) -> list[Any]:
    """i -> table[where[i]]."""
    fast = _c("take")
    result = fast(table, where) if fast is not None else None
    if result is not None:
        return result
    return list(map(table.__getitem__, where))


def run_starts(column: Any) -> list[int]:
    """The index of the first event of every run of equal consecutive values (as `itertools.groupby` finds runs)."""
    fast = _c("run_starts")
    result = fast(column) if fast is not None else None
    if result is not None:
        return result
    lens = map(len, map(list, map(itemgetter(1), itertools.groupby(column))))
    starts = list(itertools.accumulate(lens, initial=0))
    del starts[-1]
    return starts


def identity_counts(column: Any) -> Counter[Any]:
    """`Counter(column)`, counted by object first (a column of a few distinct objects: kinds, contexts)."""
    fast = _c("identity_counts")
    pairs = fast(column) if fast is not None else None
    if pairs is None:
        return Counter(column)
    counts: Counter[Any] = Counter()
    for value, n in pairs:
        counts[value] += n
    return counts


def run_signatures(starts: list[int], n: int, a: Any, b: Any) -> list[int]:
    """Per run (from `starts[k]` to the next start, or `n`): the number of the first run whose pair
    (tuple(a[run]), tuple(b[run])) equals its own."""
    fast = _c("run_signatures")
    result = fast(starts, n, a, b) if fast is not None else None
    if result is not None:
        return result
    slices = list(map(slice, starts, [*starts[1:], n]))
    numbers: dict[tuple[Any, Any], int] = {}
    return list(map(numbers.setdefault, zip(map(tuple, map(a.__getitem__, slices)),
                                            map(tuple, map(b.__getitem__, slices))), itertools.count()))


def shifted(column: list[int], k: int) -> list[int]:
    """i -> column[i] + k."""
    fast = _c("shifted")
    result = fast(column, k) if fast is not None and type(k) is int and -(2**62) < k < 2**62 else None
    if result is not None:
        return result
    return list(map(add, column, itertools.repeat(k)))
