"""Trace parts <-> document: a trace as the JSON-ready dict of a trace file, and back.

Owns the conversion in both directions: columns out of `EventColumns` and
`MemoryColumns`, t_ns as differences, seq as a range when it counts up by one (see
NOTE [ Trace file format, schema 2 ] in `ckpt_viz.trace.schema`). `to_document`
checks what the document needs of each event and sample; `from_document` trusts a
document that `ckpt_viz.trace.schema.check_document` has passed. Standard library
only; never imports torch, json, anything that touches files (`ckpt_viz.trace.io`),
or the `Trace` class: it reads a trace's parts and returns them as a dict.

NOTE [ Saving fast ]
  What a save costs is passes over a million events, so each way a trace comes to be saved
  takes the fewest (benchmarks/bench_trace_io.py has a row for each):
  1. The fields are read one list per field: a recording's `RecordedEvents.fields()` slices
     its flat rows (NOTE [ Lazy events ] in ckpt_viz.trace.rows: no Event is built); other
     sequences are read with their `column(name)`, a list of Events with one C-level pass
     per field over a piece of 4,096 Events at a time (they stay in the CPU cache; memory
     samples and data dicts are read by pieces for the same reason). A recording's memory
     samples are already columns (`RecordedMemory`, NOTE [ Lazy events ], rule 5) and are
     written as they are, with no MemorySample built or read.
  2. A loaded trace keeps, beside each run-packed column, the form it had in the file
     (`tables[PACKED]`: the column and that form); saved while the column is still that
     very list, the form is written again without looking for runs, and the data stays
     stored by key (`DataColumn.packed`). A write through the list protocol turns the
     columns into a plain list and drops both (NOTE [ Rows stored as columns ], rule 3),
     so a modified trace is saved from its events.
  3. Runs are found before anything is numbered: tags by identity (the bus hands one
     object to every event of a tag() block), then only the runs' values are numbered, by
     content with the types of the values (a merged trace has a fresh dict per event; {"a":
     1} == {"a": True} must stay two entries; by identity where a value is not an int, str,
     bool or None); handle_id and session_id are looked at whole (their types) only when a
     run holds a number (NOTE [ Packed columns ], rule 4).
  4. `ckpt_viz.trace.io.save` checks and encodes each field of the document (`document_parts`)
     as soon as it is made, and gzips it on a thread while the next one is made; the bytes
     are those of encoding the whole document at once.
  5. A recording (of 64 events or more) is packed in C where the C speed-up builds (`csrc/packrec.c`,
     NOTE [ C speed-ups ] in ckpt_viz.cext): one pass over its flat list, after the fields of the
     Events a read has built already (`RecordedEvents.packed`), makes the t_ns differences, the
     context numbering and column, the runs of handle_id, session_id and tags and the data
     stored by context, exactly as the Python above makes them from the fields; a part it
     cannot make so (a value of an unusual type, data not stored by context, tags that are not
     runs) is left to the Python, and the whole is (errors included) where a t_ns or a context
     field has an unusual type. A list of Events (64 or more, every one an Event) is packed so
     from its Events' fields, read into one flat list. Tags are numbered, and t_ns checked and
     differenced, in C too.
  The checks on save stay those of `check_document(doc, built_here=True)`; a load checks
  everything, whoever wrote the file.
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Iterator, Mapping
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

from ckpt_viz.cext import extension
from ckpt_viz.events import ROW_FIELDS, Event
from ckpt_viz.trace.columns import (
    PACKED,
    EventColumns,
    MemoryColumns,
    Times,
    _as_range,
    _intern,
    events_as_columns,
)
from ckpt_viz.trace.packed import DataColumn, Runs, by_context_limit, pack_data, pack_runs, unpack_runs
from ckpt_viz.trace.schema import (
    CONTEXT_TYPES,
    FORMAT,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    InvalidDocument,
    check_types,
    show,
)
from ckpt_viz.trace.types import CONTEXT_FIELDS, GraphSnapshot, MemorySample, TraceParts

__all__ = ["document_parts", "from_document", "to_document"]


def to_document(trace: TraceParts) -> dict[str, Any]:
    """The document of `trace`; it shares lists with `trace`.

    Raises:
        InvalidDocument: an event or sample is not one, or has a bad t_ns, data or context field.
    """
    return dict(document_parts(trace))


def document_parts(trace: TraceParts) -> Iterator[tuple[str, Any]]:
    """The fields of `trace`'s document in file order, each made when asked for (`ckpt_viz.trace.io.save`
    encodes and compresses one while the next is made: NOTE [ Saving fast ], rule 4)."""
    yield "format", FORMAT
    yield "schema_version", SCHEMA_VERSION
    yield "meta", trace.meta
    yield "events", _events_to_dict(trace.events)
    yield "memory", _memory_to_dict(trace.memory)
    yield "graphs", [
        {"seq": g.seq, "label": g.label, "nodes": g.nodes, "edges": g.edges,
         **({"torchviz": g.torchviz} if g.torchviz is not None else {})} if isinstance(g, GraphSnapshot)
        else g for g in trace.graphs
    ]


def _events_to_dict(events: Any) -> dict[str, Any]:
    loaded = events_as_columns(events)
    recorded = _packed(events) if loaded is None else None
    if loaded is not None:
        columns = dict(loaded.columns)
        context, context_table, tags_table = columns["context"], loaded.tables["context"], loaded.tables["tags"]
        kept = loaded.tables.get(PACKED, {})
        for key in RUN_COLUMNS:
            form = kept.get(key)
            columns[key] = form[1] if form is not None and form[0] is columns[key] else pack_runs(
                columns[key], indexes=key in ("context", "tags"))
    elif recorded is not None:  # NOTE [ Saving fast ], rule 5: packed in C, t_ns checked there
        seq, (deltas, context, context_table, handle_id, session_id, tags, data) = recorded
        tags, tags_table = _tags(tags[0]) if type(tags) is tuple else _numbered(tags)
        columns = {"seq": _as_range(seq), "t_ns": None, "context": context,
                   "handle_id": pack_runs(handle_id[0]) if type(handle_id) is tuple else handle_id,
                   "session_id": pack_runs(session_id[0]) if type(session_id) is tuple else session_id,
                   "tags": tags, "data": data[0] if type(data) is tuple else data}
        context = unpack_runs(context) if type(data) is tuple else context  # pack_data reads every index
    else:
        fields = _fields(events)
        try:
            context, context_table = _intern(zip(*(fields[name] for name in CONTEXT_FIELDS)))
        except TypeError:  # an unhashable kind, mode, phase, site or thread_id
            i, name = next((i, name) for name in CONTEXT_FIELDS for i, v in enumerate(fields[name])
                           if not isinstance(v, Hashable))
            _, expected = CONTEXT_TYPES[name]
            raise InvalidDocument(f"events[{i}].{name} is {show(fields[name][i])}, expected {expected}") from None
        tags, tags_table = _tags(fields["tags"])
        columns = {"seq": _as_range(fields["seq"]), "t_ns": fields["t_ns"],
                   "context": pack_runs(context, indexes=True), "handle_id": pack_runs(fields["handle_id"]),
                   "session_id": pack_runs(fields["session_id"]), "tags": tags, "data": fields["data"]}
    t_ns = columns.pop("t_ns")
    if recorded is not None:
        pass
    elif type(t_ns) is Times:  # loaded: the differences the file held (checked then), written again as they are
        deltas = t_ns.deltas
    else:
        deltas = _checked_deltas(t_ns, "events[{}].t_ns")
    data = columns["data"]
    if isinstance(data, DataColumn):  # a loaded trace: already packed
        columns["data"] = data.packed(context)
    elif type(data) is not dict:  # (a dict: packed in C)
        columns["data"] = pack_data(data, context, len(context_table))
        if columns["data"] is None:  # some data is not a dict
            data = [_plain_dict(d) for d in data]
            check_types(data, {dict}, "events[{}].data", "an object")
            columns["data"] = pack_data(data, context, len(context_table))
    columns = {"seq": _seq_out(columns.pop("seq")), "t_ns_delta": deltas, **columns}
    tables = {"context": context_table, "tags": [_plain_dict(t) for t in tags_table]}
    return {"count": len(deltas), "context_fields": list(CONTEXT_FIELDS), "tables": tables, "columns": columns}


_PACKREC = Path(__file__).with_name("csrc") / "packrec.c"


def _packed(events: Any) -> tuple[Any, tuple[Any, ...]] | None:
    # (the seqs, the columns made in C in one pass) of a recording or a list of Events (NOTE [ Saving fast ],
    # rule 5), or None: another sequence, no C, or something the Python decides.
    packed = getattr(events, "packed", None)
    recording = callable(packed) and not isinstance(events, list)
    if not (recording or (type(events) is list and len(events) >= 64)):
        return None
    module = extension(_PACKREC)
    if module is None:
        return None
    if recording:
        return packed(lambda head, flat, size: module.pack(
            flat, size, by_context_limit((len(head) + size) // len(ROW_FIELDS)), head))
    if not set(map(type, events)) <= {Event}:
        return None  # the Python names what is not an Event
    head = list(itertools.chain.from_iterable(map(_ROW_VALUES, events)))  # as a recording keeps them
    parts = module.pack([], 0, by_context_limit(len(events)), head)
    return None if parts is None else ([*map(attrgetter("seq"), events)], parts)


_ROW_VALUES = attrgetter(*ROW_FIELDS)


_FIELDS = ("seq", "t_ns", *CONTEXT_FIELDS, "handle_id", "session_id", "tags", "data")


def _fields(events: Any) -> dict[str, Any]:
    # Every field of every event, one list per field (NOTE [ Saving fast ], rule 1).
    if not isinstance(events, list):
        every = getattr(events, "fields", None)
        if callable(every):  # a recording's RecordedEvents: its kept values, sliced, no Event built
            return every()
        column = getattr(events, "column", None)
        if callable(column):  # some other sequence read field by field
            fields = {name: column(name) for name in _FIELDS}
            n = min(map(len, fields.values()))  # a recording still running appends: its first n events
            return {name: values[:n] if len(values) > n else values for name, values in fields.items()}
        events = list(events)
    fields: dict[str, list[Any]] = {name: [] for name in _FIELDS}
    try:  # a piece at a time: its Events stay in the CPU cache across the 11 passes (1.7x faster for 1M)
        for start in range(0, len(events), _PIECE):
            piece = events[start:start + _PIECE]
            for name, column in fields.items():
                column.extend(map(attrgetter(name), piece))
    except AttributeError:
        i = next(i for i, e in enumerate(events) if not isinstance(e, Event))
        raise InvalidDocument(f"events[{i}] is {show(events[i])}, not a ckpt_viz.events.Event") from None
    return fields


_PIECE = 4096


def _tags(tags: list[Any]) -> tuple[Any, list[Any]]:
    # (the tags column, its table): NOTE [ Saving fast ], rule 3. A table entry per distinct dict (by content;
    # by identity when some value is unhashable): a merged trace has a fresh tags dict per event.
    runs = pack_runs(tags, objects=True)
    if type(runs) is dict:
        return _numbered(runs)
    indexes, first = _number(tags)
    return pack_runs(indexes, indexes=True), [tags[i] for i in first]


def _numbered(runs: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    # Runs of tags objects -> runs of their indexes, and the table.
    values = runs["values"]
    runs["values"], first = _number(values)
    return runs, [values[j] for j in first]


def _number(tags: list[Any]) -> tuple[list[int], list[int]]:
    # (each dict's index, the first position of each distinct one): by content where every value is an int,
    # str, bool or None (the types are part of the key: {"a": 1} == {"a": True}), else by identity.
    module = extension(_PACKREC) if type(tags) is list and len(tags) > 64 else None
    numbered = module.number_tags(tags) if module is not None else None  # C, where every key is a str
    if numbered is not None:
        return numbered
    try:
        keys = zip(map(tuple, map(dict.items, tags)), map(tuple, map(map, repeat(type), map(dict.values, tags))))
        indexes, first = _intern(keys, keep_positions=True)
        if set(map(type, itertools.chain.from_iterable(map(dict.values, map(tags.__getitem__, first))))) <= _EXACT:
            return indexes, first
    except TypeError:  # not a dict, or an unhashable value
        pass
    return _intern(map(id, tags), keep_positions=True)


_EXACT = {int, str, bool, type(None)}  # equal values of these types are the same JSON (not so 0.0 and -0.0)


def _memory_to_dict(samples: Any) -> dict[str, Any]:
    if not (isinstance(samples, MemoryColumns) and not samples.materialized):
        samples = list(samples)
        try:
            readings = [s.bytes_by_category for s in samples]
        except AttributeError:
            i = next(i for i, s in enumerate(samples) if not isinstance(s, MemorySample))
            raise InvalidDocument(f"memory[{i}] is {show(samples[i])}, not a ckpt_viz.trace.MemorySample") from None
        if not set(map(type, readings)) <= {dict}:
            i = next(i for i, r in enumerate(readings) if type(r) is not dict)
            raise InvalidDocument(f"memory[{i}].bytes_by_category is {show(readings[i])}, expected a dict")
        samples = MemoryColumns.from_samples(samples)
    columns = samples.saved_columns()  # a recording's: kept as columns as they came (NOTE [ Lazy events ], rule 5)
    t_ns = columns.pop("t_ns")
    deltas = _checked_deltas(t_ns, "memory[{}].t_ns")
    by_category = columns.pop("bytes_by_category")
    columns = {"seq": _seq_out(columns.pop("seq")), "t_ns_delta": deltas, **columns}
    return {"count": len(t_ns), "columns": columns, "bytes_by_category": by_category}


def _seq_out(seq: Any) -> Any:
    return {"start": seq.start} if isinstance(seq, range) and seq.step == 1 else list(seq)


def _checked_deltas(t_ns: Any, where: str) -> list[int]:
    # check_types(t_ns, {int}, ...) and _deltas(t_ns), in one C pass where the C speed-up builds.
    module = extension(_PACKREC) if type(t_ns) is list and len(t_ns) > 64 else None
    deltas = module.deltas(t_ns) if module is not None else None
    if deltas is None:
        check_types(t_ns, {int}, where, "an integer")
        deltas = _deltas(t_ns)
    return deltas


def _deltas(values: list[int]) -> list[int]:
    return [values[0], *map(operator.sub, itertools.islice(values, 1, None), values)] if values else []


def _plain_dict(value: Any) -> Any:
    if type(value) is not dict and isinstance(value, Mapping):
        return dict(value)
    return value


def from_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The parts (keyword arguments of `Trace`) a checked document describes; columns stay columns until read."""
    events, memory = doc["events"], doc["memory"]
    event_columns = dict(events["columns"])
    event_columns["seq"] = _seq_in(event_columns["seq"], events["count"])
    event_columns["t_ns"] = Times(event_columns.pop("t_ns_delta"))  # NOTE [ Rows stored as columns ], rule 5
    kept = {}
    for key in RUN_COLUMNS:  # NOTE [ Saving fast ], rule 2: the packed form is saved again while untouched
        packed = event_columns[key]
        lazy = key in _LAZY_RUNS and type(packed) is dict  # NOTE [ Packed columns ], rule 6
        event_columns[key] = Runs(packed["values"], packed["runs"]) if lazy else unpack_runs(packed)
        kept[key] = (event_columns[key], packed)
    data = event_columns["data"]
    if type(data) is dict:
        shape = event_columns["context"] if data["shape"] == "context" else unpack_runs(data["shape"])
        event_columns["data"] = DataColumn(data["keys"], shape, data["values"])
    memory_columns = dict(memory["columns"])
    memory_columns["seq"] = _seq_in(memory_columns["seq"], memory["count"])
    memory_columns["t_ns"] = list(itertools.accumulate(memory_columns.pop("t_ns_delta")))
    memory_columns["bytes_by_category"] = memory["bytes_by_category"]
    graphs = [GraphSnapshot(seq=g["seq"], label=g["label"], nodes=g["nodes"], edges=g["edges"],
                            torchviz=g.get("torchviz")) for g in doc["graphs"]]
    return {"events": EventColumns(event_columns, {**events["tables"], PACKED: kept}),
            "memory": MemoryColumns(memory_columns),
            "graphs": graphs, "meta": doc["meta"]}


_LAZY_RUNS = ("session_id", "tags")  # no view of the first page reads these whole (the index reads the others)


def _seq_in(seq: Any, count: int) -> Any:
    return range(seq["start"], seq["start"] + count) if type(seq) is dict else seq
