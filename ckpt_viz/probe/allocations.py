"""Memory by category from the allocator's own record: `record(memory=True)` without a Python call per op.

Owns `AllocationProbe`, the reader behind `record(memory=True)`, and `open_probe`, which
picks it or the dispatch tracker. torch's memory-only profiler (probe/stream.py) says
which storages are live at every instant; saved-tensor hooks, the runtime's holds
(`ckpt_viz.runtime.memtags`), the sampling points (probe/points.py) and the
parameters say what they are held for. It counts what the dispatch tracker
(`MemoryProbe` in probe/memory.py, its test oracle and fallback) counts, by the same
rules (NOTE [ Memory categories ] there). Never the UI.

NOTE [ Allocation ledger ]
  1. Readings are deferred. `mark(seq, t_ns)` at an event or a sampling point logs
     the instant with a marker (a one-byte storage, probe/stream.py NOTE rule 4); what
     is live then is what the stream has allocated and not freed up to that marker.
     Each batch the stream drains is replayed against the log at once (`_on_batch`),
     and its readings go to `keep` (the recording's `points.Steps`, which stores only
     the changes) as they are made, so a long recording holds its samples, not every
     reading; with no `keep`, `finish()` (after `__exit__`) returns them.
  2. The log is in program order. Entries that must fall between two allocations carry
     a marker of their own and are replayed exactly there: the readings (M), a hold's
     beginning (H: saved-tensor pack, memtags.hold), a pass's beginning (F) and a cache
     the runtime reads (C: counted from there, "other" whenever it was made, so a
     recording reads the same whether the cache was made in it or before). The others
     (R: a hold's owner was collected, P: a tensor known from before the probe, S: a
     stage assignment, D: a watched storage died) are applied right before the next
     marked entry, after the stream's events up to it; that resolves the same way
     whatever their order with the stream because a storage's address is reused only
     after it died, and its death is in the log (the weakref), before any hold on the
     storage that reused it. A hold usually ends as its storage dies, whose free the
     stream has where it happened; one that outlives its hold keeps the hold's category
     at a high-water mark until the next marked entry (rule 7).
  3. Where it can differ from the tracker (which counts the storages ops touch):
     (a) storages the stream never saw allocated (from before the probe) count once
     they are known: given, a parameter, a buffer, a gradient, held, optimizer state,
     or `memtags.seen`; the tracker also counts one that an op only reads, so pass
     such tensors (`record(tensors=...)`) to count them from the start; (b) a storage
     allocated outside any op and never touched by one counts here: a Python scalar
     multiplied into a tensor that needs grad becomes a 0-dim tensor (8 B) that the
     graph keeps and no dispatch mode sees (8-24 B on a nested recording and at two
     events of a 2-layer GPT-2 step; none on the built-in models, tested), and the
     scratch buffers a kernel allocates and frees inside one op count at a high-water
     mark (rule 7), which the tracker never sees; (c) a storage this thread allocated
     and another thread frees stays counted, as that free is not in this thread's
     stream (on a GPU the engine's device threads are in it: they run the graph task
     of this thread).
  4. `torch.get_rng_state()` allocates a state tensor outside any op (torch's
     checkpoint and ours keep one per region for the replay): the stream has it, and
     the tracker registers it through a wrapper (probe/memory.py NOTE rule 9).
  5. The stage of a storage no hold claims is the stage open at the event before its
     allocation (the tracker: at its allocation). Stage tags change at events, so
     this differs only for bytes allocated between an action's last event and the
     next action's first.
  6. The stream is drained every DRAIN_EVERY marks, so its buffer stays bounded in a
     long recording, but never inside a backward: the engine runs each node under the
     thread-local state it captured when the backward began, which holds the profiler
     session of that time, so a session restarted inside a backward would miss the
     rest of that backward's allocations. So there is no `sample()`: a reading in the
     middle of a backward could not be made exact.
  7. High-water marks. The replay applies the stream one allocation at a time; between
     two readings it keeps the reading at the instant the live bytes were highest, and
     stores it (tied to the earlier reading's seq, at the allocator's time of that
     instant) when it is above both readings. So the highest sample of a recording is
     the allocator's own peak over the block after its first event, with the
     categories of that instant (before the first event there is no seq to tie a
     sample to: open the block where the loop starts).
"""
from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from ckpt_viz import bus
from ckpt_viz.errors import RecordingError
from ckpt_viz.probe.ledger import PHASE_CATEGORIES, RANK, Ledger
from ckpt_viz.probe.memory import MemoryProbe, join_layer, leave_layer
from ckpt_viz.probe.stream import AllocationStream, Batch
from ckpt_viz.runtime import memtags

__all__ = ["AllocationProbe", "open_probe"]

DRAIN_EVERY = 1024
_GRAD = operator.attrgetter("grad")
_MARKED = frozenset("MHFC")  # log entries with a marker of their own at [1] (NOTE rule 2)


class AllocationProbe:
    """Live bytes by category at each `mark`, and the high-water marks between; see NOTE [ Allocation ledger ].

    Args:
        params: parameters to count as "parameters" (their .grad as "gradients").
        tensors: other tensors that exist before the probe starts, counted as "inputs".
        buffers: the model's buffers, counted as "parameters".
    Open it with `open_probe`, which gives it the allocation stream.
    """

    deferred = True  # readings come from `finish()`, not from `sample()` at each event

    def __init__(self, params: Iterable[torch.Tensor] = (), tensors: Iterable[torch.Tensor] = (),
                 buffers: Iterable[torch.Tensor] = ()) -> None:
        self._stream: AllocationStream | None = None
        self._pending = (list(params), list(tensors), list(buffers))
        self._params: list[torch.Tensor] = []
        self._param_ids: set[int] = set()
        self._log: list[tuple] = []
        self._ledger = Ledger()
        self._readings: list[tuple[int, int, tuple, int | None]] = []  # kept for `finish()` where `keep` is None
        self.keep: Any = None  # keep(seq, t_ns, totals, device, by_stage): each reading as the replay makes it
        self._last_read: tuple[int, int] | None = None  # (seq, t_ns) of the last reading
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
        self._modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # those add_module counted
        self.phase: str | None = None
        self._grads_read = False  # since the pass opened (`mark`)
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        # NOTE rule 7: the interval since the last reading
        self._high = 0  # the most live bytes seen in it
        self._rising: tuple[Batch, int] | None = None  # the allocation that set _high, not yet read
        self._peak: tuple | None = None  # (t_ns, reading, device, ledger.born, ledger.grads) at _high
        self._last_total = 0  # the total of the last reading
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
        if param.grad is not None:
            self._know(param.grad)

    def add_module(self, module: torch.nn.Module) -> None:
        """Count `module`'s parameters and buffers as "parameters" (once per module)."""
        if module in self._modules:
            return
        self._modules.add(module)
        for p in module.parameters():
            self.add_param(p)
        for b in module.buffers():
            self.add_buffer(b)

    def add_buffer(self, buffer: torch.Tensor) -> None:
        """Count `buffer`'s storage as "parameters" (model state that is not trained)."""
        if id(buffer) not in self._param_ids:
            self._param_ids.add(id(buffer))
            self._know(buffer, param=True)

    def assign_stage(self, tensors: Iterable[torch.Tensor], stage: Any) -> None:
        """Count these tensors' storages (e.g. a pipeline stage's parameters) under `stage` in `by_stage`."""
        for tensor in tensors:
            self._know(tensor)
            storage = tensor.untyped_storage()
            self._log.append(("S", storage.data_ptr(), storage.nbytes(), stage))

    def hold(self, owner: Any, tensor: torch.Tensor, category: str) -> None:
        """Count `tensor`'s storage as held for `category` until `owner` is garbage-collected (owner None: until
        the storage dies). `category` "other" (from `memtags.seen`): no hold, only count the storage from now on.
        """
        if category not in RANK:
            if category == "other" and self._stream is not None:  # a cache the runtime reads (memtags.seen)
                try:
                    storage = tensor.untyped_storage()
                except (RuntimeError, NotImplementedError):
                    return
                ptr = storage.data_ptr()
                self._log.append(("C", self._stream.mark(), ptr, storage.nbytes(), bus.current_tags().get("stage")))
                self._watch_storage(storage, ptr)
            return
        stream = self._stream
        if stream is None:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if isinstance(tensor, torch.nn.Parameter) and id(tensor) not in self._param_ids:
            self.add_param(tensor)
        key = None if owner is None else next(self._keys)
        ptr = storage.data_ptr()
        self._log.append(("H", stream.mark(), key, ptr, storage.nbytes(), category, bus.current_tags().get("stage")))
        self._watch_storage(storage, ptr)
        if owner is not None:
            ref = _Ref(owner, self._released)
            ref.key = key
            self._watched[id(ref)] = ref

    def set_phase(self, phase: str | None) -> None:
        """What is allocated from now on (and held by nothing) counts for this pass (NOTE [ Memory categories ])."""
        self.phase = phase
        self._grads_read = False
        if self._stream is not None:
            self._log.append(("F", self._stream.mark(), PHASE_CATEGORIES[phase]))

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
        """The event `seq` happened now (or a sampling point after it): its reading comes out of `finish()`."""
        stream = self._stream
        if stream is None:
            return
        grads = None  # read once as a pass opens and at every mark between passes; a forward sets no .grad,
        if self.phase not in ("forward", "backward") or not self._grads_read:  # and what a backward sets counts as
            grads, self._grads_read = self._grad_ptrs(), True  # "gradients" anyway (its pass's category)
        device = torch.cuda.memory_allocated() if self.cuda else None
        self._log.append(("M", stream.mark(), seq, t_ns, grads, bus.current_tags().get("stage"), device))
        self._marks += 1
        if self._marks >= self._drain_at and torch._C._current_graph_task_id() == -1:
            self._drain_at = self._marks + DRAIN_EVERY
            stream.drain()

    def _on_batch(self, batch: Batch) -> None:
        """Replay a drained batch and the log up to its last marked entry (NOTE rule 2); keep the rest."""
        log, ledger, events = self._log, self._ledger, batch.events
        cut = max((i for i, entry in enumerate(log) if entry[0] in _MARKED), default=-1)
        skip = batch.markers
        start, pending = 0, []
        for entry in log[:cut + 1]:
            kind = entry[0]
            if kind not in _MARKED:
                pending.append(entry)
                continue
            end = batch.locate(entry[1])  # None: a marker made on another thread, applied where the replay is
            if end is not None and end >= start:
                self._advance(batch, start, end + 1, skip)  # the stream's events first, then the log's
                start = end + 1
            if pending:
                self._settle()  # a D entry may drop a storage from before the probe: read the high first
                for held in pending:
                    ledger.apply(held)
                pending.clear()
                self._rise(None)
            if kind == "M":
                self._read(entry)
            else:
                if kind == "H" and entry[2] is None and self._peak is not None:
                    self._held_at_peak(entry)
                ledger.apply(entry)
                self._rise(None)
        self._advance(batch, start, len(events), skip)  # after the last marker: read at the next one
        del log[:cut + 1]

    def _advance(self, batch: Batch, start: int, end: int, skip: set[int]) -> None:
        """Apply batch.events[start:end] one by one, keeping the high-water mark (NOTE rule 7)."""
        ledger, events = self._ledger, batch.events
        alloc, free = ledger.alloc, ledger.free
        high, rising = self._high, self._rising
        for i in range(start, end):
            ptr, size = events[i]
            if size > 0:
                if i in skip:
                    continue
                alloc(ptr, size)
                if ledger.live > high:
                    high, rising = ledger.live, (batch, i)
            else:
                if rising is not None:  # the live bytes fall from a new high: read it now
                    self._high, self._rising = high, rising
                    self._settle()
                    rising = None
                free(ptr)
        self._high, self._rising = high, rising

    def _rise(self, where: tuple[Batch, int] | None) -> None:
        if self._ledger.live > self._high:
            self._high, self._rising = self._ledger.live, where or self._rising or (None, -1)

    def _settle(self) -> None:
        """The live bytes are at this interval's high now: keep this instant's reading (NOTE rule 7)."""
        rising = self._rising
        if rising is None:
            return
        self._rising = None
        batch, index = rising
        ledger = self._ledger
        reading = ledger.reading(None, ledger.stage_now)
        if batch is not None and index >= 0:
            t_ns, device = batch.time_ns(index), batch.device_total(index)
        else:
            t_ns, device = 0, None
        self._peak = (t_ns, reading, device, ledger.born, ledger.grads)

    def _held_at_peak(self, entry: tuple) -> None:
        """A hold for the storage's life (owner None) that begins after this interval's high-water mark, on a
        storage live then and held by nothing then: it counts there for what it is held for (NOTE rule 7). An
        optimizer's first step makes its state before the update that reaches the step's peak, and says what it
        is (the step's post-hook) only after."""
        ptr, category, stage = entry[3], entry[5], entry[6]
        (totals, by_stage, _), born, grads = self._peak[1], self._peak[3], self._peak[4]  # type: ignore[index]
        rec = self._ledger.store.get(ptr)
        if rec is None or rec.born > born or rec.param or ptr in grads or any(rec.holds.values()):
            return
        totals[rec.default] -= rec.nbytes
        totals[category] += rec.nbytes
        new_stage = stage if stage is not None else rec.stage
        for (name, where), sign in (((rec.default, rec.stage), -1), ((category, new_stage), 1)):
            if where is not None and str(where) in by_stage:
                by_stage[str(where)][name] += sign * rec.nbytes

    def _read(self, entry: tuple) -> None:
        """A reading at a marker, after the interval's high-water mark if that was higher (NOTE rule 7)."""
        _, _, seq, t_ns, grads, stage, device = entry
        reading = self._ledger.reading(grads, stage)
        total = sum(reading[0].values())
        peak = self._peak
        if self._rising is not None:  # still rising at the marker: the reading is the high
            peak = None
        if peak is not None and self._last_read and sum(peak[1][0].values()) > max(total, self._last_total):
            last_seq, last_t = self._last_read
            self._put(last_seq, min(max(peak[0], last_t), t_ns), peak[1], peak[2])
        self._put(seq, t_ns, reading, device)
        self._last_read = (seq, t_ns)
        self._last_total = total
        self._high, self._rising, self._peak = self._ledger.live, None, None

    def _put(self, seq: int, t_ns: int, reading: tuple, device: int | None) -> None:
        if self.keep is not None:  # the recording's points.Steps: only the changes are stored, as they come
            totals, by_stage, _ = reading
            self.keep(seq, t_ns, totals, device, by_stage)
        else:
            self._readings.append((seq, t_ns, reading, device))

    def finish(self, keep: Any = None) -> list[Any]:
        """After `__exit__`: every reading, marks and high-water marks in time order, given to
        keep(seq, t_ns, totals, device, by_stage) (the recording's `points.Steps`); without `keep`, the
        MemorySamples of those that change the reading (`points.Steps`)."""
        from ckpt_viz.probe.points import Steps
        from ckpt_viz.trace import MemorySample

        samples: list[Any] = []
        if keep is None:
            keep = Steps(lambda seq, t_ns, totals, device, by_stage: samples.append(MemorySample(
                seq=seq, t_ns=t_ns, bytes_by_category=totals, device_allocated=device, by_stage=by_stage)))
        for seq, t_ns, (totals, by_stage, _), device in self._readings:
            keep(seq, t_ns, totals, device, by_stage)
        self._readings.clear()
        return samples

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> AllocationProbe:
        if self._stream is None:
            raise RecordingError("ckpt_viz.probe.AllocationProbe: it has no allocation stream.\n"
                                 "Tip: open it with ckpt_viz.probe.allocations.open_probe().")
        params, tensors, buffers = self._pending
        for p in params:
            self.add_param(p)
        for b in buffers:
            self.add_buffer(b)
        for t in tensors:
            self._know(t)
            self.hold(None, t, "inputs")
        self._layer = join_layer(self)
        self._detach_holder = memtags.install(self.hold)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._detach_holder is not None:
            self._detach_holder()
            self._detach_holder = None
        layer, self._layer = self._layer, None
        stream = self._stream
        try:
            if layer is not None:
                leave_layer(self, layer)
        finally:
            if stream is not None:
                try:
                    stream.close()  # its last batch comes to _on_batch
                finally:
                    self._stream = None
            self._watched.clear()
            self._log.clear()
            self._params.clear()
            self._grad_known = {}
            self._pending = ([], [], [])
            self._ledger = Ledger()


def open_probe(params: Iterable[torch.Tensor] = (), tensors: Iterable[torch.Tensor] = (),
               buffers: Iterable[torch.Tensor] = ()) -> Any:
    """The probe for `record(memory=True)`: an `AllocationProbe` on torch's memory-only profiler where this
    thread can have it (probe/stream.py NOTE rule 1), else the dispatch tracker (`MemoryProbe`). Enter it right
    away: the stream is this probe's from now until it closes.
    """
    probe = AllocationProbe(params, tensors, buffers)
    stream = AllocationStream.acquire(probe._on_batch)
    if stream is None:
        return MemoryProbe(params, tensors, buffers)
    probe._stream = stream
    return probe


class _Ref(weakref.ref):
    __slots__ = ("key", "ptr")

