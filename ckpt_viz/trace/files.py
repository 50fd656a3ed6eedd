"""Trace files on disk: bounded reads, a capped gunzip, atomic fsync-ed writes, OS errors in plain words.

Owns every system call on a trace file (and on `ckpt-viz export`'s output): `read_bounded`,
`gunzip_bounded`, `check_writable` and `write_atomically`. Each failure is a `TraceError` that
names the user's path (never the hidden temporary file) and ends with a tip; one caused by the
operating system is a `TraceFileError`, which is also an `OSError` with its `errno`. What the
bytes mean (JSON, the document) is `ckpt_viz.trace.io`. Standard library only; never torch.

NOTE [ Bounded reads ]
  1. Only a regular file is read. The path is stat-ed before it is opened, so a FIFO, a device
     (/dev/zero), a socket or a folder is refused without being opened; the open uses O_NONBLOCK
     (a FIFO swapped in after the stat cannot block it) and the open file is stat-ed again.
     Files under /proc and /sys are refused too: they claim a size of 0, and reading one can
     block, never end, or show the process's memory or environment.
  2. At most `max_bytes` are read (the size is checked before reading, and the read stops one
     byte past the cap in case the file grows), and at most `max_bytes` are inflated from a
     gzip file: the stream is inflated in pieces of at most 4 MiB, counted, so a 6 GB gzip
     bomb is refused after `max_bytes` of work. What is inflated is kept up to 128 MiB or 16
     times the compressed size, whichever is more (a trace ckpt_viz writes inflates about 11
     times: it is inflated once); past that it is dropped and counted only, and a file that
     turns out to fit is inflated a second time. The memory a refused bomb takes is 128 MiB
     (or 16 times its size on disk) and a piece, whatever the cap: a bomb inflates a
     thousand times.
  3. The caps default to DEFAULT_MAX_BYTES and DEFAULT_MAX_EVENTS; the environment variables
     CKPT_VIZ_TRACE_MAX_BYTES and CKPT_VIZ_TRACE_MAX_EVENTS change the defaults, and the
     keyword arguments of `Trace.load` override both.

NOTE [ Atomic save ]
  1. The whole file is encoded in memory first (by the caller); a value that is not JSON
     fails there, before anything touches the disk.
  2. `check_writable` tries the folder before the work that makes the bytes (a recording),
     by creating and removing a temporary file there.
  3. The bytes go to a temporary file in the target's folder, which is flushed, fsync-ed and
     then renamed over the target with os.replace (atomic on POSIX and Windows); then the
     folder is fsync-ed. A crash leaves either the old file or the new one, never half of
     one; a failure removes the temporary file (in a `finally`, whatever was raised).
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import os
import stat
import tempfile
import zlib
from typing import NoReturn

from ckpt_viz.errors import TraceError, TraceFileError

MAX_EVENTS_ENV = "CKPT_VIZ_TRACE_MAX_EVENTS"

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_EVENTS",
    "MAX_BYTES_ENV",
    "MAX_EVENTS_ENV",
    "TraceFileError",
    "check_writable",
    "gunzip_bounded",
    "limit",
    "read_bounded",
    "write_atomically",
]

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB of JSON: about 18 times the 1,000,000-event benchmark trace (56 MiB)
DEFAULT_MAX_EVENTS = 5_000_000
MAX_BYTES_ENV = "CKPT_VIZ_TRACE_MAX_BYTES"


_IN_PIECE = 256 << 10  # compressed bytes fed to zlib at a time
_OUT_PIECE = 4 << 20  # inflated bytes taken out at a time
_KEEP = 128 << 20  # inflated bytes kept on the first pass, at least (NOTE [ Bounded reads ], rule 2)
_KEEP_RATIO = 16  # ... or this many times the compressed size


# ---------------------------------------------------------------- limits

def limit(value: int | None, env: str, default: int, name: str, api: str) -> int:
    """`value`, else the environment variable `env`, else `default`; a positive integer, or a TraceError."""
    source = f"{name}={value!r}"
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        source = f"the environment variable {env}={text!r}"
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            value = None
    if type(value) is not int or value < 1:
        raise TraceError(f"{api}: {source} is not a positive whole number.\nTip: pass a number of "
                         f"{'bytes' if 'BYTES' in env else 'events'} of 1 or more (the default is {default:,}).")
    return value


# ---------------------------------------------------------------- reading

def read_bounded(name: str, max_bytes: int, api: str) -> bytes:
    """The bytes of the regular file `name`, at most `max_bytes` of them (NOTE [ Bounded reads ])."""
    try:
        _check_kind(name, os.stat(name), api)
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_BINARY", 0))
    except OSError as err:
        _os_fail(api, "read", name, err)
    try:
        info = os.fstat(fd)
        _check_kind(name, info, api)
        if info.st_size > max_bytes:
            too_big(api, name, f"the file holds {info.st_size:,} bytes, over the cap of {max_bytes:,} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(max(info.st_size, 1 << 16) + 1, max_bytes + 1 - size))
            if not chunk:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                too_big(api, name, f"the file holds more than the cap of {max_bytes:,} bytes (it grew while read)")
    except OSError as err:
        _os_fail(api, "read", name, err)
    finally:
        os.close(fd)


def _check_kind(name: str, info: os.stat_result, api: str) -> None:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        _fail(api, "read", name, "it is a folder, not a file", "pass the path of a trace file inside it")
    if not stat.S_ISREG(mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a special file")
        _fail(api, "read", name, f"it is not a regular file but {kind}; ckpt_viz reads trace files only",
              "pass the path of a .json or .json.gz file written by ckpt_viz.Trace.save (to read a "
              "stream, save it to a file first)")
    if _on_pseudo_file_system(name, info):
        _fail(api, "read", name, "it is a file of the kernel's /proc or /sys, not a trace file",
              "pass the path of a .json or .json.gz file written by ckpt_viz.Trace.save")


def _on_pseudo_file_system(name: str, info: os.stat_result) -> bool:
    real = os.path.realpath(name)
    if any(real == root or real.startswith(root + os.sep) for root in ("/proc", "/sys")):
        return True
    for root in ("/proc", "/sys"):
        with contextlib.suppress(OSError):
            if os.stat(root).st_dev == info.st_dev:
                return True
    return False


def gunzip_bounded(raw: bytes, max_bytes: int, api: str, name: str) -> bytearray:
    """The inflated bytes of the gzip data `raw` (all members), refused past `max_bytes`.

    Raises:
        TraceError: it inflates past `max_bytes`.
        EOFError: the data ends before the end of the compressed stream.
        OSError, zlib.error: it is not gzip data, or it is corrupt.
    """
    kept, size = _inflate(raw, max_bytes, keep=min(max_bytes, max(_KEEP, _KEEP_RATIO * len(raw))))
    if size > max_bytes:
        too_big(api, name, f"it is gzip-compressed and inflates to more than {max_bytes:,} bytes, the cap "
                           f"(from {len(raw):,} bytes on disk; inflating stopped there)")
    if kept is None:  # fits, but was too big to keep on the first pass
        kept, _ = _inflate(raw, max_bytes, keep=max_bytes)
    assert kept is not None
    return kept


def _inflate(raw: bytes, max_bytes: int, keep: int) -> tuple[bytearray | None, int]:
    # (the inflated bytes, or None when more than `keep`; their size, or a size past max_bytes). They grow in one
    # bytearray (a big one grows in place), not pieces joined at the end (a copy of them all: 0.2 s of a 1M-event load).
    view = memoryview(raw)
    chunks: bytearray | None = bytearray()
    size = pos = 0
    while True:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not member.eof:
            if pos >= len(view):
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            # Pieces in and out, so a refused bomb holds at most `keep` and one piece (not a kept result and
            # zlib's copy of it). A tail zlib leaves is a copy of its piece of input: it is never fed again,
            # the view is (from where zlib stopped).
            piece = view[pos:pos + _IN_PIECE]
            out = member.decompress(piece, _OUT_PIECE)
            pos += len(piece) - len(member.unconsumed_tail)
            size += len(out)
            if size > max_bytes:
                return None, size
            if chunks is not None:
                if size > keep:
                    chunks = None
                else:
                    chunks += out
        pos -= len(member.unused_data)
        if pos >= len(view):
            return chunks, size
        if bytes(view[pos:pos + 2]) != b"\x1f\x8b":
            raise gzip.BadGzipFile("Not a gzipped file (unexpected data after the compressed stream)")


def too_big(api: str, name: str, what: str) -> NoReturn:
    _fail(api, "read", name, what,
          f"if the file is a real trace, pass a larger max_bytes to ckpt_viz.Trace.load or set the "
          f"environment variable {MAX_BYTES_ENV}; otherwise it is not a trace file (a gzip bomb?)")


# ---------------------------------------------------------------- writing

def check_writable(name: str, api: str) -> None:
    """Raise a TraceError now if `name` cannot be written (NOTE [ Atomic save ], rule 2)."""
    if os.path.isdir(name):
        _fail(api, "write", name, "it is a folder", "pass a file name, e.g. trace.json inside that folder")
    folder = _folder(name)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(name)}.", suffix=".tmp", dir=folder)
    except OSError as err:
        _os_fail(api, "write", name, err)
    os.close(fd)
    os.unlink(tmp)


def write_atomically(name: str, payload: bytes, api: str) -> None:
    """Write `payload` to `name` through an fsync-ed temporary file and a rename (NOTE [ Atomic save ])."""
    if os.path.isdir(name):
        _fail(api, "write", name, "it is a folder", "pass a file name, e.g. trace.json inside that folder")
    folder = _folder(name)
    tmp = None
    try:
        mode = _file_mode(name)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(name)}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, name)
        tmp = None
    except OSError as err:
        _os_fail(api, "write", name, err)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    _fsync_folder(folder)


def _folder(name: str) -> str:
    return os.path.dirname(os.path.abspath(name))


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


# ---------------------------------------------------------------- errors

def _fail(api: str, verb: str, name: str, what: str, tip: str) -> NoReturn:
    raise TraceError(f"{api}: cannot {verb} '{name}': {what}.\nTip: {tip}.")


def _os_fail(api: str, verb: str, name: str, err: OSError) -> NoReturn:
    what, tip = _explain(err, verb, name)
    exc = TraceFileError(f"{api}: cannot {verb} '{name}': {what}.\nTip: {tip}.")
    exc.errno = err.errno  # only errno: OSError's str() would show strerror and filename instead of the message
    raise exc from None


def _explain(err: OSError, verb: str, name: str) -> tuple[str, str]:
    code, said = err.errno, err.strerror or str(err)
    folder = os.path.dirname(name) or "."
    if code == errno.ENOENT:
        if verb == "read":
            return "no such file", "check the path; ckpt_viz.Trace.save(path) writes a trace file"
        return (f"the folder '{folder}' does not exist",
                f"create it first (mkdir -p '{folder}'), or pass a path in an existing folder")
    if code == errno.ELOOP:
        return ("the path has a symbolic link loop (Too many levels of symbolic links)",
                "fix or remove the link (ls -l shows where each link points)")
    if code == errno.ENAMETOOLONG:
        return "the name is too long for the file system (File name too long)", "use a shorter path"
    if code in (errno.EACCES, errno.EPERM):
        return (f"permission denied ({said})",
                "check the file's and its folders' permissions (ls -l), or copy it somewhere you can read"
                if verb == "read" else f"check that you may write in '{folder}' (ls -ld), or save elsewhere")
    if code == errno.ENOTDIR:
        return "a part of the path is a file, not a folder (Not a directory)", "check the path"
    if code == errno.EISDIR:
        return "it is a folder", "pass a file name, e.g. trace.json inside that folder"
    if code == errno.ENOSPC:
        return f"{said}", "free some disk space, or save to another disk"
    if code == errno.EROFS:
        return f"{said}", "save to a folder on a writable disk"
    return f"{said}", ("check that the disk is healthy and the path is right, then try again"
                       if verb == "read" else "check the disk and the folder, then save again")
