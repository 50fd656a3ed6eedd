"""Replays that do not reproduce their forward: the checks a recording runs on every replay.

Owns `ReplayWatch` (what one checkpointed region's forward used, and how its replay
compares), the switch `set_checks` / `checks`, and the four kinds of divergence with
their diagnosis codes (`DIVERGENCES`). Emits `replay_diverged` events; imports torch,
never the UI or the renderers. The trace side (torch-free) is `ckpt_viz.debug.divergence`.

NOTE [ Replay divergence checks ]
  1. Cost: a watch is made only while a recording listens in this context, the switch
     is on (`active()`) and the policy picks this run (NOTE [ Sampled replay checks ]
     in divergence_sampling.py: "sampled", the default, checks a region's first runs
     and then a sample within a time budget; "all" every run); otherwise the hook
     points cost one attribute read. While it runs: what a module owns comes from a
     per-module cache (NOTE [ Owner facts cache ] in owners.py); each fingerprint is
     two or three small ops, read at once on the CPU and compared there bit for bit.
  2. Forward: when the function belongs to a module (a Module, its bound method, a
     functools.partial of one, or `__self__` set), the module's parameters that
     require grad are the *parameters the forward used* and its buffers whose version
     counter moved during the forward are the *buffers it updates* (cheap: no mode).
     Otherwise a TorchFunctionMode sees every torch call of the region's own forward
     (its excluded regions are skipped: their replay serves the forward's output):
     leaves that require grad and are not checkpoint inputs are the parameters used;
     tensors that do not require grad, are not inputs and were not made in the region
     are outside state, and those whose version moved are the buffers it updates. A
     module may own parameters its forward does not use, so for a module only a
     parameter the replay reaches with an all-zero gradient counts as lost. Before the function runs, each
     mutable non-tensor input (an object, list or dict, also inside a
     functools.partial) gets a fingerprint of its state (`state_of`: lengths, ids,
     shapes and version counters of the tensors it holds, small scalars; a few
     levels deep). After it, each floating output gets a value fingerprint (its sum,
     in float32 or float64, and up to 32 evenly strided elements): read into Python
     numbers on the CPU, kept on the device (samples copied) anywhere else.
  3. Replay: before it, the inputs' fingerprints again and the buffers' versions;
     after it, the buffers' versions and the outputs' fingerprints (one device sync);
     around the region's backward over the replay, a hook on each parameter the
     forward used sees the gradient it gets (one more sync). Each kind found gives one
     `replay_diverged` event (data: divergence, code, region, details, count):
       gradient_lost    a parameter the forward used gets no gradient, or an all-zero
                        one while others get one (the HF KV-cache case: the values are
                        identical, the key/value projections get no gradient);
       input_mutated    a non-tensor input's state changed since the forward;
       outputs_differ   the outputs' fingerprints differ beyond float tolerance
                        (randomness without preserve_rng_state, an input changed);
       buffers_updated  the replay updated the forward's buffers again (BatchNorm).
  4. Gradients are never touched: the checks read graphs, versions and values (under
     no_grad), and change nothing autograd sees.
  5. A non-reentrant recompute checks input_mutated, buffers_updated and, in place of
     the outputs, the activations it saves again (outputs_differ: the fingerprint of
     each saved activation, taken when the forward packed it, against the tensor the
     recompute packs in its place); its gradients come from the forward's own graph,
     so none is lost there. Each kind once per frame.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ckpt_viz import bus
from ckpt_viz.events import ReplayDiverged
from ckpt_viz.runtime import divergence_sampling as sampling
from ckpt_viz.runtime import fingerprints as fp
from ckpt_viz.runtime import owners

__all__ = ["DIVERGENCES", "OFF", "ReplayWatch", "active", "checks", "set_checks", "unchecked", "watch"]

# divergence kind -> its diagnosis code (a key of ckpt_viz.events.DIAGNOSIS_CODES)
DIVERGENCES: dict[str, str] = {
    "gradient_lost": "replay_lost_gradient",
    "input_mutated": "replay_input_mutated",
    "outputs_differ": "replay_outputs_differ",
    "buffers_updated": "replay_updated_buffers",
}

_ENV = "CKPT_VIZ_REPLAY_CHECKS"
_MAX_DETAILS = 6
_POLICIES = {True: "sampled", "1": "sampled", "on": "sampled", "sampled": "sampled", "all": "all",
             False: "off", "0": "off", "off": "off"}


def _policy_of(on: bool | str) -> str:
    policy = _POLICIES.get(on.lower() if isinstance(on, str) else bool(on))
    if policy is None:
        raise ValueError(f"ckpt_viz.runtime.divergence.set_checks: unknown setting {on!r}.\n"
                         "Tip: pass True or 'sampled' (the default), 'all' (every replay), or False.")
    return policy


_policy = _policy_of(os.environ.get(_ENV, "sampled"))
_checks_on = _policy != "off"
# True inside `unchecked()`: regions started in this context are not checked, whatever the process-wide setting
_UNCHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("ckpt_viz_unchecked", default=False)


def set_checks(on: bool | str) -> bool | str:
    """Set replay-divergence checking for every recording; return the previous setting (False when off).

    on: True or "sampled" (the default: every region's first runs, then a sample within a time budget;
    NOTE [ Sampled replay checks ] in divergence_sampling.py), "all" (every replay), False (none).
    The environment variable CKPT_VIZ_REPLAY_CHECKS (0, sampled, all) sets it at start.
    """
    global _checks_on, _policy
    previous = _policy if _checks_on else False
    _policy = _policy_of(on)
    _checks_on = _policy != "off"
    return previous


@contextlib.contextmanager
def checks(on: bool | str) -> Iterator[None]:
    """Run the block with replay-divergence checking set to `on` (see `set_checks`)."""
    previous = set_checks(on)
    try:
        yield
    finally:
        set_checks(previous)


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Run the block with no replay-divergence checks in this context only (other threads and sessions keep theirs):
    the planner's measurement of replays (ckpt_viz/plan/profile.py), which times replays as a training run without
    a recording runs them."""
    token = _UNCHECKED.set(True)
    try:
        yield
    finally:
        _UNCHECKED.reset(token)


def active(scope: Any = None) -> bool:
    """Whether a region starting now is watched (NOTE [ Replay divergence checks ], rule 1).

    `scope`: `bus.current_scope()` when the caller has just read it.
    """
    if not (_checks_on and bus.enabled) or _UNCHECKED.get():
        return False
    return bool((scope if scope is not None else bus.current_scope()).channels)


_NULL = contextlib.nullcontext()


# ---------------------------------------------------------------- one region's watch

def _charged(method: Callable[..., None]) -> Callable[..., None]:
    """`method` of a ReplayWatch, its time charged to the watch's region (NOTE [ Sampled replay checks ], rule 3)."""
    @functools.wraps(method)
    def charged(self: ReplayWatch, *args: Any) -> None:
        started = sampling.clock()
        try:
            method(self, *args)
        finally:
            self.region.spent += sampling.clock() - started
    return charged


def _weak(value: Any) -> Callable[[], Any]:
    """A weak reference to `value`, or a strong holder for objects that take none (lists, dicts)."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


class ReplayWatch:
    """What one region's forward used and produced; compared with each replay (NOTE rules 2-3)."""

    def __init__(self, frame: Any, args: tuple, kwargs: dict, inputs: tuple,
                 region: sampling.Region | None = None) -> None:
        self._frame = weakref.ref(frame)
        self.region = region if region is not None else sampling.Region("")  # its checks' cost is charged here
        self._started = 0.0  # when a forward under the mode began (its whole time is the checks' cost)
        self.name = owners.qualname(frame.function)
        self.inputs = inputs = {id(t) for t in inputs}
        self.made: set[int] = set()
        self.params: dict[int, torch.Tensor] = {}
        self.outside: dict[int, tuple[torch.Tensor, int]] = {}
        self.buffers: list[tuple[weakref.ref, int]] = []
        self.output_prints: list[tuple[Any, int, torch.dtype]] | None = None
        self.reported: set[str] = set()
        self._before: list[int] = []  # the buffers' versions when the replay started
        self.watched: list[torch.Tensor] = []  # parameters whose gradient the region's backward is to give
        self.saved_prints: dict[int, tuple[Any, int, torch.dtype]] = {}  # non-reentrant: saved activations
        self.repacked_prints: list[tuple[int, Any]] = []
        owner = fp.owner_of(frame.function)
        self.by_owner = owner is not None  # NOTE rule 2: the module's own parameters and buffers, no mode
        if owner is not None:  # the module's tree, cached across calls (NOTE [ Owner facts cache ] in owners.py)
            owned = owners.facts(owner)
            self.params = {id(p): p for p in owned.params if p.requires_grad and id(p) not in inputs}
            if owned.buffers:
                self.outside = {id(b): (b, b._version) for b in owned.buffers}
        self.states: list[dict[str, tuple]] = []
        self.objects: list[tuple[str, Callable[[], Any]]] = []
        names = fp.argument_names(frame.function, args, kwargs)  # [] for tensors and plain values only
        if names:
            objects = [(name, value) for name, value in names if fp.mutable(value)]
            self.states = [fp.state_of(value, name) for name, value in objects]
            # Held weakly where the object allows it: the checkpoint keeps its own inputs for the replay, and a
            # strong reference here closes a cycle through autograd's C++ hooks (the object holds the region's
            # outputs, whose graph holds the frame) that the garbage collector cannot see.
            self.objects = [(name, _weak(value)) for name, value in objects]

    def frame_recording_exclude(self) -> bool:
        frame = self._frame()
        return frame is not None and getattr(frame, "recording_exclude", False)

    def mode(self) -> contextlib.AbstractContextManager[Any]:
        if self.by_owner:
            return _NULL
        self._started = sampling.clock()
        return fp.ForwardMode(self)

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """The forward of a frame whose outputs are not compared (non-reentrant; NOTE rule 5)."""
        with self.mode():
            yield
        self.forward_done(None)

    def forward_done(self, outputs: tuple | None) -> None:
        """After the forward: keep the buffers it updated and the outputs' fingerprints."""
        started = self._started or sampling.clock()
        if self.outside:
            self.buffers = [(weakref.ref(t), t._version) for t, version in self.outside.values()
                            if t._version != version]
            self.outside = {}
        if self.made:
            self.made = set()
        if outputs is not None:
            self.output_prints = [(fp.fingerprint(o, keep=True), o.numel(), o.dtype) for o in outputs]
        self.region.spent += sampling.clock() - started

    @_charged
    def packed(self, index: int, x: torch.Tensor) -> None:
        """A non-reentrant forward saved `x`: keep its fingerprint if it is an activation (no parameter,
        no buffer: a buffer the replay updates again is buffers_updated)."""
        base = x._base if x._is_view() else x  # a parameter's view (weight.t()) is no activation either
        if (not (base.is_leaf and base.requires_grad) and id(base) not in self.outside
                and (print_ := fp.fingerprint(x, keep=True)) is not None):
            self.saved_prints[index] = (print_, x.numel(), x.dtype)

    @_charged
    def repacked(self, index: int, x: torch.Tensor) -> None:
        """Its recompute saved `x` in that place."""
        if index in self.saved_prints:
            self.repacked_prints.append((index, fp.fingerprint(x)))

    def replay_starting(self) -> None:
        if self.repacked_prints:
            self.repacked_prints = []
        if self.buffers:
            self._before = [t._version if (t := ref()) is not None else -1 for ref, _ in self.buffers]

    @_charged
    def replay_done(self, emit: Callable[..., Any], outputs: list[torch.Tensor] | None) -> None:
        """Compare the replay that just ran with the forward and emit one event per divergence found."""
        found: dict[str, list[str]] = {}
        if self.objects:
            changes = [c for (name, held), state in zip(self.objects, self.states)
                       if (value := held()) is not None for c in fp.state_changes(state, fp.state_of(value, name))]
            if changes:
                found["input_mutated"] = changes
        if self.buffers:
            updated = [t for (ref, _), old in zip(self.buffers, self._before)
                       if (t := ref()) is not None and t._version != old]
            if updated:
                frame = self._frame()
                function = frame.function if frame is not None else None
                found["buffers_updated"] = fp.buffer_names(updated, fp.names_in(function, "buffers"))
        differ = self._outputs_differ(outputs) if outputs is not None else self._saved_differ()
        if differ:
            found["outputs_differ"] = differ
        if self.params and outputs is not None and any(o.requires_grad for o in outputs):
            self.watched = list(self.params.values())
        self.params = {}
        if found:
            self._emit_found(emit, found)

    def _emit_found(self, emit: Callable[..., Any], found: dict[str, list[str]]) -> None:
        for kind, details in found.items():
            if kind in self.reported:
                continue
            self.reported.add(kind)
            self.region.found()  # from now on every run of this region is checked
            emit(ReplayDiverged, divergence=kind, code=DIVERGENCES[kind], region=self.name,
                 details=tuple(details[:_MAX_DETAILS]), count=len(details), mutable_inputs=self._mutable_inputs())

    def _mutable_inputs(self) -> tuple[str, ...]:
        """The mutable non-tensor inputs the block was handed (what a replay can read the forward's values from)."""
        found = []
        for name, held in self.objects[:8]:
            value = held()
            found.append(f"{name} ({type(value).__name__})" if value is not None else name)
        return tuple(found)

    def _name(self, p: torch.Tensor, function: Any) -> str:
        return bus.name_of(p) or fp.names_in(function, "parameters").get(id(p)) or fp.tensor_label(p)

    # A parameter the forward used that the replay's graph does not reach, or that it reaches but
    # none of the gradient does (the HF cache case: the replay's keys are cut off by a slice or a
    # mask). A parameter whose .grad was None before the region's backward holds this backward's
    # gradient after it; for the others a hook sees it (hooks exist only while this backward runs,
    # and return nothing). No graph walk: no gradient at all is a parameter not reached.

    @contextlib.contextmanager
    def gradients(self, emit: Callable[..., Any]) -> Iterator[None]:
        """Around the region's backward over its replay (the code after the yield runs only when it succeeded)."""
        watched, self.watched = self.watched, []
        if not watched:
            yield
            return
        started = sampling.clock()
        fresh: list[torch.Tensor] = []
        seen: dict[int, torch.Tensor] = {}
        hooks = []
        for p in watched:
            if p.grad is None:
                fresh.append(p)
            else:  # a parameter with no hook of its own is left with none: an emptied hook dict costs every backward
                own = p._backward_hooks is None
                hooks.append((p, own, p.register_hook(functools.partial(seen.__setitem__, id(p)))))
        spent = sampling.clock() - started
        try:
            yield
        finally:
            started = sampling.clock()
            for p, own, hook in hooks:
                hook.remove()
                if own and not p._backward_hooks:
                    p._backward_hooks = None
        self.region.spent += spent
        try:
            self._gradients_done(emit, watched, fresh, seen)
        finally:
            self.region.spent += sampling.clock() - started

    def _gradients_done(self, emit: Callable[..., Any], watched: list[torch.Tensor], fresh: list[torch.Tensor],
                        seen: dict[int, torch.Tensor]) -> None:
        for p in fresh:
            if p.grad is not None:
                seen[id(p)] = p.grad
        counts = fp.nonzero_counts(seen)
        if len(counts) == len(watched) and all(counts.values()):  # the clean case: every one got a gradient
            return
        if counts and not any(counts.values()):  # every gradient zero (a zero loss): nothing to tell apart
            return
        lost = [(p, "zero gradient" if id(p) in counts else "not reached by the replay's graph")
                for p in watched if not counts.get(id(p)) and (id(p) in counts or not self.by_owner)]
        if lost:
            frame = self._frame()
            function = frame.function if frame is not None else None
            self._emit_found(emit, {"gradient_lost": [f"{self._name(p, function)} ({why})" for p, why in lost]})

    def _outputs_differ(self, outputs: list[torch.Tensor]) -> list[str]:
        prints = self.output_prints
        if prints is None:
            return []
        if len(prints) != len(outputs):
            return [f"{len(prints)} tensor outputs in the forward, {len(outputs)} in the replay"]
        pairs = []
        for i, ((old, n, dtype), o) in enumerate(zip(prints, outputs)):
            again = fp.fingerprint(o)
            if not fp.same(old, again):
                pairs.append((f"output {i}", old, again, n, dtype))
        return fp.compare(pairs) if pairs else []

    def _saved_differ(self) -> list[str]:
        if not self.repacked_prints:
            return []
        saved = self.saved_prints
        pairs = [(f"saved tensor {i}", saved[i][0], again, *saved[i][1:])
                 for i, again in self.repacked_prints if not fp.same(saved[i][0], again)]
        self.repacked_prints = []
        return fp.compare(pairs) if pairs else []


class _Off:
    """The watch of a frame no recording checks: every hook point is a no-op."""

    _NULL = contextlib.nullcontext()

    def forward(self) -> contextlib.AbstractContextManager[None]:
        return self._NULL

    def packed(self, index: int, x: torch.Tensor) -> None:
        pass

    def repacked(self, index: int, x: torch.Tensor) -> None:
        pass

    def replay_starting(self) -> None:
        pass

    def replay_done(self, emit: Callable[..., Any], outputs: list[torch.Tensor] | None) -> None:
        pass


OFF = _Off()


def watch(frame: Any, args: tuple, kwargs: dict, inputs: tuple, scope: Any = None) -> ReplayWatch | None:
    """A watch for the region about to run, or None when no recording checks it or the policy skips this run
    (NOTE rule 1)."""
    if not (_checks_on and bus.enabled) or _UNCHECKED.get():
        return None
    scope = scope if scope is not None else bus.current_scope()
    if not scope.channels:
        return None
    region = sampling.decide(frame.function, scope, _policy)
    if region is None:
        return None
    started = sampling.clock()
    made = ReplayWatch(frame, args, kwargs, inputs, region)
    region.spent += sampling.clock() - started
    return made

