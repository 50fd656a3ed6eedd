"""Memory by category at every event: the dispatch tracker, and the rules every memory probe counts by.

Owns `MemoryProbe`: a TorchDispatchMode that sees every storage an op allocates
(with a finalizer for when it is freed), a global saved-tensor hook that sees what
autograd keeps, and the runtime's hints (`ckpt_viz.runtime.memtags`). It costs a
Python call per op and reads only when asked (`sample()`), so it misses what is
allocated and freed between two readings; `open_probe` in probe/allocations.py gives
the allocation-stream probe (which counts the same by the rules below, tested
against this one, and also keeps the high-water marks between readings) where it
can run, else this one. Never the UI.

NOTE [ Memory categories ]
  1. Every live storage is counted exactly once, so the categories of a sample add
     up to the live bytes the probe saw (the tests check that against a separate
     ground-truth tracker).
  2. A storage's category is the first that applies, in this order:
     parameters (storage of a known nn.Parameter, or of a buffer of a module run in
     the block), gradients (storage of a known parameter's .grad, read at sample
     time), then the strongest *live hold* on it: optimizer_state > checkpoint_inputs
     > excluded_outputs > replay_activations > activations > outputs > inputs
     (`RANK` in probe/ledger.py), then the category of the pass that allocated it
     (rule 3), and otherwise other.
  3. Holds have lifetimes. The global saved-tensor hook wraps every tensor autograd
     saves in a small object that lives exactly as long as the saved variable, so
     a hold ends when the graph frees it; the category is the one open in
     `memtags.category(...)` at pack time, else "activations". The runtime adds
     holds tied to its own objects (`memtags.hold(owner, tensor, category)`): a
     non-reentrant frame's recomputed tensors, excluded-region outputs. The sampling
     points (probe/points.py) add holds for the life of the storage (owner None): a
     top-level module's inputs and outputs, an optimizer's state, `record(tensors=)`.
     A storage allocated while the block ran and held by nothing counts for the pass
     open when it was allocated (`PHASE_CATEGORIES`, set by the points): in a backward
     "gradients" (the gradients flowing between the ops, before any lands in a .grad),
     in an optimizer's step "optimizer_step" (the step's working tensors), elsewhere
     "other" (in a forward, the working tensors no backward keeps; between the passes,
     tensors your own code makes, e.g. a loss computed outside the model).
     A storage from before the block that nothing holds is "other", and so is a cache
     the runtime reads (`memtags.seen`), whenever it was made.
  4. In a pipeline, bytes count for the stage of their strongest live hold (the
     stage tag open when the hold began), else the stage that allocated them.
  5. Storages that existed before the probe started are registered from the
     parameters, buffers and tensors given to it, the modules and optimizers the
     sampling points meet, and from any tensor an op reads.
  6. Probes stack. A thread pushes one saved-tensor hook pair for all its probes
     (a `_Layer`) when its first probe opens, and one TorchDispatchMode when its
     first tracker (this class, not an `AllocationProbe`) joins, and pops them when
     its last probe closes, so nested probes each see every saved tensor, nested
     trackers every op, and closing them in any order pops torch's (LIFO) stacks
     once, in order. Both stacks are per thread, as the layer is (torch carries them to
     autograd worker threads with the graph task), so a probe sees only its own
     thread's ops; a probe closes on the thread that opened it. The runtime's
     `memtags` holds reach the probes of the context that makes them.
  7. No leak: a probe watches storages and owners through weakrefs it owns, whose
     callbacks hold the probe only weakly (not `weakref.finalize`, whose registry
     would keep every probe alive as long as a parameter lives). Closing the probe
     drops its records, so a closed probe is freed with its recording.
  8. torch wraps every `__torch_dispatch__` so that its first call imports
     torch._dynamo, and a `torch.fx.wrap()` in that import keeps its own frame in a
     reference cycle, and with it every frame on the stack: the user's first
     checkpoint output, whose graph would then be freed by a later garbage
     collection instead of by reference counting (a `node_collected` at a
     different seq, different memory, handle ids shifted in the next run). So the
     first probe imports torch._dynamo on a short-lived thread whose stack holds
     nothing of the user's.
  9. `torch.get_rng_state()` allocates a state tensor outside any op (torch's
     checkpoint and ours keep one per region for the replay), which no dispatch mode
     sees; while a tracker runs, that function (`torch.get_rng_state` and
     `torch.random.get_rng_state`, which torch's checkpoint, `fork_rng` and the
     runtime call) registers its result as an op's output on the tracker's thread. A
     reference taken before the probe opened is not wrapped.
"""
from __future__ import annotations

import importlib
import operator
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ckpt_viz import bus
from ckpt_viz.probe.ledger import PHASE_CATEGORIES
from ckpt_viz.probe.ledger import RANK as _RANK
from ckpt_viz.runtime import memtags
from ckpt_viz.runtime.memtags import CATEGORIES

__all__ = ["CATEGORIES", "MemoryProbe", "join_layer", "leave_layer"]


class _Storage:
    __slots__ = ("default", "holds", "nbytes", "ref", "stage")

    def __init__(self, nbytes: int, stage: Any, default: str) -> None:
        self.ref: Any = None  # the weakref whose callback forgets this record
        self.nbytes = nbytes
        self.holds: dict[tuple[str, Any], int] = {}  # (category, stage) -> live holds
        self.stage = stage
        self.default = default  # the category when nothing holds it (NOTE rule 3)

    def strongest(self) -> tuple[str, Any] | None:
        best = None
        for (category, stage), count in self.holds.items():
            if count > 0 and (best is None or _RANK[category] > _RANK[best[0]]):
                best = (category, stage)
        return best


class _Saved:
    """What the global saved-tensor hook stores: the tensor, plus a lifetime for its hold."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _Tracker(TorchDispatchMode):
    """Registers every tensor an op reads or makes with each probe of its layer."""

    def __init__(self, layer: _Layer) -> None:
        super().__init__()
        self.layer = layer

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        probes = self.layer.trackers
        seen = probes[0].seen if len(probes) == 1 else self._seen_by_all  # one bound method per op (hot path)
        for value in _tensors_of(args, kwargs):
            seen(value)
        out = func(*args, **(kwargs or {}))
        made = probes[0].made if len(probes) == 1 else self._made_by_all
        for value in _tensors_of(out, None):
            made(value)
        return out

    def _seen_by_all(self, tensor: torch.Tensor) -> None:
        for probe in self.layer.trackers:
            probe.seen(tensor)

    def _made_by_all(self, tensor: torch.Tensor) -> None:
        for probe in self.layer.trackers:
            probe.made(tensor)


_Tensor = torch.Tensor
_GRAD = operator.attrgetter("grad")


def _tensors_of(value: Any, kwargs: dict | None) -> list[torch.Tensor]:
    """The tensors in an op's arguments or result, in `tree_flatten`'s order (depth first, left to right).

    ATen's schema allows only tensors, scalars and (nested) lists, tuples and dicts of them, so this
    walk finds what `tree_flatten` would, at a fraction of its cost on every op (the tracker's hot path).
    """
    found: list[torch.Tensor] = []
    stack: list[Any] = [value] if kwargs is None else [*reversed(kwargs.values()), value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):  # named tuples too (torch.return_types.max)
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(item.values()))
    return found


def _unpack(saved: _Saved) -> torch.Tensor:
    return saved.tensor


class _Layer:
    """The one dispatch mode and saved-tensor hook pair a context pushes for all its probes (NOTE rule 6)."""

    def __init__(self) -> None:
        self.probes: tuple[Any, ...] = ()  # every probe of this thread: each gets every saved tensor
        self.trackers: tuple[MemoryProbe, ...] = ()  # those that also see every op (not an AllocationProbe)
        self._mode = _Tracker(self)
        self._mode_pushed = False
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor: torch.Tensor) -> _Saved:
        saved = _Saved(tensor.detach() if tensor.grad_fn is not None else tensor)
        category = memtags.current() or "activations"
        for probe in self.probes:
            probe.hold(saved, tensor, category)
        return saved

    def push(self) -> None:
        self._hooks.__enter__()

    def push_mode(self) -> None:
        """Push the dispatch mode when the layer's first tracker joins; it stays until the layer pops."""
        if not self._mode_pushed:
            self._mode.__enter__()
            self._mode_pushed = True

    def pop(self) -> None:
        try:
            self._hooks.__exit__(None, None, None)
        finally:
            if self._mode_pushed:
                self._mode_pushed = False
                self._mode.__exit__(None, None, None)


def join_layer(probe: Any, tracker: bool = False) -> _Layer:
    """Add `probe` to this thread's layer (made and pushed if there is none); a tracker also gets the mode."""
    layer = getattr(_THREAD, "layer", None)
    if layer is None:
        _import_dynamo_off_stack()
        layer = _Layer()
        layer.push()
        _THREAD.layer = layer
    if tracker:
        layer.push_mode()
        layer.trackers = (*layer.trackers, probe)
    layer.probes = (*layer.probes, probe)
    return layer


def leave_layer(probe: Any, layer: _Layer) -> None:
    """Take `probe` out of `layer`; the last one out pops it (NOTE rule 6)."""
    layer.probes = tuple(p for p in layer.probes if p is not probe)
    layer.trackers = tuple(p for p in layer.trackers if p is not probe)
    if not layer.probes:
        if getattr(_THREAD, "layer", None) is layer:
            _THREAD.layer = None
        layer.pop()


_THREAD = threading.local()  # .layer: this thread's _Layer, while one of its probes is open (NOTE rule 6)


def _import_dynamo_off_stack() -> None:
    """Import torch._dynamo on a bare thread before the first dispatch would import it here (NOTE rule 8)."""
    if "torch._dynamo" not in sys.modules:
        loader = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), daemon=True)
        loader.start()
        loader.join()


class _StorageRef(weakref.ref):
    __slots__ = ("key",)


class MemoryProbe:
    """Live bytes by category; see NOTE [ Memory categories ].

    Args:
        params: parameters to count as "parameters" (their .grad as "gradients").
        tensors: other tensors that exist before the probe starts (model inputs, buffers).
    """

    deferred = False  # read with `sample()` after each event (an AllocationProbe is read with mark/finish)

    def __init__(self, params: Iterable[torch.Tensor] = (), tensors: Iterable[torch.Tensor] = (),
                 buffers: Iterable[torch.Tensor] = ()) -> None:
        self._live: dict[int, _Storage] = {}
        self._lock = threading.RLock()
        self._params: list[torch.Tensor] = []
        self._param_ids: set[int] = set()
        self._param_storages: set[int] = set()
        self._modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # those add_module counted
        self._pending = (list(params), list(tensors), list(buffers))
        self.phase: str | None = None
        self._default = "other"  # PHASE_CATEGORIES[self.phase]
        self.thread: int | None = None  # the thread that opened it
        self._layer: _Layer | None = None
        self._detach_holder: Any = None
        me = weakref.ref(self)  # the callbacks below must not keep the probe alive (NOTE rule 7)

        def storage_freed(ref: _StorageRef) -> None:
            probe = me()
            if probe is not None:
                probe._forget(ref)

        def owner_gone(ref: weakref.ref) -> None:
            probe = me()
            if probe is not None:
                probe._release(ref)

        self._storage_freed = storage_freed
        self._owner_gone = owner_gone
        self._holds: dict[int, tuple[weakref.ref, _Storage, tuple[str, Any]]] = {}  # id(ref) -> its hold
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()

    # ------------------------------------------------------------ storages

    def register(self, tensor: torch.Tensor) -> _Storage | None:
        """Track `tensor`'s storage if it is new; return its record."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or meta tensors: no plain storage
            return None
        record = self._live.get(id(storage)) or self._new(storage)
        if isinstance(tensor, torch.nn.Parameter) and id(tensor) not in self._param_ids:
            self.add_param(tensor)
        return record

    def seen(self, tensor: torch.Tensor, default: str = "other") -> None:
        """`register` for the dispatch mode, which needs no record back (every op's tensors come here)."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if id(storage) not in self._live:
            self._new(storage, default)
        if tensor.__class__ is not _Tensor and isinstance(tensor, torch.nn.Parameter) \
                and id(tensor) not in self._param_ids:
            self.add_param(tensor)

    def made(self, tensor: torch.Tensor) -> None:
        """An op's output: a storage first seen here was allocated now, in the pass open now (NOTE rule 3)."""
        self.seen(tensor, self._default)

    def _new(self, storage: Any, default: str = "other") -> _Storage:
        key = id(storage)
        with self._lock:
            record = self._live.get(key)
            if record is None:
                record = _Storage(storage.nbytes(), bus.current_tags().get("stage"), default)
                ref = _StorageRef(storage, self._storage_freed)
                ref.key = key
                record.ref = ref
                self._live[key] = record
        return record

    def _forget(self, ref: _StorageRef) -> None:
        with self._lock:
            record = self._live.get(ref.key)
            if record is not None and record.ref is ref:
                del self._live[ref.key]

    def add_param(self, param: torch.Tensor) -> None:
        """Count `param`'s storage as "parameters" and its .grad as "gradients"."""
        if id(param) in self._param_ids:
            return
        self._param_ids.add(id(param))
        self._params.append(param)
        self._param_storages.add(id(param.untyped_storage()))
        self.register(param)
        if param.grad is not None:
            self.register(param.grad)

    def add_buffer(self, buffer: torch.Tensor) -> None:
        """Count `buffer`'s storage as "parameters" (model state that is not trained)."""
        if id(buffer) not in self._param_ids:
            self._param_ids.add(id(buffer))
            self._param_storages.add(id(buffer.untyped_storage()))
            self.register(buffer)

    def add_module(self, module: torch.nn.Module) -> None:
        """Count `module`'s parameters and buffers as "parameters" (once per module)."""
        if module in self._modules:
            return
        self._modules.add(module)
        for p in module.parameters():
            self.add_param(p)
        for b in module.buffers():
            self.add_buffer(b)

    def set_phase(self, phase: str | None) -> None:
        """What ops allocate from now on (and nothing holds) counts for this pass (NOTE rule 3)."""
        self.phase = phase
        self._default = PHASE_CATEGORIES[phase]

    def assign_stage(self, tensors: Iterable[torch.Tensor], stage: Any) -> None:
        """Count these tensors' storages (e.g. a pipeline stage's parameters) under `stage` in `by_stage`."""
        for tensor in tensors:
            record = self.register(tensor)
            if record is not None:
                record.stage = stage

    def hold(self, owner: Any, tensor: torch.Tensor, category: str) -> None:
        """Count `tensor`'s storage as held for `category` until `owner` is garbage-collected (owner None: for
        as long as the storage lives)."""
        record = self.register(tensor)
        if record is None or category not in _RANK:
            if record is not None and category == "other":  # a cache the runtime reads (memtags.seen)
                record.default = "other"
            return
        key = (category, bus.current_tags().get("stage"))
        with self._lock:
            record.holds[key] = record.holds.get(key, 0) + 1
            if owner is not None:
                ref = weakref.ref(owner, self._owner_gone)
                self._holds[id(ref)] = (ref, record, key)

    def _release(self, ref: weakref.ref) -> None:
        with self._lock:
            found = self._holds.pop(id(ref), None)
            if found is not None and found[0] is ref:
                _, record, key = found
                record.holds[key] -= 1

    # ------------------------------------------------------------ reading

    def sample(self) -> tuple[dict[str, int], dict[str, dict[str, int]], int | None]:
        """(bytes by category, bytes by stage and category, CUDA allocator bytes or None)."""
        with torch._C.DisableTorchFunction():  # a Parameter's .grad without the subclass check: half the cost
            grads = {id(g.untyped_storage()) for g in map(_GRAD, self._params) if g is not None}
        totals = dict.fromkeys(CATEGORIES, 0)
        by_stage: dict[str, dict[str, int]] = {}
        params = self._param_storages
        with self._lock:
            items = list(self._live.items())
        for key, record in items:
            stage = record.stage
            if key in params:
                category = "parameters"
            elif key in grads:
                category = "gradients"
            elif not record.holds:
                category = record.default
            else:
                best = record.strongest()
                category = record.default if best is None else best[0]
                if best is not None and best[1] is not None:
                    stage = best[1]
            totals[category] += record.nbytes
            if stage is not None:
                row = by_stage.setdefault(str(stage), dict.fromkeys(CATEGORIES, 0))
                row[category] += record.nbytes
        device = torch.cuda.memory_allocated() if self.cuda else None
        return totals, by_stage, device

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> MemoryProbe:
        params, tensors, buffers = self._pending
        for p in params:
            self.add_param(p)
        for b in buffers:
            self.add_buffer(b)
        for t in tensors:
            self.hold(None, t, "inputs")
        self._layer = join_layer(self, tracker=True)
        self._detach_holder = memtags.install(self.hold)
        self.thread = threading.get_ident()
        _watch_rng(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        """Stop counting and drop every record, so nothing keeps the probe alive (NOTE rule 7)."""
        _unwatch_rng(self)
        layer, self._layer = self._layer, None
        if self._detach_holder is not None:
            self._detach_holder()
            self._detach_holder = None
        try:
            if layer is not None:
                leave_layer(self, layer)
        finally:
            with self._lock:
                self._live.clear()
                self._holds.clear()
            self._params.clear()
            self._pending = ([], [], [])


_RNG: dict[str, Any] = {"probes": ()}  # the original get_rng_state functions while probes watch them


def _watch_rng(probe: MemoryProbe) -> None:
    """NOTE rule 9: while `probe` runs, `torch.get_rng_state()` on its thread registers its result."""
    _RNG["probes"] = (*_RNG["probes"], weakref.ref(probe))
    if "original" in _RNG:  # a nested probe: the wrapper is in place and now reaches it too
        return
    original = torch.random.get_rng_state

    def get_rng_state() -> torch.Tensor:
        state = original()
        for ref in _RNG["probes"]:
            owner = ref()
            if owner is not None and owner.thread == threading.get_ident():
                owner.made(state)
        return state

    get_rng_state.__wrapped__ = original  # type: ignore[attr-defined]
    _RNG["original"] = original
    _RNG["ours"] = get_rng_state
    torch.get_rng_state = torch.random.get_rng_state = get_rng_state


def _unwatch_rng(probe: MemoryProbe) -> None:
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
