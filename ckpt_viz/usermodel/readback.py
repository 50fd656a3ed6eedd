"""What a sandboxed child leaves in its folder, read back with bounds.

Only regular files (opened without following a link, never blocking on a FIFO), each within
a size cap; a trace also within an event cap, checked from the length of its lists before an
event is built, and never gzip (the child writes plain JSON, so a compressed file was put there
by the model's code). Every refusal is a `SandboxCrashError` that says what was found.
Standard library, msgspec and ckpt_viz's torch-free modules only.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec

from ckpt_viz.errors import SandboxCrashError, TraceError
from ckpt_viz.trace import Trace
from ckpt_viz.usermodel.isolation import Limits

__all__ = ["load_trace", "read", "tail"]

_API = "ckpt_viz.record_in_subprocess"
_TAIL_CHARS = 2000


def read(path: Path, cap: int, what: str) -> bytes | None:
    """The bytes of a regular file (never through a link, never a FIFO) of at most `cap` bytes; None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SandboxCrashError(f"{_API}: the child left {what} that cannot be opened ({exc.strerror}: it may be "
                                "a link); nothing was read.\nTip: the model's code replaced the sandbox's own "
                                "file; make it write its files elsewhere.") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SandboxCrashError(f"{_API}: the child left {what} that is not a regular file; nothing was "
                                    "read.\nTip: the model's code replaced the sandbox's own file.")
        if info.st_size > cap:
            raise SandboxCrashError(f"{_API}: the child left {what} of {info.st_size / 2**20:.1f} MiB, over the "
                                    f"cap of {cap / 2**20:.1f} MiB; it was not read.\nTip: record fewer steps "
                                    "or a smaller model, or pass a larger max_trace_mb.")
        return f.read(cap + 1)[:cap]


def tail(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - _TAIL_CHARS))
        return f.read(_TAIL_CHARS).decode("utf-8", "replace").strip()


def load_trace(path: Path, limits: Limits) -> Trace:
    """The child's trace, refused when over the size or event cap (the count read before the events are built)."""
    cap = limits.max_trace_mb * 2**20
    raw = read(path, cap, "a trace file")
    assert raw is not None
    if raw[:2] == b"\x1f\x8b":
        raise SandboxCrashError(f"{_API}: the child's trace.json is gzip-compressed; the child writes plain "
                                "JSON, so it was replaced by the model's code and was not read.\nTip: make the "
                                "model write its files elsewhere.")
    try:  # only the lengths of the two lists: no event is built (a malformed file is Trace.load's to explain)
        outline = msgspec.json.decode(raw, type=_Outline)
    except msgspec.MsgspecError:
        outline = None
    del raw
    if outline is not None and len(outline.events) + len(outline.memory) > limits.max_events:
        raise _too_many(len(outline.events) + len(outline.memory), limits)
    del outline
    try:
        trace = Trace.load(path, max_bytes=cap, max_events=limits.max_events)
    except TraceError as exc:
        raise SandboxCrashError(f"{_API}: the child wrote a trace that does not load: {exc}") from None
    if len(trace.events) + len(trace.memory) > limits.max_events:
        raise _too_many(len(trace.events) + len(trace.memory), limits)
    return trace


class _Outline(msgspec.Struct):
    """A trace file's lists, each element left undecoded."""

    events: list[msgspec.Raw] = []
    memory: list[msgspec.Raw] = []


def _too_many(count: int, limits: Limits) -> SandboxCrashError:
    return SandboxCrashError(f"{_API}: the child's trace holds {count:,} events, over the cap of "
                             f"{limits.max_events:,}; it was not kept.\nTip: record fewer steps or micro-batches, "
                             "or pass a larger max_events.")
