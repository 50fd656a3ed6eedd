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
  4. Parsing makes a Python int of each of the million t_ns differences (a fifth of the parse).
     `split_times` reads events.columns.t_ns_delta in C into an array('q') instead and hands the
     JSON parser the rest of the text, with a placeholder there that no file can hold (a random
     string per load). Only the text before the column is scanned (its strings and nesting); the
     column must be a JSON array of integers that fit in 64 bits, and after the parse the
     placeholder must be what the document holds at events.columns.t_ns_delta (not so if a key
     repeats): otherwise, and whenever the document is then refused, `ckpt_viz.trace.io` parses the
     file as it is, so what a file is or which error it gets never depends on this. A loaded trace's
     `Times` keeps the array (NOTE [ Rows stored as columns ], rule 5).
"""
from __future__ import annotations

import os
from array import array
from pathlib import Path
from types import ModuleType
from typing import Any

from ckpt_viz.cext import extension

__all__ = ["by_stage", "finite", "index_counts", "ints", "kinds", "runs", "split_times", "times", "unpack"]

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
    return c is not None and type(column) is list and -I63 <= low and high <= I63 and c.ints(
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


def split_times(text: bytes) -> tuple[bytes, array, str] | None:
    """(the text with events.columns.t_ns_delta replaced by a placeholder, that column, the placeholder), or None
    (no C module, or not sure: NOTE rule 4)."""
    c = _c()
    if c is None:
        return None
    placeholder = f"ckpt_viz t_ns_delta {os.urandom(16).hex()}"
    found = c.split_times(text, f'"{placeholder}"'.encode("ascii"))
    if found is None:
        return None
    rest, values = found
    deltas = array("q")
    deltas.frombytes(values)
    return rest, deltas, placeholder


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
    c = _c()
    return c is not None and type(stages) is list and c.by_stage(stages, categories)
