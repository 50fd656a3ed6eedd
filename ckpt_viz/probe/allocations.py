"""Memory by category from the allocator's record: `record(memory=True)` without a Python call per op.

Owns `AllocationProbe`, the fast reader behind `record(memory=True)`: the allocation
stream (the native log of probe/native.py, as `open_probe` picks; or torch's profiler,
probe/stream.py, for tests) says which storages are live at each event; saved-tensor
hooks, the runtime's holds (`ckpt_viz.runtime.memtags`) and the parameters say what
they are held for. It counts what the dispatch tracker (`MemoryProbe` in
probe/memory.py, its test oracle) counts, by the same rules (NOTE [ Memory
categories ] there). Never the UI.

NOTE [ Allocation ledger ]
  1. Readings are deferred. `mark(seq, t_ns)` at an event logs the event with the
     stream's mark (the native log: its position; the profiler: a one-byte marker
     storage, kept alive until drained so its address is its last allocation); what
     is live at the event is what the stream has allocated and not freed up to that
     mark. `finish()` (after `__exit__`) replays the stream against the log and
     returns the MemorySamples, one per change of reading, as the recording stores
     them.
  2. The log is in program order: holds begin (saved-tensor pack, memtags.hold) and
     end (their owner is collected), storages die (a weakref per held or known
     storage), tensors known from before the probe (parameters, the given tensors)
     and stage assignments. Between two markers the stream's events are applied
     first, then the log's; every case where the two interleave resolves the same
     way because a storage's address is reused only after it died, and its death is
     in the log (the weakref), before any hold on the storage that reused it.
  3. Where it can differ from the tracker (which counts the storages ops touch):
     (a) storages the stream never saw allocated (from before the probe) count once
     they are known: given, a parameter, a gradient, held, or `memtags.seen`; the
     tracker also counts one that an op only reads, so pass such tensors
     (`record(tensors=...)`) to count them from the start; (b) a storage allocated
     outside any op and never touched by one counts here as "other": a Python scalar
     multiplied into a tensor that needs grad becomes a 0-dim tensor (8 B) that the
     graph keeps and no dispatch mode sees (8-24 B on a nested recording and at two
     events of a 2-layer GPT-2 step; none on the built-in models, tested); (c) the
     profiler only: a storage this thread allocated and another thread frees stays
     counted, as that free is not in this thread's stream (the native log has it).
  4. `torch.get_rng_state()` allocates a state tensor outside any op, which the
     tracker never sees; while a stream runs, that function (`torch.get_rng_state`
     and `torch.random.get_rng_state`, which torch's checkpoint, `fork_rng` and the
     runtime call) notes its result (with a marker), and the replay leaves that
     allocation out. A reference taken before the probe opened is not wrapped.
  5. The stage of a storage no hold claims is the stage open at the event before its
     allocation (the tracker: at its allocation). Stage tags change at events, so
     this differs only for bytes allocated between an action's last event and the
     next action's first.
  6. The stream is drained every DRAIN_EVERY marks, so its buffer stays bounded
     in a long recording, but never inside a backward (for the profiler): the engine runs each
     node under the thread-local state it captured when the backward began, which
     holds the profiler session of that time, so a session restarted inside a
     backward would miss the rest of that backward's allocations. So there is no
     `sample()`: a reading in the middle of a backward could not be made exact.
"""
from __future__ import annotations

import itertools
import operator
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from ckpt_viz import bus
from ckpt_viz.probe.ledger import RANK, Ledger
from ckpt_viz.probe.memory import MemoryProbe, join_layer, leave_layer
from ckpt_viz.runtime import memtags

__all__ = ["AllocationProbe", "open_probe"]

DRAIN_EVERY = 256
_GRAD = operator.attrgetter("grad")


class AllocationProbe:
    """Live bytes by category at each `mark`; see NOTE [ Allocation ledger ].

    Args:
        stream: the process's allocation stream (`NativeStream.acquire()`, or the profiler's
            `AllocationStream.acquire()`), now this probe's.
        params: parameters to count as "parameters" (their .grad as "gradients").
        tensors: other tensors that exist before the probe starts (model inputs, buffers).
    """

    deferred = True  # readings come from `finish()`, not from `sample()` at each event

    def __init__(self, stream: Any, params: Iterable[torch.Tensor] = (),
                 tensors: Iterable[torch.Tensor] = ()) -> None:
        self._stream: Any = stream
        self._pending = (list(params), list(tensors))
        self._params: list[torch.Tensor] = []
        self._param_ids: set[int] = set()
        self._log: list[tuple] = []
        self._ledger = Ledger()
        self._readings: list[tuple[int, int, tuple]] = []
        self._grad_ids: tuple = ()
        self._grad_known: dict[int, tuple[Any, int]] = {}
        self._grads_stale = False
        self._grads: frozenset[int] = frozenset()
        self._keys = itertools.count()
        self._marks = 0
        self._drain_at = DRAIN_EVERY
        self._layer: Any = None
        self._detach_holder: Any = None
        self._watched: dict[int, Any] = {}  # id(weakref) -> weakref: storages and owners, dropped on close
        log = self._log
        me = weakref.ref(self)

        def died(ref: Any) -> None:  # a watched storage was freed (NOTE rule 2)
            log.append(("D", ref.ptr))
            probe = me()
            if probe is not None:
                probe._watched.pop(id(ref), None)

        def released(ref: Any) -> None:  # a hold's owner was collected
            log.append(("R", ref.key))
            probe = me()
            if probe is not None:
                probe._watched.pop(id(ref), None)

        def grad_died(ref: Any) -> None:
            probe = me()
            if probe is not None:
                probe._grads_stale = True

        self._died = died
        self._released = released
        self._grad_died = grad_died
        self.cuda = False

    # ------------------------------------------------------------ what the log learns

    def _watch_storage(self, storage: Any, ptr: int) -> None:
        ref = _Ref(storage, self._died)
        ref.ptr = ptr
        self._watched[id(ref)] = ref

    def _know(self, tensor: torch.Tensor, stage: Any = None, param: bool = False) -> None:
        """Log a storage known from before the probe (NOTE rule 3), with a weakref for its death."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        ptr = storage.data_ptr()
        self._log.append(("P", ptr, storage.nbytes(), bus.current_tags().get("stage") if stage is None else stage,
                          param))
        self._watch_storage(storage, ptr)

    def add_param(self, param: torch.Tensor) -> None:
        """Count `param`'s storage as "parameters" and its .grad as "gradients"."""
        if id(param) in self._param_ids:
            return
        self._param_ids.add(id(param))
        self._params.append(param)
        self._know(param, param=True)

    def assign_stage(self, tensors: Iterable[torch.Tensor], stage: Any) -> None:
        """Count these tensors' storages (e.g. a pipeline stage's parameters) under `stage` in `by_stage`."""
        for tensor in tensors:
            self._know(tensor)
            storage = tensor.untyped_storage()
            self._log.append(("S", storage.data_ptr(), storage.nbytes(), stage))

    def hold(self, owner: Any, tensor: torch.Tensor, category: str) -> None:
        """Count `tensor`'s storage as held for `category` until `owner` is garbage-collected.

        `category` "other" (from `memtags.seen`): no hold, only count the storage from now on.
        """
        if category not in RANK:
            if category == "other":
                self._know(tensor)
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if isinstance(tensor, torch.nn.Parameter) and id(tensor) not in self._param_ids:
            self.add_param(tensor)
        key = next(self._keys)
        ptr = storage.data_ptr()
        self._log.append(("H", key, ptr, storage.nbytes(), category, bus.current_tags().get("stage")))
        self._watch_storage(storage, ptr)
        ref = _Ref(owner, self._released)
        ref.key = key
        self._watched[id(ref)] = ref

    def note_untracked(self, tensor: torch.Tensor) -> None:
        """Leave `tensor`'s allocation out: it was made outside any op (NOTE rule 4)."""
        self._log.append(("X", self._stream.mark(), tensor.untyped_storage().data_ptr()))

    # ------------------------------------------------------------ marks and the replay

    def _grad_ptrs(self) -> frozenset[int]:
        """The storages of the parameters' .grad now. A .grad is known by its id while a weakref says it lives
        (the ref never keeps it alive; its death marks the set stale, so a reused id is never trusted)."""
        with torch._C.DisableTorchFunction():  # .grad of a Parameter is half as dear without the subclass check
            objects = tuple(map(_GRAD, self._params))
        ids = tuple(map(id, objects))
        if ids == self._grad_ids and not self._grads_stale:
            return self._grads
        self._grads_stale = False
        known, ptrs = self._grad_known, []
        fresh: dict[int, tuple[Any, int]] = {}
        for grad in objects:
            if grad is None:
                continue
            entry = known.get(id(grad))
            if entry is None or entry[0]() is not grad:
                entry = (weakref.ref(grad, self._grad_died), grad.untyped_storage().data_ptr())
            fresh[id(grad)] = entry
            ptrs.append(entry[1])
        self._grad_known, self._grad_ids = fresh, ids
        self._grads = frozenset(ptrs)
        return self._grads

    def mark(self, seq: int, t_ns: int) -> None:
        """The event `seq` happened now: its reading comes out of `finish()` (NOTE rule 1)."""
        self._log.append(("M", self._stream.mark(), seq, t_ns, self._grad_ptrs(), bus.current_tags().get("stage")))
        self._marks += 1
        if self._marks >= self._drain_at and self._stream is not None and torch._C._current_graph_task_id() == -1:
            self._drain_at = self._marks + DRAIN_EVERY
            self._replay(self._stream, self._stream.drain())

    def _replay(self, stream: Any, events: list[tuple[int, int]]) -> None:
        """Apply the drained stream and the log up to its last mark (NOTE rule 2); keep the rest of the log."""
        log, ledger = self._log, self._ledger
        cut = max((i for i, entry in enumerate(log) if entry[0] in "MX"), default=-1)
        marked = [entry for entry in log[:cut + 1] if entry[0] in "MX"]
        located = stream.locate(events, [entry[1] for entry in marked])
        skip: set[int] = set()
        for entry, (end, own) in zip(marked, located):
            if own is not None:
                skip.add(own)  # the marker storage itself
            if entry[0] == "X":  # NOTE rule 4: the last allocation at its address before its mark
                for i in range(end if own is None else end - 1, -1, -1):
                    if events[i][0] == entry[2] and events[i][1] > 0:
                        skip.add(i)
                        break
        start, pending, places = 0, [], iter(located)
        for entry in log[:cut + 1]:
            if entry[0] not in "MX":
                pending.append(entry)
                continue
            end = next(places)[0]
            self._stream_to(events, start, end + 1, skip)  # the stream's events first, then the log's
            start = max(start, end + 1)
            for held in pending:
                ledger.apply(held)
            pending.clear()
            if entry[0] == "M":
                self._readings.append((entry[2], entry[3], ledger.reading(entry[4], entry[5])))
        self._stream_to(events, start, len(events), skip)  # after the last marker: read at the next one
        del log[:cut + 1]

    def _stream_to(self, events: list[tuple[int, int]], start: int, end: int, skip: set[int]) -> None:
        """Apply events[start:end] by their net effect: what was freed of the storages before them, and what
        is still allocated after them (a storage allocated and freed in between never shows)."""
        freed: set[int] = set()
        made: dict[int, int] = {}
        for i in range(start, end):
            ptr, size = events[i]
            if size > 0:
                if i not in skip:
                    made[ptr] = size
            elif made.pop(ptr, None) is None:
                freed.add(ptr)
        ledger = self._ledger
        for ptr in freed:
            ledger.free(ptr)
        for ptr, size in made.items():
            ledger.alloc(ptr, size)

    def finish(self, keep: Any = None) -> list[Any]:
        """The MemorySamples of every mark, one per change of reading (after `__exit__`); with `keep`, each
        change goes to keep(seq, t_ns, totals, device, by_stage) instead (a recording's RecordedMemory.keep)
        and nothing is returned."""
        from ckpt_viz.trace import MemorySample

        samples, last = [], None
        for seq, t_ns, reading in self._readings:
            if reading != last:
                last = reading
                totals, by_stage, device = reading
                if keep is not None:
                    keep(seq, t_ns, totals, device, by_stage)
                    continue
                samples.append(MemorySample(seq=seq, t_ns=t_ns, bytes_by_category=totals,
                                            device_allocated=device, by_stage=by_stage))
        self._readings.clear()
        return samples

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> AllocationProbe:
        params, tensors = self._pending
        for p in params:
            self.add_param(p)
        for p in params:
            if p.grad is not None:
                self._know(p.grad)
        for t in tensors:
            self._know(t)
        self._layer = join_layer(self)
        self._detach_holder = memtags.install(self.hold)
        _watch_rng(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _unwatch_rng(self)
        if self._detach_holder is not None:
            self._detach_holder()
            self._detach_holder = None
        layer, self._layer = self._layer, None
        stream, self._stream = self._stream, None
        try:
            if layer is not None:
                leave_layer(self, layer)
        finally:
            if stream is not None:
                self._replay(stream, stream.close())
            self._watched.clear()
            self._log.clear()
            self._params.clear()
            self._grad_known = {}
            self._pending = ([], [])
            self._ledger = Ledger()


def open_probe(params: Iterable[torch.Tensor] = (), tensors: Iterable[torch.Tensor] = ()) -> Any:
    """The probe for `record(memory=True)`: an `AllocationProbe` on the native allocation log while it is
    free and usable here (probe/native.py NOTE rules 3-4) and parameters are given, else the dispatch
    tracker (`MemoryProbe`), which finds parameters as ops read them (NOTE rule 3a). Enter it right away:
    the log is this probe's from now until it closes.
    """
    params = list(params)
    stream = None  # the memory helper replaces this (h-memory)
    if stream is None:
        return MemoryProbe(params, tensors)
    return AllocationProbe(stream, params, tensors)


class _Ref(weakref.ref):
    __slots__ = ("key", "ptr")


_RNG: dict[str, Any] = {"probes": ()}  # the original get_rng_state functions while probes watch them


def _watch_rng(probe: AllocationProbe) -> None:
    """NOTE rule 4: while `probe` runs, `torch.get_rng_state()` on its thread notes its result."""
    _RNG["probes"] = (*_RNG["probes"], weakref.ref(probe))
    if "original" in _RNG:  # a nested probe: the wrapper is in place and now reaches it too
        return
    original = torch.random.get_rng_state

    def get_rng_state() -> torch.Tensor:
        state = original()
        for ref in _RNG["probes"]:
            owner = ref()
            stream = owner._stream if owner is not None else None
            if stream is not None and threading.get_ident() == stream.thread:
                owner.note_untracked(state)
        return state

    get_rng_state.__wrapped__ = original  # type: ignore[attr-defined]
    _RNG["original"] = original
    _RNG["ours"] = get_rng_state
    torch.get_rng_state = torch.random.get_rng_state = get_rng_state


def _unwatch_rng(probe: AllocationProbe) -> None:
    _RNG["probes"] = tuple(ref for ref in _RNG["probes"] if ref() is not None and ref() is not probe)
    if _RNG["probes"]:
        return
    original, ours = _RNG.pop("original", None), _RNG.pop("ours", None)
    if original is None:
        return
    if torch.random.get_rng_state is ours:
        torch.random.get_rng_state = original
    if torch.get_rng_state is ours:
        torch.get_rng_state = original
