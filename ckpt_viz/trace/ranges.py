"""The value ranges of a trace document: integers that fit in 64 bits, finite numbers, bounded texts.

See NOTE [ Trace file format, schema 2 ], rule 4, in `ckpt_viz.trace.schema`, which calls these
after its type checks. Checks run over whole columns (min and max, the set of types); only when one
fails is the column scanned again to name the first bad row. Standard library only.
"""
from __future__ import annotations

import itertools
import math
from typing import Any

from ckpt_viz.trace.problems import InvalidDocument, show

__all__ = ["I63", "MAX_EVENTS_ENV", "MAX_SITE_CHARS", "MAX_SOURCE_CHARS", "MAX_SOURCE_SITES", "check_meta",
           "check_numbers", "check_range", "check_times", "check_types", "check_values"]

I63 = 2**63  # seq, t_ns, ids and byte counts are below this (an int64)
MAX_EVENTS_ENV = "CKPT_VIZ_TRACE_MAX_EVENTS"  # the default cap of Trace.load (ckpt_viz.trace.files)
MAX_SOURCE_SITES = 2_000  # meta.sources: distinct call sites kept by a recording
MAX_SOURCE_CHARS = 300  # meta.sources: characters kept of each line of code
MAX_SITE_CHARS = 4_096
BYTES = "0 to 2**63-1 bytes"


def check_types(column: list[Any], allowed: set[type], where: str, expected: str) -> None:
    """Raise InvalidDocument naming the first value of `column` whose type is not in `allowed` (exact: a bool
    is not an int)."""
    kinds = list(map(type, column))
    if not kinds or (kinds[0] in allowed and kinds.count(kinds[0]) == len(kinds)) or set(kinds) <= allowed:
        return  # the first test is the quick one: a column of one type (count compares by identity first)
    i = next(i for i, kind in enumerate(kinds) if kind not in allowed)
    raise InvalidDocument(f"{where.format(i)} is {show(column[i])}, expected {expected}")


def check_range(column: list[Any], low: int, high: int, where: str, expected: str) -> None:
    """Raise InvalidDocument naming the first integer of `column` outside low <= v < high (None is skipped)."""
    if not column:
        return
    try:
        smallest, largest = min(column), max(column)
        if smallest is None or largest is None:  # one value, None
            return
    except TypeError:  # None among them
        values = [v for v in column if v is not None]
        if not values:
            return
        smallest, largest = min(values), max(values)
    if smallest < low or largest >= high:
        i = next(i for i, v in enumerate(column) if v is not None and not low <= v < high)
        raise InvalidDocument(f"{where.format(i)} is {column[i]}, expected {expected}")


def check_numbers(values: list[Any], where: str) -> None:
    """Raise InvalidDocument for a non-finite float in `values`. Only for a document read from a
    file: on save, NaN and infinities are written as null (NOTE rule 5)."""
    if float in set(map(type, values)):
        bad = next((i for i, v in enumerate(values) if type(v) is float and not math.isfinite(v)), None)
        if bad is not None:
            raise InvalidDocument(f"{where.format(bad)} is {show(values[bad])}, expected a finite number")


def check_values(objects: list[dict[str, Any]], where: str, finite: bool = True) -> None:
    """The numbers among the values of many small objects (event data, tags), checked all at once:
    finite (when `finite`), and a field whose name ends in "bytes" 0 to 2**63-1 bytes or null."""
    if finite and float in set(map(type, itertools.chain.from_iterable(map(dict.values, objects)))):
        try:
            check_numbers(list(itertools.chain.from_iterable(map(dict.values, objects))), "{}")
        except InvalidDocument:  # name the object and the field
            for i, obj in enumerate(objects):
                for key, value in obj.items():
                    check_numbers([value], f"{where.format(i)}.{key}")
            raise
    for key in {k for k in set(itertools.chain.from_iterable(objects)) if type(k) is str and k.endswith("bytes")}:
        for i, obj in enumerate(objects):
            value = obj.get(key)
            if value is not None and (type(value) is not int or not 0 <= value < I63):
                raise InvalidDocument(f"{where.format(i)}.{key} is {show(value)}, expected {BYTES} or null")


def check_times(deltas: list[int], where: str) -> None:
    """Raise InvalidDocument unless every time the differences `deltas` add up to is 0 to 2**63-1 ns."""
    if not deltas:
        return
    if deltas[0] >= 0 and min(deltas) >= 0:  # counts up: the first is the least, the sum the most
        if sum(deltas) < I63:
            return
    times = list(itertools.accumulate(deltas))
    check_range(times, 0, I63, where, "a time in ns from 0 to 2**63-1")


def check_meta(meta: dict[str, Any]) -> None:
    if "sources" not in meta:
        return
    sources = meta["sources"]
    if type(sources) is not dict:
        raise InvalidDocument(f"field 'meta.sources' is {show(sources)}, expected an object of \"file:line\": "
                              "line of code")
    if len(sources) > MAX_SOURCE_SITES:
        raise InvalidDocument(f"field 'meta.sources' has {len(sources):,} lines, expected at most {MAX_SOURCE_SITES:,}")
    for site, line in sources.items():
        if len(site) > MAX_SITE_CHARS:
            raise InvalidDocument(f"meta.sources has a site of {len(site):,} characters, expected at most "
                                  f"{MAX_SITE_CHARS:,}")
        if type(line) is not str or len(line) > MAX_SOURCE_CHARS:
            raise InvalidDocument(f"meta.sources[{site[:60]!r}] is {show(line)}, expected a line of code of at most "
                                  f"{MAX_SOURCE_CHARS} characters")
