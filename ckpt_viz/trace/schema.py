"""The trace document: what a valid one holds, checked field by field.

Owns the layout of a trace file (the NOTE below, `FORMAT`, `SCHEMA_VERSION`) and its
validation: `check_document` raises `InvalidDocument` naming the first bad field.
Works on plain dicts and lists only: standard library, no json, no files, and never
torch. Turning a `Trace` into a document and back is `ckpt_viz.trace.document`;
bytes, gzip and files are `ckpt_viz.trace.io`. The names here are shared by those
two modules, not part of the package API.

NOTE [ Trace file format, schema 2 ]
  One JSON object. Events and memory samples are stored as columns, and event data by key
  (NOTE [ Packed columns ] in ckpt_viz.trace.packed), so that parsing a million-event trace
  makes a few long lists rather than a million small objects (benchmarks/bench_trace_io.py):
    {"format": "ckpt_viz.trace", "schema_version": 2,
     "meta":   {"model": ..., "mode": ..., "schedule": ..., "versions": {...}, "schema_version": 2},
     "events": {"count": N, "context_fields": ["kind", "mode", "phase", "site", "thread_id"],
                "tables":  {"context": [["tensor_packed", "nonreentrant", null, "train.py:12", 1403], ...],
                            "tags": [{}, {"stage": 0, "microbatch": 3}, ...]},
                "columns": {"seq": {"start": 0} or [N ints], "t_ns_delta": [N ints],
                            "context": RUNS of N indexes into tables.context, "handle_id": RUNS of int or null,
                            "session_id": RUNS of JSON scalars, "tags": RUNS of N indexes into tables.tags,
                            "data": {"keys": [[key, ...] per shape], "shape": "context" or RUNS of N indexes
                                     into keys, "values": [[[value per event of the shape] per key] per shape]}
                                    or [N objects]}},
     "memory": {"count": M,
                "columns": {"seq": {"start": 0} or [M ints], "t_ns_delta": [M ints],
                            "device_allocated": [int or null], "by_stage": null or [M objects]},
                "bytes_by_category": {"activations": [M ints, or null where not measured], ...}},
     "graphs": [{"seq": 12, "label": "after forward", "nodes": [{...}], "edges": [[src, dst], ...],
                 "torchviz": "digraph {...}" (optional)}]}
  RUNS is either the plain list or {"values": [...], "runs": [lengths adding up to N]}.
  1. "format" and "schema_version" come first, so `head -c 60 trace.json` identifies a file.
  2. A reader accepts every schema_version up to its own and refuses newer ones. Schema 1
     (written before the packed columns) is schema 2 with every RUNS a plain list and
     "data" the list of N objects; it is read, and checked, by the same code.
  3. seq {"start": s} means s, s+1, ...; t_ns_delta holds the first t_ns, then the
     differences (small numbers keep the file small); by_stage null means every
     sample's by_stage is empty.
  4. Ranges (checked on load and on save): seq, t_ns, handle_id and every byte count are
     integers from 0 to 2**63-1 (a graph's seq may be -1: taken before any event), and so
     is a data or tags field whose name ends in "bytes"; a thread_id fits in 64 bits
     unsigned; on load, the numbers in session_id and among the values of data and tags
     are finite. "meta.sources", when present, maps at most
     MAX_SOURCE_SITES sites ("file:line") to their line of code as it was when recorded, at
     most MAX_SOURCE_CHARS characters each (the app shows these, never the files).
  5. JSON has no tuples, no NaN and only string keys: a tuple comes back as a list,
     NaN and infinities are written as null, and int dict keys come back as strings
     (with or without orjson). An integer beyond 64 bits inside `data` comes back as
     a float when orjson reads the file.
"""
from __future__ import annotations

import itertools
from array import array
from collections import Counter
from typing import Any

from ckpt_viz.events import EVENT_KINDS, MODES, PHASES
from ckpt_viz.trace import fastcheck
from ckpt_viz.trace.lazy import JSONColumn
from ckpt_viz.trace.packed import check_data, check_runs, checked, unpack_runs
from ckpt_viz.trace.problems import TIP_REWRITE, TIP_SAVE, TIP_TRUNCATED, InvalidDocument, show
from ckpt_viz.trace.ranges import (
    BYTES,
    I63,
    MAX_EVENTS_ENV,
    MAX_SITE_CHARS,
    MAX_SOURCE_CHARS,
    MAX_SOURCE_SITES,
    check_meta,
    check_numbers,
    check_range,
    check_times,
    check_types,
    check_values,
)
from ckpt_viz.trace.types import CONTEXT_FIELDS, MEMORY_CATEGORIES, NODE_KINDS

__all__ = ["CONTEXT_TYPES", "FORMAT", "MAX_EVENTS_ENV", "MAX_SOURCE_CHARS", "MAX_SOURCE_SITES", "RUN_COLUMNS",
           "SCHEMA_VERSION", "TIP_REWRITE", "TIP_SAVE", "TIP_TRUNCATED", "InvalidDocument", "check_document",
           "check_numbers", "check_part", "check_range", "check_types", "show"]

FORMAT = "ckpt_viz.trace"
SCHEMA_VERSION = 2

_NONE = type(None)

# ---------------------------------------------------------------- validation
# Checks run over whole columns (the set of types, min and max); only when one
# fails is the column scanned again to name the first bad row.

def check_document(doc: Any, built_here: bool = False, max_events: int | None = None) -> None:
    """Raise InvalidDocument for the first problem.

    built_here: made by to_dict, so its indexes are right. max_events: refuse more events (or samples).
    """
    if not isinstance(doc, dict):
        raise InvalidDocument(f"it is not a ckpt_viz trace: the top level is {show(doc)}, not a JSON object")
    marker = doc.get("format")
    if marker != FORMAT:
        found = "has no \"format\" field" if "format" not in doc else f"has \"format\": {show(marker)}"
        raise InvalidDocument(f"it is not a ckpt_viz trace: it {found} (a trace has \"format\": \"{FORMAT}\")",
                       "open a file written by ckpt_viz.Trace.save; other JSON files are not traces")
    version = _get(doc, "schema_version", int, "an integer")
    if version > SCHEMA_VERSION:
        raise InvalidDocument(
            f"it was written by a newer ckpt_viz (schema_version {version}; this ckpt_viz reads up to "
            f"{SCHEMA_VERSION})",
            "upgrade ckpt_viz (pip install -U ckpt_viz), or record the run again with this version",
        )
    if version < 1:
        raise InvalidDocument(f"field 'schema_version' is {version}, expected 1 to {SCHEMA_VERSION}")
    check_meta(_get(doc, "meta", dict, "an object"))
    _check_events(_get(doc, "events", dict, "an object"), built_here, max_events, packed=version >= 2)
    _check_memory(_get(doc, "memory", dict, "an object"), built_here, max_events)
    _check_graphs(_get(doc, "graphs", list, "a list"))


def check_part(key: str, value: Any) -> None:
    """`check_document(doc, built_here=True)`'s checks of the one field `doc[key]` (as `document_parts` yields)."""
    if key == "meta":
        check_meta(_get({key: value}, key, dict, "an object"))
    elif key == "events":
        _check_events(_get({key: value}, key, dict, "an object"), True, None, packed=True)
    elif key == "memory":
        _check_memory(_get({key: value}, key, dict, "an object"), True, None)
    elif key == "graphs":
        _check_graphs(_get({key: value}, key, list, "a list"))


_EVENT_COLUMNS = ("seq", "t_ns_delta", "context", "handle_id", "session_id", "tags", "data")
RUN_COLUMNS = ("context", "handle_id", "session_id", "tags")  # may be stored as runs (schema 2)
CONTEXT_TYPES = {"kind": ({str}, "a string"), "mode": ({str, _NONE}, "a string or null"),
                  "phase": ({str, _NONE}, "a string or null"), "site": ({str, _NONE}, "a string or null"),
                  "thread_id": ({int}, "an integer")}
_SCALARS = {str, int, float, bool, _NONE}
_KNOWN = {"kind": EVENT_KINDS, "mode": (*MODES, None), "phase": (*PHASES, None)}


def _check_events(events: dict[str, Any], built_here: bool, max_events: int | None, packed: bool) -> None:
    count = _count(events, "events", max_events)
    fields = _get(events, "context_fields", list, "a list", "events.")
    if fields != list(CONTEXT_FIELDS):
        raise InvalidDocument(f"field 'events.context_fields' is {fields!r}, expected {list(CONTEXT_FIELDS)!r}")
    tables = _get(events, "tables", dict, "an object", "events.")
    contexts = _get(tables, "context", list, "a list", "events.tables.")
    tags = _get(tables, "tags", list, "a list", "events.tables.")
    if not fastcheck.kinds(tags, {dict}):
        check_types(tags, {dict}, "events.tables.tags[{}]", "an object")
    columns = _columns(events, "events", _EVENT_COLUMNS, count, (*RUN_COLUMNS, "data") if packed else ())
    _check_seq(columns["seq"], "events", count)
    for key in RUN_COLUMNS:  # NOTE [ Packed columns ] in ckpt_viz.trace.packed
        check_runs(columns[key], count, f"events.columns.{key}")
    data, context, per_context = columns["data"], columns["context"], None
    times_fine = fastcheck.times(columns["t_ns_delta"])  # NOTE [ Checks in C ] in ckpt_viz.trace.fastcheck
    if not built_here:  # to_dict already checked these, or built them right
        if not times_fine:
            check_types(columns["t_ns_delta"], {int}, "events[{}].t_ns (stored as t_ns_delta)", "an integer")
        if type(data) is list and not fastcheck.kinds(data, {dict}):
            check_types(data, {dict}, "events[{}].data", "an object")
        checked(columns["tags"], lambda column: _check_indexes(column, len(tags), "tags"))
        if type(context) is list:  # its counts serve the data stored by context as well (one pass, not two)
            per_context = _check_indexes(context, len(contexts), "context",
                                         counted=type(data) is dict and data.get("shape") == "context")
        else:
            checked(context, lambda column: _check_indexes(column, len(contexts), "context"))
    if not times_fine:
        _check_times(columns["t_ns_delta"], "events")
    checked(columns["handle_id"], lambda column: fastcheck.ints(column, 0, I63, none_ok=True) or (
        check_types(column, {int, _NONE}, "events[{}].handle_id", "an integer or null"),
        check_range(column, 0, I63, "events[{}].handle_id", "an id from 0 to 2**63-1")))
    checked(columns["session_id"], lambda column: fastcheck.kinds(column, _SCALARS) or check_types(
        column, _SCALARS, "events[{}].session_id", "a string, number, boolean or null"))
    if not built_here:  # on save, NaN and infinities become null
        checked(columns["session_id"], lambda column: fastcheck.finite(column) or check_numbers(
            column, "events[{}].session_id"))
    if type(data) is list:
        check_values(data, "events[{}].data", finite=not built_here)
    else:  # after the context indexes: packed data may be stored by context
        check_data(data, count, built_here, context, len(contexts), per_context)
    check_values(tags, "events.tables.tags[{}]", finite=not built_here)
    for entry, row in enumerate(contexts):
        _check_context(row, entry, columns["context"])


def _check_context(row: Any, entry: int, column: Any) -> None:
    def where(name: str) -> str:
        # Name the first event that uses this row; the table entry if none does.
        try:
            return f"events[{unpack_runs(column).index(entry)}].{name}"
        except ValueError:
            return f"events.tables.context[{entry}] ({name})"

    if type(row) not in (list, tuple) or len(row) != len(CONTEXT_FIELDS):
        raise InvalidDocument(f"events.tables.context[{entry}] is {show(row)}, expected a list of "
                       f"{len(CONTEXT_FIELDS)} values ({', '.join(CONTEXT_FIELDS)})")
    for name, value in zip(CONTEXT_FIELDS, row):
        types, expected = CONTEXT_TYPES[name]
        if type(value) not in types:
            raise InvalidDocument(f"{where(name)} is {show(value)}, expected {expected}")
        if name == "thread_id" and not 0 <= value < 2**64:
            raise InvalidDocument(f"{where(name)} is {show(value)}, expected a thread id from 0 to 2**64-1")
        if name == "site" and value is not None and len(value) > MAX_SITE_CHARS:
            raise InvalidDocument(f"{where(name)} is {show(value)}, expected at most {MAX_SITE_CHARS:,} characters")
        known = _KNOWN.get(name)
        if known is not None and value not in known:
            label = "event kind" if name == "kind" else name
            tip = ("this file may come from a newer ckpt_viz that has more event kinds; upgrade ckpt_viz"
                   if name == "kind" else TIP_REWRITE)
            raise InvalidDocument(f"{where(name)} is {show(value)}, an unknown {label} "
                           f"(known: {', '.join(str(k) for k in known)})", tip)


def _check_memory(memory: dict[str, Any], built_here: bool, max_events: int | None) -> None:
    count = _count(memory, "memory", max_events)
    columns = _columns(memory, "memory", ("seq", "t_ns_delta", "device_allocated"), count)
    _check_seq(columns["seq"], "memory", count)
    if not fastcheck.times(columns["t_ns_delta"]):  # NOTE [ Checks in C ] in ckpt_viz.trace.fastcheck
        if not built_here:  # to_dict checked t_ns before taking differences
            check_types(columns["t_ns_delta"], {int}, "memory[{}].t_ns (stored as t_ns_delta)", "an integer")
        _check_times(columns["t_ns_delta"], "memory")
    if not fastcheck.ints(columns["device_allocated"], 0, I63, none_ok=True):
        check_types(columns["device_allocated"], {int, _NONE}, "memory[{}].device_allocated", "an integer or null")
        _check_bytes(columns["device_allocated"], "memory[{}].device_allocated")
    by_category = _get(memory, "bytes_by_category", dict, "an object", "memory.")
    for category, column in by_category.items():
        if category not in MEMORY_CATEGORIES:
            raise InvalidDocument(f"memory.bytes_by_category has an unknown category {show(category)} "
                           f"(known: {', '.join(MEMORY_CATEGORIES)})")
        _get(by_category, category, list, "a list", "memory.bytes_by_category.")
        _check_length(column, count, f"memory.bytes_by_category.{category}", "memory.count")
        if not fastcheck.ints(column, 0, I63, none_ok=True):
            where = f"memory[{{}}].bytes_by_category.{category}"
            check_types(column, {int, _NONE}, where, "an integer of 0 or more, or null")
            _check_bytes(column, where)
    stages = _get(columns, "by_stage", (list, _NONE, JSONColumn), "null or a list", "memory.columns.")  # JSONColumn:
    # NOTE [ Checks in C ], rule 5
    if stages is not None:
        _check_length(stages, count, "memory.columns.by_stage", "memory.count")
        if not fastcheck.by_stage(stages, _CATEGORIES):
            check_types(stages, {dict}, "memory[{}].by_stage", "an object")
            for start in range(0, len(stages), _STAGE_PIECE):  # a piece's dicts stay in the CPU cache across passes
                _check_by_stage(stages[start:start + _STAGE_PIECE], start)


_STAGE_PIECE = 2048
_CATEGORIES = set(MEMORY_CATEGORIES)


def _check_bytes(column: list[Any], where: str) -> None:
    # check_range(column, 0, I63, ...) of ints and None (types checked), the range read off the distinct values:
    # byte counts repeat (parameters, a constant category, the nulls of one not measured).
    distinct = set(column)
    distinct.discard(None)
    if distinct and (min(distinct) < 0 or max(distinct) >= I63):
        check_range(column, 0, I63, where, BYTES)


def _check_by_stage(stages: list[dict[str, Any]], first: int = 0) -> None:
    # Vectorized over the samples `first`, first + 1, ...; the slow scan below runs only to name a bad one.
    readings = list(itertools.chain.from_iterable(map(dict.values, stages)))
    values = list(itertools.chain.from_iterable(map(dict.values, readings))) if set(map(type, readings)) <= {
        dict} else None
    if (values is not None and set(map(type, values)) <= {int}
            and (not values or (min(values) >= 0 and max(values) < I63))
            and set().union(*readings) <= set(MEMORY_CATEGORIES)):
        return
    for i, per_stage in enumerate(stages, first):
        for stage, reading in per_stage.items():
            where = f"memory[{i}].by_stage[{stage!r}]"
            if type(reading) is not dict:
                raise InvalidDocument(f"{where} is {show(reading)}, expected an object of bytes by category")
            for category, nbytes in reading.items():
                if category not in MEMORY_CATEGORIES or type(nbytes) is not int or not 0 <= nbytes < I63:
                    raise InvalidDocument(f"{where} has {category!r}: {show(nbytes)}, expected a category of "
                                   f"{', '.join(MEMORY_CATEGORIES)} with 0 to 2**63-1 bytes")


_NODE_FIELDS = (("id", {int, str}, "an integer or string"), ("name", {str}, "a string"),
                ("kind", {str}, "a string"), ("handle_id", {int, _NONE}, "an integer or null"),
                ("dx_reached", {bool}, "true or false"), ("dw_reached", {bool}, "true or false"),
                ("shape", {list, tuple, _NONE}, "a list of integers or null"))


def _check_graphs(graphs: list[Any]) -> None:
    for g, graph in enumerate(graphs):
        at = f"graphs[{g}]"
        if type(graph) is not dict:
            raise InvalidDocument(f"{at} is {show(graph)}, expected an object")
        if not -1 <= _get(graph, "seq", int, "an integer", f"{at}.") < I63:
            raise InvalidDocument(f"{at}.seq is {show(graph['seq'])}, expected -1 to 2**63-1")
        _get(graph, "label", str, "a string", f"{at}.")
        if graph.get("torchviz") is not None:  # optional: make_dot's DOT source, absent in older traces
            _get(graph, "torchviz", str, "a string or null", f"{at}.")
        nodes = _get(graph, "nodes", list, "a list", f"{at}.")
        edges = _get(graph, "edges", (list, tuple), "a list of [src, dst] pairs", f"{at}.")
        ids = set()
        for n, node in enumerate(nodes):
            where = f"{at}.nodes[{n}]"
            if type(node) is not dict:
                raise InvalidDocument(f"{where} is {show(node)}, expected an object")
            for key, types, expected in _NODE_FIELDS:
                if key not in node:
                    raise InvalidDocument(f"field '{where}.{key}' is missing")
                if type(node[key]) not in types:
                    raise InvalidDocument(f"{where}.{key} is {show(node[key])}, expected {expected}")
            if node["kind"] not in NODE_KINDS:
                raise InvalidDocument(f"{where}.kind is {show(node['kind'])}, an unknown node kind "
                               f"(known: {', '.join(NODE_KINDS)})")
            if node["shape"] is not None and not all(type(d) is int and 0 <= d < I63 for d in node["shape"]):
                raise InvalidDocument(f"{where}.shape is {show(node['shape'])}, expected a list of integers or null")
            ids.add(node["id"])
        for e, edge in enumerate(edges):
            if type(edge) not in (list, tuple) or len(edge) != 2:
                raise InvalidDocument(f"{at}.edges[{e}] is {show(edge)}, expected a [src, dst] pair")
            for end in edge:
                if type(end) not in (int, str) or end not in ids:
                    raise InvalidDocument(f"{at}.edges[{e}] refers to node {end!r}, which is not in {at}.nodes")


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], expected: str, prefix: str = "") -> Any:
    if key not in obj:
        raise InvalidDocument(f"field '{prefix}{key}' is missing")
    value = obj[key]
    if type(value) not in (kind if isinstance(kind, tuple) else (kind,)):  # exact: a bool is not an integer
        raise InvalidDocument(f"field '{prefix}{key}' is {show(value)}, expected {expected}")
    return value


def _count(part: dict[str, Any], name: str, max_events: int | None = None) -> int:
    count = _get(part, "count", int, "an integer", f"{name}.")
    if count < 0:
        raise InvalidDocument(f"field '{name}.count' is {count}, expected 0 or more")
    if max_events is not None and count > max_events:
        what = "events" if name == "events" else "memory samples"
        raise InvalidDocument(f"it holds {count:,} {what}, over the cap of {max_events:,}",
                              "if the file is a real trace, pass a larger max_events to ckpt_viz.Trace.load or "
                              f"set the environment variable {MAX_EVENTS_ENV}; otherwise record fewer steps")
    return count


def _columns(part: dict[str, Any], name: str, required: tuple[str, ...], count: int,
             packed: tuple[str, ...] = ()) -> dict[str, Any]:
    columns = _get(part, "columns", dict, "an object", f"{name}.")
    for key in required:
        kinds = (list, dict) if key == "seq" or key in packed else (list, array) if key == "t_ns_delta" else list
        column = _get(columns, key, kinds, "a list", f"{name}.columns.")  # array: NOTE [ Checks in C ], rule 4
        if type(column) is not dict:
            _check_length(column, count, f"{name}.columns.{key}", f"{name}.count")
    return columns


def _check_seq(seq: Any, name: str, count: int) -> None:
    if type(seq) is dict:
        start = _get(seq, "start", int, "an integer", f"{name}.columns.seq.")
        if not 0 <= start < I63 - count:
            raise InvalidDocument(f"field '{name}.columns.seq.start' is {start}, expected 0 to 2**63-1 less the count")
    elif not fastcheck.ints(seq, 0, I63):
        check_types(seq, {int}, f"{name}[{{}}].seq", "an integer")
        check_range(seq, 0, I63, f"{name}[{{}}].seq", "a seq from 0 to 2**63-1")


def _check_times(deltas: list[int], name: str) -> None:
    check_times(deltas, f"{name}[{{}}].t_ns")


def _check_length(column: list[Any], count: int, name: str, count_name: str) -> None:
    if len(column) != count:
        raise InvalidDocument(f"field '{name}' has {len(column)} values but {count_name} is {count}")


def _check_indexes(column: list[Any], size: int, name: str, counted: bool = False) -> Counter[int] | None:
    # Every value an int from 0 to size - 1; the range is read off the distinct values (at most `size` of them
    # when valid: a set is built faster than min and max compare a million ints). counted: return their counts
    # (a Counter, or from C a list of size counts: either gives the count of index k as [k]).
    if counted:
        fast = fastcheck.index_counts(column, size)
        if fast is not None:
            return fast  # type: ignore[return-value]
    elif fastcheck.ints(column, 0, size):
        return None
    check_types(column, {int}, f"events[{{}}].{name}", f"an index into events.tables.{name}")
    distinct: Any = None
    if counted:
        distinct = Counter(column)
    elif size * 4 < len(column):
        distinct = set(column)
    values = distinct if distinct is not None else column
    if values and (min(values) < 0 or max(values) >= size):
        i = next(i for i, v in enumerate(column) if not 0 <= v < size)
        raise InvalidDocument(f"events[{i}].{name} is {column[i]}, but events.tables.{name} has {size} entries")
    return distinct if counted else None
