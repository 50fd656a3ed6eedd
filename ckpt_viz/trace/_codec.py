"""The trace file: one JSON document, decoded straight into the typed events and checked as it is read.

    {"format": "ckpt_viz.trace", "schema_version": 3, "meta": {...},
     "events": [{"kind": "handle_created", "seq": 0, ...}, ...], "memory": [...], "graphs": [...]}

Owns `save`, `load`, `encode` and `decode`, and the checks a type cannot say (NOTE [ Trace checks ]).
The system calls (bounded reads, the capped gunzip, atomic fsync-ed writes) are `ckpt_viz.trace.files`.
Never pickle: a trace file is plain JSON that `json.load` reads. Standard library and msgspec only.

NOTE [ Trace checks ]
  1. "format" and "schema_version" come first, so `head -c 60 trace.json` identifies a file. They decide the
     message: a file that is not a trace, or of another schema version, is refused as such (with how to record
     it again) before any complaint about its events. The document is decoded once; the header is read on its
     own only to explain a refusal.
  2. Every field is checked against its declaration (`ckpt_viz.events`, `MemorySample`, `GraphSnapshot`):
     its type, its range (integers within 64 bits and usually much less, bounded texts and lists) and, for
     kinds, phases, modes, reasons and categories, its vocabulary. A refusal names the field's path
     (`events[3].seq`) and the file.
  3. Then what a type cannot say: event seqs strictly increase; a memory sample or a graph snapshot follows
     an event of the trace (its seq is at most the last event's) and samples are in seq order; `meta`'s known
     keys have their types (`_Meta`), the others are plain JSON.
  4. A trace is checked the same way when it is saved (its bytes are decoded again before they are written),
     so a file ckpt_viz writes is one it reads.
"""
from __future__ import annotations

import gzip
import os
import zlib
from functools import lru_cache
from itertools import islice
from operator import attrgetter, lt
from os import PathLike
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from ckpt_viz.errors import TraceError
from ckpt_viz.events import Count, Event, Name, Site
from ckpt_viz.plan.schema import PlanProfile
from ckpt_viz.trace import MAX_SOURCE_CHARS, MAX_SOURCE_SITES, SCHEMA_VERSION, GraphSnapshot, MemorySample, files

if TYPE_CHECKING:
    from ckpt_viz.trace import Trace

__all__ = ["FORMAT", "decode", "encode", "load", "package_version", "save"]

FORMAT: Final = "ckpt_viz.trace"
GZIP_LEVEL = 1  # traces are repetitive: level 1 is several times faster than 9 and nearly as small
_WRONG_VALUE = ("Tip: a hand-built trace or a runtime hook put a value of the wrong type there; build events with "
                "their types in ckpt_viz.events and keep meta plain JSON.")
_RERECORD = ("Tip: record the run again with this version of ckpt_viz (`ckpt-viz record ...`, or your "
             "`with ckpt_viz.record() as rec:` block, then rec.trace.save(path)).")


_SEQ = attrgetter("seq")


class _Header(msgspec.Struct):
    format: Any = None
    schema_version: Any = None


class _Distributed(msgspec.Struct, omit_defaults=True):
    run_id: Annotated[str, Meta(max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")] | None = None
    world_size: Annotated[int, Meta(ge=1, le=1 << 20)] | None = None
    rank: Annotated[int, Meta(ge=0, le=1 << 20)] | None = None
    ranks: Annotated[list[Annotated[int, Meta(ge=0, le=1 << 20)]], Meta(max_length=1 << 20)] | None = None
    headers: dict[Annotated[str, Meta(max_length=16)], dict[Annotated[str, Meta(max_length=64)], Any]] | None = None
    missing_ranks: Annotated[list[Annotated[int, Meta(ge=0, le=1 << 20)]], Meta(max_length=1 << 20)] | None = None


class _ReplayChecks(msgspec.Struct):
    policy: Name
    checked: Count
    skipped: Count
    first_checks: Count | None = None
    budget: float | None = None
    skipped_regions: dict[Name, Count] = {}
    by_rank: dict[Annotated[str, Meta(max_length=16)], dict[Name, Count]] = {}  # a merged trace: each rank's


class _Partial(msgspec.Struct, omit_defaults=True):
    """Why a run stopped early (a rank's file; NOTE [ Partial runs ] in ckpt_viz/distributed.py), or, merged, which
    ranks are missing and each present rank's own."""

    reason: Name | None = None
    signal: Name | None = None
    error: Annotated[str, Meta(max_length=4096)] | None = None
    step: Count | None = None
    missing_ranks: Annotated[list[Annotated[int, Meta(ge=0, le=1 << 20)]], Meta(max_length=1 << 20)] | None = None
    ranks: dict[Annotated[str, Meta(max_length=16)], Any] | None = None


class _Meta(msgspec.Struct):
    """The known keys of `meta` and their types (NOTE [ Trace checks ], rule 3); other keys are any JSON."""

    model: Name | None = None
    mode: Name | None = None
    schedule: Name | None = None
    description: Annotated[str, Meta(max_length=65536)] | None = None
    look_at: Annotated[str, Meta(max_length=65536)] | None = None
    versions: dict[Annotated[str, Meta(max_length=64)], Name] | None = None
    sources: Annotated[dict[Site, Annotated[str, Meta(max_length=MAX_SOURCE_CHARS)]],
                       Meta(max_length=MAX_SOURCE_SITES)] | None = None
    actions: Annotated[list[tuple[Literal["F", "DX", "DW", "B"], Count, Count, Count]], Meta(max_length=1 << 24)
                       ] | None = None
    replay_checks: _ReplayChecks | None = None
    distributed: _Distributed | None = None
    partial: bool | _Partial | None = None
    partial_reason: Annotated[str, Meta(max_length=4096)] | None = None
    plan_profile: PlanProfile | None = None  # ckpt_viz.plan.attach: one step profiled for the planner


class _Document(msgspec.Struct, kw_only=True, omit_defaults=True):
    format: Literal["ckpt_viz.trace"]
    schema_version: int
    meta: dict[Annotated[str, Meta(max_length=256)], Any] = {}
    events: list[Event] = []
    memory: list[MemorySample] = []
    graphs: list[GraphSnapshot] = []


_ENCODER = msgspec.json.Encoder()
_HEADER = msgspec.json.Decoder(_Header)


@lru_cache(maxsize=8)
def _decoder(max_events: int) -> msgspec.json.Decoder[Any]:
    capped = msgspec.defstruct("_CappedDocument", [("events", Annotated[list[Event], Meta(max_length=max_events)], [])],
                               bases=(_Document,), kw_only=True, omit_defaults=True)
    return msgspec.json.Decoder(capped)


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("ckpt_viz")
    except Exception:
        return "unknown"


# ---------------------------------------------------------------- encode / decode

def encode(trace: Trace, *, name: str = "<bytes>", api: str = "ckpt_viz.Trace.to_json") -> bytes:
    """The JSON bytes of `trace`'s file (format and schema version first).

    Raises:
        TraceError: a value is not JSON (an object of another type put into an event or the meta by hand).
    """
    try:
        return _ENCODER.encode(_Document(format=FORMAT, schema_version=SCHEMA_VERSION, meta=trace.meta,
                                         events=trace.events, memory=trace.memory, graphs=trace.graphs))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as err:
        raise TraceError(f"{api}: cannot write {name}: a value of the trace cannot be written as JSON ({err}); "
                         f"nothing was written.\n{_WRONG_VALUE}") from None


def decode(raw: bytes | bytearray, name: str, api: str, *, max_events: int = files.DEFAULT_MAX_EVENTS) -> Trace:
    """Check the JSON bytes of a trace file and build the `Trace` (NOTE [ Trace checks ])."""
    from ckpt_viz.trace import Trace

    if not raw or raw.isspace():
        raise TraceError(f"{api}: {name} is empty.\n{_RERECORD}")
    if raw[:1] == b"\x80":  # pickle protocol 2 and later start with PROTO
        raise TraceError(f"{api}: {name} is not a ckpt_viz trace: it looks like a Python pickle, which ckpt_viz never "
                         "unpickles (unpickling a file can run any code).\nTip: open a file written by Trace.save or "
                         "`ckpt-viz record` (plain JSON).")
    # The whole document is decoded first (one pass over the bytes); a refusal, or another schema version, is then
    # explained by the header, so its message comes first (NOTE [ Trace checks ], rule 1).
    try:
        doc = _decoder(max_events).decode(raw)
    except msgspec.ValidationError as err:
        _check_header(raw, name, api)
        tip = (_WRONG_VALUE if api.endswith((".save", ".to_json")) else "Tip: the file was changed or damaged after "
               "it was written; record the run again, or fix that field.")
        raise TraceError(f"{api}: {name} is not a valid trace: {_where(err, max_events)}.\n{tip}") from None
    except msgspec.DecodeError as err:
        _check_header(raw, name, api)
        raise TraceError(f"{api}: {name} is not a valid trace: its JSON is malformed ({err}).\n{_RERECORD}") from None
    if doc.schema_version != SCHEMA_VERSION or type(doc.schema_version) is not int:
        _check_header(raw, name, api)
    _check_order(doc, name, api)
    try:
        msgspec.convert(doc.meta, _Meta)
    except msgspec.ValidationError as err:
        raise TraceError(f"{api}: {name} is not a valid trace: meta: {_where(err, max_events)}.\nTip: fix or remove "
                         "that meta field; ckpt_viz writes it with this type.") from None
    return Trace(events=doc.events, memory=doc.memory, graphs=doc.graphs, meta=doc.meta)


def _check_header(raw: bytes | bytearray, name: str, api: str) -> None:
    """Refuse a document that is not JSON, not a ckpt_viz trace, or of another schema version (rule 1)."""
    try:
        header = _HEADER.decode(raw)
    except msgspec.DecodeError as err:
        raise TraceError(f"{api}: {name} is not a ckpt_viz trace: it is not valid JSON ({err}); the file may be "
                         f"truncated or not a trace file.\n{_RERECORD}") from None
    except msgspec.ValidationError:
        raise TraceError(f"{api}: {name} is not a ckpt_viz trace: its JSON is not an object with \"format\": "
                         f"\"{FORMAT}\".\nTip: open a file written by Trace.save or `ckpt-viz record`.") from None
    if header.format != FORMAT:
        raise TraceError(f"{api}: {name} is not a ckpt_viz trace (its \"format\" is {_show(header.format)}, expected "
                         f"\"{FORMAT}\").\nTip: open a file written by Trace.save or `ckpt-viz record`.")
    version = header.schema_version
    if type(version) is not int or version != SCHEMA_VERSION:
        when = "an older" if type(version) is int and version < SCHEMA_VERSION else "another"
        raise TraceError(f"{api}: {name} is a trace of schema version {_show(version)}, written by {when} ckpt_viz; "
                         f"this version reads schema version {SCHEMA_VERSION} only.\n{_RERECORD}")


def _where(err: msgspec.ValidationError, max_events: int) -> str:
    text = str(err)
    message, _, path = text.partition(" - at `")
    key = path.startswith("key` in `")  # an object's key, e.g. a memory category: "key` in `$.memory[0].by..."
    path = path.removeprefix("key` in `").rstrip("`").removeprefix("$").removeprefix(".")
    if key:
        return f"a key of field {path}: {message}" if path else f"a key: {message}"
    if path == "events" and "length <=" in message:
        return (f"it holds more than {max_events:,} events (the cap; raise it with max_events= or the environment "
                f"variable {files.MAX_EVENTS_ENV})")
    return f"field {path}: {message}" if path else message


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_order(doc: _Document, name: str, api: str) -> None:
    """NOTE [ Trace checks ], rule 3."""
    seqs = list(map(_SEQ, doc.events))
    increasing = all(map(lt, seqs, islice(seqs, 1, None)))  # (in C; the loop below finds the first fault)
    previous = -1
    for i, seq in enumerate(() if increasing else seqs):
        if seq <= previous:
            raise TraceError(f"{api}: {name} is not a valid trace: events[{i}].seq is {seq} after "
                             f"{previous}; event seqs must strictly increase.\nTip: events are written in the order "
                             "they happened; do not reorder or duplicate them.")
        previous = seq
    last = seqs[-1] if seqs else -1
    previous = -1
    for i, sample in enumerate(doc.memory):
        if sample.seq < previous or sample.seq > last:
            raise TraceError(f"{api}: {name} is not a valid trace: memory[{i}].seq is {sample.seq}"
                             + (f" after {previous}" if sample.seq < previous else f", past the last event ({last})")
                             + ".\nTip: a memory sample follows an event of the trace, in order.")
        previous = sample.seq
    for i, graph in enumerate(doc.graphs):
        if graph.seq > last:
            raise TraceError(f"{api}: {name} is not a valid trace: graphs[{i}].seq is {graph.seq}, past the last "
                             f"event ({last}).\nTip: a graph snapshot follows an event of the trace.")


# ---------------------------------------------------------------- files

def save(trace: Trace, path: str | PathLike[str]) -> None:
    """Write `trace` to `path` as JSON (gzip if the name ends with ".gz"), atomically; see NOTE [ Trace checks ]."""
    name = os.fspath(path)
    api = "ckpt_viz.Trace.save"
    files.check_writable(name, api)
    payload = encode(trace, name=name, api=api)
    decode(payload, name, api, max_events=max(len(trace.events), 1))  # rule 4: what we write, we read
    if name.endswith(".gz"):
        payload = gzip.compress(payload, compresslevel=GZIP_LEVEL, mtime=0)
    files.write_atomically(name, payload, api)


def load(path: str | PathLike[str], *, max_bytes: int | None = None, max_events: int | None = None) -> Trace:
    """Read and check a trace file (gzip or not: the content decides)."""
    name = os.fspath(path)
    api = "ckpt_viz.Trace.load"
    cap_bytes = files.limit(max_bytes, files.MAX_BYTES_ENV, files.DEFAULT_MAX_BYTES, "max_bytes", api)
    cap_events = files.limit(max_events, files.MAX_EVENTS_ENV, files.DEFAULT_MAX_EVENTS, "max_events", api)
    raw = files.read_bounded(name, cap_bytes, api)
    text: bytes | bytearray = raw
    if raw[:2] == b"\x1f\x8b":
        try:
            text = files.gunzip_bounded(raw, cap_bytes, api, name)
        except EOFError:
            raise TraceError(f"{api}: {name} is not a valid trace: the gzip data is truncated (the file was cut "
                             f"short).\n{_RERECORD}") from None
        except (OSError, zlib.error) as err:
            raise TraceError(f"{api}: {name} is not a valid trace: it is not a valid gzip file, or it is corrupt "
                             f"({err}).\n{_RERECORD}") from None
    return decode(text, name, api, max_events=cap_events)
