"""The allocator's own record of every allocation and free, read without a Python call per op.

Owns `AllocationStream`: torch's profiler run with memory profiling only (no op
events, so its cost per op is a few C++ stores), drained into `(ptr, nbytes)` pairs
in allocation order (`nbytes` < 0 for a free). Never the UI.

NOTE [ Allocation stream ]
  1. One per process. torch's profiler (kineto) is process-wide state: two threads
     profiling at once crash the process, so `acquire()` hands the stream to one
     probe at a time and says no (None) while it is taken, while any torch profiler
     is already running, or where the stream cannot be exact (a CUDA device is
     available: its caching allocator reports rounded block sizes, not storage bytes).
     A probe that gets None uses the dispatch tracker (probe/memory.py).
  2. Only the thread that acquired the stream (and the autograd work it launches,
     which inherits its thread-local state) reports allocations, as the tracker's
     dispatch mode sees only its own thread's ops.
  3. Draining stops and restarts the profiler. Nothing on this thread may allocate or
     free a storage in between (the collector is paused there), else that event would
     be missed.
  4. torch prints a line to stderr when a profiler starts and stops, and warns that no
     kineto events matched; the stream silences file descriptor 2 around those calls
     (another thread's stderr output in that instant is lost) and ignores that one
     warning while it runs. torch's CPU allocator also logs, once and then every
     1000th time, that a block allocated before profiling was freed; that line shows.
  5. A user's own torch profiler cannot start while the stream runs (torch refuses a
     second profiler on a thread, and two threads profiling at once crash it): leave
     memory=False while profiling with torch.profiler.
"""
from __future__ import annotations

import contextlib
import gc
import operator
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["AllocationStream"]

_LOCK = threading.Lock()
_taken = False
_KINETO_WARNING = "Failed to recover relationship between all profiler and kineto events"
_EXTRA = operator.attrgetter("extra_fields")
_PAIR = operator.attrgetter("ptr", "alloc_size")


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the block (NOTE rule 4)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _config() -> tuple[object, set]:
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

    # Positional: state, report_input_shapes, profile_memory, with_stack, with_flops, with_modules, experimental.
    config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
    # An activity is required; MTIA records nothing where there is no MTIA device, so only the
    # allocation events come back (the CPU activity would record every op).
    return config, {ProfilerActivity.MTIA}


def _usable() -> bool:
    if torch.cuda.is_available():
        return False
    mtia = getattr(torch, "mtia", None)
    try:
        if mtia is not None and mtia.is_available():
            return False
    except Exception:  # an MTIA module that cannot answer: do not risk it
        return False
    return not torch.autograd._profiler_enabled()


class AllocationStream:
    """The process's one memory-only profiler session (NOTE [ Allocation stream ])."""

    def __init__(self) -> None:
        self._config = _config()
        self._running = False
        self._filter: Any = None
        self._markers: list[Any] = []  # kept alive until drained, so a marker's address is its last allocation
        self.thread = threading.get_ident()

    @staticmethod
    def acquire() -> AllocationStream | None:
        """Start the stream on this thread, or None if it is taken or cannot be exact here (NOTE rule 1)."""
        global _taken
        if torch._C._current_graph_task_id() != -1:  # inside a backward: see allocations.py NOTE rule 6
            return None
        with _LOCK:
            if _taken or not _usable():
                return None
            _taken = True
        stream = AllocationStream()
        # A drain inside an op's C++ call (an event from a saved-tensor hook) has its warning raised when that
        # call returns, outside any catch_warnings here: this filter lives as long as the stream (NOTE rule 4).
        warnings.filterwarnings("ignore", message=_KINETO_WARNING, category=UserWarning)
        stream._filter = warnings.filters[0]
        try:
            stream._start()
        except Exception:
            stream._unfilter()
            with _LOCK:
                _taken = False
            return None
        return stream

    def _unfilter(self) -> None:
        with contextlib.suppress(ValueError):
            warnings.filters.remove(self._filter)
        mutated = getattr(warnings, "_filters_mutated", None)  # what filterwarnings calls: drop cached verdicts
        if mutated is not None:
            mutated()

    def _start(self) -> None:
        from torch.autograd import _enable_profiler, _prepare_profiler

        config, activities = self._config
        with _quiet_stderr():
            _prepare_profiler(config, activities)
            _enable_profiler(config, activities)
        self._running = True

    def _stop(self) -> list[tuple[int, int]]:
        from torch.autograd import _disable_profiler

        self._running = False
        with _quiet_stderr(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Failed to recover relationship ... kineto events" (NOTE rule 4)
            result = _disable_profiler()
        # No op events: every event is an allocation (or a free), a root of the tree, in the order made.
        fields = map(_EXTRA, result.experimental_event_tree())
        return list(map(_PAIR, fields))

    def mark(self) -> int:
        """A one-byte marker storage (no op, so no dispatch mode sees it): its address marks this instant."""
        storage = torch.UntypedStorage(1)
        self._markers.append(storage)
        return storage.data_ptr()

    def locate(self, events: list[tuple[int, int]], marks: list[int]) -> list[tuple[int, int | None]]:
        """Each mark's place in the last drain: (the index of its marker's allocation, that same index)."""
        where = {ptr: i for i, (ptr, size) in enumerate(events) if size > 0}  # last allocation at each address
        last = len(events) - 1
        return [(last, -1) if (i := where.get(m)) is None else (i, i) for m in marks]

    def drain(self) -> list[tuple[int, int]]:
        """Every allocation and free since the last drain, in order; the stream keeps running (NOTE rule 3)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            found = self._stop()
            self._start()
            self._markers.clear()
        finally:
            if collecting:
                gc.enable()
        return found

    def close(self) -> list[tuple[int, int]]:
        """Stop the stream for good and hand it back; return what it recorded since the last drain."""
        global _taken
        try:
            return self._stop() if self._running else []
        finally:
            self._markers.clear()
            self._unfilter()
            with _LOCK:
                _taken = False
