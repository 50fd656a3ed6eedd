"""Trace files: `save` and `load` a `Trace` as JSON, gzip-compressed when the name ends in ".gz".

Owns the file format and its validation. Standard library only (orjson is used when
installed, as a pure speed-up); never pickle: a trace file is plain JSON that
`json.load` reads.

NOTE [ Trace file format, schema 1 ]
  One JSON object. Events and memory samples are stored as columns, so that a
  million-event trace saves and loads in under 2 s each with orjson on a slow
  2-core machine (the stdlib json alone loads as fast but saves in about 3 s; see
  benchmarks/bench_trace_io.py):
    {"format": "ckpt_viz.trace", "schema_version": 1,
     "meta":   {"model": ..., "mode": ..., "schedule": ..., "versions": {...}, "schema_version": 1},
     "events": {"count": N, "context_fields": ["kind", "mode", "phase", "site", "thread_id"],
                "tables":  {"context": [["tensor_packed", "nonreentrant", null, "train.py:12", 1403], ...],
                            "tags": [{}, {"stage": 0, "microbatch": 3}, ...]},
                "columns": {"seq": {"start": 0} or [N ints], "t_ns_delta": [N ints],
                            "context": [N indexes into tables.context], "handle_id": [int or null],
                            "session_id": [JSON scalar], "tags": [N indexes into tables.tags],
                            "data": [N objects]}},
     "memory": {"count": M,
                "columns": {"seq": {"start": 0} or [M ints], "t_ns_delta": [M ints],
                            "device_allocated": [int or null], "by_stage": null or [M objects]},
                "bytes_by_category": {"activations": [M ints, or null where not measured], ...}},
     "graphs": [{"seq": 12, "label": "after forward", "nodes": [{...}], "edges": [[src, dst], ...]}]}
  1. "format" and "schema_version" come first, so `head -c 60 trace.json` identifies a file.
  2. A reader accepts every schema_version up to its own and refuses newer ones.
  3. seq {"start": s} means s, s+1, ...; t_ns_delta holds the first t_ns, then the
     differences (small numbers keep the file small); by_stage null means every
     sample's by_stage is empty.
  4. JSON has no tuples, no NaN and only string keys: a tuple comes back as a list,
     NaN and infinities are written as null, and int dict keys come back as strings
     (with or without orjson). An integer beyond 64 bits inside `data` comes back as
     a float when orjson reads the file.

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
import itertools
import json
import math
import operator
import os
import stat
import tempfile
import zlib
from os import PathLike
from collections.abc import Hashable
from typing import Any, Callable, Iterator, Mapping, NoReturn

from ckpt_viz.errors import TraceError
from ckpt_viz.events import EVENT_KINDS, MODES, PHASES, Event
from ckpt_viz.trace import (
    CONTEXT_FIELDS,
    MEMORY_CATEGORIES,
    NODE_KINDS,
    EventColumns,
    GraphSnapshot,
    MemoryColumns,
    MemorySample,
    Trace,
)

try:  # optional speed-up; the files are the same standard JSON with or without it
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["FORMAT", "SCHEMA_VERSION", "from_dict", "load", "package_version", "save", "to_dict"]

FORMAT = "ckpt_viz.trace"
SCHEMA_VERSION = 1
GZIP_LEVEL = 1  # traces are repetitive: level 1 is several times faster than 9 and nearly as small

_NONE = type(None)
# Make orjson refuse what the stdlib json refuses, so that the stdlib decides those cases.
_ORJSON_STRICT = (
    _orjson.OPT_PASSTHROUGH_DATACLASS | _orjson.OPT_PASSTHROUGH_DATETIME | _orjson.OPT_PASSTHROUGH_SUBCLASS
    if _orjson is not None else 0
)
_TIP_REWRITE = (
    "the file was not written by ckpt_viz.Trace.save, or was edited; record the run again, "
    "or restore the file from a copy"
)
_TIP_TRUNCATED = (
    "the file was cut short (an interrupted copy or download, or a full disk); copy it again or record "
    "the run again. Trace.save itself writes atomically, so a file it finished is never cut short"
)


_TIP_SAVE = (
    "a hand-built trace or a runtime hook put a wrong value there; events use the names and types of "
    "ckpt_viz.events (EVENT_KINDS, MODES, PHASES), memory samples the categories in "
    "ckpt_viz.trace.MEMORY_CATEGORIES"
)


class _Invalid(Exception):
    """One thing wrong with a trace document: `what` happened; `tip` (reading) or `save_tip` says what to do."""

    def __init__(self, what: str, tip: str = _TIP_REWRITE, save_tip: str = _TIP_SAVE) -> None:
        super().__init__(what)
        self.what = what
        self.tip = tip
        self.save_tip = save_tip


# ---------------------------------------------------------------- save

def save(trace: Trace, path: str | PathLike[str]) -> None:
    """Write `trace` to `path` as JSON (gzip if the name ends with ".gz"), atomically.

    See NOTE [ Atomic save ].

    Raises:
        TraceError: the trace holds a value a trace file cannot; nothing is written.
        OSError: the folder is missing or not writable; an existing file is untouched.
    """
    name = os.fspath(path)
    with _gc_paused():
        try:
            doc = _document(trace)
            _check_document(doc, built_here=True)
            payload = _encode(doc)
        except _Invalid as bad:
            raise TraceError(
                f"ckpt_viz.Trace.save: cannot save to '{name}': {bad.what}.\nTip: {bad.save_tip}.") from None
    if name.endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=GZIP_LEVEL, mtime=0)
    _write_atomically(name, payload)


def to_dict(trace: Trace) -> dict[str, Any]:
    """The JSON document of `trace` (see NOTE [ Trace file format, schema 1 ]); it shares lists with `trace`.

    Raises:
        TraceError: the trace holds something that is not an Event or MemorySample, or a bad t_ns or data.
    """
    try:
        return _document(trace)
    except _Invalid as bad:
        raise TraceError(
            f"ckpt_viz.Trace.to_dict: cannot convert the trace: {bad.what}.\nTip: {bad.save_tip}.") from None


def _document(trace: Trace) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "meta": trace.meta,
        "events": _events_to_dict(trace.events),
        "memory": _memory_to_dict(trace.memory),
        "graphs": [
            {"seq": g.seq, "label": g.label, "nodes": g.nodes, "edges": g.edges} if isinstance(g, GraphSnapshot)
            else g for g in trace.graphs
        ],
    }


def _events_to_dict(events: Any) -> dict[str, Any]:
    if not (isinstance(events, EventColumns) and not events.materialized):
        events = list(events)
        try:
            events = EventColumns.from_events(events)
        except AttributeError:
            i = next(i for i, e in enumerate(events) if not isinstance(e, Event))
            raise _Invalid(f"events[{i}] is {_show(events[i])}, not a ckpt_viz.events.Event") from None
        except TypeError:  # an unhashable kind, mode, phase, site or thread_id
            i, name, value = next((i, name, getattr(e, name)) for i, e in enumerate(events) for name in CONTEXT_FIELDS
                                  if not isinstance(getattr(e, name), Hashable))
            types, expected = _CONTEXT_TYPES[name]
            raise _Invalid(f"events[{i}].{name} is {_show(value)}, expected {expected}") from None
    columns = dict(events.columns)
    t_ns = columns.pop("t_ns")
    _check_types(t_ns, {int}, "events[{}].t_ns", "an integer")
    if not set(map(type, columns["data"])) <= {dict}:
        columns["data"] = [_plain_dict(d) for d in columns["data"]]
        _check_types(columns["data"], {dict}, "events[{}].data", "an object")
    columns = {"seq": _seq_out(columns.pop("seq")), "t_ns_delta": _deltas(t_ns), **columns}
    tables = {"context": events.tables["context"], "tags": [_plain_dict(t) for t in events.tables["tags"]]}
    return {"count": len(t_ns), "context_fields": list(CONTEXT_FIELDS), "tables": tables, "columns": columns}


def _memory_to_dict(samples: Any) -> dict[str, Any]:
    if not (isinstance(samples, MemoryColumns) and not samples.materialized):
        samples = list(samples)
        try:
            readings = [s.bytes_by_category for s in samples]
        except AttributeError:
            i = next(i for i, s in enumerate(samples) if not isinstance(s, MemorySample))
            raise _Invalid(f"memory[{i}] is {_show(samples[i])}, not a ckpt_viz.trace.MemorySample") from None
        if not set(map(type, readings)) <= {dict}:
            i = next(i for i, r in enumerate(readings) if type(r) is not dict)
            raise _Invalid(f"memory[{i}].bytes_by_category is {_show(readings[i])}, expected a dict")
        samples = MemoryColumns.from_samples(samples)
    columns = dict(samples.columns)
    t_ns = columns.pop("t_ns")
    _check_types(t_ns, {int}, "memory[{}].t_ns", "an integer")
    by_category = columns.pop("bytes_by_category")
    columns = {"seq": _seq_out(columns.pop("seq")), "t_ns_delta": _deltas(t_ns), **columns}
    return {"count": len(t_ns), "columns": columns, "bytes_by_category": by_category}


def _seq_out(seq: Any) -> Any:
    return {"start": seq.start} if isinstance(seq, range) and seq.step == 1 else list(seq)


def _deltas(values: list[int]) -> list[int]:
    return [values[0], *map(operator.sub, values[1:], values[:-1])] if values else []


def _plain_dict(value: Any) -> Any:
    if type(value) is not dict and isinstance(value, Mapping):
        return dict(value)
    return value


def _encode(doc: dict[str, Any]) -> bytes:
    # orjson when installed (several times faster); whatever it refuses goes to the
    # stdlib, which decides. Both write standard JSON; non-finite floats become null.
    if _orjson is not None:
        with contextlib.suppress(TypeError):  # orjson.JSONEncodeError is a TypeError
            return _orjson.dumps(doc, option=_ORJSON_STRICT)
    try:
        try:
            text = _stdlib_dumps(doc)
        except ValueError:  # NaN or infinity somewhere: standard JSON has no such numbers
            text = _stdlib_dumps(_finite(doc))
    except (TypeError, ValueError, RecursionError) as err:
        tip = ("keep event data, tags, meta and graph nodes to str, int, float, bool, None, "
               "lists and dicts with str keys; convert other values (dtypes, devices, tensors) with str()")
        raise _Invalid(f"{_locate_unencodable(doc)} cannot be written as JSON ({err})", tip, tip) from None
    return text.encode("ascii")


def _stdlib_dumps(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=True, allow_nan=False, check_circular=False, separators=(",", ":"))


def _finite(value: Any) -> Any:
    # Only on the rare path: a copy of `value` with NaN and infinities replaced by None.
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _locate_unencodable(doc: dict[str, Any]) -> str:
    # Only on the error path: the first value json.dumps refuses, found by walking down.
    def bad(value: Any) -> bool:
        try:
            json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            return True
        return False

    def walk(value: Any, where: str) -> str:
        if isinstance(value, dict):
            for key, item in value.items():
                if bad(item) or not isinstance(key, (str, int, float, bool, _NONE)):
                    return walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if bad(item):
                    return walk(item, f"{where}[{i}]")
        return f"{where} ({_show(value)})"

    for part in ("events", "memory"):
        for name, column in doc[part]["columns"].items():
            if bad(column):
                i = next(i for i, v in enumerate(column) if bad(v))
                return walk(column[i], f"{part}[{i}].{name}")
    if bad(doc["events"]["tables"]):
        return walk(doc["events"]["tables"], "the tags of an event")
    return walk({k: v for k, v in doc.items() if k not in ("events", "memory")}, "")


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

    def fail(what: str, tip: str = _TIP_REWRITE) -> NoReturn:
        # `from None`: the message already says what the parser or gzip said.
        raise TraceError(f"ckpt_viz.Trace.load: cannot read '{name}': {what}.\nTip: {tip}.") from None

    try:
        with open(name, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        fail("no such file", "check the path; ckpt_viz.Trace.save(path) writes a trace file")
    except IsADirectoryError:
        fail("it is a folder, not a file", "pass the path of a trace file inside it")
    with _gc_paused():
        return _build(_parse(raw, fail))


def from_dict(doc: Any) -> Trace:
    """Validate a trace document (as `to_dict` returns or `json.load` reads) and build the Trace.

    Raises:
        TraceError: the document is not a trace, is too new, or has a missing or ill-typed field.
    """
    try:
        _check_document(doc)
    except _Invalid as bad:
        raise TraceError(f"ckpt_viz.Trace.from_dict: cannot read the trace: {bad.what}.\nTip: {bad.tip}.") from None
    return _build(doc)


def _parse(raw: bytes, fail: Callable[..., NoReturn]) -> dict[str, Any]:
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
    if _orjson is not None:
        doc = _fast_document(raw)
        if doc is not None:
            return doc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fail(f"it is not valid JSON: not UTF-8 text (byte {err.start})", _TIP_REWRITE)
    if not text.strip():
        fail("the file is empty (only whitespace)", "the save that wrote it did not finish; record the run again")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        if _ends_early(text, err):
            fail(f"the JSON is truncated: it ends early ({err.msg} at line {err.lineno}, column {err.colno})",
                 _TIP_TRUNCATED)
        fail(f"it is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})", _TIP_REWRITE)
    except (ValueError, RecursionError) as err:
        fail(f"it is not valid JSON ({err})", _TIP_REWRITE)
    try:
        _check_document(doc)
    except _Invalid as bad:
        fail(bad.what, bad.tip)
    return doc


def _ends_early(text: str, err: json.JSONDecodeError) -> bool:
    # The parser failed at the end of the text, or on a token the end cut off
    # (`"abc`, `tru`, `nul`, `-`, `1.`): the file is a cut-off prefix, not garbage.
    tail = text[err.pos:].rstrip()
    return (not tail or err.msg.startswith("Unterminated string")
            or (len(tail) < 5 and any(word.startswith(tail) for word in ("true", "false", "null")))
            or (len(tail) < 32 and tail.strip("0123456789.eE+-") == ""))


def _fast_document(raw: bytes) -> dict[str, Any] | None:
    # orjson's parse if it parses and validates; otherwise None, and the stdlib
    # path parses again and explains what is wrong.
    try:
        doc = _orjson.loads(raw)
        _check_document(doc)
    except (ValueError, _Invalid):  # orjson.JSONDecodeError is a ValueError
        return None
    return doc


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not standard JSON")


def _build(doc: dict[str, Any]) -> Trace:
    events, memory = doc["events"], doc["memory"]
    event_columns = dict(events["columns"])
    event_columns["seq"] = _seq_in(event_columns["seq"], events["count"])
    event_columns["t_ns"] = list(itertools.accumulate(event_columns.pop("t_ns_delta")))
    memory_columns = dict(memory["columns"])
    memory_columns["seq"] = _seq_in(memory_columns["seq"], memory["count"])
    memory_columns["t_ns"] = list(itertools.accumulate(memory_columns.pop("t_ns_delta")))
    memory_columns["bytes_by_category"] = memory["bytes_by_category"]
    graphs = [GraphSnapshot(seq=g["seq"], label=g["label"], nodes=g["nodes"], edges=g["edges"])
              for g in doc["graphs"]]
    return Trace(events=EventColumns(event_columns, events["tables"]), memory=MemoryColumns(memory_columns),
                 graphs=graphs, meta=doc["meta"])


def _seq_in(seq: Any, count: int) -> Any:
    return range(seq["start"], seq["start"] + count) if type(seq) is dict else seq


# ---------------------------------------------------------------- validation
# Checks run over whole columns (the set of types, min and max); only when one
# fails is the column scanned again to name the first bad row.

def _check_document(doc: Any, built_here: bool = False) -> None:
    """Raise _Invalid for the first problem. built_here: made by to_dict, so its indexes are right."""
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
    _check_events(_get(doc, "events", dict, "an object"), built_here)
    _check_memory(_get(doc, "memory", dict, "an object"), built_here)
    _check_graphs(_get(doc, "graphs", list, "a list"))


_EVENT_COLUMNS = ("seq", "t_ns_delta", "context", "handle_id", "session_id", "tags", "data")
_CONTEXT_TYPES = {"kind": ({str}, "a string"), "mode": ({str, _NONE}, "a string or null"),
                  "phase": ({str, _NONE}, "a string or null"), "site": ({str, _NONE}, "a string or null"),
                  "thread_id": ({int}, "an integer")}
_KNOWN = {"kind": EVENT_KINDS, "mode": (*MODES, None), "phase": (*PHASES, None)}


def _check_events(events: dict[str, Any], built_here: bool) -> None:
    count = _count(events, "events")
    fields = _get(events, "context_fields", list, "a list", "events.")
    if fields != list(CONTEXT_FIELDS):
        raise _Invalid(f"field 'events.context_fields' is {fields!r}, expected {list(CONTEXT_FIELDS)!r}")
    tables = _get(events, "tables", dict, "an object", "events.")
    contexts = _get(tables, "context", list, "a list", "events.tables.")
    tags = _get(tables, "tags", list, "a list", "events.tables.")
    _check_types(tags, {dict}, "events.tables.tags[{}]", "an object")
    columns = _columns(events, "events", _EVENT_COLUMNS, count)
    _check_seq(columns["seq"], "events")
    if not built_here:  # to_dict already checked these, or built them right
        _check_types(columns["t_ns_delta"], {int}, "events[{}].t_ns (stored as t_ns_delta)", "an integer")
        _check_types(columns["data"], {dict}, "events[{}].data", "an object")
        _check_indexes(columns["tags"], len(tags), "tags")
        _check_indexes(columns["context"], len(contexts), "context")
    _check_types(columns["handle_id"], {int, _NONE}, "events[{}].handle_id", "an integer or null")
    _check_types(columns["session_id"], {str, int, float, bool, _NONE}, "events[{}].session_id",
                 "a string, number, boolean or null")
    for entry, row in enumerate(contexts):
        _check_context(row, entry, columns["context"])


def _check_context(row: Any, entry: int, column: list[int]) -> None:
    def where(name: str) -> str:
        # Name the first event that uses this row; the table entry if none does.
        try:
            return f"events[{column.index(entry)}].{name}"
        except ValueError:
            return f"events.tables.context[{entry}] ({name})"

    if type(row) not in (list, tuple) or len(row) != len(CONTEXT_FIELDS):
        raise _Invalid(f"events.tables.context[{entry}] is {_show(row)}, expected a list of "
                       f"{len(CONTEXT_FIELDS)} values ({', '.join(CONTEXT_FIELDS)})")
    for name, value in zip(CONTEXT_FIELDS, row):
        types, expected = _CONTEXT_TYPES[name]
        if type(value) not in types:
            raise _Invalid(f"{where(name)} is {_show(value)}, expected {expected}")
        known = _KNOWN.get(name)
        if known is not None and value not in known:
            label = "event kind" if name == "kind" else name
            tip = ("this file may come from a newer ckpt_viz that has more event kinds; upgrade ckpt_viz"
                   if name == "kind" else _TIP_REWRITE)
            raise _Invalid(f"{where(name)} is {_show(value)}, an unknown {label} "
                           f"(known: {', '.join(str(k) for k in known)})", tip)


def _check_memory(memory: dict[str, Any], built_here: bool) -> None:
    count = _count(memory, "memory")
    columns = _columns(memory, "memory", ("seq", "t_ns_delta", "device_allocated"), count)
    _check_seq(columns["seq"], "memory")
    if not built_here:  # to_dict checked t_ns before taking differences
        _check_types(columns["t_ns_delta"], {int}, "memory[{}].t_ns (stored as t_ns_delta)", "an integer")
    _check_types(columns["device_allocated"], {int, _NONE}, "memory[{}].device_allocated", "an integer or null")
    by_category = _get(memory, "bytes_by_category", dict, "an object", "memory.")
    for category, column in by_category.items():
        if category not in MEMORY_CATEGORIES:
            raise _Invalid(f"memory.bytes_by_category has an unknown category {_show(category)} "
                           f"(known: {', '.join(MEMORY_CATEGORIES)})")
        _get(by_category, category, list, "a list", "memory.bytes_by_category.")
        _check_length(column, count, f"memory.bytes_by_category.{category}", "memory.count")
        where = f"memory[{{}}].bytes_by_category.{category}"
        types = _check_types(column, {int, _NONE}, where, "an integer of 0 or more, or null")
        measured = column if _NONE not in types else [v for v in column if v is not None]
        if measured and min(measured) < 0:
            i = next(i for i, v in enumerate(column) if v is not None and v < 0)
            raise _Invalid(f"{where.format(i)} is {column[i]}, expected 0 or more bytes")
    stages = _get(columns, "by_stage", (list, _NONE), "null or a list", "memory.columns.")
    if stages is not None:
        _check_length(stages, count, "memory.columns.by_stage", "memory.count")
        _check_types(stages, {dict}, "memory[{}].by_stage", "an object")
        _check_by_stage(stages)


def _check_by_stage(stages: list[dict[str, Any]]) -> None:
    # Vectorized over all samples; the slow scan below runs only to name a bad one.
    readings = [r for per_stage in stages for r in per_stage.values()]
    values = [v for r in readings for v in r.values()] if set(map(type, readings)) <= {dict} else None
    if (values is not None and set(map(type, values)) <= {int} and (not values or min(values) >= 0)
            and set().union(*readings) <= set(MEMORY_CATEGORIES)):
        return
    for i, per_stage in enumerate(stages):
        for stage, reading in per_stage.items():
            where = f"memory[{i}].by_stage[{stage!r}]"
            if type(reading) is not dict:
                raise _Invalid(f"{where} is {_show(reading)}, expected an object of bytes by category")
            for category, nbytes in reading.items():
                if category not in MEMORY_CATEGORIES or type(nbytes) is not int or nbytes < 0:
                    raise _Invalid(f"{where} has {category!r}: {_show(nbytes)}, expected a category of "
                                   f"{', '.join(MEMORY_CATEGORIES)} with 0 or more bytes")


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
        edges = _get(graph, "edges", (list, tuple), "a list of [src, dst] pairs", f"{at}.")
        ids = set()
        for n, node in enumerate(nodes):
            where = f"{at}.nodes[{n}]"
            if type(node) is not dict:
                raise _Invalid(f"{where} is {_show(node)}, expected an object")
            for key, types, expected in _NODE_FIELDS:
                if key not in node:
                    raise _Invalid(f"field '{where}.{key}' is missing")
                if type(node[key]) not in types:
                    raise _Invalid(f"{where}.{key} is {_show(node[key])}, expected {expected}")
            if node["kind"] not in NODE_KINDS:
                raise _Invalid(f"{where}.kind is {_show(node['kind'])}, an unknown node kind "
                               f"(known: {', '.join(NODE_KINDS)})")
            if node["shape"] is not None and not all(type(d) is int for d in node["shape"]):
                raise _Invalid(f"{where}.shape is {_show(node['shape'])}, expected a list of integers or null")
            ids.add(node["id"])
        for e, edge in enumerate(edges):
            if type(edge) not in (list, tuple) or len(edge) != 2:
                raise _Invalid(f"{at}.edges[{e}] is {_show(edge)}, expected a [src, dst] pair")
            for end in edge:
                if type(end) not in (int, str) or end not in ids:
                    raise _Invalid(f"{at}.edges[{e}] refers to node {end!r}, which is not in {at}.nodes")


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], expected: str, prefix: str = "") -> Any:
    if key not in obj:
        raise _Invalid(f"field '{prefix}{key}' is missing")
    value = obj[key]
    if type(value) not in (kind if isinstance(kind, tuple) else (kind,)):  # exact: a bool is not an integer
        raise _Invalid(f"field '{prefix}{key}' is {_show(value)}, expected {expected}")
    return value


def _count(part: dict[str, Any], name: str) -> int:
    count = _get(part, "count", int, "an integer", f"{name}.")
    if count < 0:
        raise _Invalid(f"field '{name}.count' is {count}, expected 0 or more")
    return count


def _columns(part: dict[str, Any], name: str, required: tuple[str, ...], count: int) -> dict[str, Any]:
    columns = _get(part, "columns", dict, "an object", f"{name}.")
    for key in required:
        column = _get(columns, key, (list, dict) if key == "seq" else list, "a list", f"{name}.columns.")
        if type(column) is list:
            _check_length(column, count, f"{name}.columns.{key}", f"{name}.count")
    return columns


def _check_seq(seq: Any, name: str) -> None:
    if type(seq) is dict:
        _get(seq, "start", int, "an integer", f"{name}.columns.seq.")
    else:
        _check_types(seq, {int}, f"{name}[{{}}].seq", "an integer")


def _check_length(column: list[Any], count: int, name: str, count_name: str) -> None:
    if len(column) != count:
        raise _Invalid(f"field '{name}' has {len(column)} values but {count_name} is {count}")


def _check_types(column: list[Any], allowed: set[type], where: str, expected: str) -> set[type]:
    """The set of types in `column`; raise _Invalid naming the first value of a type not allowed."""
    types = set(map(type, column))
    if types <= allowed:
        return types
    i = next(i for i, v in enumerate(column) if type(v) not in allowed)
    raise _Invalid(f"{where.format(i)} is {_show(column[i])}, expected {expected}")


def _check_indexes(column: list[Any], size: int, name: str) -> None:
    _check_types(column, {int}, f"events[{{}}].{name}", f"an index into events.tables.{name}")
    if column and (min(column) < 0 or max(column) >= size):
        i = next(i for i, v in enumerate(column) if not 0 <= v < size)
        raise _Invalid(f"events[{i}].{name} is {column[i]}, but events.tables.{name} has {size} entries")


def _show(value: Any) -> str:
    names = {dict: "an object", list: "a list", tuple: "a tuple", str: "a string", int: "an integer",
             float: "a number", bool: "a boolean"}
    if value is None:
        return "null"
    kind = names.get(type(value), f"a {type(value).__name__}")
    if type(value) in (dict, list, tuple):
        return kind
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # A big trace means a million small dicts and lists; pausing the cyclic GC
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
