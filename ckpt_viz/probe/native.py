"""The native allocation log: every CPU allocation and free, without the profiler and without a Python call per op.

Owns `NativeStream`, the allocation stream `record(memory=True)` reads (through
`AllocationProbe` in probe/allocations.py), and the build of its C++ half,
probe/csrc/alloc_log.cpp. Never the UI.

NOTE [ Native log ]
  1. The library wraps torch's CPU allocator (`c10::SetAllocator`, public C++ API):
     an allocation made on a thread whose logging flag is on is logged as
     (ptr, nbytes), and its free, on any thread, as (ptr, -nbytes), while a stream
     is open. The flag is on for the thread that acquired the stream, as the
     tracker's dispatch mode sees only its own thread's ops; a CPU-only backward
     runs on that thread. Allocations made while no flag is on pass through
     untouched (one virtual call and a thread-local test more).
  2. A mark is the log's position (a plain read of a counter), so the stream's
     events before a mark are exactly those logged before it; no marker storage.
  3. Built once per torch version and source (g++ against torch's headers and
     libc10) into the user's cache, `$CKPT_VIZ_CACHE` or `$XDG_CACHE_HOME/ckpt_viz`
     or `~/.cache/ckpt_viz`, saying so on stderr (a library already built under the
     account's home directory is used where $HOME points elsewhere, as in the app's
     sandbox, if that directory can be read). Where it cannot be built or
     loaded (no compiler, a read-only cache), where a CUDA or MTIA device is
     available (their caching allocators are not this one), where another
     allocator of higher priority is installed, or with `CKPT_VIZ_NATIVE=0`,
     `acquire()` returns None and the probe is the dispatch tracker.
  4. The log is process-wide and has readers (one per open probe), all on one
     thread: nested recordings each read it (each from when it opened); a probe
     opened on another thread while one is open gets None, so the tracker. A
     drain moves what the log holds to every open reader. torch's own profiler
     keeps working: the wrapper forwards to the allocator that reports to it.
  5. What bypasses the CPU allocator is not in the log: `torch.UntypedStorage(n)`
     made from Python (torch uses its default allocator there), memory a tensor
     borrows (`torch.from_numpy`, `torch.frombuffer`). None of these is an op's
     output, and the runtime makes none while recording.
"""
from __future__ import annotations

import array
import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from ckpt_viz.cext import account_cache as _account_cache
from ckpt_viz.cext import cache_dir as _cache_dir

__all__ = ["NativeStream", "library"]

SOURCE = Path(__file__).with_name("csrc") / "alloc_log.cpp"
PRIORITY = 1  # above torch's default CPU allocator (0)
_LOCK = threading.Lock()
_library: list[Any] = []  # [the loaded library or None] once tried


def _build(target: Path) -> None:
    from torch.utils.cpp_extension import include_paths

    lib = Path(torch.__file__).parent / "lib"
    compiler = os.environ.get("CXX", "g++")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, "-O2", "-shared", "-fPIC", "-std=c++17",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *(f"-I{p}" for p in include_paths()), str(SOURCE), "-o", scratch,
           f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]
    print(f"ckpt_viz: building the native allocation log once (a few seconds) into {target.parent}",
          file=sys.stderr)
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        os.replace(scratch, target)  # atomic: a parallel build leaves one whole file
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


def _load() -> Any:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + torch.__version__.encode()).hexdigest()[:16]
    name = f"native/alloc_log-torch{torch.__version__}-{key}.so"
    target = _cache_dir() / name
    if not target.exists():
        built = _account_cache() / name  # a child whose HOME was moved (the app's sandbox) reads the user's
        if built.exists():
            target = built
        else:
            _build(target)
    lib = ctypes.CDLL(str(target))
    lib.path = target
    lib.ckpt_alloc_log_drain.restype = ctypes.c_void_p
    lib.ckpt_alloc_log_drain.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
    lib.ckpt_alloc_log_position_address.restype = ctypes.c_void_p
    lib.ckpt_alloc_log_live.restype = ctypes.c_int64
    if not lib.ckpt_alloc_log_install(PRIORITY):
        return None
    lib.position = ctypes.c_int64.from_address(lib.ckpt_alloc_log_position_address())
    return lib


def _usable() -> bool:
    if os.environ.get("CKPT_VIZ_NATIVE", "1") == "0" or torch.cuda.is_available():
        return False
    mtia = getattr(torch, "mtia", None)
    try:
        return not (mtia is not None and mtia.is_available())
    except Exception:  # an MTIA module that cannot answer: do not risk it
        return False


def library() -> Any:
    """The loaded log, or None where it cannot be built, loaded or installed here (NOTE rule 3)."""
    if not _library:
        try:
            _library.append(_load() if _usable() else None)
        except Exception as exc:  # no compiler, a read-only cache, a failed build: the tracker
            print(f"ckpt_viz: the native allocation log is not available ({exc}); memory=True uses the "
                  "dispatch tracker", file=sys.stderr)
            _library.append(None)
    return _library[0]


class NativeStream:
    """One reader of the process's allocation log, for `AllocationProbe` (NOTE [ Native log ])."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._position = lib.position
        self._events: list[tuple[int, int]] = []  # drained from the log for this stream, not yet handed out
        self._next = 0  # the position of the first event after `_events`
        self._first = 0  # the position of the first event of the last drain handed out
        self._open = True
        self.thread = threading.get_ident()

    @staticmethod
    def acquire() -> NativeStream | None:
        """A reader of the log with logging on for this thread, or None (NOTE rules 3 and 4)."""
        if not _usable():
            return None
        lib = library()
        if lib is None:
            return None
        with _LOCK:
            if _open and _open[0].thread != threading.get_ident():
                return None
            lib.ckpt_alloc_log_open(1)
            end = _pull(lib)  # what the log holds is the open readers' (NOTE rule 4)
            stream = NativeStream(lib)
            stream._next = stream._first = end
            _open.append(stream)
        lib.ckpt_alloc_log_thread(1)
        before = stream.mark()
        probe = torch.empty(1)  # an allocator another library installed since: not logged, so not exact
        logged = stream.mark() > before
        del probe
        if not logged:
            stream.close()
            return None
        return stream

    def mark(self) -> int:
        """The log's position now: the events logged before it happened before this instant (NOTE rule 2)."""
        return self._position.value

    def locate(self, events: list[tuple[int, int]], marks: list[int]) -> list[tuple[int, int | None]]:
        """Each mark's place in the last drain: (the index of its last event before it, no marker event)."""
        first, last = self._first, len(events) - 1
        return [(min(max(m - first - 1, -1), last), None) for m in marks]

    def drain(self) -> list[tuple[int, int]]:
        """Every allocation and free logged since the last drain (or since this reader opened), in order."""
        with _LOCK:
            _pull(self._lib)
            events, self._events = self._events, []
            self._first, self._next = self._next, self._next + len(events)
        return events

    def close(self) -> list[tuple[int, int]]:
        """Turn this reader's logging off and return what it logged since the last drain."""
        if not self._open:
            return []
        self._open = False
        self._lib.ckpt_alloc_log_thread(-1)
        try:
            return self.drain()
        finally:
            with _LOCK:
                _open.remove(self)
                self._lib.ckpt_alloc_log_open(0)


_open: list[NativeStream] = []  # the open readers, all on one thread (NOTE rule 4)


def _pull(lib: Any) -> int:
    """Move what the log holds to every open reader (with _LOCK held); return the position after it."""
    count, first = ctypes.c_int64(), ctypes.c_int64()
    address = lib.ckpt_alloc_log_drain(ctypes.byref(count), ctypes.byref(first))
    end = first.value + count.value
    if not count.value or not _open:
        return end
    pairs = array.array("q")
    pairs.frombytes(ctypes.string_at(address, count.value * 16))
    events = list(zip(pairs[0::2], pairs[1::2]))
    for stream in _open:
        stream._events.extend(events)
    return end
