"""`record()`: capture what the runtime emits while a block runs, with memory and graphs on request.

Owns the `Recording` context manager and the reference-counted autograd watch. It
imports torch when a block opens (the watch; memory and graphs through
`ckpt_viz.probe`), never at import, so opening a saved trace never needs torch.

NOTE [ What a recording captures ]
  1. Events: every event emitted while the block is open, in order, in `trace.events`
     (a plain list of the typed events of `ckpt_viz.events`).
  2. memory=True: live bytes by category (see NOTE [ Memory categories ] in
     probe/memory.py) right after every event, at every module's forward exit, and
     at the allocator's high-water mark between two of those (torch's memory-only
     profiler read by `AllocationProbe`, probe/allocations.py, which marks each one
     and fills `trace.memory` as the stream is drained and when the block closes;
     the dispatch tracker, its fallback where the profiler is taken, reads at each
     one and keeps no high-water mark). A top-level module's forward, each top-level
     backward and each optimizer step open with a `memory_sampled` event, so a loop
     with no checkpoint has samples too (NOTE [ Sampling points ] in probe/points.py).
     A sample is stored when the reading differs from the previous one, so the memory
     right after an event is its first sample, else the last sample before it (a
     step function); several samples may share the seq of the event before them, in
     time order (`points.Steps`), in `trace.memory` (a list of `MemorySample`).
  3. PyTorch's own errors in a top-level `torch.autograd.backward` / `grad` call
     become `error` events even when the caller catches them (R13 needs that).
  4. graphs=True: a `GraphSnapshot` of the roots of every top-level
     `torch.autograd.backward` / `torch.autograd.grad` call made in the block
     (`Tensor.backward` and the split helpers included), taken just before the
     call runs, plus any `rec.snapshot(tensors, label)` the user asks for.
     Snapshots never replay a checkpoint.
  5. Scope: "in the block" means the code the block wraps: the context that
     opened it (and the autograd work that code starts, also on the engine's
     device threads), never another thread's code (NOTE [ Recording scopes ] in
     bus.py). Recordings nest (the outer sees the inner's events too) and close in
     any order. The `torch.autograd.backward` / `grad` watch is installed when the
     first recording in the process opens and removed when the last one closes;
     it acts only for the recordings of the calling context, so a closed
     recording never snapshots again. Parameter names live in the recording (an
     id -> name map beside its channel, read with `bus.name_of`), never on the
     parameters. Each memory=True recording has its own probe; probes stack.
  6. Hand-over: a thread started in the block does not inherit the recording.
     `with rec.attach():` on that thread sends its events to `rec` (and to the
     recordings `rec` is nested in), with handle ids from the same numbering.
     Memory of that thread's own ops is not counted (either probe sees only the
     opening thread's allocations); samples are still taken at its events.
  7. Source lines: when the block closes, the line of code of each distinct event
     `site` ("file:line") is read here, by the process that ran that code, and kept
     in `trace.meta["sources"]` (site -> the stripped line; at most
     MAX_SOURCE_SITES sites, those of the events a debugger finding shows first, and
     MAX_SOURCE_CHARS characters each). Viewers show
     these, never the file a site names: a saved trace shows the code as it was
     when it ran, and a crafted site cannot make the app read a file. A line read
     at an earlier close is reused while `linecache` still holds that file's lines
     (the text getline would give again), without a new stat of the file.
"""
from __future__ import annotations

import functools
import linecache
import os
import stat
import sys
import threading
import weakref
from contextlib import AbstractContextManager
from operator import attrgetter
from types import TracebackType
from typing import Any

from ckpt_viz import bus
from ckpt_viz.errors import RecordingError, error_code
from ckpt_viz.events import BackwardCalled, EventBase
from ckpt_viz.trace import MAX_SOURCE_CHARS, MAX_SOURCE_SITES, MemorySample, Trace
from ckpt_viz.vocabulary import Kind

__all__ = ["Recording", "last_trace", "record"]


_WATCH_LOCK = threading.Lock()
_watchers = 0  # open recordings; the autograd watch is installed while this is > 0 (NOTE rule 5)
_originals: dict[str, Any] = {}
_wrappers: dict[str, Any] = {}  # name -> our wrapper of _originals[name], reused while the original stays the same
_BY_CHANNEL: weakref.WeakKeyDictionary[bus.Channel, Recording] = weakref.WeakKeyDictionary()
_last: list[Trace] = []  # the trace of the last recording closed in this process (`ckpt_viz.explain()`)


def last_trace() -> Trace | None:
    """The trace of the last `record()` block that closed in this process, or None."""
    return _last[0] if _last else None


def _open_here() -> list[Recording]:
    """The open recordings of the current context, outermost first."""
    found = (_BY_CHANNEL.get(c) for c in bus.current_scope().channels if c.is_open)
    return [r for r in found if r is not None]


def _watched(name: str, original: Any, roots_keyword: str) -> Any:
    """`torch.autograd.<name>` that snapshots, reports errors and opens memory's backward pass for the recordings
    of the calling context."""
    import torch

    from ckpt_viz.probe import points

    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        # an inner (replay) pass first: a reentrant replay's backward needs no lookup of the recordings
        recordings = _open_here() if bus.enabled and torch._C._current_graph_task_id() == -1 else []
        if not recordings:  # nobody here, or an inner (replay) pass
            return original(*args, **kwargs)
        retain = kwargs.get("retain_graph")
        asked = kwargs.get("inputs", args[1] if roots_keyword == "outputs" and len(args) > 1 else None)
        bus.emit(BackwardCalled, api=name, retain_graph=retain if isinstance(retain, bool) else None,
                 inputs=None if asked is None else 1 if isinstance(asked, torch.Tensor) else len(asked))
        for recording in recordings:
            if recording.graphs:
                count = sum(1 for g in recording.trace.graphs if g.label.startswith("before"))
                recording.snapshot(args[0] if args else kwargs.get(roots_keyword), f"before {name} #{count + 1}")
        sampled = any(recording._sampling is not None for recording in recordings)
        if sampled:  # the backward pass, for memory's sampling points (probe/points.py NOTE rule 2)
            points.backward_started()
        try:
            return original(*args, **kwargs)
        except Exception as exc:  # e.g. "Trying to backward through the graph a second time" (R13)
            bus.emit_error(exc, name, retain_graph=retain if isinstance(retain, bool) else None, code=error_code(exc))
            raise
        finally:
            if sampled:
                points.backward_ended()

    watched._ckpt_viz_original = original  # type: ignore[attr-defined]
    return watched


def _watch_autograd() -> None:
    global _watchers
    import torch

    import ckpt_viz.runtime.handover  # noqa: F401 (installs the engine hand-over: bus NOTE rule 5)
    from ckpt_viz.runtime import torch_observer  # torch's own checkpoint, observed (its NOTE, rule 6)

    with _WATCH_LOCK:
        torch_observer.install()
        if _watchers == 0:
            for name, roots_keyword in (("backward", "tensors"), ("grad", "outputs")):
                original = getattr(torch.autograd, name)
                _originals[name] = original
                wrapper = _wrappers.get(name)
                if wrapper is None or wrapper._ckpt_viz_original is not original:  # built once per original
                    wrapper = _wrappers[name] = _watched(f"autograd.{name}", original, roots_keyword)
                setattr(torch.autograd, name, wrapper)
        _watchers += 1


def _unwatch_autograd() -> None:
    global _watchers
    import torch

    from ckpt_viz.runtime import torch_observer

    with _WATCH_LOCK:
        torch_observer.uninstall()
        _watchers -= 1
        if _watchers:
            return
        for name, original in _originals.items():
            if getattr(getattr(torch.autograd, name), "_ckpt_viz_original", None) is original:
                setattr(torch.autograd, name, original)
            # else someone wrapped ours since: leave theirs; ours does nothing with no recording open
        _originals.clear()


class Recording:
    """A context manager whose `.trace` holds what the code it wraps emitted while it was open."""

    def __init__(self, *, memory: bool = False, graphs: bool = False, model: Any = None,
                 tensors: Any = (), optimizer: Any = None) -> None:
        self.trace = Trace()
        self.memory = memory
        self.graphs = graphs
        self.model = model
        self.optimizer = optimizer
        self._tensors = tensors
        self._channel: bus.Channel | None = None
        self._scope: bus.Scope | None = None
        self._watching = False
        self._probe: Any = None
        self._names: dict[int, str] = {}
        self._sampling: Any = None  # the probe's readings at events and sampling points (probe/points.py)
        self._unhook: list[Any] = []  # undoes what the memory side installed, in reverse order

    def _keep(self, event: EventBase) -> None:
        """The channel's listener: keep the event, then read memory right after it (in seq order; NOTE rule 2)."""
        self.trace.events.append(event)  # type: ignore[arg-type]
        if self._sampling is not None:
            self._sampling.on_event(event)

    def _keep_sample(self, seq: int, t_ns: int, totals: dict[str, int], device: int | None,
                     by_stage: dict[str, dict[str, int]] | None) -> None:
        self.trace.memory.append(MemorySample(seq=seq, t_ns=t_ns, bytes_by_category=totals, device_allocated=device,
                                              by_stage=by_stage or {}))

    def _open_memory(self) -> None:
        """Open the probe and attach the sampling points (NOTE rule 2)."""
        from ckpt_viz.probe import points
        from ckpt_viz.probe.allocations import open_probe

        model = self.model
        params = list(model.parameters()) if model is not None else []
        buffers = list(model.buffers()) if model is not None else []
        self._probe = open_probe(params=params, tensors=_tensors_in(self._tensors), buffers=buffers)
        self._probe.__enter__()
        # how memory was read: "allocator" (torch's allocation events: high-water marks too) or "dispatch"
        self.trace.meta["memory_probe"] = "allocator" if self._probe.deferred else "dispatch"
        modules = {id(m): name or type(m).__name__ for name, m in model.named_modules()} if model is not None else {}
        self._sampling = points.Sampling(self._probe, self._keep_sample, modules)
        self._unhook.append(points.attach(self._sampling))
        if model is not None and hasattr(model, "register_forward_pre_hook"):
            self._unhook.append(model.register_forward_pre_hook(points.model_inputs, with_kwargs=True).remove)
        if self.optimizer is not None:  # its state from before the block counts from the start
            points.optimizer_state(self.optimizer, (self._sampling,))

    def assign_stage(self, tensors: Any, stage: Any) -> None:
        """Count `tensors` (a pipeline stage's parameters) under `stage` in the memory samples' `by_stage`."""
        if self._probe is not None:
            self._probe.assign_stage(_tensors_in(tensors), stage)

    def mark(self, label: str) -> None:
        """A named point of the run (a `memory_sampled` event, `at=label`): with memory=True, memory is read there.

        Memory is read at events only (NOTE [ What a recording captures ], rule 2), so a loop with no checkpoint
        emits none; mark the points to compare ("block 0", "loss", "end").

        Example:
            with ckpt_viz.record(memory=True, model=model) as rec:
                loss = model(x).sum(); rec.mark("loss"); loss.backward(); rec.mark("end")
        """
        if self._channel is None or not self._channel.is_open:
            raise RecordingError("ckpt_viz.Recording.mark: this recording is not open.\n"
                                 "Tip: call rec.mark(...) inside the `with ckpt_viz.record() as rec:` block.")
        from ckpt_viz.events import MemorySampled

        bus.emit(MemorySampled, capture_site=False, at=str(label))

    def snapshot(self, roots: Any, label: str) -> None:
        """Add a graph snapshot of the graph behind `roots` now (needs graphs=True or works anyway)."""
        from ckpt_viz.probe.graph import capture_graph

        seq = self.trace.events[-1].seq if self.trace.events else -1
        self.trace.graphs.append(capture_graph(roots, label=label, seq=seq, names=self._names))

    def attach(self) -> AbstractContextManager[bus.Scope]:
        """Hand this open recording to another thread; see NOTE [ What a recording captures ], rule 6.

        Example:
            def work():
                with rec.attach():
                    run_stage(x)          # its events reach `rec` (and the recordings around it)
            with ckpt_viz.record() as rec:
                t = threading.Thread(target=work); t.start(); t.join()
        """
        if self._channel is None or not self._channel.is_open or self._scope is None:
            raise RecordingError("ckpt_viz.Recording.attach: this recording is not open.\n"
                                 "Tip: call attach() while the record() block is running.")
        return bus.enter_scope(self._scope)

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> Recording:
        if self._channel is not None:
            state = "open" if self._channel.is_open else "closed"
            raise RecordingError(f"ckpt_viz.record: this recording is already {state} (a record() block runs "
                                 "once).\nTip: use a new record() block.")
        if self.model is not None:  # routing events name captured parameters, handles their modules (bus.name_of)
            self._names = {id(p): n for n, p in self.model.named_parameters()}
            self._names.update((id(m), n) for n, m in self.model.named_modules() if n)
        try:
            if self.memory:
                self._open_memory()
            _watch_autograd()
            self._watching = True
        except BaseException:
            self._release(None, None, None)
            raise
        # no memory probe: the channel appends straight to the list (one C call per event)
        keep = self._keep if self._sampling is not None else self.trace.events.append
        self._channel = bus.open_channel(keep, names=self._names)  # type: ignore[arg-type]
        _BY_CHANNEL[self._channel] = self
        self._scope = bus.current_scope()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None:  # once: an error the runtime or an autograd call already reported is not repeated
                bus.emit_error(exc, "record")
        finally:
            if self._channel is not None:
                self._channel.close()
                _BY_CHANNEL.pop(self._channel, None)  # a handle's scope may outlive us: keep no trace alive
                _keep_sources(self.trace)
                _keep_replay_checks(self._channel, self.trace)
                _keep_run_facts(self, self.trace)
                _last[:] = [self.trace]
            self._release(exc_type, exc, tb)

    def _release(self, *exc: Any) -> None:
        try:
            if self._watching:
                self._watching = False
                _unwatch_autograd()
        finally:
            try:
                if self._sampling is not None:  # the memory as the block closes
                    self._sampling.point()
                while self._unhook:
                    self._unhook.pop()()
            finally:
                probe, self._probe = self._probe, None
                sampling, self._sampling = self._sampling, None
                if probe is not None:
                    probe.__exit__(*exc)
                    if sampling is not None:
                        sampling.finish()


def _keep_replay_checks(channel: bus.Channel, trace: Trace) -> None:
    """The runs the replay-divergence checks checked and skipped in this block, as `meta["replay_checks"]`
    (NOTE [ Sampled replay checks ] in ckpt_viz/runtime/divergence_sampling.py). Read only when the runtime
    ran in this process: no import here, so no torch."""
    sampling = sys.modules.get("ckpt_viz.runtime.divergence_sampling")
    counts = sampling.counts_of(channel) if sampling is not None else None
    if counts:
        trace.meta["replay_checks"] = counts


def _keep_run_facts(recording: Recording, trace: Trace) -> None:
    """meta "model" for `record(model=...)`: the model's class (a run that names itself, such as run_scenario's,
    sets it after; the mode a run did not name is derived from its handles: `ckpt_viz.analysis.handles.observed_mode`),
    and "unobserved" (what torch's checkpoint observer could not see: NOTE [ Observing torch's checkpoint ], rule 4,
    in ckpt_viz/runtime/torch_observer.py)."""
    meta = trace.meta
    if recording.model is not None:  # without a model the caller names the run (ckpt_viz.distributed: "pipeline")
        meta.setdefault("model", type(recording.model).__name__)
    observer = sys.modules.get("ckpt_viz.runtime.torch_observer")  # imported when the block opened
    notes = observer.notes(recording._scope) if observer is not None else []
    if notes:
        meta["unobserved"] = notes


_SITE = attrgetter("site")
_STORY_KINDS: frozenset[Kind] = frozenset({
    "handle_created", "phase_set", "backward_entered", "session_bound", "prefired", "released", "node_collected",
    "replay_refused", "error", "session_cleared", "replay_started", "grads_routed"})


# site -> (file, linecache's entry for it, the line kept): a later close reuses the line while linecache holds
# the same entry (what getline would read again), with no stat and no getline per site
_LINES: dict[str, tuple[str, Any, str]] = {}


def _keep_sources(trace: Trace) -> None:
    """NOTE [ What a recording captures ], rule 7: the line of code of each distinct site, read now."""
    # The sites a debugger finding names come first, so the cap never drops them (ckpt_viz/analysis/findings.py).
    events = trace.events
    sites = dict.fromkeys(map(_SITE, trace.of_kind(*_STORY_KINDS)))  # (map: no Python step per event, at each close)
    sites.update(dict.fromkeys(map(_SITE, events)))
    sites.pop(None, None)
    sites.pop("", None)
    sources = trace.meta.get("sources")
    if not sites or (sources is not None and type(sources) is not dict):
        return
    sources = trace.meta["sources"] = dict(sources or {})
    readable: dict[str, bool] = {}
    known, held = _LINES, linecache.cache
    for site in sites:
        if len(sources) >= MAX_SOURCE_SITES:
            break
        hit = known.get(site)  # read at an earlier close and linecache still holds those lines: the same text
        if hit is not None and held.get(hit[0]) is hit[1]:
            if site not in sources:
                sources[site] = hit[2]
            continue
        file, _, line = site.rpartition(":")
        if site in sources or not file or not line.isdigit():
            continue
        if file not in readable:  # a regular file of a sane size only: never a FIFO or a device
            try:
                info = os.stat(file)
                readable[file] = stat.S_ISREG(info.st_mode) and info.st_size < 64 << 20
            except (OSError, ValueError):
                readable[file] = False
        text = linecache.getline(file, int(line)).strip() if readable[file] else ""
        if text:
            sources[site] = text = text[:MAX_SOURCE_CHARS]
            entry = held.get(file)
            if entry is not None:
                if len(known) >= 4096:
                    known.clear()
                known[site] = (file, entry, text)


def _tensors_in(value: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def record(*, memory: bool = False, graphs: bool = False, model: Any = None, tensors: Any = (),
           optimizer: Any = None) -> Recording:
    """Record the runtime's events (and optionally memory and graphs) while the block runs.

    Args:
        memory: sample live bytes by category after every event, at every module
            boundary and at the allocator's high-water marks between them.
        graphs: snapshot the autograd graph before every top-level backward.
        model: the module being run: names its parameters in snapshots and its modules
            in memory samples, and counts its parameters and buffers as "parameters"
            from the start.
        tensors: tensors that exist before the block (inputs) to count from the start.
        optimizer: the `torch.optim.Optimizer` the loop steps: its state (from earlier
            steps too) counts as "optimizer_state" from the start. An optimizer that
            steps in the block is found anyway, its earlier state from its first step.

    Example:
        with ckpt_viz.record(memory=True, graphs=True, model=model, optimizer=opt) as rec:
            loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
        rec.trace.save("trace.json")
    """
    return Recording(memory=memory, graphs=graphs, model=model, tensors=tensors, optimizer=optimizer)
