"""The allocator's own record of every allocation and free, read without a Python call per op.

Owns `AllocationStream`: torch's profiler run with memory profiling only (no op
events, so its cost per allocation is a few C++ stores), drained into `Batch`es of
`(ptr, nbytes)` pairs in allocation order (`nbytes` < 0 for a free). Never the UI.

NOTE [ Allocation stream ]
  1. One profiler session per process, read by every open `AllocationStream` (one per
     probe: nested recordings each read it, each from when it opened), all on the
     thread that started it. torch's profiler (kineto) is process-wide state: two
     threads profiling at once crash the process, so `acquire()` says no (None) on
     another thread while the session runs, and while any other torch profiler runs
     (the user's own). A probe that gets None uses the dispatch tracker
     (probe/memory.py).
  2. Only the thread that started the session (and the autograd work it launches,
     which inherits its thread-local state, on a GPU's device threads too) reports
     allocations, as the tracker's dispatch mode sees only its own thread's ops.
  3. A drain stops and restarts the profiler and hands the same `Batch` to every open
     stream's `on_batch`, at once, so each reads it with its own marks. Nothing on
     this thread may allocate or free a storage in between (the collector is paused
     there), else that event would be missed.
  4. A mark is a one-byte marker storage (no op, so no dispatch mode sees it), kept
     alive until the drain: its allocation is the last at its address in the batch, so
     its index marks the instant. Every marker is left out of every reader's replay.
  5. torch prints a line to stderr when a profiler starts and stops, and warns that no
     kineto events matched; the stream silences file descriptor 2 around those calls
     (another thread's stderr output in that instant is lost) and ignores that one
     warning while it runs. torch's CPU allocator also logs, once and then every
     1000th time, that a block allocated before profiling was freed; that line shows.
  6. A user's own torch profiler cannot start while the stream runs (torch refuses a
     second profiler on a thread, and two threads profiling at once crash it): leave
     memory=False while profiling with torch.profiler, or open the profiler first
     (then `record(memory=True)` uses the dispatch tracker).
  7. On a GPU the events are the caching allocator's: sizes are its blocks (rounded up
     to 512 bytes), as `torch.cuda.memory_allocated()` counts them, and each event
     carries the allocator's own total (`Batch.device_total`). The backward runs on the
     engine's device threads, whose events come in their own run: a batch is put in the
     order of the profiler's clock (events less than its resolution apart may swap).
     Not yet run on a GPU: `test_peak_on_a_gpu` (tests/recording/test_memory_peak.py,
     marked gpu) is the check.
  8. torch's profiler starts a thread of its own (kineto's) the first time it runs in a
     process, and keeps it. A process that must stay single-threaded to fork safely
     (the app's warm sandbox, ckpt_viz/usermodel/forked.py) records inside
     `no_profiler()`: every probe opened there is the dispatch tracker.
"""
from __future__ import annotations

import contextlib
import gc
import operator
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["AllocationStream", "Batch", "no_profiler", "quiet_stderr"]

_LOCK = threading.Lock()
_held_off = 0  # open no_profiler() blocks (NOTE rule 8)
_KINETO_WARNING = "Failed to recover relationship between all profiler and kineto events"
_EXTRA = operator.attrgetter("extra_fields")
_PAIR = operator.attrgetter("ptr", "alloc_size")
_START = operator.attrgetter("start_time_ns")


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the block: torch's profiler prints on start and stop (NOTE rule 5)."""
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


@contextlib.contextmanager
def no_profiler() -> Iterator[None]:
    """Probes opened in the block never start torch's profiler: they use the dispatch tracker (NOTE rule 8)."""
    global _held_off
    with _LOCK:
        _held_off += 1
    try:
        yield
    finally:
        with _LOCK:
            _held_off -= 1


def _usable() -> bool:
    mtia = getattr(torch, "mtia", None)
    try:
        if mtia is not None and mtia.is_available():
            return False
    except Exception:  # an MTIA module that cannot answer: do not risk it
        return False
    return not torch.autograd._profiler_enabled()


class Batch:
    """What one drain read: `events[i]` is (ptr, nbytes), nbytes < 0 for a free; markers located (NOTE rule 4)."""

    __slots__ = ("_nodes", "_offset", "events", "markers", "where")

    def __init__(self, nodes: list[Any], markers: list[int], offset: int) -> None:
        self._nodes = nodes
        self._offset = offset
        self.events: list[tuple[int, int]] = list(map(_PAIR, map(_EXTRA, nodes)))
        # the last allocation at each address: a marker's own, as markers live until the drain
        self.where = {ptr: i for i, (ptr, size) in enumerate(self.events) if size > 0}
        self.markers = {i for i in map(self.where.get, markers) if i is not None}  # left out of every replay

    def locate(self, marker: int) -> int | None:
        """The index of `marker`'s allocation, or None where it is not in the batch (made on another thread)."""
        return self.where.get(marker)

    def time_ns(self, index: int) -> int:
        """When event `index` happened, on `time.monotonic_ns`'s clock."""
        return self._nodes[index].start_time_ns - self._offset

    def device_total(self, index: int) -> int | None:
        """The GPU allocator's own total right after event `index` (None for a CPU allocation; NOTE rule 7)."""
        fields = self._nodes[index].extra_fields
        return fields.total_allocated if fields.device.type != "cpu" else None


class _Session:
    """The process's one memory-only profiler session and its readers (NOTE rules 1 and 3)."""

    def __init__(self) -> None:
        self.config = _config()
        self.readers: list[AllocationStream] = []
        self.markers: list[Any] = []  # kept alive until drained (NOTE rule 4)
        self.thread = threading.get_ident()
        self.running = False
        self.filter: Any = None
        self.offset = 0  # the profiler's clock (ns since the epoch) less time.monotonic_ns

    def start(self) -> None:
        from torch.autograd import _enable_profiler, _prepare_profiler

        config, activities = self.config
        with quiet_stderr():
            _prepare_profiler(config, activities)
            _enable_profiler(config, activities)
        self.running = True
        self.offset = time.time_ns() - time.monotonic_ns()

    def stop(self) -> Batch:
        from torch.autograd import _disable_profiler

        self.running = False
        with quiet_stderr(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Failed to recover relationship ... kineto events" (NOTE rule 5)
            result = _disable_profiler()
        # No op events: every event is an allocation (or a free), a root of the tree, in the order made on each
        # thread; on a GPU the backward's device threads add their own, merged here by time (NOTE rule 7).
        nodes = result.experimental_event_tree()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            nodes = sorted(nodes, key=_START)
        return Batch(nodes, [m.data_ptr() for m in self.markers], self.offset)

    def drain(self, restart: bool = True) -> None:
        """Hand what the profiler recorded to every reader (NOTE rule 3)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            batch = self.stop()
            if restart:
                self.start()
            self.markers.clear()
        finally:
            if collecting:
                gc.enable()
        for reader in tuple(self.readers):
            reader.on_batch(batch)

    def unfilter(self) -> None:
        with contextlib.suppress(ValueError):
            warnings.filters.remove(self.filter)
        mutated = getattr(warnings, "_filters_mutated", None)  # what filterwarnings calls: drop cached verdicts
        if mutated is not None:
            mutated()


_session: list[_Session] = []  # the running session, if any


class AllocationStream:
    """One reader of the process's memory-only profiler session (NOTE [ Allocation stream ]).

    `on_batch(batch)` gets every `Batch` drained while this reader is open, in order, the last one
    when it closes.
    """

    def __init__(self, session: _Session, on_batch: Callable[[Batch], None]) -> None:
        self._session = session
        self.on_batch = on_batch
        self.thread = session.thread
        self.open = True

    @staticmethod
    def acquire(on_batch: Callable[[Batch], None]) -> AllocationStream | None:
        """A reader of the session (started now if none runs), or None (NOTE rule 1)."""
        if torch._C._current_graph_task_id() != -1 or _held_off:  # in a backward (allocations.py NOTE rule 6),
            return None  # or in no_profiler() (NOTE rule 8)
        with _LOCK:
            if _session:
                session = _session[0]
                if session.thread != threading.get_ident():
                    return None
                session.drain()  # what came before this reader opened is the others' only
                stream = AllocationStream(session, on_batch)
                session.readers.append(stream)
                return stream
            if not _usable():
                return None
            session = _Session()
            # A drain inside an op's C++ call (an event from a saved-tensor hook) has its warning raised when that
            # call returns, outside any catch_warnings here: this filter lives as long as the session (NOTE rule 5).
            warnings.filterwarnings("ignore", message=_KINETO_WARNING, category=UserWarning)
            session.filter = warnings.filters[0]
            try:
                session.start()
            except Exception:
                session.unfilter()
                return None
            stream = AllocationStream(session, on_batch)
            session.readers.append(stream)
            _session.append(session)
            return stream

    def mark(self) -> int:
        """A one-byte marker storage: its address marks this instant in the next batch (NOTE rule 4)."""
        storage = torch.UntypedStorage(1)
        self._session.markers.append(storage)
        return storage.data_ptr()

    def drain(self) -> None:
        """Hand every reader what was allocated and freed since the last drain; the session keeps running."""
        self._session.drain()

    def close(self) -> None:
        """Hand this reader its last batch and stop reading; the last reader out stops the session."""
        if not self.open:
            return
        self.open = False
        session = self._session
        with _LOCK:
            last = len(session.readers) == 1
            try:
                session.drain(restart=not last)
            finally:
                session.readers.remove(self)
                if last:
                    session.unfilter()
                    _session.clear()
