"""Trace parts <-> document: a trace as the JSON-ready dict of a trace file, and back.

Owns the conversion in both directions: columns out of `EventColumns` and
`MemoryColumns`, t_ns as differences, seq as a range when it counts up by one (see
NOTE [ Trace file format, schema 2 ] in `ckpt_viz.trace.schema`). `to_document`
checks what the document needs of each event and sample; `from_document` trusts a
document that `ckpt_viz.trace.schema.check_document` has passed. Standard library
only; never imports torch, json, anything that touches files (`ckpt_viz.trace.io`),
or the `Trace` class: it reads a trace's parts and returns them as a dict.
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Mapping
from typing import Any

from ckpt_viz.events import Event
from ckpt_viz.trace.columns import EventColumns, MemoryColumns
from ckpt_viz.trace.packed import DataColumn, pack_data, pack_runs, unpack_runs
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

__all__ = ["from_document", "to_document"]


def to_document(trace: TraceParts) -> dict[str, Any]:
    """The document of `trace`; it shares lists with `trace`.

    Raises:
        InvalidDocument: an event or sample is not one, or has a bad t_ns, data or context field.
    """
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "meta": trace.meta,
        "events": _events_to_dict(trace.events),
        "memory": _memory_to_dict(trace.memory),
        "graphs": [
            {"seq": g.seq, "label": g.label, "nodes": g.nodes, "edges": g.edges,
             **({"torchviz": g.torchviz} if g.torchviz is not None else {})} if isinstance(g, GraphSnapshot)
            else g for g in trace.graphs
        ],
    }


def _events_to_dict(events: Any) -> dict[str, Any]:
    if not (isinstance(events, EventColumns) and not events.materialized):
        if not callable(getattr(events, "column", None)):  # a recording's events are read by field (from_events)
            events = list(events)
        try:
            events = EventColumns.from_events(events)
        except AttributeError:
            i = next(i for i, e in enumerate(events) if not isinstance(e, Event))
            raise InvalidDocument(f"events[{i}] is {show(events[i])}, not a ckpt_viz.events.Event") from None
        except TypeError:  # an unhashable kind, mode, phase, site or thread_id
            i, name, value = next((i, name, getattr(e, name)) for i, e in enumerate(events) for name in CONTEXT_FIELDS
                                  if not isinstance(getattr(e, name), Hashable))
            _, expected = CONTEXT_TYPES[name]
            raise InvalidDocument(f"events[{i}].{name} is {show(value)}, expected {expected}") from None
    columns = dict(events.columns)
    t_ns = columns.pop("t_ns")
    check_types(t_ns, {int}, "events[{}].t_ns", "an integer")
    data = columns["data"]
    if isinstance(data, DataColumn):  # a loaded trace: already packed
        columns["data"] = data.packed(columns["context"])
    else:
        if not set(map(type, data)) <= {dict}:
            data = [_plain_dict(d) for d in data]
            check_types(data, {dict}, "events[{}].data", "an object")
        columns["data"] = pack_data(data, columns["context"], len(events.tables["context"]))
    for key in RUN_COLUMNS:
        columns[key] = pack_runs(columns[key], indexes=key in ("context", "tags"))
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
            raise InvalidDocument(f"memory[{i}] is {show(samples[i])}, not a ckpt_viz.trace.MemorySample") from None
        if not set(map(type, readings)) <= {dict}:
            i = next(i for i, r in enumerate(readings) if type(r) is not dict)
            raise InvalidDocument(f"memory[{i}].bytes_by_category is {show(readings[i])}, expected a dict")
        samples = MemoryColumns.from_samples(samples)
    columns = dict(samples.columns)
    t_ns = columns.pop("t_ns")
    check_types(t_ns, {int}, "memory[{}].t_ns", "an integer")
    by_category = columns.pop("bytes_by_category")
    columns = {"seq": _seq_out(columns.pop("seq")), "t_ns_delta": _deltas(t_ns), **columns}
    return {"count": len(t_ns), "columns": columns, "bytes_by_category": by_category}


def _seq_out(seq: Any) -> Any:
    return {"start": seq.start} if isinstance(seq, range) and seq.step == 1 else list(seq)


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
    event_columns["t_ns"] = list(itertools.accumulate(event_columns.pop("t_ns_delta")))
    for key in RUN_COLUMNS:
        event_columns[key] = unpack_runs(event_columns[key])
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
    return {"events": EventColumns(event_columns, events["tables"]), "memory": MemoryColumns(memory_columns),
            "graphs": graphs, "meta": doc["meta"]}


def _seq_in(seq: Any, count: int) -> Any:
    return range(seq["start"], seq["start"] + count) if type(seq) is dict else seq
