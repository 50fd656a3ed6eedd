"""The reentrant checkpoint with split DX/DW backward (spec 1.5, 2 and 3).

Owns `ReentrantCheckpointHandle`, `reentrant_checkpoint_scope` and the autograd
Function that replays a region inside the engine's backward. Emits an event at
every transition; never imports the UI.

NOTE [ Handle lifetime ]
  1. The autograd node holds its handle strongly; the handle holds the node only
     through a weakref (`context_ref`), so looking a handle up never keeps a graph
     alive. When the node is collected the handle emits `node_collected`.
  2. A handle replays at most once. The replay graph stays alive in
     `replay_outputs` until the handle is released, so DX and DW share it.
  3. Release is terminal and idempotent; it frees the replay graph and every
     excluded-region tape, and records its reason (spec 7 `released`).
  4. Who releases: an ordinary backward that does not retain; DW always; any
     exception in backward unless retained; `clear_recompute_session`;
     `release()`; a failing forward. Nothing else.
  5. DX never releases: its inner `autograd.grad` keeps the replay graph.

  Worked example (split, one handle h0):
      forward in scope -> handle_created h0, forward_started, forward_finished
      set_phase('dx'); backward(inputs=acts, retain_graph=True)
          -> backward_entered, replay_started, replay_finished, grads_routed(dx)
      set_phase('dw'); backward(inputs=(*params, h0.backward_trigger))
          -> backward_entered, grads_routed(dw), released(dw_complete)

NOTE [ Split routing ]
  1. DX targets the replay inputs that require grad and are not scope parameters;
     it runs `autograd.grad` on the replay graph and writes no `.grad`.
  2. DW (and ordinary backward) runs `autograd.backward` over the whole replay
     graph: captured parameters accumulate straight into their `.grad`; explicit
     parameter inputs return their gradient through the node's input edge.
  3. The `backward_trigger` is a zero-element leaf that gives every split handle
     an outer edge DW can target, so closure-only regions are reached (spec 3.4).
     Its gradient is always None.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ckpt_viz import bus
from ckpt_viz.errors import (
    CheckpointError,
    CheckpointUsageError,
    GraphReleasedError,
    HandleReleasedError,
    PhaseNotSetError,
)
from ckpt_viz.runtime import memtags
from ckpt_viz.runtime import session as _session
from ckpt_viz.runtime.state import ExecutionState, noop_context_fn

__all__ = [
    "ReentrantCheckpointHandle",
    "current_frame",
    "new_handle_id",
    "reentrant_checkpoint",
    "reentrant_checkpoint_scope",
]

_SCOPE: contextvars.ContextVar[list | None] = contextvars.ContextVar("ckpt_viz_reentrant_scope", default=None)
_CURRENT_FRAME: contextvars.ContextVar[Any] = contextvars.ContextVar("ckpt_viz_reentrant_frame", default=None)
_HANDLE_IDS = itertools.count()
_API = "ckpt_viz.checkpoint"


def new_handle_id() -> int:
    """Next handle id, shared by reentrant handles and non-reentrant frames (spec D2)."""
    return next(_HANDLE_IDS)


def current_frame() -> "ReentrantCheckpointHandle | None":
    """The reentrant handle whose function is running (original forward or replay), or None."""
    return _CURRENT_FRAME.get()


@contextlib.contextmanager
def _execution_frame(frame: "ReentrantCheckpointHandle") -> Iterator[None]:
    token = _CURRENT_FRAME.set(frame)
    try:
        yield
    finally:
        _CURRENT_FRAME.reset(token)


@dataclass(frozen=True)
class _InputSlot:
    """Index of a tensor among the Function's positional tensor inputs."""

    index: int


def _meta(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "device": str(t.device), "requires_grad": bool(t.requires_grad),
            "nbytes": t.numel() * t.element_size()}


def _qualname(function: Callable) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


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

    def __init__(self, function: Callable, template: list, spec: Any, params: tuple | None,
                 preserve_rng_state: bool, context_fn: Callable) -> None:
        self.handle_id = new_handle_id()
        self.function = function
        self.template = template
        self.spec = spec
        self.params = params
        self.split = params is not None
        self.preserve_rng_state = preserve_rng_state
        self.context_fn = context_fn
        self.exclude_cache: Any = None  # set by ckpt_viz.runtime.exclude when a region records
        self.entries: list = []
        self.replaying = False
        self.phase = "ordinary"
        self.replay_outputs: Any = None
        self.replay_inputs: tuple = ()
        self.state: ExecutionState | None = None
        self.context_ref: Callable[[], Any] | None = None
        self.input_count = 0
        self.param_input_mask: tuple[bool, ...] = ()
        self.backward_trigger: torch.Tensor | None = None
        self.released = False
        self.retain_graph = False
        self.active_session: _session.SessionActivation | None = None
        self.session_id: Hashable | None = None
        self.output_spec: Any = None
        self.output_template: tuple = ()
        self.excluded_output_mask: dict[int, tuple[Any, bool]] = {}
        self.recording_exclude = False
        self.site: str | None = None
        self.release_reason: str | None = None
        self.release_seq: int | None = None
        self.release_site: str | None = None
        self.node_collected = False
        self.collected_seq: int | None = None
        self.replay_count = 0
        self._backward_site: str | None = None

    def __repr__(self) -> str:
        state = "released" if self.released else ("replayed" if self.replay_outputs is not None else "recorded")
        return f"<ReentrantCheckpointHandle h{self.handle_id} {state} phase={self.phase}>"

    # ------------------------------------------------------------ events

    def _emit(self, kind: str, capture_site: bool = True, **data: Any) -> Any:
        # Inside one engine callback every event has the same user line: walk the stack once (see backward).
        return bus.emit(kind, handle_id=self.handle_id, mode="reentrant", phase=self.phase,
                        session_id=self.session_id, site=self._backward_site, capture_site=capture_site, data=data)

    # ------------------------------------------------------------ running the function

    def _call(self, tensors: Sequence[torch.Tensor]) -> Any:
        if self.spec is None:  # fast path: positional tensors only
            args, kwargs = tuple(tensors), {}
        else:
            leaves = [tensors[item.index] if isinstance(item, _InputSlot) else item for item in self.template]
            args, kwargs = tree_unflatten(leaves, self.spec)
        with _execution_frame(self):
            return self.function(*args, **kwargs)

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
        captured = self._captured(values) if bus.enabled else None
        before = [(p.grad, p.grad._version if p.grad is not None else -1) for p in captured] if captured else None
        torch.autograd.backward(values, grads, retain_graph=self.retain_graph)
        if captured:
            self._captured_report = [
                {"shape": list(p.shape), "name": getattr(p, "_ckpt_viz_name", None),
                 "accumulated": p.grad is not None and (p.grad is not old or p.grad._version != version)}
                for p, (old, version) in zip(captured, before)
            ]
        return tuple(item.grad if item.requires_grad else None for item in self.replay_inputs)

    def _captured(self, values: tuple) -> list[torch.Tensor]:
        """Parameters the replay reaches without an input edge: a module's own, else found by a graph walk."""
        owner = self.function if isinstance(self.function, torch.nn.Module) else getattr(self.function, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            inputs = {id(t) for t in self.replay_inputs}
            return [p for p in owner.parameters() if p.requires_grad and id(p) not in inputs]
        return _captured_leaves(values, self.replay_inputs)

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
                self._emit("replay_refused", reason="released", last_release_reason=self.release_reason,
                           last_release_seq=self.release_seq)
            raise HandleReleasedError(api, "Cannot replay a released reentrant checkpoint", self.handle_id,
                                      self.release_reason, self.release_seq, self.release_site)
        if self.replay_outputs is not None:
            return
        ctx = self.context_ref() if self.context_ref is not None else None
        if ctx is None:
            if bus.enabled:
                self._emit("replay_refused", reason="node_collected", collected_seq=self.collected_seq)
            raise GraphReleasedError(api, self.handle_id, self.collected_seq)
        inputs = ctx.saved_tensors
        self.replay_inputs = tuple(
            t.detach().requires_grad_(t.requires_grad) if (t.is_floating_point() or t.is_complex()) else t.detach()
            for t in inputs
        )
        self.replay_count += 1
        if bus.enabled:
            self._emit("replay_started", trigger="backward" if in_backward else "prefire",
                       retain_graph=self.retain_graph, replay_index=self.replay_count)
        self.replaying = True
        try:
            def replay() -> None:
                self.replay_outputs = self._call(self.replay_inputs)

            with torch.enable_grad(), (memtags.category("replay_activations") if memtags.enabled else memtags.NULL):
                self.state.recompute_fn(replay, {})
        except BaseException as exc:
            self.replay_outputs = None
            if bus.enabled:
                self._emit("replay_failed", type=type(exc).__name__, message=str(exc))
            raise
        finally:
            self.replaying = False
        if bus.enabled:
            self._emit("replay_finished", trigger="backward" if in_backward else "prefire")

    def set_phase(self, phase: str) -> None:
        """Select how the engine's next visit routes gradients: "dx" or "dw".

        Raises:
            CheckpointUsageError: the handle is not split, or the phase is not dx/dw (E5).
            HandleReleasedError: the handle was released (E6).
        """
        if not self.split or phase not in {"dx", "dw"}:
            why = "it was created outside reentrant_checkpoint_scope" if not self.split else f"got {phase!r}"
            raise _fail(CheckpointUsageError(
                f"ckpt_viz.ReentrantCheckpointHandle.set_phase: Split reentrant handles require phase='dx' or "
                f"phase='dw' (handle h{self.handle_id}: {why}).\nTip: only handles from reentrant_checkpoint_scope "
                "take a phase; ordinary handles route by themselves."), "set_phase", self)
        if self.released:
            raise _fail(HandleReleasedError(
                "ckpt_viz.ReentrantCheckpointHandle.set_phase", "Cannot set phase on a released reentrant checkpoint",
                self.handle_id, self.release_reason, self.release_seq, self.release_site), "set_phase", self)
        old, self.phase = self.phase, phase
        if bus.enabled:
            self._emit("phase_set", old=old, new=phase)

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
        self.released = True
        self.release_reason = reason
        if bus.enabled:
            event = self._emit("released", reason=reason, was_replayed=was_replayed,
                               entries_released=entries, exclude_cache_size=cache_size)
            if event is not None:
                self.release_seq, self.release_site = event.seq, event.site

    def bind_session(self, session_id: Hashable) -> None:
        """Register this handle under `session_id` for activation and clearing; does not replay.

        Raises:
            CheckpointUsageError: another session id is active (E10).
            CheckpointError: the handle is bound to another session (E11).
        """
        api = "ckpt_viz.ReentrantCheckpointHandle.bind_session"
        _session.validate_session_id(session_id, api)
        activation = _session.current_activation()
        if activation is not None and activation.session_id != session_id:
            raise _fail(CheckpointUsageError(
                f"{api}: Active session does not match the reentrant handle session (active {activation.session_id!r}, "
                f"binding h{self.handle_id} to {session_id!r}).\nTip: bind inside the session with the same id, or "
                "outside any session."), "bind_session", self)
        if self.active_session is not None and self.active_session.session_id != session_id:
            raise _fail(CheckpointError(
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
            raise _fail(exc, "recompute_handle", self)

    def _on_node_collected(self) -> None:
        self.node_collected = True
        if bus.enabled:
            event = self._emit("node_collected", capture_site=False,
                               was_replayed=self.replay_count > 0, released=self.released)
            if event is not None:
                self.collected_seq = event.seq


def _fail(exc: BaseException, where: str, handle: ReentrantCheckpointHandle | None = None) -> BaseException:
    """Emit an `error` event for an exception leaving a public API; return it for `raise`."""
    if bus.enabled:
        bus.emit("error", handle_id=handle.handle_id if handle else None, mode="reentrant" if handle else None,
                 phase=handle.phase if handle else None, session_id=handle.session_id if handle else None,
                 data={"where": where, "type": type(exc).__name__, "message": str(exc)})
    return exc


def _captured_leaves(values: tuple, replay_inputs: tuple) -> list[torch.Tensor]:
    """Leaf tensors the replay graph reaches that are not replay inputs (captured parameters)."""
    inputs = {id(t) for t in replay_inputs}
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    stack = [v.grad_fn for v in values if v.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) not in inputs:
            found.append(variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def _collected_callback(handle_ref: "weakref.ref[ReentrantCheckpointHandle]") -> Callable[[Any], None]:
    def collected(_: Any) -> None:
        handle = handle_ref()
        if handle is not None:
            handle._on_node_collected()
    return collected


class _Checkpoint(torch.autograd.Function):
    """The outer-graph node: input edges, one trigger edge, and the replay inside backward."""

    @staticmethod
    def forward(ctx: Any, frame: ReentrantCheckpointHandle, dummy: torch.Tensor, *tensors: torch.Tensor) -> tuple:
        inputs = tensors[:frame.input_count]
        ctx.frame = frame
        ctx.save_for_backward(*inputs)
        frame.context_ref = weakref.ref(ctx, _collected_callback(weakref.ref(frame)))
        frame.state = ExecutionState.capture(frame.context_fn, frame.preserve_rng_state, inputs, api=_API)
        if bus.enabled:
            frame._emit("forward_started", capture_site=False, device_type=frame.state.device_type,
                        rng_captured=frame.state.cpu_rng_state is not None)
        with torch.no_grad(), frame.state.forward_context:
            output = frame._call(inputs)
        for entry in frame.entries:  # a save_output=False region's output was needed only during this forward
            entry.chain_outputs = None
        frame.state.check_device_state_preserved(frame.preserve_rng_state, api=_API)
        leaves, frame.output_spec = tree_flatten(output)
        frame.output_template = tuple(
            _InputSlot(i) if isinstance(v, torch.Tensor) else v for i, v in enumerate(leaves)
        )
        originals = [v for v in leaves if isinstance(v, torch.Tensor)]
        if not originals:
            raise CheckpointUsageError(
                f"{_API}: Reentrant checkpoint requires at least one Tensor output (h{frame.handle_id}: "
                f"{_qualname(frame.function)} returned {type(output).__name__}).\n"
                "Tip: return the tensor result, or do not checkpoint a function without tensor outputs."
            )
        outputs = tuple(v.detach() for v in originals)

        def differentiable(original: torch.Tensor) -> bool:
            matched = frame.excluded_output_mask.get(id(original))
            if matched is not None and matched[0]() is original:
                return matched[1]
            return original.is_floating_point() or original.is_complex()

        non_diff = [i for i, original in enumerate(originals) if not differentiable(original)]
        ctx.mark_non_differentiable(*(outputs[i] for i in non_diff))
        frame.excluded_output_mask.clear()
        if bus.enabled:
            frame._emit("forward_finished", capture_site=False, outputs=[_meta(o) for o in outputs],
                        non_differentiable=non_diff, exclude_entries=len(frame.entries))
        return outputs

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple:
        frame = ctx.frame
        if bus.enabled:
            frame._backward_site = bus.call_site()
            frame._emit("backward_entered", split=frame.split, retain_graph=frame.retain_graph,
                        grad_count=len(grad_outputs), none_grads=sum(g is None for g in grad_outputs))
        try:
            return _run_backward(frame, grad_outputs)
        except BaseException as exc:
            _fail(exc, "backward", frame)
            if not frame.retain_graph:
                frame._release("backward_exception")
            raise
        finally:
            frame._backward_site = None


def _run_backward(frame: ReentrantCheckpointHandle, grad_outputs: tuple) -> tuple:
    if frame.split and frame.phase == "ordinary":
        raise PhaseNotSetError(frame.handle_id)
    frame.recompute()
    outputs = [v for v in tree_flatten(frame.replay_outputs)[0] if isinstance(v, torch.Tensor)]
    selected = [(v, g) for v, g in zip(outputs, grad_outputs) if v.requires_grad and g is not None]
    input_grads = frame._gradients(*zip(*selected)) if selected else (None,) * frame.input_count
    if bus.enabled:
        got = [i for i, g in enumerate(input_grads) if g is not None]
        params = [i for i in got if frame.param_input_mask[i]]
        acts = [i for i in got if not frame.param_input_mask[i]]
        # In DW the activation grads are returned but the engine drops them (they are not DW targets).
        data: dict[str, Any] = ({"targets": params, "explicit_params": params, "discarded_activations": acts}
                                if frame.split and frame.phase == "dw"
                                else {"targets": got, "explicit_params": params, "activations": acts})
        captured = getattr(frame, "_captured_report", None)
        if captured is not None:
            data["captured"] = captured
            frame._captured_report = None
        frame._emit("grads_routed", **data)
    if frame.split:
        if frame.phase == "dw":
            frame._release("dw_complete")
    elif not frame.retain_graph:
        frame._release("ordinary_backward_complete")
    return (None, None, *input_grads, None)


@contextlib.contextmanager
def reentrant_checkpoint_scope(parameters: Sequence[torch.Tensor] | Callable[[], Sequence[torch.Tensor]]
                               ) -> Iterator[list[ReentrantCheckpointHandle]]:
    """Make every reentrant checkpoint in the block split, and collect its handles.

    Args:
        parameters: the stage's parameters, or a zero-argument provider evaluated
            lazily at the first checkpoint (e.g. `stage.parameters`).

    Yields:
        The live list of handles. Set each handle's phase before DX and DW,
        include every `backward_trigger` in DW's `inputs`, and release them on
        cancellation; leaving the scope releases nothing.
    """
    if _SCOPE.get() is not None:
        raise _fail(CheckpointUsageError(
            "ckpt_viz.reentrant_checkpoint_scope: Nested reentrant checkpoint scopes are not supported.\n"
            "Tip: open one scope per stage forward."), "reentrant_checkpoint_scope")
    scope: list = [parameters, [], None]
    token = _SCOPE.set(scope)
    try:
        yield scope[1]
    finally:
        _SCOPE.reset(token)


def _checkpoint_inputs(args: tuple, kwargs: dict) -> tuple[tuple, list, Any]:
    """Tensor leaves in order, the template that rebuilds (args, kwargs), and its spec (None: all positional tensors)."""
    if not kwargs and all(type(a) is torch.Tensor or isinstance(a, torch.Tensor) for a in args):
        return tuple(args), [_InputSlot(i) for i in range(len(args))], None
    leaves, spec = tree_flatten((args, kwargs))
    inputs: list[torch.Tensor] = []
    template: list = []
    for item in leaves:
        if isinstance(item, torch.Tensor):
            template.append(_InputSlot(len(inputs)))
            inputs.append(item)
        else:
            template.append(item)
    return tuple(inputs), template, spec


def _scope_parameters(scope: list | None) -> tuple | None:
    if scope is None:
        return None
    if scope[2] is None:
        supplied = tuple(scope[0]() if callable(scope[0]) else scope[0])
        bad = [type(p).__name__ for p in supplied if not isinstance(p, torch.Tensor)]
        if bad:
            raise CheckpointUsageError(
                f"ckpt_viz.reentrant_checkpoint_scope: Scope parameters must be Tensors (got {', '.join(bad)}).\n"
                "Tip: pass `stage.parameters` (the method) or a list of tensors; a module itself would be called."
            )
        scope[2] = tuple({id(p): p for p in supplied if p.requires_grad}.values())
    return scope[2]


def reentrant_checkpoint(function: Callable, *args: Any, preserve_rng_state: bool = True,
                         context_fn: Callable = noop_context_fn, **kwargs: Any) -> Any:
    """Run `function` under a reentrant checkpoint; see `ckpt_viz.runtime.checkpoint`."""
    if current_frame() is not None:
        raise _fail(CheckpointUsageError(
            f"{_API}: Nested reentrant checkpoints are not supported (inside h{current_frame().handle_id}).\n"
            "Tip: checkpoint the outer region only, or use use_reentrant=False for the inner one."), "checkpoint")
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    inputs, template, spec = _checkpoint_inputs(args, kwargs)
    scope = _SCOPE.get()
    try:
        params = _scope_parameters(scope)
    except BaseException as exc:
        raise _fail(exc, "checkpoint")
    frame = ReentrantCheckpointHandle(function, template, spec, params, preserve_rng_state, context_fn)
    frame.input_count = len(inputs)
    param_ids = {id(p) for p in params or ()}
    frame.param_input_mask = tuple(id(t) in param_ids for t in inputs)
    frame.backward_trigger = torch.empty(0, requires_grad=True) if frame.split else None
    if scope is not None:
        collector, collector_name = scope[1], "scope"
    else:
        collector = _session.current_collector()
        collector_name = "unified" if collector is not None else "none"
    if collector is not None:
        collector.append(frame)
    if bus.enabled:
        event = frame._emit("handle_created", split=frame.split, input_count=frame.input_count,
                            param_input_mask=list(frame.param_input_mask), collector=collector_name,
                            preserve_rng_state=preserve_rng_state, function=_qualname(function),
                            inputs=[_meta(t) for t in inputs])
        frame.site = event.site if event is not None else None
    try:
        with (memtags.category("checkpoint_inputs") if memtags.enabled else memtags.NULL):
            result = _Checkpoint.apply(frame, torch.empty(0, requires_grad=True), *inputs, frame.backward_trigger)
    except BaseException as exc:
        if bus.enabled:
            frame._emit("forward_failed", type=type(exc).__name__, message=str(exc))
        frame._release("forward_exception")
        if collector is not None:
            collector.remove(frame)
        raise _fail(exc, "checkpoint", frame)
    tensors = iter((result,) if isinstance(result, torch.Tensor) else result)
    return tree_unflatten([next(tensors) if isinstance(item, _InputSlot) else item
                           for item in frame.output_template], frame.output_spec)
