"""`ReentrantCheckpointHandle`: one reentrant checkpoint invocation and its state machine.

Owns the handle (spec 1.5 and 2): replay, phase, release with its reason, session
binding, the routing of gradients by phase, and the handle ids (spec D2). The autograd
Function that drives it from the engine lives in `runtime/reentrant.py`. See NOTE
[ Handle lifetime ] and NOTE [ Split routing ] there. Imports torch; never the UI.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ckpt_viz import bus
from ckpt_viz.errors import (
    CheckpointError,
    CheckpointUsageError,
    GraphReleasedError,
    HandleReleasedError,
    SessionMismatchError,
)
from ckpt_viz.events import (
    EventBase,
    NodeCollected,
    PhaseSet,
    Released,
    ReplayFailed,
    ReplayFinished,
    ReplayRefused,
    ReplayStarted,
)
from ckpt_viz.runtime import debug as _debug
from ckpt_viz.runtime import memtags, owners, unasked
from ckpt_viz.runtime import session as _session
from ckpt_viz.runtime.handle_ids import _LIVE, new_handle_id, restart_handle_ids  # noqa: F401 (_LIVE: debug lookup)
from ckpt_viz.runtime.owners import qualname
from ckpt_viz.runtime.state import ExecutionState
from ckpt_viz.runtime.tensor_meta import meta

__all__ = ["InputSlot", "ReentrantCheckpointHandle", "current_frame", "execution_frame", "fail", "input_slot", "meta",
           "new_handle_id", "qualname", "restart_handle_ids", "tensors_of"]

E = TypeVar("E", bound=EventBase)
_CURRENT_FRAME: contextvars.ContextVar[Any] = contextvars.ContextVar("ckpt_viz_reentrant_frame", default=None)
_API = "ckpt_viz.checkpoint"


def current_frame() -> ReentrantCheckpointHandle | None:
    """The reentrant handle whose function is running (original forward or replay), or None."""
    return _CURRENT_FRAME.get()


@contextlib.contextmanager
def execution_frame(frame: ReentrantCheckpointHandle) -> Iterator[None]:
    token = _CURRENT_FRAME.set(frame)
    try:
        yield
    finally:
        _CURRENT_FRAME.reset(token)


@dataclass(frozen=True)
class InputSlot:
    """Index of a tensor among the Function's positional tensor inputs."""

    index: int


_SLOTS: list[InputSlot] = []  # InputSlot(i), made once: a frozen dataclass's __init__ is slow


def input_slot(index: int) -> InputSlot:
    """`InputSlot(index)`, shared (slots are immutable and compare by value)."""
    while len(_SLOTS) <= index:
        _SLOTS.append(InputSlot(len(_SLOTS)))
    return _SLOTS[index]


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors among a function's outputs, in order (a lone tensor without the pytree walk)."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]


class ReentrantCheckpointHandle:
    """One reentrant checkpoint invocation: its replay, its phase and its release.

    A handle from `reentrant_checkpoint_scope` is *split*: set its phase to "dx"
    before the DX pass and to "dw" before the DW pass, and include its
    `backward_trigger` in DW's `inputs` (see NOTE [ Split routing ]). The
    helpers `backward_input` / `backward_weight` do both.

    Attributes (the seed's public state, plus ids):
        handle_id: sequential id (`h3`), never `id()`.
        phase: "ordinary", "dx" or "dw".
        split: True inside `reentrant_checkpoint_scope`.
        released: terminal state; `release_reason` says why.
        replay_outputs: the retained replay (None before replay and after release).
        backward_trigger: the zero-element leaf DW must target (split only).
        retain_graph: mirrors the bound session's `retain_on_unpack`.
    """

    _is_checkpoint_handle = True
    mode = "reentrant"
    # Defaults read from the class until first set (the immutable ones: no per-handle store for each)
    exclude_cache: Any = None  # set by ckpt_viz.runtime.exclude when a region records
    replaying: bool = False
    phase: str = "ordinary"
    replay_outputs: Any = None
    replay_inputs: tuple = ()
    state: ExecutionState | None = None
    context_ref: Callable[[], Any] | None = None
    input_count: int = 0
    param_input_mask: tuple[bool, ...] = ()
    backward_trigger: torch.Tensor | None = None
    released: bool = False
    retain_graph: bool = False
    active_session: _session.SessionActivation | None = None
    session_id: Hashable | None = None
    output_spec: Any = None
    output_template: tuple = ()
    recording_exclude: bool = False
    site: str | None = None
    release_reason: str | None = None
    release_site: str | None = None
    node_collected: bool = False
    _release_event: Any = None  # the innermost recording's `released` / `node_collected` events
    _collected_event: Any = None
    replay_count: int = 0
    _backward_site: str | None = None
    _story: Any = None  # debug.py's story of this handle once adopted (runtime/debug.py NOTE rule 2)
    _captured_report: tuple | None = None  # `grads_routed`'s captured field, between the backward and its event
    divergence: Any = None  # a ReplayWatch while a recording checks this region's replay

    def __init__(self, function: Callable, template: list, spec: Any, params: tuple | None,
                 preserve_rng_state: bool, context_fn: Callable) -> None:
        self._home = bus.current_scope() if bus.enabled else None  # where node_collected goes (bus NOTE rule 6)
        self.handle_id = new_handle_id(self, self._home)
        self.function = function
        self.template = template
        self.spec = spec
        self.params = params
        self.split = params is not None
        self.preserve_rng_state = preserve_rng_state
        self.context_fn = context_fn
        self.entries: list = []
        self.excluded_output_mask: dict[int, tuple[Any, bool]] = {}

    def __repr__(self) -> str:
        state = "released" if self.released else ("replayed" if self.replay_outputs is not None else "recorded")
        return f"<ReentrantCheckpointHandle h{self.handle_id} {state} phase={self.phase}>"

    @property
    def release_seq(self) -> int | None:
        """The seq of this handle's `released` event in the innermost recording that got it, else None."""
        return self._release_event.seq if self._release_event is not None else None

    @property
    def collected_seq(self) -> int | None:
        """The seq of this handle's `node_collected` event in the innermost recording that got it, else None."""
        return self._collected_event.seq if self._collected_event is not None else None

    # ------------------------------------------------------------ events

    def _emit(self, cls: type[E], *, site: str | None = None, capture_site: bool = True, scope: Any = None,
              **fields: Any) -> E | None:
        """Emit an event about this handle (its id, mode, phase and session), into its debug story too.

        Inside one engine callback every event has the same user line: the backward's, walked once (see backward).
        """
        event = bus.emit(cls, handle_id=self.handle_id, mode="reentrant", phase=self.phase, session_id=self.session_id,
                         site=site or self._backward_site, capture_site=capture_site, scope=scope, **fields)
        story = self._story
        if story is not None and event is not None:
            story.add(event)
        return event

    # ------------------------------------------------------------ running the function

    def _call(self, tensors: Sequence[torch.Tensor]) -> Any:
        if self.spec is None:  # fast path: positional tensors only
            args, kwargs = tuple(tensors), {}
        else:
            leaves = [tensors[item.index] if isinstance(item, InputSlot) else item for item in self.template]
            args, kwargs = tree_unflatten(leaves, self.spec)
        token = _CURRENT_FRAME.set(self)  # execution_frame(self), without a generator per call
        try:
            return self.function(*args, **kwargs)
        finally:
            _CURRENT_FRAME.reset(token)

    def _gradients(self, values: tuple, grads: tuple) -> tuple:
        """Route gradients by phase; see NOTE [ Split routing ]."""
        if self.split and self.phase == "dx":
            targets = [item for item, is_param in zip(self.replay_inputs, self.param_input_mask)
                       if item.requires_grad and not is_param]
            if not targets:
                return (None,) * self.input_count
            calculated = iter(torch.autograd.grad(values, targets, grads, retain_graph=True, allow_unused=True))
            return tuple(next(calculated) if item.requires_grad and not is_param else None
                         for item, is_param in zip(self.replay_inputs, self.param_input_mask))
        for item in self.replay_inputs:
            if item.requires_grad:
                item.grad = None
        if bus.enabled:
            return self._recorded_gradients(values, grads)
        if unasked.pending and not self.split:  # See NOTE [ Unasked accumulation ] in unasked.py, rule 4.
            return unasked.checked_gradients(self, values, grads)
        watch, self.divergence = self.divergence, None
        with watch.gradients(self._emit) if watch is not None else memtags.NULL:
            torch.autograd.backward(values, grads, retain_graph=self.retain_graph)
        return tuple([item.grad if item.requires_grad else None for item in self.replay_inputs])

    def _recorded_gradients(self, values: tuple, grads: tuple) -> tuple:
        """`_gradients`' ordinary or DW pass while somebody listens: the same backward, and the captured-parameter
        report around it."""
        before = owners.grad_states(self._captured(values))
        states = unasked.before(self, values) if not self.split else None  # unasked.py NOTE rule 4: every time
        watch, self.divergence = self.divergence, None
        backward = torch.autograd.backward  # a recording's wrapper passes an inner pass through: call what it wraps
        backward = getattr(backward, "_ckpt_viz_original", backward)  # (ckpt_viz/recording.py, `_watched`)
        with watch.gradients(self._emit) if watch is not None else memtags.NULL:
            backward(values, grads, retain_graph=self.retain_graph)
        if before[0]:
            self._captured_report = owners.captured_report(before)
        unasked.after(self, states)
        return tuple([item.grad if item.requires_grad else None for item in self.replay_inputs])

    def _captured(self, values: tuple) -> Sequence[torch.Tensor]:
        """Parameters the replay may reach without an input edge: a module's own (never a replay input: those are
        detached copies), else found by a graph walk; `grad_states` keeps those that require grad."""
        function = self.function
        owner = function if isinstance(function, torch.nn.Module) else getattr(function, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            return owners.facts(owner).params
        return owners.captured_leaves(values, self.replay_inputs)

    # ------------------------------------------------------------ transitions

    def recompute(self) -> None:
        """Replay the function once and keep its graph (see NOTE [ Handle lifetime ], rule 2).

        Raises:
            HandleReleasedError: "Cannot replay a released reentrant checkpoint" (E7).
            GraphReleasedError: "output graph was released before replay" (E8).
        """
        in_backward = torch._C._current_graph_task_id() != -1
        api = f"{_API} (backward)" if in_backward else "ckpt_viz.recompute_handle"
        if self.released:
            if bus.enabled:
                self._emit(ReplayRefused, reason="released", last_release_reason=self.release_reason,
                           last_release_seq=self.release_seq)
            raise HandleReleasedError(api, "Cannot replay a released reentrant checkpoint", self.handle_id,
                                      self.release_reason, self.release_seq, self.release_site)
        if self.replay_outputs is not None:
            return
        ctx = self.context_ref() if self.context_ref is not None else None
        if ctx is None:
            if bus.enabled:
                self._emit(ReplayRefused, reason="node_collected", collected_seq=self.collected_seq)
            raise GraphReleasedError(api, self.handle_id, self.collected_seq)
        inputs = ctx.saved_tensors
        self.replay_inputs = tuple([
            t.detach().requires_grad_(t.requires_grad) if (t.is_floating_point() or t.is_complex()) else t.detach()
            for t in inputs
        ])
        self.replay_count += 1
        if bus.enabled:
            self._emit(ReplayStarted, trigger="backward" if in_backward else "prefire", retain_graph=self.retain_graph,
                       replay_index=self.replay_count)
        watch = self.divergence
        if watch is not None:
            watch.replay_starting()
        self.replaying = True
        grad_was = torch.is_grad_enabled()
        try:
            torch._C._set_grad_enabled(True)  # torch.enable_grad(), without its Python context manager
            try:
                with (memtags.category("replay_activations") if memtags.enabled else memtags.NULL):
                    self.replay_outputs = self.state.recompute_fn(self._call, {}, self.replay_inputs)
            finally:
                torch._C._set_grad_enabled(grad_was)
        except BaseException as exc:
            self.replay_outputs = None
            if bus.enabled:
                self._emit(ReplayFailed, type=type(exc).__name__, message=str(exc)[:65536])
            raise
        finally:
            self.replaying = False
        if bus.enabled:
            self._emit(ReplayFinished, trigger="backward" if in_backward else "prefire")
        if watch is not None:
            watch.replay_done(self._emit, tensors_of(self.replay_outputs))

    def set_phase(self, phase: str) -> None:
        """Select how the engine's next visit routes gradients: "dx" or "dw".

        Raises:
            CheckpointUsageError: the handle is not split, or the phase is not dx/dw (E5).
            HandleReleasedError: the handle was released (E6).
        """
        if not self.split or phase not in {"dx", "dw"}:
            why = "it was created outside reentrant_checkpoint_scope" if not self.split else f"got {phase!r}"
            raise fail(CheckpointUsageError(
                f"ckpt_viz.ReentrantCheckpointHandle.set_phase: Split reentrant handles require phase='dx' or "
                f"phase='dw' (handle h{self.handle_id}: {why}).\nTip: only handles from reentrant_checkpoint_scope "
                "take a phase; ordinary handles route by themselves."), "set_phase", self)
        if self.released:
            raise fail(HandleReleasedError(
                "ckpt_viz.ReentrantCheckpointHandle.set_phase", "Cannot set phase on a released reentrant checkpoint",
                self.handle_id, self.release_reason, self.release_seq, self.release_site), "set_phase", self)
        old, self.phase = self.phase, phase
        if bus.enabled:  # to dw: the fact that tells a DW without the trigger from a DX without retain_graph
            self._emit(PhaseSet, old=old, new=phase,
                       outer_graph_freed=self._outer_graph_freed() if phase == "dw" else None)

    def _outer_graph_freed(self) -> bool:
        """Whether a backward without retain_graph freed this checkpoint's saved inputs (read, never unpacked)."""
        ctx = self.context_ref() if self.context_ref is not None else None
        try:
            return ctx is None or ctx._raw_saved_tensors is None  # raises once the graph freed them
        except RuntimeError:
            return True

    def release(self) -> None:
        """Release the replay graph and excluded-region tapes now (reason `explicit_release`)."""
        self._release("explicit_release")

    def _release(self, reason: str) -> None:
        if self.released:
            return
        entries = len(self.entries)
        cache = self.exclude_cache
        cache_size = len(cache) if cache is not None else 0
        if cache is not None:
            cache.clear()
        for entry in self.entries:
            entry.release()
        self.entries.clear()
        self.excluded_output_mask.clear()
        was_replayed = self.replay_outputs is not None
        self.replay_outputs = None
        self.replay_inputs = ()
        self.divergence = None
        self.released = True
        self.release_reason = reason
        if bus.enabled:
            event = self._emit(Released, reason=reason, was_replayed=was_replayed, entries_released=entries,
                               exclude_cache_size=cache_size)
            if event is not None:  # an error about this handle quotes its seq and site
                self._release_event, self.release_site = event, event.site

    def bind_session(self, session_id: Hashable) -> None:
        """Register this handle under `session_id` for activation and clearing; does not replay.

        Raises:
            SessionMismatchError: another session id is active (E10).
            CheckpointError: the handle is bound to another session (E11).
        """
        api = "ckpt_viz.ReentrantCheckpointHandle.bind_session"
        _session.validate_session_id(session_id, api)
        activation = _session.current_activation()
        if activation is not None and activation.session_id != session_id:
            error = SessionMismatchError(api, self.handle_id, activation.session_id, session_id)
            raise fail(error, "bind_session", self)
        if self.active_session is not None and self.active_session.session_id != session_id:
            raise fail(CheckpointError(
                f"{api}: Concurrent reentrant recompute sessions on one frame are unsupported (h{self.handle_id} is "
                f"bound to {self.active_session.session_id!r}, binding {session_id!r}).\nTip: one session per "
                "micro-batch; leave the first session before binding another."), "bind_session", self)
        _session.register(self, session_id)

    # ------------------------------------------------------------ session protocol

    def _bind_activation(self, activation: _session.SessionActivation | None) -> None:
        self.active_session = activation
        self.retain_graph = bool(activation and activation.retain_on_unpack)
        if activation is not None:
            self.session_id = activation.session_id

    def _session_cleared(self, session_id: Hashable) -> None:
        self.session_id = session_id
        self._release("session_cleared")

    def _prefire(self) -> None:
        try:
            self.recompute()
        except BaseException as exc:
            raise fail(exc, "recompute_handle", self)  # noqa: B904  (fail returns exc itself)

    def _on_node_collected(self) -> None:
        self.node_collected = True
        if bus.enabled:
            event = self._emit(NodeCollected, site=None, capture_site=False, scope=self._home,
                               was_replayed=self.replay_count > 0, released=self.released)
            if event is not None:
                self._collected_event = event


def fail(exc: BaseException, where: str, handle: ReentrantCheckpointHandle | None = None) -> BaseException:
    """Emit an `error` event for an exception leaving a public API; return it for `raise`."""
    if bus.enabled:
        bus.emit_error(exc, where, handle_id=handle.handle_id if handle else None,
                       mode="reentrant" if handle else None, phase=handle.phase if handle else None,
                       session_id=handle.session_id if handle else None)
        if handle is not None:
            _debug.annotate(exc, handle)  # debug=True: the error tells the handle's story
    return exc

