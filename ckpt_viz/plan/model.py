"""What a policy's step would peak at, and what its recompute would cost, from one profiled step.

Owns `predict` and the timeline model the search (ckpt_viz/plan/search.py) optimises over.
Torch-free: it reads a `PlanProfile` (ckpt_viz/plan/schema.py) only.

NOTE [ Plan timeline ]
  1. The profiled step (no checkpointing) is the allocator's list of allocations and frees. A
     policy's step is built from it window by window: the forward of each block, the code between
     blocks, the tail (head, loss, the first backward nodes), the backward of each block, the rest.
     Each window has one event list per choice of the block it belongs to (checkpointed or not);
     windows outside blocks have one. So the step's live bytes at any point are
         base + sum over earlier windows w' of net(w', x[own(w')]) + running sum inside w,
     and the peak is the maximum over windows of (that level at the window's start + the
     window's own rise). Both are linear in the 0/1 choices x: the search solves over exactly
     this model (an exhaustive enumeration, or a MILP), and `predict` walks the same lists.
  2. A checkpointed block's forward: the tensors only it saved ("private", profile.py NOTE rule 3)
     are freed right after the next allocation (the op that reads them) instead of at its
     backward; its inputs that its backward did not already keep are kept until its backward
     ends; the CPU RNG state is kept (preserve_rng_state).
  3. Its backward starts with the replay: the events of its forward again (a non-reentrant replay
     stops after the last saved tensor, torch's and ours early stop; a reentrant one runs the
     whole forward and keeps the replay's outputs until its inner backward ends), with the
     private tensors kept until the backward frees them as in the profile; then the profiled
     backward's own events.
  4. Split kinds (DX then DW for the whole step, the runtime's backward_input/backward_weight):
     DX is every backward window again without freeing saved tensors (retain_graph) and without
     parameter gradients; each checkpointed block replays at the start of its DX window and keeps
     the replay until its DW window frees it. DW is the profiled backward (parameter gradients,
     frees), without a leaf input's gradient (DW asks for parameters only), and the input
     gradients DX returned are dropped when DX ends.
  5. Excluded regions keep their forward's saved tensors and outputs from the forward until the
     replay takes the outputs from their cache (a reentrant region's tape also holds the replay's
     copy of its inputs until the tape is freed, and its RNG state); ops in `save_ops` (selective
     checkpointing) keep their outputs the same way and the replay takes them from torch's cache.
     Both take their time off the recompute. Every replay also holds the RNG state it replaces
     while it runs.
  6. Where a private tensor's profiled free is not inside its block's backward (retain_graph, a
     graph kept by a reference), the model treats it as saved by others: checkpointing the block
     does not drop it, so the prediction stays on the safe side.
  7. Lifetimes the runtime sets: a reentrant handle keeps its RNG state until the backward of the step
     ends (the handle outlives its node); a split non-reentrant step replays in a recompute session
     that keeps each frame (its inputs, its RNG state) until DW ends. A split step whose inputs need
     no grad (token ids) has nothing for DX to do: DW is then the whole backward with the replays,
     as in the plain kinds. Each of these was measured against the allocator (tests/plan).
  8. Recompute time: a block's replay reruns its forward (up to its last saved tensor for the
     non-reentrant kinds, which stop early), less the excluded regions and kept ops it takes from
     caches, plus the runtime's own work for the replay: a fixed part, a part per tensor it saves
     again and one per excluded region it passes, per kind, measured on the profile's machine
     (ckpt_viz/plan/calibrate.py NOTE [ Replay cost ]; none when the profile has no
     `replay_costs`). The figures are those of ckpt_viz's runtime; torch's checkpoint has its own.
     Where the profile measured the block's replay in a recorded run of the model itself (`profile_spec`
     does, per kind: `BlockProfile.replay_ns`), that figure is the replay, and the formula only moves it
     by what the policy changes (its excluded regions and kept ops): measured + formula(policy) -
     formula(no policy). The formula alone predicted every kind low (a replay inside a backward runs
     slower than the same forward in a plain step: benchmarks/README.md, bench_plan).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan.schema import (
    KINDS,
    ROLE_INPUT_GRAD,
    ROLE_PARAM_GRAD,
    ROLE_PRIVATE,
    ROLE_SAVED,
    BlockProfile,
    PlanProfile,
    Policy,
    Prediction,
    ReplayCost,
    check_profile,
)

__all__ = ["CATEGORIES", "Timeline", "Window", "build_timeline", "choices", "forget_timelines", "peak_of", "predict",
           "predict_pipeline", "timeline"]

_API = "ckpt_viz.plan.predict"
CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "activations", "checkpoint_inputs", "replay_activations",
                               "excluded_outputs", "other")
_GRAD, _ACT, _CKIN, _REPLAY, _EXCL, _OTHER = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Window:
    """One window of the step (NOTE [ Plan timeline ], rule 1).

    Attributes:
        name: where it is, in words ("forward of layers.3").
        own: the block index whose choice picks the event list, or -1.
        events: per choice (0: not checkpointed, 1: checkpointed), (sizes, categories) arrays.
        net: per choice, the window's net bytes; rise: per choice, its highest running sum (>= 0).
    """

    name: str
    own: int
    events: tuple[tuple[np.ndarray, np.ndarray], ...]
    net: tuple[int, ...]
    rise: tuple[int, ...]


@dataclass(frozen=True)
class Timeline:
    """A profile's windows for one checkpoint kind, with the per-block recompute cost."""

    kind: str
    blocks: tuple[str, ...]
    windows: tuple[Window, ...]
    base: int
    base_by_category: dict[str, int]
    recompute_ns: tuple[int, ...]
    recompute_flops: tuple[int | None, ...]
    step_ns: int


def _window(name: str, own: int, lists: Sequence[list[tuple[int, int]]]) -> Window:
    events, nets, rises = [], [], []
    for items in lists:
        sizes = np.fromiter((s for s, _ in items), dtype=np.int64, count=len(items))
        cats = np.fromiter((c for _, c in items), dtype=np.int8, count=len(items))
        run = np.cumsum(sizes) if len(sizes) else np.zeros(0, dtype=np.int64)
        events.append((sizes, cats))
        nets.append(int(run[-1]) if len(run) else 0)
        rises.append(max(0, int(run.max())) if len(run) else 0)
    return Window(name, own, tuple(events), tuple(nets), tuple(rises))


class _Step:
    """The profile's events with what the windows need: categories, frees by allocation, intervals."""

    def __init__(self, profile: PlanProfile, kind: str, exclude: frozenset[str], save_ops: frozenset[str]) -> None:
        self.p = profile
        sizes, role, free_of = profile.sizes, profile.role, profile.free_of
        n = len(sizes)
        self.n = n
        alloc_of = [-1] * n
        for a, f in enumerate(free_of):
            if f >= 0:
                alloc_of[f] = a
        self.alloc_of = alloc_of
        blocks = profile.blocks
        self.private: list[list[int]] = [[] for _ in blocks]
        owner = list(profile.owner)
        role = list(role)
        for a in range(n):
            if role[a] == ROLE_PRIVATE and owner[a] >= 0:
                b = blocks[owner[a]]
                if not (b.w0 >= 0 and b.w0 <= free_of[a] < (b.w1 if b.w1 >= 0 else profile.end)):
                    role[a] = ROLE_SAVED  # NOTE rule 6
                else:
                    self.private[owner[a]].append(a)
        self.role = role
        cat = [_OTHER] * n
        for a in range(n):
            r = role[a]
            if r in (ROLE_PRIVATE, ROLE_SAVED):
                cat[a] = _ACT
            elif r == ROLE_PARAM_GRAD:
                cat[a] = _GRAD
        for f in range(n):
            if sizes[f] < 0 and alloc_of[f] >= 0:
                cat[f] = cat[alloc_of[f]]
        self.cat = cat
        # kept from forward in a checkpointed block (NOTE rule 5): excluded regions' and saved ops' allocations
        self.kept: list[set[int]] = [set() for _ in blocks]
        self.skipped: list[list[tuple[int, int]]] = [[] for _ in blocks]  # ranges a replay does not run
        self.kept_ns = [0] * len(blocks)
        reentrant = kind in ("reentrant", "split-reentrant")
        self.reentrant_plain = kind == "reentrant"
        # NOTE rule 7: a reentrant handle keeps its RNG state until the step's backward ends; a split
        # non-reentrant step's session keeps its frames (inputs, RNG state) until DW ends
        self.rng_to_end = kind != "nonreentrant"
        self.session = kind == "split-nonreentrant"
        self.region_saved = [0] * len(blocks)  # tensors the excluded regions saved: a replay does not save them
        for r in profile.regions:
            if r.name in exclude and r.block < len(blocks):
                self.skipped[r.block].append((r.f0, r.f1))
                self.kept_ns[r.block] += r.time_ns
                self.region_saved[r.block] += r.saved_count
                keep = set(r.saved_allocs) if reentrant else set(r.saved_allocs) - set(r.input_allocs)
                keep |= set(r.output_allocs)
                self.kept[r.block] |= {a for a in keep if 0 <= a < n and sizes[a] > 0}
        self.sac_outputs: list[set[int]] = [set() for _ in blocks]
        if save_ops:
            for i, b in enumerate(blocks):
                total = sum(o.time_ns for o in b.ops) or 1
                for o in b.ops:
                    if o.name in save_ops:
                        self.kept_ns[i] += int(b.time_ns * o.time_ns / total)
                        self.kept[i] |= {a for a in o.out_allocs if 0 <= a < n and sizes[a] > 0}
                        self.sac_outputs[i] |= {a for a in o.out_allocs if 0 <= a < n and sizes[a] > 0}
        # what a checkpointed block holds from its forward to its backward's end beyond the profile:
        # kept allocations the profiled step freed before that block's backward began
        self.held = [0] * len(blocks)
        self.region_rng = [0] * len(blocks)  # each excluded region's call keeps the RNG state after it
        for r in profile.regions:
            if r.name in exclude and r.block < len(blocks):
                self.region_rng[r.block] += profile.rng_state_bytes
        for i, b in enumerate(blocks):
            start = b.w0 if b.w0 >= 0 else profile.end
            for a in self.kept[i]:
                cat[a] = _EXCL
                if free_of[a] < start:
                    self.held[i] += sizes[a]
        for f in range(n):
            if sizes[f] < 0 and alloc_of[f] >= 0:
                cat[f] = cat[alloc_of[f]]

    def span(self, lo: int, hi: int, *, drop: set[int] | None = None) -> list[tuple[int, int]]:
        sizes, cat = self.p.sizes, self.cat
        if drop:
            return [(sizes[i], cat[i]) for i in range(lo, hi) if i not in drop]
        return [(sizes[i], cat[i]) for i in range(lo, hi)]


def _intervals(profile: PlanProfile) -> list[tuple[int, int, int]]:
    """The backward part of the step as (lo, hi, owner block or -1) intervals, in order."""
    end = profile.end
    start = profile.backward_start
    blocks = profile.blocks
    cuts = {start, end}
    spans = []
    for i, b in enumerate(blocks):
        if b.w0 >= start:
            w1 = b.w1 if b.w1 >= b.w0 else -1
            spans.append((b.w0, w1, i))
            cuts.add(b.w0)
            if w1 >= 0:
                cuts.add(w1)
    points = sorted(c for c in cuts if start <= c <= end)
    # a block without an input-gradient mark ends at the next cut after its start
    ends = {}
    for w0, w1, i in spans:
        ends[i] = w1 if w1 >= 0 else next((c for c in points if c > w0), end)
    out = []
    for lo, hi in itertools.pairwise(points):
        owner = -1
        width = None
        for w0, _, i in spans:
            if w0 <= lo and hi <= ends[i] and (width is None or ends[i] - w0 < width):
                owner, width = i, ends[i] - w0
        out.append((lo, hi, owner))
    return out


def _forward_dropped(step: _Step, b: int) -> list[tuple[int, int]]:
    """NOTE rule 2: block b's forward with its private tensors freed right after the next allocation."""
    p = step.p
    blk = p.blocks[b]
    sizes, cat = p.sizes, step.cat
    private = {a for a in step.private[b] if a not in step.kept[b]}
    out: list[tuple[int, int]] = []
    pending: list[int] = []
    for i in range(blk.f0, blk.f1):
        out.append((sizes[i], cat[i]))
        if sizes[i] > 0:
            for a in pending:
                out.append((-sizes[a], cat[a]))
            pending = []
        if i in private:
            pending.append(i)
    for a in pending:
        out.append((-sizes[a], cat[a]))
    return out


def _kept_inputs(step: _Step, b: int) -> int:
    """Bytes of block b's inputs that a checkpoint keeps and the profiled step freed before b's backward ended."""
    p = step.p
    blk = p.blocks[b]
    start = blk.w0 if blk.w0 >= 0 else p.end
    total = 0
    for a, nbytes in zip(blk.input_allocs, blk.input_bytes):
        if a >= 0 and 0 <= p.free_of[a] < start:
            total += nbytes
    return total


def _replay(step: _Step, b: int, *, early_stop: bool, keep_outputs: bool, release_held: bool,
            tape_until_end: bool, release_rng: bool) -> tuple[list[tuple[int, int]], int]:
    """NOTE rule 3: block b's replay events, and the bytes it leaves held (its outputs when kept)."""
    p = step.p
    blk = p.blocks[b]
    sizes, free_of = p.sizes, p.free_of
    hi = blk.last_pack if early_stop and blk.f0 <= blk.last_pack <= blk.f1 else blk.f1
    private = set(step.private[b])
    outputs = {a for a in blk.output_allocs if a >= 0}
    skipped = step.skipped[b]
    kept = step.kept[b]
    out: list[tuple[int, int]] = [(p.rng_state_bytes, _OTHER)]  # the replay keeps the RNG state it replaces
    garbage = 0
    held = 0
    for i in range(blk.f0, hi):
        if any(lo <= i < up for lo, up in skipped):
            continue
        size = sizes[i]
        if i in step.sac_outputs[b] or (size < 0 and step.alloc_of[i] in step.sac_outputs[b]):
            continue  # a kept op's output: the replay takes it from the cache (NOTE rule 5)
        if i in kept:  # kept from the forward, yet outside the region: the replay makes it again and the
            if size > 0:  # region's tape holds the new one until it is freed with the original (NOTE rule 5)
                out.append((size, _REPLAY))
                if tape_until_end:
                    held += size
            continue
        if size > 0:
            if i in private:
                out.append((size, _REPLAY))
            else:
                out.append((size, _OTHER))
                f = free_of[i]
                if not (0 <= f < hi):
                    if keep_outputs and i in outputs:
                        held += size
                    else:
                        garbage += size
        else:
            a = step.alloc_of[i]
            if a >= blk.f0 and a not in private and a not in kept and not any(lo <= a < up for lo, up in skipped):
                out.append((size, _OTHER))
    if garbage:
        out.append((-garbage, _OTHER))
    if release_held:  # the replay takes the excluded regions' outputs out of their cache (NOTE rule 5)
        out.append((-step.held[b], _EXCL))
    if release_rng:
        out.append((-step.region_rng[b], _OTHER))
    out.append((-p.rng_state_bytes, _OTHER))
    return out, held


def _release(step: _Step, b: int, outputs: int, inputs: int, rng: int, held: bool) -> list[tuple[int, int]]:
    """What a checkpointed block frees when its backward ends: a kept replay output, its kept inputs, what its
    excluded regions and saved ops held (when the replay did not take it), the RNG state."""
    rngs = (0 if step.rng_to_end else rng) + (step.region_rng[b] if held or step.reentrant_plain else 0)
    kept_inputs = 0 if step.session else inputs
    return [(-outputs, _OTHER), (-kept_inputs, _CKIN), (-step.held[b] if held else 0, _EXCL), (-rngs, _OTHER)]


def _backward_events(step: _Step, lo: int, hi: int, b: int, *, replayed: bool) -> list[tuple[int, int]]:
    sizes, cat = step.p.sizes, step.cat
    if not replayed:
        return [(sizes[i], cat[i]) for i in range(lo, hi)]
    private = set(step.private[b])
    copied = step.kept[b] if step.reentrant_plain else set()  # NOTE rule 5: a tape's copy goes with the original
    retained = set(step.p.blocks[b].input_allocs) if step.session else set()  # NOTE rule 7
    out = []
    for i in range(lo, hi):
        a = step.alloc_of[i]
        if a in retained and sizes[i] < 0:
            continue
        out.append((sizes[i], _REPLAY if a in private and sizes[i] < 0 else cat[i]))
        if a in copied and sizes[i] < 0 and not any(r0 <= a < r1 for r0, r1 in step.skipped[b]):
            out.append((sizes[i], _REPLAY))
    return out


def _dx_events(step: _Step, lo: int, hi: int) -> list[tuple[int, int]]:
    """NOTE rule 4: a backward window in DX: no frees of saved tensors, no parameter gradients."""
    sizes, role, cat, alloc_of = step.p.sizes, step.role, step.cat, step.alloc_of
    out = []
    for i in range(lo, hi):
        size = sizes[i]
        if size > 0:
            if role[i] == ROLE_PARAM_GRAD:
                continue
        else:
            a = alloc_of[i]
            if a >= 0 and role[a] in (ROLE_PRIVATE, ROLE_SAVED, ROLE_PARAM_GRAD):
                continue
        out.append((size, cat[i]))
    return out


def _dw_events(step: _Step, lo: int, hi: int, b: int, *, replayed: bool) -> list[tuple[int, int]]:
    """NOTE rule 4: a backward window in DW: as profiled, without leaf input gradients."""
    sizes, role, alloc_of = step.p.sizes, step.role, step.alloc_of
    events = _backward_events(step, lo, hi, b, replayed=replayed)
    return [e for i, e in zip(range(lo, hi), events)
            if not (role[i] == ROLE_INPUT_GRAD or (sizes[i] < 0 and alloc_of[i] >= 0 and role[alloc_of[i]]
                                                     == ROLE_INPUT_GRAD))]


def _input_grads_in_dx(step: _Step, intervals: list[tuple[int, int, int]]) -> int:
    sizes, role = step.p.sizes, step.role
    return sum(sizes[i] for lo, hi, _ in intervals for i in range(lo, hi)
               if sizes[i] > 0 and role[i] == ROLE_INPUT_GRAD)


def build_timeline(profile: PlanProfile, kind: str, exclude: frozenset[str] = frozenset(),
                   save_ops: frozenset[str] = frozenset()) -> Timeline:
    """The windows of NOTE [ Plan timeline ] for `kind` (cached per profile object: `timeline`)."""
    if kind not in KINDS:
        raise CkptVizError(f"{_API}: unknown checkpoint kind {kind!r}; expected one of "
                           f"{', '.join(repr(k) for k in KINDS)}.\nTip: 'nonreentrant' is torch's default.")
    check_profile(profile, _API)
    fixed = frozenset(r.name for r in profile.regions if r.fixed)  # the model's own regions
    exclude = frozenset(exclude) | fixed
    step = _Step(profile, kind, exclude, save_ops)
    p = profile
    blocks = p.blocks
    split = kind.startswith("split") and p.dx_targets
    reentrant = kind.endswith("-reentrant") or kind == "reentrant"
    windows: list[Window] = []
    rng = p.rng_state_bytes
    held_after: dict[int, int] = {}  # per block: bytes a checkpoint holds from its forward to its backward's end
    cursor = 0
    for b, blk in enumerate(blocks):
        if blk.f0 > cursor:
            windows.append(_window(f"forward before {blk.name}", -1, [step.span(cursor, blk.f0)]))
        kept = _kept_inputs(step, b)
        held_after[b] = kept
        dropped = [*_forward_dropped(step, b), (kept, _CKIN), (step.held[b], _EXCL),
                   (rng + step.region_rng[b], _OTHER)]
        windows.append(_window(f"forward of {blk.name}", b, [step.span(blk.f0, blk.f1), dropped]))
        cursor = max(cursor, blk.f1)
    if p.backward_start > cursor:
        windows.append(_window("forward after the blocks (head, loss)", -1, [step.span(cursor, p.backward_start)]))
    intervals = _intervals(p)
    replays = {}
    for b in range(len(blocks)):
        events, held = _replay(step, b, early_stop=not reentrant, keep_outputs=reentrant,
                               release_held=kind != "split-reentrant", tape_until_end=kind == "split-reentrant",
                               release_rng=not reentrant)
        replays[b] = (events, held)
    first_in = {}
    last_in = {}
    for k, (_, _, owner) in enumerate(intervals):
        if owner >= 0:
            first_in.setdefault(owner, k)
            last_in[owner] = k

    def label(lo: int, owner: int, phase: str) -> str:
        if owner >= 0:
            return f"{phase} of {blocks[owner].name}"
        return f"{phase} outside the blocks" if lo > p.backward_start else f"{phase} of the head and loss"

    if not split:
        for k, (lo, hi, owner) in enumerate(intervals):
            if owner < 0:
                windows.append(_window(label(lo, owner, "backward"), -1, [step.span(lo, hi)]))
                continue
            plain = step.span(lo, hi)
            ck = _backward_events(step, lo, hi, owner, replayed=True)
            if k == first_in[owner]:
                events, _ = replays[owner]
                ck = events + ck
            if k == last_in[owner]:
                ck = ck + _release(step, owner, replays[owner][1], held_after[owner], rng, kind == "split-reentrant")
            windows.append(_window(label(lo, owner, "backward"), owner, [plain, ck]))
    else:
        dx_grads = _input_grads_in_dx(step, intervals)
        for k, (lo, hi, owner) in enumerate(intervals):
            plain = _dx_events(step, lo, hi)
            if owner < 0:
                windows.append(_window(label(lo, owner, "DX"), -1, [plain]))
                continue
            ck = list(plain)
            if k == first_in[owner]:
                ck = replays[owner][0] + ck
            windows.append(_window(label(lo, owner, "DX"), owner, [plain, ck]))
        if dx_grads:
            windows.append(_window("end of DX (input gradients returned)", -1, [[(-dx_grads, _OTHER)]]))
        for k, (lo, hi, owner) in enumerate(intervals):
            if owner < 0:
                windows.append(_window(label(lo, owner, "DW"), -1, [_dw_events(step, lo, hi, -1, replayed=False)]))
                continue
            plain = _dw_events(step, lo, hi, owner, replayed=False)
            ck = _dw_events(step, lo, hi, owner, replayed=True)
            if k == last_in[owner]:
                ck = ck + _release(step, owner, replays[owner][1], held_after[owner], rng, kind == "split-reentrant")
            windows.append(_window(label(lo, owner, "DW"), owner, [plain, ck]))
    if p.end > (intervals[-1][1] if intervals else p.backward_start):
        lo = intervals[-1][1] if intervals else p.backward_start
        windows.append(_window("after the backward", -1, [step.span(lo, p.end)]))
    base_by = {"parameters": p.base.get("parameters", 0), "gradients": p.base.get("gradients", 0),
               "other": p.base.get("other", 0)}
    cost = p.replay_costs.get(kind)
    recompute = [_replay_ns(step, b, blk, cost, early_stop=not reentrant) for b, blk in enumerate(blocks)]
    flops = [blk.flops for blk in blocks]
    if any(kind in blk.replay_ns for blk in blocks):  # NOTE rule 8: the replay measured in the model itself
        plain = recompute
        if exclude != fixed or save_ops:
            default = _Step(profile, kind, fixed, frozenset())
            plain = [_replay_ns(default, b, blk, cost, early_stop=not reentrant) for b, blk in enumerate(blocks)]
        recompute = [max(0, blk.replay_ns[kind] + r - r0) if kind in blk.replay_ns else r
                     for blk, r, r0 in zip(blocks, recompute, plain)]
    return Timeline(kind=kind, blocks=tuple(b.name for b in blocks), windows=tuple(windows),
                    base=sum(base_by.values()), base_by_category=base_by, recompute_ns=tuple(recompute),
                    recompute_flops=tuple(flops), step_ns=p.step_time_ns)


def _replay_ns(step: _Step, b: int, blk: BlockProfile, cost: ReplayCost | None, *, early_stop: bool) -> int:
    """NOTE rule 8: block b's replay time: the forward it reruns, less what it takes from caches, and the
    runtime's own work for it (ckpt_viz/plan/calibrate.py NOTE [ Replay cost ])."""
    forward = blk.time_to_last_pack_ns if early_stop and blk.time_to_last_pack_ns else blk.time_ns
    ns = max(0, forward - step.kept_ns[b])
    if cost is not None:
        tensors = max(0, blk.saved_count - step.region_saved[b])
        ns += cost.fixed_ns + cost.per_tensor_ns * tensors + cost.per_region_ns * len(step.skipped[b])
    return ns


@lru_cache(maxsize=64)
def _cached(key: int, kind: str, exclude: frozenset[str], save_ops: frozenset[str]) -> Timeline:
    return build_timeline(_PROFILES[key], kind, exclude, save_ops)


_PROFILES: dict[int, PlanProfile] = {}


def timeline(profile: PlanProfile, kind: str, exclude: Iterable[str] = (), save_ops: Iterable[str] = ()) -> Timeline:
    """`build_timeline`, cached for the profile object (a profile is not changed once made)."""
    key = id(profile)
    if _PROFILES.get(key) is not profile:
        if len(_PROFILES) > 32:
            _PROFILES.clear()
            _cached.cache_clear()
        _PROFILES[key] = profile
    return _cached(key, kind, frozenset(exclude), frozenset(save_ops))


def forget_timelines() -> None:
    """Drop the cached timelines (`timeline`): the next call builds its timeline afresh (benchmarks)."""
    _PROFILES.clear()
    _cached.cache_clear()


def choices(line: Timeline, blocks: Iterable[str]) -> np.ndarray:
    """The 0/1 vector of `blocks` over the timeline's blocks."""
    names = set(blocks)
    unknown = names - set(line.blocks)
    if unknown:
        raise CkptVizError(f"{_API}: the profile has no block {sorted(unknown)[0]!r}; its blocks are "
                           f"{', '.join(line.blocks[:8])}{' ...' if len(line.blocks) > 8 else ''}.\nTip: use the "
                           "names the profile lists (`ckpt-viz plan TRACE` prints them).")
    return np.array([1 if name in names else 0 for name in line.blocks], dtype=np.int8)


def peak_of(line: Timeline, x: np.ndarray) -> tuple[int, int]:
    """(peak bytes, index of the window it falls in) for the 0/1 choices `x` (NOTE rule 1)."""
    level = line.base
    best, where = level, 0
    for k, w in enumerate(line.windows):
        c = int(x[w.own]) if w.own >= 0 else 0
        top = level + w.rise[c]
        if top > best:
            best, where = top, k
        level += w.net[c]
    return best, where


def predict(profile: PlanProfile, policy: Policy) -> Prediction:
    """Predict `policy`'s step from `profile`: its peak by category, where it falls, and its recompute.

    Args:
        profile: what `ckpt_viz.plan.profiling` measured (a step without checkpointing).
        policy: the blocks to checkpoint, the kind, excluded regions, ops to keep.

    Returns:
        The `Prediction`; see NOTE [ Plan timeline ] for the model.
    """
    if policy.schedule is not None:
        return predict_pipeline(profile, policy)
    line = timeline(profile, policy.kind, policy.exclude, policy.save_ops)
    x = choices(line, policy.blocks)
    peak, where = peak_of(line, x)
    by = _categories_at(line, x, where)
    recompute = int(sum(t for t, c in zip(line.recompute_ns, x) if c))
    known = [f for f, c in zip(line.recompute_flops, x) if c]
    flops = int(sum(known)) if known and all(f is not None for f in known) else (0 if not known else None)
    return Prediction(policy=policy, peak=peak, by_category=by, where=line.windows[where].name if line.windows else "",
                      recompute_ns=recompute, recompute_flops=flops, step_ns=line.step_ns + recompute)


def _categories_at(line: Timeline, x: np.ndarray, where: int) -> dict[str, int]:
    """Bytes by category at the peak: the running sums by category up to the peak's event in window `where`."""
    totals = np.zeros(len(CATEGORIES), dtype=np.int64)
    for name, value in line.base_by_category.items():
        totals[CATEGORIES.index(name)] += value
    for k, w in enumerate(line.windows):
        c = int(x[w.own]) if w.own >= 0 else 0
        sizes, cats = w.events[c]
        if k < where:
            np.add.at(totals, cats, sizes)
            continue
        if len(sizes):
            run = np.cumsum(sizes)
            stop = int(run.argmax()) + 1 if run.max() > 0 else 0
            np.add.at(totals, cats[:stop], sizes[:stop])
        break
    return {name: int(v) for name, v in zip(CATEGORIES, totals)}


# ---------------------------------------------------------------- pipelines

# NOTE [ Plan pipelines ]
#   1. A pipeline profile is one micro-batch through every stage without checkpointing, with each
#      stage's forward and backward marked (profile.py, `stage_calls`). The executor
#      (ckpt_viz/run/pipeline.py) runs each stage's checkpointed blocks as split reentrant
#      checkpoints: F keeps what the blocks save (a checkpointed block: its inputs and RNG state),
#      DX replays the checkpointed blocks and keeps the replays and the graph for DW, DW frees them
#      and makes the weight gradients. Stage 0's input needs no grad, so its DX does nothing and its
#      DW replays.
#   2. Each action's events come from the profile's windows: F from the stage's forward (the last
#      stage's also computes the loss), DX and DW from the stage's backward (rule 4 of NOTE
#      [ Plan timeline ]), with the checkpoint changes of rules 2, 3 and 5. Events name their
#      allocation, so one action may free what another made (a saved tensor of F freed in DW).
#   3. The executor's slots hold, beyond the graph: a stage's output until the DW of that stage
#      and of the next one, the gradient sent to the stage before until that stage's DW, and a
#      micro-batch's handles (RNG states, kept inputs, kept replay outputs) until its DW.
#   4. Weight gradients: the first micro-batch's DW makes `.grad`; later ones add into it (their
#      gradient is a transient). A plain block's is freed once added; a checkpointed block's are
#      computed by its replay's own backward and added when that backward ends, so they stay until
#      the block's backward ends (the gradient of its input, `w1`), all of them together (measured
#      against the allocator: tests/plan/test_search.py, the pipeline's recommendation when run).
#   5. The step is the schedule's actions in the executor's order (`ckpt_viz.run.schedules`), one
#      process: the peak is the whole process's; a stage's bytes are those its actions made
#      (parameters and its own gradients included), its peak their highest point.

def _stage_ranges(p: PlanProfile) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Per stage: its forward (lo, hi) and backward (lo, hi) event ranges."""
    stages = p.stage_calls
    out = []
    for s, st in enumerate(stages):
        f_hi = p.backward_start if s == len(stages) - 1 else st.f1
        w_lo = p.backward_start if s == len(stages) - 1 else st.w0
        w_hi = st.w1 if st.w1 >= 0 else p.end
        out.append(((st.f0, f_hi), (w_lo, w_hi)))
    return out


def _pipeline_lists(p: PlanProfile, ckpt: set[int], exclude: frozenset[str]
                    ) -> tuple[dict[tuple[str, int], list], dict[int, int]]:
    """NOTE [ Plan pipelines ], rule 2: each (action kind, stage)'s keyed events (key, bytes, category); and the
    weight gradients a checkpointed block's backward makes, by allocation, with the block (rule 4)."""
    step = _Step(p, "split-reentrant", exclude, frozenset())
    sizes, role, cat, alloc_of = p.sizes, step.role, step.cat, step.alloc_of
    ranges = _stage_ranges(p)
    S = len(p.stage_calls)
    held_by_slot = set()
    for st in p.stage_calls:
        held_by_slot |= {a for a in (*st.output_allocs, *st.input_allocs) if a >= 0}
    blocks_of = [[b for b, blk in enumerate(p.blocks) if ranges[s][0][0] <= blk.f0 < ranges[s][0][1]]
                 for s in range(S)]
    rng = p.rng_state_bytes
    lists: dict[tuple[str, int], list] = {}
    grad_block: dict[int, int] = {}

    def plain(i: int) -> tuple:
        a = i if sizes[i] > 0 else alloc_of[i]
        return (a if a >= 0 else None, sizes[i], cat[i])

    for s in range(S):
        (f_lo, f_hi), (w_lo, w_hi) = ranges[s]
        mine = [b for b in blocks_of[s] if b in ckpt]
        # F: the forward, checkpointed blocks drop their private tensors after the next allocation
        forward: list = []
        pending: list[int] = []
        dropped = {a for b in mine for a in step.private[b] if a not in step.kept[b]}
        ends = {p.blocks[b].f1: b for b in mine}
        for i in range(f_lo, f_hi):
            if i in ends:
                forward += _holds(step, ends[i], rng)
            if sizes[i] < 0 and alloc_of[i] in held_by_slot:
                continue
            forward.append(plain(i))
            if sizes[i] > 0:
                forward += [(a, -sizes[a], cat[a]) for a in pending]
                pending = []
            if i in dropped:
                pending.append(i)
        forward += [(a, -sizes[a], cat[a]) for a in pending]
        if f_hi in ends:
            forward += _holds(step, ends[f_hi], rng)
        lists[("F", s)] = forward
        replay_at = {p.blocks[b].w0: b for b in mine}
        grads_done = {p.blocks[b].w1: b for b in mine if 0 <= p.blocks[b].w0 <= p.blocks[b].w1}  # NOTE rule 4
        for b in grads_done.values():
            blk = p.blocks[b]
            grad_block.update({i: b for i in range(blk.w0, blk.w1) if sizes[i] > 0 and role[i] == ROLE_PARAM_GRAD})
        has_dx = p.stage_calls[s].w1 >= 0
        dx: list = []
        dw: list = []
        own_grads = {a for a in p.stage_calls[s].input_allocs if a >= 0}
        for i in range(w_lo, w_hi):
            if i in grads_done:
                dw.append((("grads done", grads_done[i]), 0, _GRAD))
            if i in replay_at:
                (dx if has_dx else dw).extend(_keyed_replay(step, replay_at[i]))
            a = i if sizes[i] > 0 else alloc_of[i]
            slot = a in held_by_slot and sizes[i] < 0
            if has_dx and not slot:
                skip = (sizes[i] > 0 and role[i] == ROLE_PARAM_GRAD) or (
                    sizes[i] < 0 and a >= 0 and role[a] in (ROLE_PRIVATE, ROLE_SAVED, ROLE_PARAM_GRAD))
                if not skip:
                    dx.append(plain(i))
            if slot or (has_dx and a in own_grads):  # DW asks for the weights only
                continue
            dw.append(plain(i))
        if w_hi in grads_done:
            dw.append((("grads done", grads_done[w_hi]), 0, _GRAD))
        release = []
        for b in mine:
            release += _releases(step, b, rng)
        for a in p.stage_calls[s].output_allocs:  # NOTE rule 3: this stage's slot lets go of its output
            if a >= 0:
                release.append((a, 0, _OTHER))
        if s > 0:
            for a in p.stage_calls[s - 1].output_allocs:  # ... and of its input, the last stage's output
                if a >= 0:
                    release.append((a, 0, _OTHER))
        if s + 1 < S:
            for a in p.stage_calls[s + 1].input_allocs:  # ... and of the gradient the next stage sent
                if a >= 0:
                    release.append((a, 0, _OTHER))
        lists[("DX", s)] = dx
        lists[("DW", s)] = dw + release
    return lists, grad_block


def _holds(step: _Step, b: int, rng: int) -> list:
    """What a checkpointed block's handle holds from its forward until its micro-batch's DW."""
    return [(("rng", b), rng, _OTHER), (("inputs", b), _kept_inputs(step, b), _CKIN),
            (("held", b), step.held[b], _EXCL)]


def _releases(step: _Step, b: int, rng: int) -> list:
    return [(("rng", b), -rng, _OTHER), (("inputs", b), -_kept_inputs(step, b), _CKIN),
            (("held", b), -step.held[b], _EXCL), (("outputs", b), 0, _OTHER)]


def _keyed_replay(step: _Step, b: int) -> list:
    """A reentrant replay of block b, keyed: its private tensors under their own keys (freed where the
    profile frees them), its outputs kept until DW, the rest freed when the replay ends."""
    p = step.p
    blk = p.blocks[b]
    sizes = p.sizes
    private = set(step.private[b])
    outputs = {a for a in blk.output_allocs if a >= 0}
    out: list = [(("replay rng", b), p.rng_state_bytes, _OTHER)]  # the replay keeps the RNG state it replaces
    alive: dict[int, int] = {}
    kept = 0
    for i in range(blk.f0, blk.f1):
        if any(lo <= i < hi for lo, hi in step.skipped[b]):
            continue
        size = sizes[i]
        if size > 0:
            if i in private and i not in step.kept[b]:
                out.append((i, size, _REPLAY))
            else:
                alive[i] = size
                out.append((("replay", i), size, _OTHER))
        else:
            a = step.alloc_of[i]
            if a in alive:
                out.append((("replay", a), -alive.pop(a), _OTHER))
    for a, size in alive.items():
        if a in outputs:
            kept += size
        out.append((("replay", a), -size, _OTHER))
    if kept:
        out.append((("outputs", b), kept, _OTHER))
    out.append((("replay rng", b), -p.rng_state_bytes, _OTHER))
    return out


def predict_pipeline(profile: PlanProfile, policy: Policy) -> Prediction:
    """Predict a pipeline step (NOTE [ Plan pipelines ]): the process's peak and each stage's.

    `policy.schedule` ("GPipe", "1F1B", "ZB-H1") and `policy.microbatches` (default: the profile's)
    pick the schedule; the checkpointed blocks are split reentrant checkpoints, as the executor runs them.
    """
    from ckpt_viz.plan.schema import StagePeak
    from ckpt_viz.run.schedules import make_schedule, schedule_name, simulate

    if not profile.stage_calls:
        raise CkptVizError(f"{_API}: the profile has no pipeline stages.\nTip: profile the pipeline with "
                           "ckpt_viz.plan.profile_spec(spec, microbatch=M).")
    check_profile(profile, _API)
    name = schedule_name(policy.schedule or "1F1B")
    M = policy.microbatches or profile.microbatches or 1
    S = len(profile.stage_calls)
    line = timeline(profile, "split-reentrant")
    x = choices(line, policy.blocks)
    ckpt = {b for b, v in enumerate(x) if v}
    exclude = frozenset(policy.exclude) | {r.name for r in profile.regions if r.fixed}
    lists, grad_block = _pipeline_lists(profile, ckpt, exclude)
    held_grads: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # (block, micro-batch) -> (bytes, stage, cat)
    role = profile.role
    inputs = profile.base.get("other", 0)
    base_stage = [st.param_bytes for st in profile.stage_calls]
    base_stage[0] += inputs * 2 * M  # the full batch, and its micro-batches' copies (NOTE rule 5)
    base_cat = np.zeros((S, len(CATEGORIES)), dtype=np.int64)
    for s in range(S):
        base_cat[s, 0] = profile.stage_calls[s].param_bytes
    base_cat[0, _OTHER] += inputs * 2 * M
    by = base_cat.copy()
    totals = np.array(base_stage, dtype=np.int64)
    live: dict[tuple, tuple[int, int, int]] = {}
    holders: dict[tuple, int] = {}
    slot_refs = {}
    for s, st in enumerate(profile.stage_calls):
        for a in st.output_allocs:
            if a >= 0:
                slot_refs[a] = 2 if s + 1 < S else 1
        for a in st.input_allocs:
            if a >= 0:
                slot_refs[a] = 1
    peak = int(totals.sum())
    peak_by = by.sum(axis=0).copy()
    where = "start"
    stage_peak = totals.copy()
    stage_by = [by[s].copy() for s in range(S)]
    order = simulate(make_schedule(name, S, M))
    for action, _ in order:
        s, m = action.stage, action.microbatch
        kinds = ("DX", "DW") if action.kind == "B" else (action.kind,)
        for kind in kinds:
            for key, size, c in lists[(kind, s)]:
                if isinstance(key, tuple) and key[0] == "grads done":  # NOTE rule 4: the block's backward ended
                    for nbytes, owner, cc in held_grads.pop((key[1], m), ()):
                        totals[owner] -= nbytes
                        by[owner, cc] -= nbytes
                    continue
                if key is None:
                    totals[s] += size
                    by[s, c] += size
                    owner = s
                elif size > 0:
                    k = (key, m)
                    if k in live:
                        continue
                    if isinstance(key, int) and role[key] == ROLE_PARAM_GRAD and m > 0:
                        owner = s  # NOTE rule 4: added into .grad, then freed (a checkpointed block's: at its end)
                        totals[s] += size
                        by[s, c] += size
                        peak, peak_by, where = _top(totals, by, peak, peak_by, where, action, kind)
                        stage_peak, stage_by = _stage_top(totals, by, stage_peak, stage_by)
                        if key in grad_block:
                            held_grads.setdefault((grad_block[key], m), []).append((size, s, c))
                        else:
                            totals[s] -= size
                            by[s, c] -= size
                        continue
                    live[k] = (size, s, c)
                    if isinstance(key, int) and key in slot_refs:
                        holders[k] = slot_refs[key]
                    owner = s
                    totals[s] += size
                    by[s, c] += size
                else:
                    k = (key, m)
                    if k not in live:
                        continue
                    if size == 0 and k in holders:  # a slot lets go
                        holders[k] -= 1
                        if holders[k] > 0:
                            continue
                    elif k in holders and holders[k] > 0:
                        continue  # held by a slot: its free comes when the slots let go (NOTE rule 3)
                    nbytes, owner, cc = live.pop(k)
                    holders.pop(k, None)
                    totals[owner] -= nbytes
                    by[owner, cc] -= nbytes
                    continue
                peak, peak_by, where = _top(totals, by, peak, peak_by, where, action, kind)
                stage_peak, stage_by = _stage_top(totals, by, stage_peak, stage_by)
    recompute = int(sum(line.recompute_ns[b] for b in ckpt)) * M
    stages = tuple(StagePeak(stage=s, peak=int(stage_peak[s]),
                             by_category={c: int(v) for c, v in zip(CATEGORIES, stage_by[s])}) for s in range(S))
    return Prediction(policy=policy, peak=int(peak), by_category={c: int(v) for c, v in zip(CATEGORIES, peak_by)},
                      where=where, recompute_ns=recompute, recompute_flops=None,
                      step_ns=profile.step_time_ns * M + recompute, stages=stages)



def _top(totals: np.ndarray, by: np.ndarray, peak: int, peak_by: np.ndarray, where: str, action: object,
         kind: str) -> tuple[int, np.ndarray, str]:
    total = int(totals.sum())
    if total > peak:
        return total, by.sum(axis=0).copy(), f"{kind} of stage {action.stage}, micro-batch {action.microbatch}"
    return peak, peak_by, where


def _stage_top(totals: np.ndarray, by: np.ndarray, stage_peak: np.ndarray, stage_by: list) -> tuple:
    for s in range(len(totals)):
        if totals[s] > stage_peak[s]:
            stage_peak[s] = totals[s]
            stage_by[s] = by[s].copy()
    return stage_peak, stage_by
