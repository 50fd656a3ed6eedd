"""The non-reentrant, saved-tensor-hook checkpoint (spec 1.2).

Owns `NonReentrantFrame`: holders for saved tensors, the recompute keyed by session
or graph task, early stop and the metadata determinism check. Emits events; never
imports the UI.

NOTE [ Holders and keys ]
  1. Forward: every tensor autograd saves inside the region is replaced by a
     `_Holder`; the frame keeps only a weakref to it (and its metadata).
  2. Unpack: the key is the bound session id when the frame is bound to an
     activation, else the autograd graph task id, else (outside backward) a fresh
     random int. The frame recomputes once per key; the recompute stores one
     tensor per live holder under that key.
  3. A read consumes the tensor (the holder's slot becomes None) unless the session
     retains (`retain_on_unpack=True`); a second read under the same key is an error.
  4. Early stop: with `early_stop=True` the recompute stops right after the last
     tensor the forward saved, so the function's tail does not run again.
  5. Without a session, DX and DW are two graph tasks, hence two recomputes; with a
     session (prefire or the split helpers) there is one.

  Worked example: DX in `recompute_session_ctx(7, retain_on_unpack=True)` unpacks
  holder 0 -> recompute under key 7 -> tensors kept; DW in the non-retaining
  session 7 unpacks holder 0 again -> same tensor, slot cleared; clearing session 7
  drops what is left.
"""
from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

from ckpt_viz import bus
from ckpt_viz.errors import CheckpointError
from ckpt_viz.events import (
    EarlyStopped,
    EventBase,
    ForwardFailed,
    ForwardFinished,
    ForwardStarted,
    HandleCreated,
    ReplayFailed,
    ReplayFinished,
    ReplayStarted,
    TensorPacked,
    TensorUnpacked,
)
from ckpt_viz.runtime import compat, divergence, memtags
from ckpt_viz.runtime import debug as _debug
from ckpt_viz.runtime import session as _session
from ckpt_viz.runtime.graphmark import HANDLE_KEY, mark_new_nodes
from ckpt_viz.runtime.labels import label_of
from ckpt_viz.runtime.owners import qualname
from ckpt_viz.runtime.recompute_state import compose_context_fns, create_recompute_contexts
from ckpt_viz.runtime.reentrant import new_handle_id
from ckpt_viz.runtime.state import ExecutionState
from ckpt_viz.runtime.tensor_meta import meta

__all__ = ["NonReentrantFrame", "nonreentrant_checkpoint"]

E = TypeVar("E", bound=EventBase)
_API = "ckpt_viz.checkpoint"


class _StopRecomputation(Exception):
    """Raised by the recompute pack hook after the last needed tensor (early stop)."""


class _Handle:
    """Key object for one recomputed tensor; it dies with its holder."""

    __slots__ = ("__weakref__",)


class _Holder:
    """Stands in for a saved tensor in the autograd graph."""

    __slots__ = ("__weakref__", "handles", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.handles: dict[Hashable, _Handle | None] = {}


def _metadata(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, t.device)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class NonReentrantFrame:
    """One non-reentrant checkpoint invocation (a "frame"); see NOTE [ Holders and keys ]."""

    _is_checkpoint_handle = True
    mode = "nonreentrant"

    def __init__(self, recompute_fn: Callable[..., Any], early_stop: bool,
                 metadata_fn: Callable[[torch.Tensor], Any] | None, function: Callable) -> None:
        self.handle_id = new_handle_id(self)
        self.function = function
        self.recompute_fn = recompute_fn
        self.early_stop = early_stop
        self.metadata_fn = metadata_fn
        self.input_saver: torch.Tensor | None = None
        self.weak_holders: list[weakref.ref] = []
        self.x_metadatas: list[Any] = []
        self.forward_completed = False
        self.ignore_saved_mismatch = False
        self.recomputed: dict[Hashable, weakref.WeakKeyDictionary[_Handle, torch.Tensor]] = {}
        self.recomp_counter: dict[Hashable, int] = {}
        self.is_recomputed: dict[Hashable, bool] = {}
        self.active_session: _session.SessionActivation | None = None
        self.session_id: Hashable | None = None
        self.replay_count = 0
        self.site: str | None = None
        self._api = _API
        self.divergence: Any = divergence.OFF  # a ReplayWatch while a recording checks its recomputes

    def __repr__(self) -> str:
        return f"<NonReentrantFrame h{self.handle_id} saved={len(self.weak_holders)}>"

    _story: Any = None  # debug.py's story of this frame once adopted (runtime/debug.py NOTE rule 2)

    def _emit(self, cls: type[E], *, site: str | None = None, capture_site: bool = True, **fields: Any) -> E | None:
        """Emit an event about this frame (its id and session), into its debug story too."""
        event = bus.emit(cls, handle_id=self.handle_id, mode="nonreentrant", session_id=self.session_id, site=site,
                         capture_site=capture_site, **fields)
        if self._story is not None and event is not None:
            self._story.add(event)
        return event

    def get_inputs(self) -> list:
        node = self.input_saver.grad_fn
        return node.get_args(node.saved_tensors)

    # ------------------------------------------------------------ forward hooks

    def _pack(self, x: torch.Tensor) -> _Holder:
        holder = _Holder(len(self.weak_holders))
        self.weak_holders.append(weakref.ref(holder))
        if self.metadata_fn is not None:
            with torch.no_grad():
                self.x_metadatas.append(self.metadata_fn(x))
        if bus.enabled:
            self._emit(TensorPacked, capture_site=False, index=holder.index, shape=tuple(x.shape),
                       dtype=str(x.dtype).replace("torch.", ""), nbytes=_nbytes(x),
                       is_parameter=isinstance(x, torch.nn.Parameter))
            self.divergence.packed(holder.index, x)
        return holder

    def _key(self) -> tuple[Hashable, str, bool]:
        activation = self.active_session
        if activation is not None:
            return activation.session_id, "session", activation.retain_on_unpack
        group = compat.group_key(self)  # GraphExecGroup: one recompute for all its backward calls
        if group is not None:
            return group, "group", False
        key = torch._C._current_graph_task_id()
        if key == -1:
            return int(uuid.uuid4()), "temporary", False
        return key, "graph_task", False

    def _unpack(self, holder: _Holder) -> torch.Tensor:
        key, source, retain = self._key()
        if not self.is_recomputed.get(key, False):
            self._recompute(key, source)
        if key not in holder.handles:
            raise CheckpointError(
                f"{_API} (backward): No recomputed tensor was saved for this checkpoint value (frame "
                f"h{self.handle_id}, saved tensor {holder.index}, key {key!r}).\nTip: this happens when a recompute "
                "saved fewer tensors than the forward; make the function deterministic or pass early_stop=True.",
                code="saved_count_mismatch")
        handle = holder.handles[key]
        if handle is None:
            overlap, tip = "", ("run a second pass inside recompute_session_ctx(sid, retain_on_unpack=True), or use "
                                "a new session id for it.")
            if source == "group":
                overlap = ("Performing two backward calls that overlap (i.e. require the same saved activation) is "
                           "not allowed under GraphExecGroup: ")
                tip = ("under GraphExecGroup each saved tensor serves one backward call; for DX/DW passes that share "
                       "tensors use backward_input/backward_weight with a session_id.")
            raise CheckpointError(
                f"{_API} (backward): {overlap}a saved tensor was unpacked more than once in the same recompute "
                f"session (frame h{self.handle_id}, saved tensor {holder.index}, key {key!r}).\nTip: {tip}",
                code="unpacked_twice_in_session")
        stored = self.recomputed.get(key)
        if stored is None or handle not in stored:
            raise CheckpointError(
                f"{_API} (backward): The recomputed tensor has already been released (frame h{self.handle_id}, saved "
                f"tensor {holder.index}, key {key!r}).\nTip: do not clear the session before its last consumer ran.")
        tensor = stored[handle]
        if not retain:
            holder.handles[key] = None
        if bus.enabled:
            self._emit(TensorUnpacked, capture_site=False, index=holder.index, key_source=source,
                       retain=retain, consumed=not retain, shape=tuple(tensor.shape), nbytes=_nbytes(tensor))
        return tensor

    # ------------------------------------------------------------ recompute

    def _recompute_pack(self, key: Hashable, x: torch.Tensor) -> torch.Tensor:
        x = x.detach() if x.requires_grad else x
        index = self.recomp_counter.get(key, 0)
        self.recomp_counter[key] = index + 1
        if bus.enabled:
            self.divergence.repacked(index, x)
        if index >= len(self.weak_holders):
            if not self.early_stop and not self.forward_completed:
                self.ignore_saved_mismatch = True
                return x
            raise CheckpointError(
                f"{self._api}: recomputation tried to save more tensors during recomputation than during "
                f"forward (frame h{self.handle_id}: forward saved {len(self.weak_holders)}).\nTip: the checkpointed "
                "function must do the same work in its replay; check for data-dependent control flow.",
                code="saved_count_mismatch")
        holder = self.weak_holders[index]()
        if holder is not None:
            if holder.handles.get(key) is not None:
                raise CheckpointError(
                    f"{self._api}: A recomputed tensor handle already exists for this session "
                    f"(frame h{self.handle_id}, "
                    f"saved tensor {index}, key {key!r}).\nTip: a previous recompute for this session failed part-way; "
                    "call clear_recompute_session(session_id) before retrying.")
            handle = _Handle()
            holder.handles[key] = handle
            self.recomputed.setdefault(key, weakref.WeakKeyDictionary())[handle] = x
            if memtags.enabled:
                memtags.hold(handle, x, "replay_activations")
        if self.early_stop and self.recomp_counter[key] == len(self.weak_holders):
            raise _StopRecomputation
        return x

    def _recompute(self, key: Hashable, source: str) -> None:
        in_backward = torch._C._current_graph_task_id() != -1
        trigger = "backward" if in_backward else "prefire"
        self.replay_count += 1
        if bus.enabled:
            self._emit(ReplayStarted, trigger=trigger, key_source=source, replay_index=self.replay_count)
        self.recomputed.setdefault(key, weakref.WeakKeyDictionary())
        self.recomp_counter[key] = 0  # a retry after a failed recompute starts over (and then meets its handles)
        self._api = f"{_API} (backward)" if in_backward else "ckpt_viz.recompute_handle"
        activation = self.active_session
        token = None
        if activation is not None and _session.current_activation() is not activation:
            token = _session._SESSION.set(activation)
        early_stopped = False
        try:
            args = self.get_inputs()
            self.divergence.replay_starting()
            me = weakref.ref(self)  # autograd keeps the pack hook with every tensor saved: no cycle through C++
            with torch.autograd.graph.saved_tensors_hooks(lambda x: me()._recompute_pack(key, x), lambda x: x), \
                    torch.enable_grad():
                try:
                    self.recompute_fn(*args)
                except _StopRecomputation:
                    early_stopped = True
            self.is_recomputed[key] = True
            self._check_recomputed(key)
            self.divergence.replay_done(self._emit, None)
        except BaseException as exc:
            if bus.enabled:
                self._emit(ReplayFailed, type=type(exc).__name__, message=str(exc)[:65536])
                bus.emit_error(exc, "backward" if in_backward else "recompute_handle", handle_id=self.handle_id,
                               mode="nonreentrant", session_id=self.session_id)
                _debug.annotate(exc, self)
            raise
        finally:
            if token is not None:
                _session._SESSION.reset(token)
        if bus.enabled:
            saved = self.recomp_counter.get(key, 0)
            if early_stopped:
                self._emit(EarlyStopped, capture_site=False, saved_count=saved)
            self._emit(ReplayFinished, trigger=trigger, key_source=source, saved_count=saved,
                       early_stopped=early_stopped, ignore_saved_mismatch=self.ignore_saved_mismatch)

    def _check_recomputed(self, key: Hashable) -> None:
        if self.ignore_saved_mismatch:
            return
        forward_count, replay_count = len(self.weak_holders), self.recomp_counter.get(key, 0)
        if forward_count != replay_count:
            raise CheckpointError(
                f"{self._api}: recomputation saved a different number of tensors during forward and "
                f"recomputation. Forward saved {forward_count} tensors, but recomputation saved {replay_count} "
                f"tensors (frame h{self.handle_id}).\nTip: the checkpointed function must be deterministic; keep "
                "preserve_rng_state=True and avoid data-dependent control flow.", code="saved_count_mismatch")
        if self.metadata_fn is None:
            return
        stored = self.recomputed.get(key, {})
        lines = []
        for index, ref in enumerate(self.weak_holders):
            holder = ref()
            if holder is None or holder.handles.get(key) is None:
                continue
            got = self.metadata_fn(stored[holder.handles[key]])
            if got != self.x_metadatas[index]:
                lines.append(f"tensor {index}: forward={self.x_metadatas[index]}, recompute={got}")
        if lines:
            raise CheckpointError(
                f"{self._api}: detected different tensor metadata during recomputation:\n"
                + "\n".join(lines)
                + f"\n(frame h{self.handle_id})\nTip: the replay must see the same shapes and dtypes; keep autocast "
                "and inputs unchanged, or pass determinism_check='none'.", code="metadata_mismatch")

    # ------------------------------------------------------------ session protocol

    def _bind_activation(self, activation: _session.SessionActivation | None) -> None:
        self.active_session = activation
        if activation is not None:
            self.session_id = activation.session_id

    def _session_cleared(self, session_id: Hashable) -> None:
        self.recomputed.pop(session_id, None)
        self.recomp_counter.pop(session_id, None)
        self.is_recomputed.pop(session_id, None)
        for ref in self.weak_holders:
            holder = ref()
            if holder is not None:
                holder.handles.pop(session_id, None)

    def _prefire(self) -> None:
        key, source, _ = self._key()
        if not self.is_recomputed.get(key, False):
            self._recompute(key, source)


class _SaveInputs(torch.autograd.Function):
    """Keeps the checkpoint's tensor inputs for the recompute; never differentiated."""

    @staticmethod
    def forward(*args: Any) -> torch.Tensor:
        return torch.empty((0,))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        positions = [i for i, value in enumerate(inputs) if isinstance(value, torch.Tensor)]
        slot_of = {position: slot for slot, position in enumerate(positions)}
        plain = [None if isinstance(value, torch.Tensor) else value for value in inputs]

        def get_args(saved: tuple) -> list:
            rebuilt = [saved[slot_of[i]] if i in slot_of else value for i, value in enumerate(plain)]
            return rebuilt[1:]  # drop the dummy; what is left is (kwargs, *args)

        ctx.get_args = get_args
        ctx.save_for_backward(*(inputs[i] for i in positions))

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise CheckpointError(
            f"{_API}: the internal checkpoint input saver must not be backwarded directly.\n"
            "Tip: differentiate the checkpoint's outputs, not its internal nodes.")


def nonreentrant_checkpoint(function: Callable, *args: Any, preserve_rng_state: bool, context_fn: Callable,
                            determinism_check: str, early_stop: bool, **kwargs: Any) -> Any:
    """Run `function` under the saved-tensor-hook checkpoint; see `ckpt_viz.runtime.checkpoint`."""
    metadata_fn = _metadata if determinism_check == "default" else None
    try:
        contexts = functools.partial(create_recompute_contexts, preserve_rng_state)
        state = ExecutionState.capture(compose_context_fns(contexts, context_fn),
                                       preserve_rng_state, args, api=_API)
    except BaseException as exc:
        raise _error(exc)  # noqa: B904  (_error returns exc itself when it is already ours)
    dummy = torch.empty((0,), requires_grad=True)
    with (memtags.category("checkpoint_inputs") if memtags.enabled else memtags.NULL):
        saver = _SaveInputs.apply(dummy, kwargs, *args)
    if saver.grad_fn is None:  # grad mode is off: nothing will be saved
        return function(*args, **kwargs)
    activation = _session.current_activation()
    if activation is not None:
        raise _error(CheckpointError(
            f"{_API}: Nested checkpoint is not supported during scheduled recomputation (session "
            f"{activation.session_id!r} is open).\nTip: run forwards outside recompute_session_ctx; use the session "
            "only around backward passes and prefire."))

    def recompute_fn(kwargs_: dict, *inputs: Any) -> Any:
        return state.recompute_fn(function, kwargs_, *inputs)

    frame = NonReentrantFrame(recompute_fn, early_stop, metadata_fn, function)
    frame.input_saver = saver
    collector = _session.current_collector()
    if collector is not None:
        collector.append(frame)
    if bus.enabled:
        event = frame._emit(HandleCreated, function=qualname(function), label=label_of(function),
                            collector="unified" if collector is not None else "none",
                            preserve_rng_state=preserve_rng_state, early_stop=early_stop,
                            input_count=sum(isinstance(a, torch.Tensor) for a in args),
                            inputs=tuple(meta(a) for a in args if isinstance(a, torch.Tensor)))
        frame.site = event.site if event is not None else None
        frame._emit(ForwardStarted, site=frame.site, capture_site=False, device_type=state.device_type)
        frame.divergence = divergence.watch(frame, args, kwargs, (*args, *kwargs.values())) or divergence.OFF
    try:
        unpack = _debug.unpack_hook(frame) if _debug.is_debug_handle(frame) else frame._unpack
        with torch.autograd.graph.saved_tensors_hooks(frame._pack, unpack), state.forward_context, \
                frame.divergence.forward():
            output = function(*args, **kwargs)
        frame.forward_completed = True
        state.check_device_state_preserved(preserve_rng_state, api=_API)
    except BaseException as exc:
        if collector is not None and frame in collector:
            collector.remove(frame)
        if bus.enabled:
            frame._emit(ForwardFailed, site=frame.site, capture_site=False, type=type(exc).__name__,
                        message=str(exc)[:65536])
        raise _error(exc, frame)  # noqa: B904  (see above)
    if bus.enabled:
        marked = mark_new_nodes(output, args, HANDLE_KEY, frame.handle_id)
        frame._emit(ForwardFinished, site=frame.site, capture_site=False, saved_count=len(frame.weak_holders),
                    graph_nodes=marked)
    return output


def _error(exc: BaseException, frame: NonReentrantFrame | None = None) -> BaseException:
    if bus.enabled:
        bus.emit_error(exc, "checkpoint", handle_id=frame.handle_id if frame else None,
                       mode="nonreentrant" if frame else None)
    return exc
