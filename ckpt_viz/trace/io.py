"""Trace files: `save` and `load` a `Trace` as JSON, gzip-compressed when the name ends in ".gz".

Owns the bytes: JSON encoding and parsing, gzip compression, and the entry
points behind `Trace.save`/`load`/`to_dict`/`from_dict` with their `TraceError`
messages. The document inside a file is `ckpt_viz.trace.schema` (layout and
validation) and `ckpt_viz.trace.document` (parts <-> document). Works on a trace's
parts (`ckpt_viz.trace.types.TraceParts`) and never imports the `Trace` class:
`load_parts` returns the keyword arguments of `Trace`. Standard library only
(orjson is used when installed, as a pure speed-up); never torch, and never pickle:
a trace file is plain JSON that `json.load` reads.

The system calls (bounded reads, the capped gunzip, the atomic fsync-ed write, OS errors
as `TraceError`s naming the user's path) are `ckpt_viz.trace.files`: see NOTE [ Bounded
reads ] and NOTE [ Atomic save ] there. Where our C speed-up is built, a load reads two long
columns in C and the checks run one C pass per column: NOTE [ Checks in C ] in
`ckpt_viz.trace.fastcheck` (the same documents load, with the same errors, without it).
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from os import PathLike
from typing import Any, NoReturn

from ckpt_viz.errors import TraceError
from ckpt_viz.trace import fastcheck, files
from ckpt_viz.trace.document import document_parts, from_document, to_document
from ckpt_viz.trace.packed import DataColumn, data_shape, unpack_runs
from ckpt_viz.trace.schema import (
    FORMAT,
    SCHEMA_VERSION,
    TIP_REWRITE,
    TIP_TRUNCATED,
    InvalidDocument,
    check_document,
    check_part,
    show,
)
from ckpt_viz.trace.types import TraceParts

try:  # optional speed-up; the files are the same standard JSON with or without it
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["FORMAT", "SCHEMA_VERSION", "load_parts", "package_version", "parts_from_dict", "save", "to_dict"]

GZIP_LEVEL = 1  # traces are repetitive: level 1 is several times faster than 9 and nearly as small

_NONE = type(None)
# Make orjson refuse what the stdlib json refuses, so that the stdlib decides those cases.
_ORJSON_STRICT = (
    _orjson.OPT_PASSTHROUGH_DATACLASS | _orjson.OPT_PASSTHROUGH_DATETIME | _orjson.OPT_PASSTHROUGH_SUBCLASS
    if _orjson is not None else 0
)


# ---------------------------------------------------------------- save

def save(trace: TraceParts, path: str | PathLike[str]) -> None:
    """Write `trace` to `path` as JSON (gzip if the name ends with ".gz"), atomically.

    See NOTE [ Atomic save ] in `ckpt_viz.trace.files`.

    Raises:
        TraceError: the trace holds a value a trace file cannot; nothing is written.
        TraceFileError (a TraceError and an OSError): the folder is missing or not writable,
            the disk is full...; an existing file is untouched and no temporary file is left.
    """
    name = os.fspath(path)
    with _gc_paused():
        try:
            payload = _payload(trace, name.endswith(".gz"))
        except InvalidDocument as bad:
            raise TraceError(
                f"ckpt_viz.Trace.save: cannot save to '{name}': {bad.what}.\nTip: {bad.save_tip}.") from None
    files.write_atomically(name, payload, "ckpt_viz.Trace.save")


def _payload(trace: TraceParts, compress: bool) -> bytes:
    # The file's bytes: each field of the document checked and encoded as soon as it is made, and with
    # `compress` gzip-ed on a thread meanwhile (zlib lets go of the GIL): NOTE [ Saving fast ], rule 4.
    # The same bytes as encoding the whole document at once.
    pieces: list[bytes] = []
    gz = _Gzip() if compress else None
    try:
        for key, value in document_parts(trace):
            check_part(key, value)
            encoded = _encode_value(value)
            if encoded is None:  # a value neither encoder takes: the whole document says where
                return _encode(to_document(trace))
            piece = b"".join((b"," if pieces else b"{", b'"', key.encode("ascii"), b'":', encoded))
            pieces.append(piece)
            if gz is not None:
                gz.add(piece)
        if gz is None:
            return b"".join((*pieces, b"}"))
        gz.add(b"}")
        return gz.result()
    finally:
        if gz is not None:
            gz.close()


class _Gzip:
    """gzip (level GZIP_LEVEL, mtime 0) of the pieces added, compressed on a thread as they come."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 31: a gzip header, as gzip.compress
        self._pieces: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._out: list[bytes] = []
        self._thread = threading.Thread(target=self._run, name="ckpt_viz.Trace.save gzip", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (piece := self._pieces.get()) is not None:
            self._out.append(self._deflate.compress(piece))
        self._out.append(self._deflate.flush())

    def add(self, piece: bytes) -> None:
        self._pieces.put(piece)

    def result(self) -> bytes:
        self.close()
        return b"".join(self._out)

    def close(self) -> None:
        if self._thread.is_alive():
            self._pieces.put(None)
            self._thread.join()


def to_dict(trace: TraceParts) -> dict[str, Any]:
    """The JSON document of `trace`; it shares lists with `trace`.

    See NOTE [ Trace file format, schema 2 ] in `ckpt_viz.trace.schema`.

    Raises:
        TraceError: the trace holds something that is not an Event or MemorySample, or a bad t_ns or data.
    """
    try:
        return to_document(trace)
    except InvalidDocument as bad:
        raise TraceError(
            f"ckpt_viz.Trace.to_dict: cannot convert the trace: {bad.what}.\nTip: {bad.save_tip}.") from None


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
        raise InvalidDocument(f"{_locate_unencodable(doc)} cannot be written as JSON ({err})", tip, tip) from None
    return text.encode("ascii")


def _encode_value(value: Any) -> bytes | None:
    # `_encode` of one value; None where it would raise (the caller then encodes the whole document).
    if _orjson is not None:
        with contextlib.suppress(TypeError):
            return _orjson.dumps(value, option=_ORJSON_STRICT)
    try:
        try:
            return _stdlib_dumps(value).encode("ascii")
        except ValueError:
            return _stdlib_dumps(_finite(value)).encode("ascii")
    except (TypeError, ValueError, RecursionError):
        return None


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
        return f"{where} ({show(value)})"

    for part in ("events", "memory"):
        for name, column in doc[part]["columns"].items():
            if part == "events" and type(column) is dict and name != "seq":  # packed: look at the plain column
                column = list(DataColumn(column["keys"], data_shape(column, doc["events"]["columns"]["context"]),
                                         column["values"])) if name == "data" else unpack_runs(column)
            if bad(column):
                i = next(i for i, v in enumerate(column) if bad(v))
                return walk(column[i], f"{part}[{i}].{name}")
    if bad(doc["events"]["tables"]):
        return walk(doc["events"]["tables"], "the tags of an event")
    return walk({k: v for k, v in doc.items() if k not in ("events", "memory")}, "")


# ---------------------------------------------------------------- load

def load_parts(path: str | PathLike[str], *, max_bytes: int | None = None,
               max_events: int | None = None) -> dict[str, Any]:
    """Read a trace file written by `save` into the keyword arguments of `Trace`; gzip is detected from the content.

    Only a regular file is read, and at most `max_bytes` of JSON (after gzip) holding at most
    `max_events` events and as many memory samples; see NOTE [ Bounded reads ] in
    `ckpt_viz.trace.files`.

    Args:
        max_bytes: default `files.DEFAULT_MAX_BYTES` (1 GiB), or the environment variable
            CKPT_VIZ_TRACE_MAX_BYTES.
        max_events: default `files.DEFAULT_MAX_EVENTS` (5,000,000), or CKPT_VIZ_TRACE_MAX_EVENTS.

    Raises:
        TraceError: the file is missing, not a regular file, over a cap, empty, truncated, not JSON,
            not a trace, written by a newer ckpt_viz, or has a missing, ill-typed or out-of-range
            field; a TraceFileError (also an OSError) when the operating system refused the read.
    """
    name = os.fspath(path)
    api = "ckpt_viz.Trace.load"
    max_bytes = files.limit(max_bytes, files.MAX_BYTES_ENV, files.DEFAULT_MAX_BYTES, "max_bytes", api)
    max_events = files.limit(max_events, files.MAX_EVENTS_ENV, files.DEFAULT_MAX_EVENTS, "max_events", api)

    def fail(what: str, tip: str = TIP_REWRITE) -> NoReturn:
        # `from None`: the message already says what the parser or gzip said.
        raise TraceError(f"{api}: cannot read '{name}': {what}.\nTip: {tip}.") from None

    raw = files.read_bounded(name, max_bytes, api)
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = files.gunzip_bounded(raw, max_bytes, api, name)
        except EOFError:
            fail("the gzip data is truncated (the file ends before the end of the compressed stream)",
                 TIP_TRUNCATED)
        except (OSError, zlib.error) as err:
            fail(f"it is not a valid gzip file, or it is corrupt ({err})", TIP_REWRITE)
        if not raw:
            fail("the file is empty (a gzip file holding 0 bytes)", "record the run again")
    with _gc_paused():
        return from_document(_parse(raw, fail, max_events))


def parts_from_dict(doc: Any) -> dict[str, Any]:
    """Validate a trace document (as `to_dict` returns or `json.load` reads): the keyword arguments of `Trace`.

    Raises:
        TraceError: the document is not a trace, is too new, or has a missing or ill-typed field.
    """
    try:
        check_document(doc)
    except InvalidDocument as bad:
        raise TraceError(f"ckpt_viz.Trace.from_dict: cannot read the trace: {bad.what}.\nTip: {bad.tip}.") from None
    return from_document(doc)


def _parse(raw: bytes, fail: Callable[..., NoReturn], max_events: int) -> dict[str, Any]:
    if not raw:
        fail("the file is empty (0 bytes)", "the save that wrote it did not finish; record the run again")
    if raw[:1] == b"\x80":
        fail("it looks like a Python pickle, not JSON; ckpt_viz never unpickles files",
             "trace files are JSON; write one with ckpt_viz.Trace.save(path)")
    if _orjson is not None:
        doc = _fast_document(raw, max_events)
        if doc is not None:
            return doc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fail(f"it is not valid JSON: not UTF-8 text (byte {err.start})", TIP_REWRITE)
    if not text.strip():
        fail("the file is empty (only whitespace)", "the save that wrote it did not finish; record the run again")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        if _ends_early(text, err):
            fail(f"the JSON is truncated: it ends early ({err.msg} at line {err.lineno}, column {err.colno})",
                 TIP_TRUNCATED)
        fail(f"it is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})", TIP_REWRITE)
    except (ValueError, RecursionError) as err:
        fail(f"it is not valid JSON ({err})", TIP_REWRITE)
    try:
        check_document(doc, max_events=max_events)
    except InvalidDocument as bad:
        fail(bad.what, bad.tip)
    return doc


def _ends_early(text: str, err: json.JSONDecodeError) -> bool:
    # The parser failed at the end of the text, or on a token the end cut off
    # (`"abc`, `tru`, `nul`, `-`, `1.`): the file is a cut-off prefix, not garbage.
    tail = text[err.pos:].rstrip()
    return (not tail or err.msg.startswith("Unterminated string")
            or (len(tail) < 5 and any(word.startswith(tail) for word in ("true", "false", "null")))
            or (len(tail) < 32 and tail.strip("0123456789.eE+-") == ""))


def _fast_document(raw: bytes, max_events: int) -> dict[str, Any] | None:
    # orjson's parse if it parses and validates; otherwise None, and the stdlib
    # path parses again and explains what is wrong. First with long columns cut out and read in C
    # (NOTE [ Checks in C ], rules 4 to 6, in ckpt_viz.trace.fastcheck), then, if that is not sure, as the file is.
    split = fastcheck.split_text(raw, _orjson.loads)
    if split is not None:
        rest, placed = split
        with contextlib.suppress(ValueError, InvalidDocument):
            doc = _orjson.loads(rest)
            if all(_put(doc, path, placeholder, column) for path, (placeholder, column) in placed.items()):
                check_document(doc, max_events=max_events)
                return doc
        doc = rest = placed = None
    try:
        doc = _orjson.loads(raw)
        check_document(doc, max_events=max_events)
    except (ValueError, InvalidDocument):  # orjson.JSONDecodeError is a ValueError
        return None
    return doc


def _put(doc: Any, path: tuple[str, ...], placeholder: str, column: Any) -> bool:
    # doc[a][b][c] = column where it holds the placeholder (NOTE [ Checks in C ], rule 4); else False.
    *parents, last = path
    for key in parents:
        doc = doc.get(key) if type(doc) is dict else None
    if type(doc) is not dict or doc.get(last) != placeholder:
        return False
    doc[last] = column
    return True


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not standard JSON")


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
