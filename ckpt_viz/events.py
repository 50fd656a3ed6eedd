"""The event types: one declaration per event kind, which is at once the schema, the validator and the codec.

Every event is a plain fact in the past tense, a frozen `msgspec.Struct` with the fields every event
has (`EventBase`) and the fields of its kind. The union `Event` is tagged by `kind` (spec section 7),
so a trace file's events decode straight into these types, each field checked against its type and
range as it is read (`ckpt_viz.trace`), and a renderer reads `event.reason`, never a dict.

    ReplayStarted(seq=12, t_ns=..., handle_id=3, mode="reentrant", phase="dx", trigger="backward")
    encodes as {"kind": "replay_started", "seq": 12, "t_ns": ..., "handle_id": 3, ..., "trigger": "backward"}

Events are `gc=False`: they hold no reference cycles, so the cyclic collector never walks the million
events of a long trace. Their containers are tuples, and `tags` a small dict of scalars.
Standard library and msgspec only: never torch, never a UI.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

import msgspec
from msgspec import Meta

from ckpt_viz.vocabulary import HandleMode, Kind, Phase, ReleaseReason, Runtime

__all__ = [
    "EVENT_TYPES",
    "ActionFinished",
    "ActionStarted",
    "BackwardCalled",
    "BackwardEntered",
    "CapturedParam",
    "DwRunnerCalled",
    "EarlyStopped",
    "Error",
    "Event",
    "EventBase",
    "ExcludeReused",
    "ExcludeSaved",
    "ForwardFailed",
    "ForwardFinished",
    "ForwardStarted",
    "GradsRouted",
    "HandleCreated",
    "MemorySampled",
    "NodeCollected",
    "PhaseSet",
    "Prefired",
    "Released",
    "ReplayDiverged",
    "ReplayFailed",
    "ReplayFinished",
    "ReplayRefused",
    "ReplayStarted",
    "SessionActivated",
    "SessionBound",
    "SessionCleared",
    "SessionDeactivated",
    "TensorMeta",
    "TensorPacked",
    "TensorUnpacked",
    "UnaskedGradsAccumulated",
]

# -- ranges shared by the fields (a trace file is checked against them as it is read)
I64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Meta(ge=0, le=2**62)]
Id = Annotated[int, Meta(ge=0, le=2**53)]
Nanos = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Name = Annotated[str, Meta(max_length=1024)]
Text = Annotated[str, Meta(max_length=65536)]
Site = Annotated[str, Meta(max_length=4096)]
Shape = Annotated[tuple[Count, ...], Meta(max_length=64)]
Indices = Annotated[tuple[Count, ...], Meta(max_length=65536)]
Scalar = Annotated[str, Meta(max_length=1024)] | I64 | float | bool | None
Tags = Annotated[dict[Annotated[str, Meta(max_length=64)], Scalar], Meta(max_length=64)]


class TensorMeta(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A tensor as an event describes it."""

    shape: Shape
    dtype: Name
    nbytes: Count
    device: Name = "cpu"
    requires_grad: bool | None = None


class CapturedParam(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A parameter a checkpointed block uses without taking it as an input, after a backward through it."""

    shape: Shape
    accumulated: bool
    name: Name | None = None


class EventBase(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True, tag_field="kind"):
    """The fields every event has.

    Attributes:
        seq: position in its recording, from 0 (assigned by the bus).
        t_ns: monotonic nanoseconds.
        handle_id: the handle or frame it concerns (`h3` on every page), or None.
        mode: the handle's kind of checkpoint, or None.
        phase: the handle's phase when it happened, or None.
        session_id: the recompute session (as given when it is a str, int, float or bool, else its repr).
        tags: user tags open at the time, such as `stage`, `microbatch`, `action`, `rank`.
        site: the user's `file:line`, or None.
        thread_id: the emitting thread.
    """

    kind: ClassVar[Kind]
    seq: Count
    t_ns: Nanos
    handle_id: Id | None = None
    mode: HandleMode | None = None
    phase: Phase | None = None
    session_id: Scalar = None
    tags: Tags = {}
    site: Site | None = None
    thread_id: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0


class HandleCreated(EventBase, tag="handle_created", frozen=True):
    """A reentrant handle or a non-reentrant frame was built (its `site` is the user's checkpoint call)."""

    kind: ClassVar[Kind] = "handle_created"
    function: Name = ""
    label: Name | None = None  # the checkpointed module's qualified name ("model.layers.3"), when known
    runtime: Runtime = "ckpt_viz"
    split: bool = False
    input_count: Count = 0
    param_input_mask: Annotated[tuple[bool, ...], Meta(max_length=65536)] = ()
    collector: Literal["scope", "unified", "none"] = "none"
    preserve_rng_state: bool = True
    early_stop: bool | None = None
    determinism_check: Name | None = None
    inputs: Annotated[tuple[TensorMeta, ...], Meta(max_length=65536)] = ()
    # torch's checkpoint, observed: which front door led to it (NOTE [ Observing torch's checkpoint ])
    via: Literal["checkpoint", "checkpoint_sequential", "transformers", "checkpoint_wrapper"] | None = None


class ForwardStarted(EventBase, tag="forward_started", frozen=True):
    kind: ClassVar[Kind] = "forward_started"
    device_type: Name | None = None
    rng_captured: bool | None = None


class ForwardFinished(EventBase, tag="forward_finished", frozen=True):
    kind: ClassVar[Kind] = "forward_finished"
    outputs: Annotated[tuple[TensorMeta, ...], Meta(max_length=65536)] = ()
    non_differentiable: Indices = ()
    exclude_entries: Count = 0
    saved_count: Count | None = None  # non-reentrant: tensors its forward saved
    graph_nodes: Count | None = None  # non-reentrant: autograd nodes its forward made


class ForwardFailed(EventBase, tag="forward_failed", frozen=True):
    kind: ClassVar[Kind] = "forward_failed"
    type: Name
    message: Text = ""


class TensorPacked(EventBase, tag="tensor_packed", frozen=True):
    """A non-reentrant forward saved a tensor as a holder instead of keeping it."""

    kind: ClassVar[Kind] = "tensor_packed"
    index: Count
    shape: Shape
    dtype: Name
    nbytes: Count
    is_parameter: bool = False


class TensorUnpacked(EventBase, tag="tensor_unpacked", frozen=True):
    """A non-reentrant holder was read back by a backward."""

    kind: ClassVar[Kind] = "tensor_unpacked"
    index: Count
    key_source: Literal["session", "graph_task", "temporary"]
    retain: bool
    consumed: bool
    shape: Shape = ()
    nbytes: Count = 0


class PhaseSet(EventBase, tag="phase_set", frozen=True):
    kind: ClassVar[Kind] = "phase_set"
    old: Phase
    new: Phase
    outer_graph_freed: bool | None = None  # to dw: a backward without retain_graph freed its saved inputs


class BackwardCalled(EventBase, tag="backward_called", frozen=True):
    """The user's code called `torch.autograd.backward` (also through `Tensor.backward` and the split helpers) or
    `torch.autograd.grad` inside a recording: a backward pass starts (its `site` is that call)."""

    kind: ClassVar[Kind] = "backward_called"
    api: Literal["autograd.backward", "autograd.grad"]
    inputs: Count | None = None  # how many tensors it asked gradients for; None: every leaf
    retain_graph: bool | None = None


class BackwardEntered(EventBase, tag="backward_entered", frozen=True):
    kind: ClassVar[Kind] = "backward_entered"
    split: bool = False
    retain_graph: bool = False
    grad_count: Count = 0
    none_grads: Count = 0


class ReplayStarted(EventBase, tag="replay_started", frozen=True):
    kind: ClassVar[Kind] = "replay_started"
    trigger: Literal["prefire", "backward"]
    retain_graph: bool | None = None
    key_source: Literal["session", "graph_task", "temporary"] | None = None
    replay_index: Count = 0


class ReplayFinished(EventBase, tag="replay_finished", frozen=True):
    kind: ClassVar[Kind] = "replay_finished"
    trigger: Literal["prefire", "backward"]
    key_source: Literal["session", "graph_task", "temporary"] | None = None
    saved_count: Count | None = None  # non-reentrant: tensors the recompute saved
    early_stopped: bool | None = None
    ignore_saved_mismatch: bool | None = None


class ReplayFailed(EventBase, tag="replay_failed", frozen=True):
    kind: ClassVar[Kind] = "replay_failed"
    type: Name
    message: Text = ""


class EarlyStopped(EventBase, tag="early_stopped", frozen=True):
    kind: ClassVar[Kind] = "early_stopped"
    saved_count: Count


class ReplayRefused(EventBase, tag="replay_refused", frozen=True):
    """"Released before replay", in either form."""

    kind: ClassVar[Kind] = "replay_refused"
    reason: Literal["released", "node_collected"]
    last_release_reason: ReleaseReason | None = None
    last_release_seq: Count | None = None
    collected_seq: Count | None = None


class GradsRouted(EventBase, tag="grads_routed", frozen=True):
    """Gradients left the checkpoint (`phase` says ordinary, dx or dw); indices are of its tensor inputs."""

    kind: ClassVar[Kind] = "grads_routed"
    targets: Indices = ()
    explicit_params: Indices = ()
    activations: Indices = ()
    discarded_activations: Indices = ()  # DW: activation grads returned but not routed by the engine
    captured: Annotated[tuple[CapturedParam, ...], Meta(max_length=65536)] = ()


class Released(EventBase, tag="released", frozen=True):
    kind: ClassVar[Kind] = "released"
    reason: ReleaseReason
    was_replayed: bool = False
    entries_released: Count = 0
    exclude_cache_size: Count = 0


class NodeCollected(EventBase, tag="node_collected", frozen=True):
    kind: ClassVar[Kind] = "node_collected"
    was_replayed: bool = False
    released: bool = False


class SessionBound(EventBase, tag="session_bound", frozen=True):
    kind: ClassVar[Kind] = "session_bound"
    activation_present: bool = False
    retain: bool = False


class SessionActivated(EventBase, tag="session_activated", frozen=True):
    kind: ClassVar[Kind] = "session_activated"
    retain_on_unpack: bool = False
    handles: Indices = ()


class SessionDeactivated(EventBase, tag="session_deactivated", frozen=True):
    kind: ClassVar[Kind] = "session_deactivated"
    retain_on_unpack: bool = False
    handles: Indices = ()


class SessionCleared(EventBase, tag="session_cleared", frozen=True):
    kind: ClassVar[Kind] = "session_cleared"
    handles: Indices = ()  # reentrant handles it released
    frames: Indices = ()  # non-reentrant frames whose replays it dropped


class Prefired(EventBase, tag="prefired", frozen=True):
    kind: ClassVar[Kind] = "prefired"
    path: Literal["in_session", "temporary_session"]


class ExcludeSaved(EventBase, tag="exclude_saved", frozen=True):
    """An excluded region ran in the original forward and stored its output."""

    kind: ClassVar[Kind] = "exclude_saved"
    wrapper: Name
    wrapper_id: Id
    call_index: Count
    checkpoint_mode: Literal["reentrant", "nonreentrant"]
    save_output: bool = True
    output_tensor_count: Count = 0
    used_inputs: Indices = ()
    boundary_added: bool = False
    cached_nbytes: Count = 0
    saved_nbytes: Count | None = None


class ExcludeReused(EventBase, tag="exclude_reused", frozen=True):
    """An excluded region served its stored output in a replay instead of running."""

    kind: ClassVar[Kind] = "exclude_reused"
    wrapper: Name
    wrapper_id: Id
    call_index: Count
    checkpoint_mode: Literal["reentrant", "nonreentrant"]
    placeholder: bool = False
    materialized_inputs: Count = 0
    bridge: bool = False


class ReplayDiverged(EventBase, tag="replay_diverged", frozen=True):
    """A replay did not reproduce its forward (NOTE [ Replay divergence checks ] in runtime/divergence.py)."""

    kind: ClassVar[Kind] = "replay_diverged"
    divergence: Literal["gradient_lost", "input_mutated", "outputs_differ", "buffers_updated"]
    code: Name
    region: Name = ""
    details: Annotated[tuple[Text, ...], Meta(max_length=64)] = ()
    count: Count = 0
    mutable_inputs: Annotated[tuple[Name, ...], Meta(max_length=64)] = ()  # "past_key_values (DynamicCache)"


class UnaskedGradsAccumulated(EventBase, tag="unasked_grads_accumulated", frozen=True):
    """An unscoped reentrant handle reached by `autograd.grad` / `backward(inputs=...)` accumulated into `.grad` of
    parameters that call did not ask for (NOTE [ Unasked accumulation ] in ckpt_viz/runtime/unasked.py)."""

    kind: ClassVar[Kind] = "unasked_grads_accumulated"
    count: Count
    params: Annotated[tuple[Name | None, ...], Meta(max_length=65536)] = ()  # recorded names, None when unnamed
    shapes: Annotated[tuple[Shape, ...], Meta(max_length=65536)] = ()
    function: Name = ""
    warned: bool = False  # this occurrence raised the UnaskedAccumulationWarning


class DwRunnerCalled(EventBase, tag="dw_runner_called", frozen=True):
    """A pipeline stage ran the weight-gradient work its `dw_builder` deferred (tags: the W or B action)."""

    kind: ClassVar[Kind] = "dw_runner_called"
    stage: Count
    runner: Name = ""


class MemorySampled(EventBase, tag="memory_sampled", frozen=True):
    """A point where memory was read with nothing else happening (a block boundary)."""

    kind: ClassVar[Kind] = "memory_sampled"
    at: Name | None = None


class ActionStarted(EventBase, tag="action_started", frozen=True):
    """A pipeline action (F, DX, DW or B of one stage and micro-batch) began: it carries nothing but its tags
    (`stage`, `microbatch`, `action`, and `rank`, `step` where known). Its box on the schedule timeline starts
    here, so work before the action's first checkpoint event counts as busy (NOTE [ Timeline boxes ] in
    ckpt_viz/analysis/actions.py)."""

    kind: ClassVar[Kind] = "action_started"


class ActionFinished(EventBase, tag="action_finished", frozen=True):
    """The pipeline action of the same tags ended (also when it raised: the error event comes first)."""

    kind: ClassVar[Kind] = "action_finished"


class Error(EventBase, tag="error", frozen=True):
    """An exception left a public API, an engine callback or the `record()` block."""

    kind: ClassVar[Kind] = "error"
    where: Name
    type: Name
    message: Text = ""
    code: Name | None = None  # the diagnosis or error code (ckpt_viz.errors), never read from the message
    retain_graph: bool | None = None


Event = (HandleCreated | ForwardStarted | ForwardFinished | ForwardFailed | TensorPacked | TensorUnpacked |
    PhaseSet | BackwardCalled | BackwardEntered | ReplayStarted | ReplayFinished | ReplayFailed |
    EarlyStopped | ReplayRefused | GradsRouted | Released | NodeCollected | SessionBound | SessionActivated |
    SessionDeactivated | SessionCleared | Prefired | ExcludeSaved | ExcludeReused | ReplayDiverged |
    UnaskedGradsAccumulated | DwRunnerCalled | MemorySampled | ActionStarted | ActionFinished | Error)

EVENT_TYPES: dict[Kind, type[EventBase]] = {cls.kind: cls for cls in get_args(Event)}


def _check_complete() -> None:
    from ckpt_viz.vocabulary import KINDS

    missing = set(KINDS) ^ set(EVENT_TYPES)
    if missing:  # pragma: no cover - a declaration error, caught by every test run
        raise AssertionError(f"ckpt_viz.events: kinds without a type or types without a kind: {sorted(missing)}")


_check_complete()


def fields_of(event: Any) -> dict[str, Any]:
    """The event's own fields (those of its kind, after the common ones), as a plain dict."""
    common = EventBase.__struct_fields__
    return {name: getattr(event, name) for name in event.__struct_fields__ if name not in common}
