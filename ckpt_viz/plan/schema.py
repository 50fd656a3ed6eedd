"""The plan's data, torch-free: the profile of one step, a policy, a prediction.

Owns the typed shapes the planner reads and writes: `PlanProfile` (what
`ckpt_viz.plan.profile` measured; stored in a trace as `meta["plan_profile"]` and checked
on load by ckpt_viz/trace/_codec.py), `Policy` (what to checkpoint and how) and the
results (`Prediction`, `CurvePoint`, `Recommendation`). msgspec and the standard library
only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "KINDS",
    "ROLES",
    "ROLE_INPUT_GRAD",
    "ROLE_OTHER",
    "ROLE_PARAM_GRAD",
    "ROLE_PRIVATE",
    "ROLE_SAVED",
    "SCHEDULES",
    "BlockProfile",
    "CheckpointKind",
    "CurvePoint",
    "OpProfile",
    "PlanProfile",
    "Policy",
    "Prediction",
    "Recommendation",
    "RegionProfile",
    "ReplayCost",
    "StagePeak",
    "check_profile",
    "profile_of",
]

CheckpointKind = Literal["nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant"]
KINDS: tuple[str, ...] = ("nonreentrant", "reentrant", "split-reentrant", "split-nonreentrant")
SCHEDULES: tuple[str, ...] = ("GPipe", "1F1B", "ZB-H1")

# An allocation's role in the profiled step (NOTE [ Plan profile ], rule 3, in ckpt_viz/plan/profile.py).
ROLE_OTHER = 0        # transients, outputs, the loss, gradients in flight
ROLE_PRIVATE = 1      # saved for backward by one block only, made in its forward: checkpointing drops it
ROLE_SAVED = 2        # saved for backward otherwise (by code outside the blocks, or by several)
ROLE_PARAM_GRAD = 3   # became a parameter's .grad
ROLE_INPUT_GRAD = 4   # became a leaf input's .grad
ROLES: tuple[str, ...] = ("other", "private", "saved", "param_grad", "input_grad")

_Count = Annotated[int, Meta(ge=0, le=2**62)]
_Index = Annotated[int, Meta(ge=-1, le=2**40)]
_Bytes = Annotated[int, Meta(ge=-(2**62), le=2**62)]
_Name = Annotated[str, Meta(max_length=1024)]
_Events = Meta(max_length=1 << 26)


class ReplayCost(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What one kind's replay costs beyond the forward it reruns (ckpt_viz/plan/calibrate.py NOTE [ Replay cost ]).

    Attributes:
        fixed_ns: per replay.
        per_tensor_ns: per tensor the replay saves.
        per_region_ns: per excluded region the replay passes (its cache lookup instead of its forward).
    """

    fixed_ns: _Count = 0
    per_tensor_ns: _Count = 0
    per_region_ns: _Count = 0


class OpProfile(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One op of a block's forward (profiled with ops=True).

    Attributes:
        name: the ATen op, e.g. "mm", "_scaled_dot_product_flash_attention".
        out_bytes: bytes of the storages it made.
        saved_bytes: of those, the bytes autograd saved for backward.
        time_ns: its time (inside the dispatch mode).
        flops: its FLOPs where torch.utils.flop_counter has a formula, else None.
    """

    name: _Name
    out_bytes: _Count
    saved_bytes: _Count = 0
    time_ns: _Count = 0
    flops: _Count | None = None
    out_allocs: Annotated[list[_Index], Meta(max_length=4096)] = []


class BlockProfile(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One call of a block in the profiled step; indices are into `PlanProfile.sizes`.

    Attributes:
        name: the block's qualified name (`layers.3`; `layer#1` for a second call).
        f0, f1: its forward's first and one-past-last event.
        w0, w1: its backward's (the gradient of its output arrived; of its input), -1 if not seen.
        last_pack: the event before which its forward saved its last tensor (a non-reentrant
            replay stops there).
        time_ns: its forward's time; time_to_last_pack_ns: up to its last saved tensor.
        backward_time_ns: its backward's time, when both marks were seen.
        input_allocs, input_bytes: its input storages (the allocation event, -1 for one older
            than the step) and their sizes: what a checkpoint keeps.
        output_allocs, output_bytes: its output storages.
        param_bytes: its parameters' bytes.
        flops: its forward's FLOPs (with ops=True).
        ops: its forward's ops (with ops=True).
        saved_count: the tensors its forward saved for backward (a non-reentrant replay's hook runs once each).
        replay_ns: per checkpoint kind, one replay of the block as a recorded run of the model itself measured
            it (`profile_spec(replays=True)`; ckpt_viz/plan/model.py NOTE [ Plan timeline ], rule 8); empty for a
            profile of the user's own loop.
    """

    name: _Name
    f0: _Index
    f1: _Index
    w0: _Index = -1
    w1: _Index = -1
    last_pack: _Index = -1
    time_ns: _Count = 0
    time_to_last_pack_ns: _Count = 0
    backward_time_ns: _Count | None = None
    input_allocs: Annotated[list[_Index], Meta(max_length=4096)] = []
    input_bytes: Annotated[list[_Count], Meta(max_length=4096)] = []
    output_allocs: Annotated[list[_Index], Meta(max_length=4096)] = []
    output_bytes: Annotated[list[_Count], Meta(max_length=4096)] = []
    param_bytes: _Count = 0
    flops: _Count | None = None
    ops: Annotated[list[OpProfile], Meta(max_length=1 << 20)] = []
    saved_count: _Count = 0
    replay_ns: dict[CheckpointKind, _Count] = {}


class RegionProfile(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An excluded-region candidate's call: a submodule of block call `block`.

    Attributes:
        fixed: the model already wraps it (`checkpoint_exclude_wrapper`): excluded in every policy.
        saved_allocs, input_allocs, output_allocs: what its forward saved, read and made.
        saved_count: the tensors its forward saved (a replay does not save them again).
    """

    name: _Name
    block: _Count
    f0: _Index
    f1: _Index
    time_ns: _Count = 0
    output_allocs: Annotated[list[_Index], Meta(max_length=4096)] = []
    input_allocs: Annotated[list[_Index], Meta(max_length=4096)] = []
    saved_allocs: Annotated[list[_Index], Meta(max_length=1 << 20)] = []
    fixed: bool = False
    saved_count: _Count = 0


class PlanProfile(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the planner needs from one step without checkpointing (see ckpt_viz/plan/profile.py).

    Attributes:
        label: the model's name.
        sizes: the allocator's record of the step: bytes per allocation (>0) or free (<0), in order.
        free_of: per allocation, the index of the event that frees it (-1: alive at the end; a
            free's own entry is -1).
        role: per event, its ROLE_* (allocations only).
        owner: per allocation of role ROLE_PRIVATE, the index of the block call that saved it.
        blocks: the block calls in forward order.
        regions: excluded-region candidates' calls.
        backward_start: the event index where the first backward call began.
        end: the number of events in the step.
        base: bytes that existed before the step, by category (parameters, gradients, other).
        step_time_ns: the step's time (`profile_spec`: the fastest of its timed steps and the profiled one).
        suspended: checkpoints the profile suspended (NOTE [ Plan profile ], rule 1).
        ops_timed: block times were measured with the per-op recorder on (inflated).
        rng_state_bytes: the CPU RNG state a checkpoint keeps (preserve_rng_state).
        microbatches: for a pipeline profile, the number of micro-batches the batch was split
            into (the profile is of one); 0 otherwise.
        stage_calls: for a pipeline profile, each stage's call (its forward and backward marks;
            `output_allocs` its output storages, `input_allocs` the gradient of its input, the one
            it sends to the stage before).
        dx_targets: the step's inputs include a leaf that requires grad, so a split step's DX has
            something to differentiate (without one, DX does nothing and DW is the whole backward).
        replay_costs: per checkpoint kind, what a replay costs beyond its forward on the machine that
            made the profile (ckpt_viz/plan/calibrate.py NOTE [ Replay cost ]); empty: not calibrated,
            the recompute is the forward alone.
    """

    sizes: Annotated[list[_Bytes], _Events]
    free_of: Annotated[list[_Index], _Events]
    role: Annotated[list[Annotated[int, Meta(ge=0, le=4)]], _Events]
    owner: Annotated[list[_Index], _Events]
    blocks: Annotated[list[BlockProfile], Meta(max_length=1 << 16)]
    backward_start: _Index
    end: _Count
    base: dict[Annotated[str, Meta(max_length=64)], _Count]
    label: _Name = ""
    regions: Annotated[list[RegionProfile], Meta(max_length=1 << 16)] = []
    step_time_ns: _Count = 0
    suspended: Annotated[list[_Name], Meta(max_length=4096)] = []
    ops_timed: bool = False
    rng_state_bytes: _Count = 0
    microbatches: _Count = 0
    stage_calls: Annotated[list[BlockProfile], Meta(max_length=4096)] = []
    dx_targets: bool = True
    replay_costs: dict[CheckpointKind, ReplayCost] = {}


@dataclass(frozen=True)
class Policy:
    """What to checkpoint, and how.

    Attributes:
        blocks: names of the checkpointed blocks (block calls' names from the profile).
        kind: "nonreentrant", "reentrant", or a split kind ("split-reentrant",
            "split-nonreentrant": DX replays each checkpoint and keeps the replay until DW).
        exclude: names of excluded regions (submodules of checkpointed blocks whose outputs are
            kept from the forward, never recomputed).
        save_ops: ATen op names whose outputs a checkpointed block keeps (torch's selective
            checkpoint: `create_selective_checkpoint_contexts` with MUST_SAVE for these).
        schedule, microbatches: for a pipeline profile, the schedule and micro-batch count.
    """

    blocks: frozenset[str] = frozenset()
    kind: CheckpointKind = "nonreentrant"
    exclude: frozenset[str] = frozenset()
    save_ops: frozenset[str] = frozenset()
    schedule: str | None = None
    microbatches: int | None = None


@dataclass(frozen=True)
class StagePeak:
    """A pipeline stage's predicted peak."""

    stage: int
    peak: int
    by_category: dict[str, int]


@dataclass(frozen=True)
class Prediction:
    """A policy's predicted step.

    Attributes:
        policy: the policy.
        peak: the step's peak live bytes (the base included).
        by_category: those bytes by memory category at the peak.
        where: where in the step the peak falls, in words ("backward of layers.3").
        recompute_ns: the recompute's predicted time.
        recompute_flops: its FLOPs where the profile has them, else None.
        step_ns: the profiled step's time plus the recompute.
        stages: per pipeline stage, its peak (pipeline profiles only).
    """

    policy: Policy
    peak: int
    by_category: dict[str, int]
    where: str
    recompute_ns: int
    recompute_flops: int | None
    step_ns: int
    stages: tuple[StagePeak, ...] = ()


@dataclass(frozen=True)
class CurvePoint:
    """One point of the trade-off curve: the least recompute at this peak."""

    peak: int
    recompute_ns: int
    blocks: frozenset[str]
    save_ops: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Recommendation:
    """The policy with the least recompute under a budget, with the curve it was chosen from.

    Attributes:
        budget: the memory budget in bytes.
        prediction: the chosen policy's prediction, or None if no policy meets the budget.
        curve: every Pareto-optimal point (peak ascending).
        method: how it was found ("exhaustive over 2^n subsets", "scipy.optimize.milp").
        words: the plan in one sentence for people.
        floor: the lowest peak any policy reaches.
        baseline: the prediction with nothing checkpointed (the profiled step).
    """

    budget: int
    prediction: Prediction | None
    curve: tuple[CurvePoint, ...]
    method: str
    words: str
    floor: int
    baseline: Prediction | None = None


def profile_of(trace: object) -> PlanProfile:
    """The `PlanProfile` stored in a trace's meta (`ckpt_viz.plan.attach`), checked against its schema.

    Raises:
        CkptVizError: the trace holds no profile, or one that does not match the schema.
    """
    from ckpt_viz.errors import CkptVizError

    meta = getattr(trace, "meta", None)
    raw = meta.get("plan_profile") if isinstance(meta, dict) else None
    if raw is None:
        raise CkptVizError("ckpt_viz.plan: this trace holds no plan profile (meta['plan_profile']).\nTip: record "
                           "one step inside `with ckpt_viz.plan.profiling(model) as prof:` and call "
                           "ckpt_viz.plan.attach(trace, prof.profile), or `ckpt-viz plan` a built-in model's trace.")
    if isinstance(raw, PlanProfile):
        profile = raw
    else:
        try:
            profile = msgspec.convert(raw, PlanProfile)
        except msgspec.ValidationError as err:
            raise CkptVizError(f"ckpt_viz.plan: the trace's plan profile does not match its schema ({err}).\n"
                               "Tip: profile the step again with this version of ckpt_viz.") from None
    check_profile(profile)
    return profile


def check_profile(profile: PlanProfile, api: str = "ckpt_viz.plan") -> None:
    """What the schema's types cannot say: equal column lengths, indices inside the step, marks in order.

    Raises:
        CkptVizError: naming the first field that is out of place.
    """
    from ckpt_viz.errors import CkptVizError

    n = len(profile.sizes)

    def bad(what: str) -> CkptVizError:
        return CkptVizError(f"{api}: the plan profile is inconsistent: {what}.\nTip: the profile was changed after "
                            "it was made; profile the step again.")

    for name in ("free_of", "role", "owner"):
        if len(getattr(profile, name)) != n:
            raise bad(f"{name} has {len(getattr(profile, name))} entries for {n} events")
    if not 0 <= profile.backward_start <= profile.end == n:
        raise bad(f"backward_start {profile.backward_start} and end {profile.end} do not fit {n} events")
    for a, f in enumerate(profile.free_of):
        if f != -1 and not (a < f < n and profile.sizes[a] > 0 and profile.sizes[f] < 0):
            raise bad(f"free_of[{a}] is {f}")
    for a, o in enumerate(profile.owner):
        if o != -1 and not (0 <= o < len(profile.blocks)):
            raise bad(f"owner[{a}] is {o} with {len(profile.blocks)} blocks")
    for i, b in enumerate(profile.blocks):
        marks = [b.f0, b.f1] + [m for m in (b.w0, b.w1, b.last_pack) if m != -1]
        if not (0 <= b.f0 <= b.f1 <= n) or any(not 0 <= m <= n for m in marks):
            raise bad(f"blocks[{i}] ({b.name!r}) has marks outside the step")
        if any(not -1 <= a < n for a in (*b.input_allocs, *b.output_allocs)):
            raise bad(f"blocks[{i}] ({b.name!r}) names an allocation outside the step")
        for op in b.ops:
            if any(not -1 <= a < n for a in op.out_allocs):
                raise bad(f"blocks[{i}] ({b.name!r}) has an op naming an allocation outside the step")
    for i, r in enumerate(profile.regions):
        if not (0 <= r.f0 <= r.f1 <= n) or r.block >= len(profile.blocks) or any(
                not -1 <= a < n for a in (*r.output_allocs, *r.input_allocs, *r.saved_allocs)):
            raise bad(f"regions[{i}] ({r.name!r}) is outside the step or its blocks")
