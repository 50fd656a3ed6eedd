"""Traces: the data a recorded run leaves behind, its file format, and the queries views ask of it.

Standard library only: opening, validating and indexing a saved trace never needs torch.

  model      Trace, MemorySample, GraphSnapshot and their column storage
  schema     the file layout and its validation
  document   Trace <-> plain JSON document
  io         bytes, gzip, atomic writes, validated loads
  index      TraceIndex: per-seq lookups for views on one cursor
"""
from ckpt_viz.trace.model import (
    CONTEXT_FIELDS,
    MEMORY_CATEGORIES,
    NODE_KINDS,
    EventColumns,
    GraphSnapshot,
    MemoryColumns,
    MemorySample,
    Trace,
    run_meta,
)

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
