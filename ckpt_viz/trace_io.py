"""Trace files: `save` and `load` a `Trace` as JSON, gzip-compressed when the name ends in ".gz".

Owns the file format and its validation. Standard library only; never pickle: a
trace file is plain JSON that `json.load` reads.

NOTE [ Trace file format, schema 1 ]
  One JSON object. Events are stored as columns so that a million-event trace saves
  and loads in about a second with the stdlib `json` (see benchmarks/bench_trace_io.py):
    {"format": "ckpt_viz.trace", "schema_version": 1,
     "meta":   {"model": ..., "mode": ..., "schedule": ..., "versions": {...}, "schema_version": 1},
     "events": {"count": N,
                "tables":  {"kind": ["handle_created", ...], "mode": [null, "reentrant"], "phase": [...],
                            "site": [...], "thread_id": [...], "tags": [{}, {"stage": 0}]},
                "columns": {"seq": [N ints], "t_ns": [...], "kind": [N indexes into tables.kind],
                            "handle_id": [int or null], "mode": [index], "phase": [index],
                            "session_id": [JSON scalar], "tags": [index], "site": [index],
                            "thread_id": [index], "data": [N objects]}},
     "memory": {"count": M, "columns": {"seq": [...], "t_ns": [...], "device_allocated": [int or null]},
                "bytes_by_category": {"activations": [M ints or null (not measured)], ...}},
     "graphs": [{"seq": 12, "label": "after forward", "nodes": [{...}], "edges": [[src, dst], ...]}]}
  1. "format" and "schema_version" come first, so `head -c 60 trace.json` identifies a file.
  2. A reader accepts every schema_version up to its own and refuses newer ones.
  3. JSON has no tuples: a tuple inside `data`, `tags`, a node's shape or an edge comes
     back as a list. Non-string dict keys come back as strings (JSON object keys).

NOTE [ Atomic save ]
  1. The whole file is encoded in memory first; a value that is not JSON fails
     there, before anything touches the disk.
  2. The bytes go to a temporary file in the target's folder, which is flushed,
     fsync-ed and then renamed over the target with os.replace (atomic on POSIX
     and Windows). A crash leaves either the old file or the new one, never half
     of one; a failure removes the temporary file.
"""
from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import stat
import tempfile
import zlib
from os import PathLike
from typing import Any, Iterator, Mapping, NoReturn

from ckpt_viz.errors import TraceError
from ckpt_viz.events import EVENT_KINDS, MODES, PHASES, Event
from ckpt_viz.trace import (
    EVENT_FIELDS,
    INTERNED_FIELDS,
    MEMORY_CATEGORIES,
    NODE_KINDS,
    EventColumns,
    GraphSnapshot,
    MemorySample,
    Trace,
)

__all__ = ["FORMAT", "SCHEMA_VERSION", "from_dict", "load", "package_version", "save", "to_dict"]

FORMAT = "ckpt_viz.trace"
SCHEMA_VERSION = 1
GZIP_LEVEL = 1  # level 1 is ~4x faster than 9 and within ~25% of its size on traces

_NONE = type(None)
_TIP_REWRITE = (
    "the file was not written by ckpt_viz.Trace.save, or was edited; record the run again, "
    "or restore the file from a copy"
)
_TIP_TRUNCATED = (
    "the file was cut short (an interrupted copy or download, or a full disk); copy it again or record "
    "the run again. Trace.save itself writes atomically, so a file it finished is never cut short"
)


class _Invalid(Exception):
    """One thing wrong with a trace document: `what` happened, `tip` says what to do."""

    def __init__(self, what: str, tip: str = _TIP_REWRITE) -> None:
        super().__init__(what)
        self.what = what
        self.tip = tip


# ---------------------------------------------------------------- save

def save(trace: Trace, path: str | PathLike[str]) -> None:
    """Write `trace` to `path` as JSON (gzip if the name ends with ".gz"), atomically.

    See NOTE [ Atomic save ].

    Raises:
        TraceError: the trace holds a value a trace file cannot; nothing is written.
        OSError: the folder is missing or not writable; an existing file is untouched.
    """
    name = os.fspath(path)
    api = f"ckpt_viz.Trace.save: cannot save to '{name}'"
    with _gc_paused():
        try:
            doc = to_dict(trace)
            _check_document(doc)
            payload = _encode(doc)
        except _Invalid as bad:
            raise TraceError(f"{api}: {bad.what}.\nTip: {bad.tip}.") from None
    if name.endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=GZIP_LEVEL, mtime=0)
    _write_atomically(name, payload)


def to_dict(trace: Trace) -> dict[str, Any]:
    """The JSON document of `trace` (see NOTE [ Trace file format, schema 1 ]); shares lists with it."""
    events = trace.events
    if not (isinstance(events, EventColumns) and not events.materialized):
        events = list(events)
        if not set(map(type, events)) <= {Event}:
            i = next(i for i, e in enumerate(events) if type(e) is not Event)
            raise _Invalid(f"events[{i}] is {_show(events[i])}, not a ckpt_viz.events.Event")
        events = EventColumns.from_events(events)
    tables = dict(events.tables)
    tables["tags"] = [_plain_dict(t) for t in tables["tags"]]
    columns = dict(events.columns)
    if not set(map(type, columns["data"])) <= {dict}:
        columns["data"] = [_plain_dict(d) for d in columns["data"]]
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "meta": trace.meta,
        "events": {"count": len(columns["seq"]), "tables": tables, "columns": columns},
        "memory": _memory_to_dict(trace.memory),
        "graphs": [
            {"seq": g.seq, "label": g.label, "nodes": g.nodes, "edges": g.edges} if isinstance(g, GraphSnapshot)
            else g for g in trace.graphs
        ],
    }


def _memory_to_dict(samples: list[MemorySample]) -> dict[str, Any]:
    for i, sample in enumerate(samples):
        if not isinstance(sample, MemorySample):
            raise _Invalid(f"memory[{i}] is {_show(sample)}, not a ckpt_viz.trace.MemorySample")
    present = dict.fromkeys(c for s in samples for c in s.bytes_by_category)
    return {
        "count": len(samples),
        "columns": {
            "seq": [s.seq for s in samples],
            "t_ns": [s.t_ns for s in samples],
            "device_allocated": [s.device_allocated for s in samples],
        },
        "bytes_by_category": {c: [s.bytes_by_category.get(c) for s in samples] for c in present},
    }


def _plain_dict(value: Any) -> Any:
    if type(value) is not dict and isinstance(value, Mapping):
        return dict(value)
    return value


def _encode(doc: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(doc, ensure_ascii=True, allow_nan=False, check_circular=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as err:
        where = _locate_unencodable(doc)
        raise _Invalid(
            f"{where} cannot be written as JSON ({err})",
            "keep event data, tags, meta and graph nodes to str, int, float (finite), bool, None, "
            "lists and dicts with str keys; convert other values (dtypes, devices, tensors) with str()",
        ) from None
    return text.encode("ascii")


def _locate_unencodable(doc: dict[str, Any]) -> str:
    # Only on the error path: find the first value json.dumps refuses, by walking down.
    def bad(value: Any) -> bool:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return True
        return False

    def walk(value: Any, where: str) -> str:
        if isinstance(value, dict):
            for key, item in value.items():
                if bad(item):
                    return walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if bad(item):
                    return walk(item, f"{where}[{i}]")
        return f"{where} ({_show(value)})"

    events = doc["events"]
    for name, column in events["columns"].items():
        if bad(column):
            i = next(i for i, v in enumerate(column) if bad(v))
            return walk(column[i], f"events[{i}].{name}")
    for name, table in events["tables"].items():
        if bad(table):
            return walk(table, f"the {name} of an event")
    return walk({k: v for k, v in doc.items() if k != "events"}, "")


def _write_atomically(name: str, payload: bytes) -> None:
    folder = os.path.dirname(os.path.abspath(name))
    mode = _file_mode(name)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(name)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def _file_mode(name: str) -> int:
    try:
        return stat.S_IMODE(os.stat(name).st_mode)
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable on POSIX; not possible (or needed) everywhere.
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------- load

def load(path: str | PathLike[str]) -> Trace:
    """Read a trace file written by `save`; gzip is detected from the content.

    Raises:
        TraceError: the file is missing, empty, truncated, not JSON, not a trace,
            written by a newer ckpt_viz, or has a missing or ill-typed field.
    """
    name = os.fspath(path)
    api = f"ckpt_viz.Trace.load: cannot read '{name}'"

    def fail(what: str, tip: str = _TIP_REWRITE) -> NoReturn:
        raise TraceError(f"{api}: {what}.\nTip: {tip}.")

    try:
        with open(name, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        fail("no such file", "check the path; ckpt_viz.Trace.save(path) writes a trace file")
    except IsADirectoryError:
        fail("it is a folder, not a file", "pass the path of a trace file inside it")
    with _gc_paused():
        return _parse(raw, fail)


def _parse(raw: bytes, fail: Any) -> Trace:
    if not raw:
        fail("the file is empty (0 bytes)", "the save that wrote it did not finish; record the run again")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            fail("the gzip data is truncated (the file ends before the end of the compressed stream)",
                 _TIP_TRUNCATED)
        except (OSError, zlib.error) as err:
            fail(f"it is not a valid gzip file, or it is corrupt ({err})", _TIP_REWRITE)
        if not raw:
            fail("the file is empty (a gzip file holding 0 bytes)", "record the run again")
    if raw[:1] == b"\x80":
        fail("it looks like a Python pickle, not JSON; ckpt_viz never unpickles files",
             "trace files are JSON; write one with ckpt_viz.Trace.save(path)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fail(f"it is not valid JSON: not UTF-8 text (byte {err.start})", _TIP_REWRITE)
    if not text.strip():
        fail("the file is empty (only whitespace)", "the save that wrote it did not finish; record the run again")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        if err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string"):
            fail(f"the JSON is truncated: it ends early ({err.msg} at line {err.lineno}, column {err.colno})",
                 _TIP_TRUNCATED)
        fail(f"it is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})", _TIP_REWRITE)
    except (ValueError, RecursionError) as err:
        fail(f"it is not valid JSON ({err})", _TIP_REWRITE)
    try:
        _check_document(doc)
    except _Invalid as bad:
        fail(bad.what, bad.tip)
    return _build(doc)


def from_dict(doc: Any) -> Trace:
    """Validate a trace document (as `to_dict` returns and `json.load` reads) and build the Trace.

    Raises:
        TraceError: the document is not a trace, is too new, or has a missing or ill-typed field.
    """
    try:
        _check_document(doc)
    except _Invalid as bad:
        raise TraceError(f"ckpt_viz.Trace.from_dict: cannot read the trace: {bad.what}.\nTip: {bad.tip}.") from None
    return _build(doc)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not standard JSON")


def _build(doc: dict[str, Any]) -> Trace:
    events = doc["events"]
    memory = doc["memory"]
    mem_cols = memory["columns"]
    by_cat = memory["bytes_by_category"]
    samples = [
        MemorySample(
            seq=mem_cols["seq"][i],
            t_ns=mem_cols["t_ns"][i],
            bytes_by_category={c: col[i] for c, col in by_cat.items() if col[i] is not None},
            device_allocated=mem_cols["device_allocated"][i],
        )
        for i in range(memory["count"])
    ]
    graphs = [GraphSnapshot(seq=g["seq"], label=g["label"], nodes=g["nodes"], edges=g["edges"])
              for g in doc["graphs"]]
    return Trace(events=EventColumns(events["columns"], events["tables"]), memory=samples, graphs=graphs,
                 meta=doc["meta"])


# ---------------------------------------------------------------- validation
# Checks run over whole columns (set of types, min and max); only when one fails
# is the column scanned again to name the first bad event.

def _check_document(doc: Any) -> None:
    if not isinstance(doc, dict):
        raise _Invalid(f"it is not a ckpt_viz trace: the top level is {_show(doc)}, not a JSON object")
    marker = doc.get("format")
    if marker != FORMAT:
        found = "has no \"format\" field" if "format" not in doc else f"has \"format\": {_show(marker)}"
        raise _Invalid(f"it is not a ckpt_viz trace: it {found} (a trace has \"format\": \"{FORMAT}\")",
                       "open a file written by ckpt_viz.Trace.save; other JSON files are not traces")
    version = _get(doc, "schema_version", int, "an integer")
    if version > SCHEMA_VERSION:
        raise _Invalid(
            f"it was written by a newer ckpt_viz (schema_version {version}; this ckpt_viz reads up to "
            f"{SCHEMA_VERSION})",
            "upgrade ckpt_viz (pip install -U ckpt_viz), or record the run again with this version",
        )
    if version < 1:
        raise _Invalid(f"field 'schema_version' is {version}, expected 1 to {SCHEMA_VERSION}")
    _get(doc, "meta", dict, "an object")
    _check_events(_get(doc, "events", dict, "an object"))
    _check_memory(_get(doc, "memory", dict, "an object"))
    _check_graphs(_get(doc, "graphs", list, "a list"))


def _check_events(events: dict[str, Any]) -> None:
    count = _get(events, "count", int, "an integer", "events.")
    if count < 0:
        raise _Invalid(f"field 'events.count' is {count}, expected 0 or more")
    tables = _get(events, "tables", dict, "an object", "events.")
    columns = _get(events, "columns", dict, "an object", "events.")
    table_types = {"kind": {str}, "mode": {str, _NONE}, "phase": {str, _NONE}, "site": {str, _NONE},
                   "thread_id": {int}, "tags": {dict}}
    for name in INTERNED_FIELDS:
        table = _get(tables, name, list, "a list", "events.tables.")
        _check_types(table, table_types[name], f"events.tables.{name}[{{}}]", _expected(table_types[name]))
    for name in EVENT_FIELDS:
        column = _get(columns, name, list, "a list", "events.columns.")
        if len(column) != count:
            raise _Invalid(f"field 'events.columns.{name}' has {len(column)} values but events.count is {count}")
    _check_types(columns["seq"], {int}, "events[{}].seq", "an integer")
    _check_types(columns["t_ns"], {int}, "events[{}].t_ns", "an integer")
    _check_types(columns["handle_id"], {int, _NONE}, "events[{}].handle_id", "an integer or null")
    _check_types(columns["session_id"], {str, int, float, bool, _NONE}, "events[{}].session_id",
                 "a string, number, boolean or null")
    _check_types(columns["data"], {dict}, "events[{}].data", "an object")
    for name in INTERNED_FIELDS:
        _check_indexes(columns[name], len(tables[name]), name)
    allowed = {"kind": EVENT_KINDS, "mode": (*MODES, None), "phase": (*PHASES, None)}
    for name, known in allowed.items():
        for entry, value in enumerate(tables[name]):
            if value not in known:
                used = columns[name].index(entry) if entry in columns[name] else None
                where = f"events[{used}].{name}" if used is not None else f"events.tables.{name}[{entry}]"
                label = "event kind" if name == "kind" else name
                tip = ("this file may come from a newer ckpt_viz that has more event kinds; upgrade ckpt_viz"
                       if name == "kind" else _TIP_REWRITE)
                raise _Invalid(f"{where} is {_show(value)}, an unknown {label} (known: "
                               f"{', '.join(str(k) for k in known)})", tip)


def _check_memory(memory: dict[str, Any]) -> None:
    count = _get(memory, "count", int, "an integer", "memory.")
    columns = _get(memory, "columns", dict, "an object", "memory.")
    by_cat = _get(memory, "bytes_by_category", dict, "an object", "memory.")
    for name, types, expected in (("seq", {int}, "an integer"), ("t_ns", {int}, "an integer"),
                                  ("device_allocated", {int, _NONE}, "an integer or null")):
        column = _get(columns, name, list, "a list", "memory.columns.")
        _check_length(column, count, f"memory.columns.{name}", "memory.count")
        _check_types(column, types, f"memory[{{}}].{name}", expected)
    for category, column in by_cat.items():
        if category not in MEMORY_CATEGORIES:
            raise _Invalid(f"memory.bytes_by_category has an unknown category {_show(category)} "
                           f"(known: {', '.join(MEMORY_CATEGORIES)})")
        if type(column) is not list:
            raise _Invalid(f"field 'memory.bytes_by_category.{category}' is {_show(column)}, expected a list")
        _check_length(column, count, f"memory.bytes_by_category.{category}", "memory.count")
        where = f"memory[{{}}].bytes_by_category.{category}"
        _check_types(column, {int, _NONE}, where, "an integer of 0 or more, or null")
        negative = next((i for i, v in enumerate(column) if v is not None and v < 0), None)
        if negative is not None:
            raise _Invalid(f"{where.format(negative)} is {column[negative]}, expected 0 or more bytes")


_NODE_FIELDS = (("id", {int, str}, "an integer or string"), ("name", {str}, "a string"),
                ("kind", {str}, "a string"), ("handle_id", {int, _NONE}, "an integer or null"),
                ("dx_reached", {bool}, "true or false"), ("dw_reached", {bool}, "true or false"),
                ("shape", {list, tuple, _NONE}, "a list of integers or null"))


def _check_graphs(graphs: list[Any]) -> None:
    for g, graph in enumerate(graphs):
        at = f"graphs[{g}]"
        if type(graph) is not dict:
            raise _Invalid(f"{at} is {_show(graph)}, expected an object")
        _get(graph, "seq", int, "an integer", f"{at}.")
        _get(graph, "label", str, "a string", f"{at}.")
        nodes = _get(graph, "nodes", list, "a list", f"{at}.")
        ids = set()
        for n, node in enumerate(nodes):
            where = f"{at}.nodes[{n}]"
            if type(node) is not dict:
                raise _Invalid(f"{where} is {_show(node)}, expected an object")
            for key, types, expected in _NODE_FIELDS:
                if key not in node:
                    raise _Invalid(f"{where} has no field '{key}'")
                if type(node[key]) not in types:
                    raise _Invalid(f"{where}.{key} is {_show(node[key])}, expected {expected}")
            if node["kind"] not in NODE_KINDS:
                raise _Invalid(f"{where}.kind is {_show(node['kind'])}, an unknown node kind "
                               f"(known: {', '.join(NODE_KINDS)})")
            if node["shape"] is not None and not all(type(d) is int for d in node["shape"]):
                raise _Invalid(f"{where}.shape is {_show(node['shape'])}, expected a list of integers or null")
            ids.add(node["id"])
        edges = graph.get("edges")
        if type(edges) not in (list, tuple):
            raise _Invalid(f"field '{at}.edges' is {_show(edges)}, expected a list of [src, dst] pairs")
        for e, edge in enumerate(edges):
            if type(edge) not in (list, tuple) or len(edge) != 2:
                raise _Invalid(f"{at}.edges[{e}] is {_show(edge)}, expected a [src, dst] pair")
            for end in edge:
                if end not in ids:
                    raise _Invalid(f"{at}.edges[{e}] refers to node {end!r}, which is not in {at}.nodes")


def _get(obj: dict[str, Any], key: str, kind: type, expected: str, prefix: str = "") -> Any:
    if key not in obj:
        raise _Invalid(f"field '{prefix}{key}' is missing")
    value = obj[key]
    if type(value) is not kind:  # exact: a bool is not an integer here
        raise _Invalid(f"field '{prefix}{key}' is {_show(value)}, expected {expected}")
    return value


def _check_length(column: list[Any], count: int, name: str, count_name: str) -> None:
    if len(column) != count:
        raise _Invalid(f"field '{name}' has {len(column)} values but {count_name} is {count}")


def _check_types(column: list[Any], allowed: set[type], where: str, expected: str) -> None:
    if set(map(type, column)) <= allowed:
        return
    i = next(i for i, v in enumerate(column) if type(v) not in allowed)
    raise _Invalid(f"{where.format(i)} is {_show(column[i])}, expected {expected}")


def _check_indexes(column: list[Any], size: int, name: str) -> None:
    _check_types(column, {int}, f"events[{{}}].{name}", f"an index into events.tables.{name}")
    if column and (min(column) < 0 or max(column) >= size):
        i = next(i for i, v in enumerate(column) if not 0 <= v < size)
        raise _Invalid(f"events[{i}].{name} is {column[i]}, but events.tables.{name} has {size} entries")


def _expected(types: set[type]) -> str:
    names = {str: "a string", int: "an integer", dict: "an object", _NONE: "null"}
    return " or ".join(names[t] for t in sorted(types, key=lambda t: t is _NONE))


def _show(value: Any) -> str:
    names = {dict: "an object", list: "a list", tuple: "a tuple", str: "a string", int: "an integer",
             float: "a number", bool: "a boolean", _NONE: "null"}
    kind = names.get(type(value), f"a {type(value).__name__}")
    if type(value) in (dict, list, tuple):
        return kind
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # json.loads of a big trace makes a million small dicts; pausing the cyclic GC
    # avoids repeated full collections over them (about 3x faster). Nothing made here is cyclic.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def package_version() -> str:
    """The installed ckpt_viz version, or "unknown" when running from a source tree."""
    from importlib import metadata

    try:
        return metadata.version("ckpt_viz")
    except metadata.PackageNotFoundError:
        return "unknown"
