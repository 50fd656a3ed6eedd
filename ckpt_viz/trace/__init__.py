"""Traces: the data a recorded run leaves behind, its file format, and the queries views ask of it.

Standard library only: opening, validating and indexing a saved trace never needs torch.

  types      MemorySample, GraphSnapshot and the vocabularies they use
  columns    EventColumns, MemoryColumns: a loaded trace's rows stored as columns
  model      Trace (the queries, save/load) and run_meta
  schema     the file layout and its validation (problems: what is wrong, in words; ranges: value ranges)
  document   trace parts <-> plain JSON document
  io         JSON bytes, gzip, validated loads
  files      the system calls: bounded reads of regular files, a capped gunzip, atomic fsync-ed writes
  cache      derived: a value computed once per trace; event_column: one field of every event
  lifecycle  each handle's state transitions, derived once from the events
  index      TraceIndex: per-seq lookups for views on one cursor

Imports go one way: columns and schema read types (schema also problems and ranges); document
reads those; files reads schema; io reads document, schema and files; model (Trace) reads io,
so Trace.save and Trace.load call the file format and the file format never sees Trace; cache,
lifecycle and index read a Trace.
tests/core/test_layering.py checks that no cycle appears.
"""
from ckpt_viz.trace.columns import EventColumns, MemoryColumns
from ckpt_viz.trace.model import Trace, run_meta
from ckpt_viz.trace.types import CONTEXT_FIELDS, MEMORY_CATEGORIES, NODE_KINDS, GraphSnapshot, MemorySample

__all__ = [
    "CONTEXT_FIELDS",
    "MEMORY_CATEGORIES",
    "NODE_KINDS",
    "EventColumns",
    "GraphSnapshot",
    "MemoryColumns",
    "MemorySample",
    "Trace",
    "run_meta",
]
