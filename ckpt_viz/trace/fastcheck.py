"""The checks of a trace document's long columns in one C pass each, when the C speed-up is built.

Each function here answers True only when the Python check that follows it in `ckpt_viz.trace.schema`
or `ckpt_viz.trace.packed` would pass, and False otherwise (or without the C module), so the caller
writes `if not fastcheck.ints(column, ...): check_types(...); check_range(...)`. Standard library
only (the C source is `csrc/load_checks.c`, built by `ckpt_viz.cext`).

NOTE [ Checks in C ]
  1. A load checks every value of a million-event trace: the Python checks make a few C-level passes
     per column (the set of types, min and max, a Counter), about 0.2 s for 1M events; one C pass per
     column reads each value once (about 0.02 s).
  2. C never decides that something is wrong, and never words an error: on anything it is not sure
     of (a value out of range, a float, a type it does not expect) it says False and the Python check
     runs, as it did before, and raises its own message naming the first bad value, or passes. So
     every message, and which problem of several is named first, is the Python path's.
  3. The C module is built on first use, not at import (`import ckpt_viz` builds nothing); without a
     compiler, or with CKPT_VIZ_CEXT=0, every function here is False and the Python checks do all.
     Tests run every corrupt file both ways and compare the messages (tests/trace/test_load_checks.py).
  4. Parsing makes a Python int of each of the million t_ns differences (a fifth of the parse) and
     reads a million context indexes (a tenth). `split_text` reads both columns in C instead (t_ns into
     an array('q'), which a loaded trace's `Times` keeps, NOTE [ Rows stored as columns ], rule 5; the
     context indexes into the list the parser would make) and hands the JSON parser the rest of the
     text, with a placeholder in their place that no file can hold (a random string per load). Only
     the text up to events.columns and through it is scanned (its strings and nesting); a column must
     be a JSON array of integers that fit in 64 bits, and after the parse each placeholder must be what
     the document holds at its place (not so if a key repeats): otherwise, and whenever the document
     is then refused, `ckpt_viz.trace.io` parses the file as it is, so what a file is or which error it
     gets never depends on this.
  5. No view of the first page reads memory.columns.by_stage (62,500 small dicts for 1M events, a
     tenth of the parse). `split_text` cuts it out as well, where its text is an array of
     {stage: {category: int}} objects with stage names of plain printable ASCII (no escapes),
     categories spelled as MEMORY_CATEGORIES and ints of 0 to 2**63-1: exactly what the Python checks
     pass, in a form any JSON parser reads to the same objects. The trace keeps that text as a
     `ckpt_viz.trace.lazy.JSONColumn`, parsed when a sample is first read (or the trace saved);
     otherwise the parser reads it as usual, under the same placeholder rule as rule 4.
  6. memory.bytes_by_category (seven lists of byte counts per sample, a sixth of what is left to parse)
     is cut out and read in C as well, where it is an object of plain names to lists of 64-bit ints and
     nulls: the same dict of lists, but an int equal to the one before it in its list is the same
     object (a category that does not change costs one int, not one per sample). Then checked as usual.
"""
from __future__ import annotations

import itertools
import os
from array import array
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ckpt_viz.cext import extension
from ckpt_viz.trace.lazy import JSONColumn
from ckpt_viz.trace.types import MEMORY_CATEGORIES

__all__ = ["by_stage", "finite", "index_counts", "ints", "kinds", "runs", "split_text", "times", "unpack"]

I63 = 2**63

_SOURCE = Path(__file__).with_name("csrc") / "load_checks.c"
_NOT_BUILT: Any = object()
_C: Any = _NOT_BUILT  # None: no C module (tests set it so to run the Python checks alone)


def _c() -> ModuleType | None:
    global _C
    if _C is _NOT_BUILT:
        _C = extension(_SOURCE)
    return _C


def ints(column: Any, low: int, high: int, none_ok: bool = False) -> bool:
    """Every item an int with low <= v < high (or None when `none_ok`): check_types, then check_range."""
    c = _c()
    return c is not None and type(column) is list and -I63 <= low < I63 and -I63 < high <= I63 and c.ints(
        column, low, high - 1, none_ok)


def index_counts(column: Any, size: int) -> list[int] | None:
    """How often each index 0 .. size - 1 occurs; None unless every item is an int from 0 to size - 1."""
    c = _c()
    return c.index_counts(column, size) if c is not None and type(column) is list and 0 <= size < I63 else None


def times(deltas: Any) -> bool:
    """Every item an int of 0 or more, adding up to less than 2**63 (check_times' quick test, types included)."""
    c = _c()
    return c is not None and type(deltas) in (list, array) and c.times(deltas)


def unpack(values: Any, runs: Any) -> list[Any] | None:
    """`values[i]` repeated `runs[i]` times, as one list (`packed.unpack_runs`); None: not sure."""
    c = _c()
    return c.unpack(values, runs) if c is not None and type(values) is list and type(runs) is list else None


def split_text(text: bytes, loads: Callable[[bytes], Any]) -> tuple[bytes, dict[tuple[str, ...], Any]] | None:
    """(the text with the columns of NOTE rules 4 to 6 cut out, {path: (placeholder, the column read in C)}),
    or None: no C module, or none found in the form those rules need."""
    c = _c()
    if c is None:
        return None
    cuts = []  # (start, stop, path, column)
    for name, (start, stop, values) in c.find_ints(text).items():
        if name == "t_ns_delta":  # kept as int64s (rule 4)
            column: Any = array("q")
            column.frombytes(values)
        else:  # the context indexes: a list, as the parser makes it (its small ints are shared objects)
            column = c.int_list(values)
        cuts.append((start, stop, ("events", "columns", name), column))
    at = text.rfind(b'"by_stage"')
    stages = c.find_stages(text, at, _CATEGORY_BYTES) if at >= 0 else None
    if stages is not None:
        start, stop, count = stages
        cuts.append((start, stop, ("memory", "columns", "by_stage"),
                     JSONColumn(text[start:stop], count, loads, checked=True)))
    at = text.rfind(b'"bytes_by_category"')
    by_category = c.find_categories(text, at) if at >= 0 else None
    if by_category is not None:  # rule 6
        start, stop, columns = by_category
        cuts.append((start, stop, ("memory", "bytes_by_category"), columns))
    cuts.sort(key=lambda cut: cut[0])
    if not cuts or any(a[1] > b[0] for a, b in itertools.pairwise(cuts)):  # none, or overlapping: not sure
        return None
    view, pieces, placed, done = memoryview(text), [], {}, 0
    for start, stop, path, column in cuts:
        placeholder = f"ckpt_viz {path[-1]} {os.urandom(16).hex()}"
        pieces += [view[done:start], f'"{placeholder}"'.encode("ascii")]
        placed[path] = (placeholder, column)
        done = stop
    pieces.append(view[done:])
    return b"".join(pieces), placed


def runs(lengths: Any, count: int) -> bool:
    """Every item an int from 1 to `count`, adding up to `count`."""
    c = _c()
    return c is not None and type(lengths) is list and c.runs(lengths, count)


_KIND_BITS = {int: "INT", type(None): "NONE", str: "STR", bool: "BOOL", float: "FLOAT", dict: "DICT", list: "LIST"}


def kinds(column: Any, allowed: set[type]) -> bool:
    """Every item of an exact type in `allowed` (a float also finite): check_types (and check_numbers)."""
    c = _c()
    if c is None or type(column) is not list or not allowed <= _KIND_BITS.keys():
        return False
    return c.kinds(column, sum(getattr(c, _KIND_BITS[t]) for t in allowed))


def finite(column: Any) -> bool:
    """No item is a NaN or infinite float: check_numbers."""
    c = _c()
    return c is not None and type(column) is list and c.finite(column)


def by_stage(stages: Any, categories: set[str]) -> bool:
    """Every item a dict of {category in `categories`: int from 0 to 2**63-1} dicts."""
    if type(stages) is JSONColumn and stages._list is None:  # its text was checked when it was cut out (rule 5)
        return stages.checked and categories == set(MEMORY_CATEGORIES)
    c = _c()
    # Exact strings only: the C's set lookups then run no Python (an __eq__ could change the dicts it walks).
    return c is not None and type(stages) is list and all(type(k) is str for k in categories) and c.by_stage(
        stages, categories)


_CATEGORY_BYTES = tuple(c.encode("ascii") for c in MEMORY_CATEGORIES)
