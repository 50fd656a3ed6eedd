"""Which replays a recording checks for divergence: a region's first runs always, then a sample in a time budget.

Owns the policy of `ckpt_viz.runtime.divergence` (NOTE [ Replay divergence checks ]
there, rule 1): the identity of a checkpointed region across `record()` blocks
(`Region`, `region_of`), the decision for each run (`decide`), the cost it measures, and
the counts each recording keeps in `trace.meta["replay_checks"]`. Imports torch only
through the names it tests against; never the UI.

NOTE [ Sampled replay checks ]
  1. Policies: "all" checks every run of every region (the behaviour before sampling);
     "sampled" (the default, what `checks(True)` means) checks a region's first
     FIRST_CHECKS runs in this process, every run of a region whose check ever found a
     divergence, and after that a sample; "off" none.
  2. A region is the checkpointed function's identity, which outlives `record()`
     blocks (a user who wraps each training step in a fresh block runs the same
     regions again): its owner (the Module it is, or whose bound method, partial or
     labelled function it is, else the first Module or tensor a partial's
     arguments, its closure or its defaults hold; held weakly, so a new model is a
     new region) with its code object and qualname. A function with no such owner is keyed by code and
     qualname alone (at most _MAX_FREE of those; then the table starts over and
     each is a new region again, checked first). A module checkpointed several times
     in a step is one region, unless each call has its own label (`run.blocks`).
  3. The sample: after its first runs each run of a region is checked with
     probability p = BUDGET * r / c, between P_MIN and 1, drawn as a geometric gap
     from a private seeded RNG (never torch's or `random`'s global state), so a
     skipped run costs a lookup and a decrement and no pattern of runs is always
     missed. c is the region's measured check cost per checked run (perf_counter
     around every hook of its watch; the whole forward when it runs under the
     TorchFunctionMode). r is the recorded time per region run: the time between two
     runs under the same recording, so the time before a block's first region and
     after its last one (a step's backward, when each step has its own block) is not
     counted: the estimate errs towards fewer checks. Both are running means that
     halve their weight now and then, so they follow a changing workload. A skipped
     run costs about a microsecond (a lookup, a decrement, its counts).
  4. Visible: each recording counts, in `trace.meta["replay_checks"]`, the policy,
     the runs checked and skipped, and the skipped ones by region name (at most
     _MAX_NAMES names): kept here by channel, the recording takes them when it closes
     (`counts_of`; the runtime never imports the recording). The debugger says how many runs were not checked
     (`replay_checks_note` in ckpt_viz/debug/divergence.py), so "no divergence" is
     never said of a replay nobody looked at.
  5. What sampling can miss: a divergence that starts after a region's first
     FIRST_CHECKS runs and shows on m runs in a row is missed with probability
     (1 - p)^m (one run: found with probability p); the first run of a region, of a new
     model, and every run of a region that has diverged once are always checked.
     `checks("all")` (or CKPT_VIZ_REPLAY_CHECKS=all) checks every run.
"""
from __future__ import annotations

import functools
import math
import random
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from ckpt_viz.runtime import fingerprints as fp
from ckpt_viz.runtime import owners

__all__ = ["BUDGET", "FIRST_CHECKS", "P_MIN", "Region", "counts_of", "decide", "region_of", "reset"]

FIRST_CHECKS = 4  # runs of a region checked before sampling starts (NOTE rule 1)
# The checks' measured time, as a share of the recorded time (NOTE rule 3). Below the 1 % the checks may add: the
# clock around the hooks sees about a third to a half of what a sampled check costs the step (the rest: cold code
# and caches, which a steady "all" run does not pay), measured with bench_divergence.py.
BUDGET = 0.002
P_MIN = 1e-3  # a region is never checked less often than one run in 1/P_MIN
_MAX_FREE = 4096
_MAX_NAMES = 64
_DECAY_RUNS = 8192  # the recorded-time mean halves its weight after this many runs
_DECAY_CHECKS = 64  # a region's cost mean halves its weight after this many checked runs

clock = time.perf_counter


class Region:
    """One checkpointed region's history in this process (NOTE rule 2)."""

    __slots__ = ("checked", "diverged", "name", "samples", "skip", "spent")

    def __init__(self, name: str) -> None:
        self.name = name
        self.checked = 0  # runs checked so far
        self.skip = 0  # runs still to skip before the next check
        self.diverged = False  # a check of this region found a divergence: check every run from now on
        self.spent = 0.0  # seconds the checks took, over `samples` checked runs (a running mean)
        self.samples = 0.0

    def found(self) -> None:
        self.diverged, self.skip = True, 0


# id(owner) -> (a weak reference to it, its regions by (code, qualname); None for a Module itself)
_by_owner: dict[int, tuple[weakref.ref, dict[Any, Region]]] = {}
_free: dict[Any, Region] = {}
_rng = random.Random(0x5EED)


def _dead() -> None:
    return None


class _Clock:
    """Recorded time: gaps between runs under the same recording (NOTE rule 3); that recording's counts."""

    recorded = 0.0
    runs = 0.0
    last = 0.0
    channel: Callable[[], Any] = _dead  # a weak reference to the innermost channel of the last run
    policy = ""
    counts: ClassVar[list[dict[str, Any]]] = []


def reset() -> None:
    """Forget every region and the measured times (what a fresh process starts from)."""
    _by_owner.clear()
    _free.clear()
    _Clock.recorded = _Clock.runs = _Clock.last = 0.0
    _Clock.channel, _Clock.policy, _Clock.counts = _dead, "", []
    _rng.seed(0x5EED)


def _owner(function: Any) -> Any:
    owner = fp.owner_of(function)  # a Module, its bound method, a partial of one, a labelled function
    if owner is not None:
        return owner
    partial = isinstance(function, functools.partial)
    inner = function.func if partial else function
    cells = getattr(inner, "__closure__", None) or ()
    for value in (*(function.args if partial else ()), *(c.cell_contents for c in cells if _filled(c)),
                  *(getattr(inner, "__defaults__", None) or ())):
        if isinstance(value, (torch.nn.Module, torch.Tensor)):
            return value
    return None


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


def _table(owner: Any) -> dict[Any, Region]:
    key = id(owner)
    held = _by_owner.get(key)
    if held is not None and held[0]() is owner:
        return held[1]
    table: dict[Any, Region] = {}
    _by_owner[key] = (weakref.ref(owner, lambda _, key=key: _forget(key)), table)
    return table


def _forget(key: int) -> None:
    held = _by_owner.get(key)
    if held is not None and held[0]() is None:
        del _by_owner[key]


def region_of(function: Any) -> Region:
    """The region `function` runs (NOTE rule 2), made on its first run."""
    if isinstance(function, torch.nn.Module):  # the usual case: a block module
        key: Any = None
        table = _table(function)
    else:
        key = (getattr(getattr(function, "func", function), "__code__", None) or type(function),
               getattr(function, "__qualname__", None))
        owner = _owner(function)
        if owner is not None:
            table = _table(owner)
        else:
            table = _free
            if key not in table and len(table) >= _MAX_FREE:
                table.clear()
    region = table.get(key)
    if region is None:
        region = table[key] = Region(owners.qualname(function))
    return region


def _gap(region: Region) -> int:
    """Runs to skip before the region's next check: geometric with p (NOTE rule 3)."""
    c = _Clock
    cost = region.spent / region.samples if region.samples else 0.0
    per_run = c.recorded / c.runs if c.runs else 0.0
    p = 1.0 if cost <= 0.0 else max(P_MIN, min(1.0, BUDGET * per_run / cost))
    if p >= 1.0:
        return 0
    if p <= 0.0:  # P_MIN set to 0 and nothing to spend: never again
        return 1 << 62
    return int(math.log(1.0 - _rng.random()) / math.log(1.0 - p))


_by_channel: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _counts_for(scope: Any, policy: str) -> list[dict[str, Any]]:
    """The counts of each channel (recording) `scope` sends to, made on first use (NOTE rule 4)."""
    found = []
    for channel in scope.channels:
        counts = _by_channel.get(channel)
        if counts is None:
            counts = _by_channel[channel] = {"policy": policy, "first_checks": FIRST_CHECKS, "budget": BUDGET,
                                             "checked": 0, "skipped": 0, "skipped_regions": {}}
        elif counts["policy"] != policy:
            counts["policy"] = "mixed"  # a block that ran under two policies says so
        found.append(counts)
    return found


def counts_of(channel: Any) -> dict[str, Any] | None:
    """What the checks counted for the recording of `channel` (its `trace.meta["replay_checks"]`), once."""
    return _by_channel.pop(channel, None)


def decide(function: Any, scope: Any, policy: str) -> Region | None:
    """The region of this run if it is to be checked, else None (counted as skipped; NOTE rules 1-4)."""
    now = clock()
    c = _Clock
    channel = scope.channels[-1]
    if c.channel() is channel and c.policy == policy:
        if now > c.last:  # another thread's run may have ticked after this one read the clock
            c.recorded += now - c.last
        counts = c.counts
    else:  # a new recording (or policy): its time starts now
        c.channel, c.policy = weakref.ref(channel), policy
        counts = c.counts = _counts_for(scope, policy)
    c.last = now
    c.runs += 1
    if c.runs > _DECAY_RUNS:
        c.runs *= 0.5
        c.recorded *= 0.5
    region = region_of(function)
    if region.skip and policy == "sampled":
        region.skip -= 1
        for entry in counts:
            entry["skipped"] += 1
            names = entry["skipped_regions"]
            if region.name in names or len(names) < _MAX_NAMES:
                names[region.name] = names.get(region.name, 0) + 1
        return None
    region.checked += 1
    region.samples += 1
    if region.samples > _DECAY_CHECKS:
        region.samples *= 0.5
        region.spent *= 0.5
    for entry in counts:
        entry["checked"] += 1
    if policy == "sampled" and region.checked >= FIRST_CHECKS and not region.diverged:
        region.skip = _gap(region)
    region.spent += clock() - now
    return region
