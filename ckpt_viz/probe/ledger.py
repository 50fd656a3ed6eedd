"""The replay behind the allocation probe: live storages and their categories, allocation by allocation.

Owns `Ledger`, which `AllocationProbe` (probe/allocations.py) feeds the allocation
stream's events and its log's entries in the order of NOTE [ Allocation ledger ]
rule 2 there, and reads at each marker and at each high-water mark, and the rules
both probes share: `RANK` (the holds, strongest first) and `PHASE_CATEGORIES` (what
a storage no one holds counts as, by the pass that allocated it). Pure Python over
integers and tuples: no torch. The categories follow NOTE [ Memory categories ] in
probe/memory.py.
"""
from __future__ import annotations

from typing import Any

from ckpt_viz.runtime.memtags import CATEGORIES

__all__ = ["PHASE_CATEGORIES", "RANK", "Ledger"]

# The holds, strongest first: a storage held for several counts for the strongest (NOTE rule 2 in memory.py).
RANK = {"optimizer_state": 8, "checkpoint_inputs": 7, "excluded_outputs": 6, "replay_activations": 5,
        "activations": 4, "outputs": 3, "inputs": 2}
# A storage allocated while the recording ran and held by nothing counts for the pass that made it (rule 3).
PHASE_CATEGORIES = {"forward": "other", "backward": "gradients", "optimizer": "optimizer_step", None: "other"}


class _Rec:
    __slots__ = ("born", "contribution", "default", "holds", "keys", "nbytes", "param", "pre", "ptr", "stage")

    def __init__(self, ptr: int, nbytes: int, stage: Any, pre: bool, default: str, born: int) -> None:
        self.ptr = ptr
        self.born = born  # the ledger's count of records when this one came
        self.nbytes = nbytes
        self.stage = stage
        self.pre = pre  # known from before the probe, not from the stream (NOTE rule 3)
        self.default = default  # the category when nothing holds it: by the pass that allocated it
        self.param = False
        self.holds: dict[tuple[str, Any], int] = {}
        self.keys: set[int] = set()
        self.contribution: tuple[str, Any] | None = None  # (category, stage) this record is counted under


class Ledger:
    """The live storages and their categories (NOTE [ Allocation ledger ] rules 1-2 in probe/allocations.py)."""

    def __init__(self) -> None:
        self.store: dict[int, _Rec] = {}
        self.by_key: dict[int, tuple[_Rec, tuple[str, Any]]] = {}
        self.grads: frozenset[int] = frozenset()
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.by_stage: dict[Any, dict[str, int]] = {}
        self.stage_counts: dict[Any, int] = {}
        self.dirty: dict[int, _Rec] = {}
        self.stage_now: Any = None
        self.default_now = "other"  # PHASE_CATEGORIES of the pass open now
        self.live = 0  # bytes of every record in the store
        self.born = 0  # records made so far

    def _count(self, rec: _Rec, new: tuple[str, Any] | None) -> None:
        old = rec.contribution
        if old == new:
            return
        for sign, entry in ((-1, old), (1, new)):
            if entry is None:
                continue
            category, stage = entry
            self.totals[category] += sign * rec.nbytes
            if stage is not None:
                self.stage_counts[stage] = self.stage_counts.get(stage, 0) + sign
                row = self.by_stage.get(stage)
                if row is None:
                    row = self.by_stage[stage] = dict.fromkeys(CATEGORIES, 0)
                row[category] += sign * rec.nbytes
                if not self.stage_counts[stage]:
                    del self.stage_counts[stage], self.by_stage[stage]
        rec.contribution = new

    def _drop(self, ptr: int) -> None:
        rec = self.store.pop(ptr, None)
        if rec is not None:
            self.live -= rec.nbytes
            self._count(rec, None)
            self.dirty.pop(ptr, None)
            self._forget_holds(rec)

    def _forget_holds(self, rec: _Rec) -> None:
        for key in rec.keys:
            self.by_key.pop(key, None)
        rec.keys.clear()
        rec.holds.clear()

    def _known(self, ptr: int, nbytes: int, stage: Any) -> _Rec:
        rec = self.store.get(ptr)
        if rec is None:
            self.born += 1
            rec = self.store[ptr] = _Rec(ptr, nbytes, stage, True, "other", self.born)
            self.live += nbytes
        self.dirty[ptr] = rec
        return rec

    def alloc(self, ptr: int, nbytes: int) -> None:
        self._drop(ptr)  # a new allocation here: whatever was known at this address is gone
        self.born += 1
        rec = self.store[ptr] = _Rec(ptr, nbytes, self.stage_now, False, self.default_now, self.born)
        self.live += nbytes
        self.dirty[ptr] = rec

    def free(self, ptr: int) -> None:
        rec = self.store.get(ptr)
        if rec is not None and not rec.pre:
            self._drop(ptr)

    def apply(self, entry: tuple) -> None:
        kind = entry[0]
        if kind == "H":  # (H, marker, key or None, ptr, nbytes, category, stage); no key: while the storage lives
            _, _, key, ptr, nbytes, category, stage = entry
            rec = self._known(ptr, nbytes, stage)
            hold = (category, stage)
            rec.holds[hold] = rec.holds.get(hold, 0) + 1
            if key is not None:
                rec.keys.add(key)
                self.by_key[key] = (rec, hold)
        elif kind == "R":  # (R, key): the hold's owner was collected
            found = self.by_key.pop(entry[1], None)
            if found is not None:
                rec, hold = found
                rec.holds[hold] -= 1
                rec.keys.discard(entry[1])
                self.dirty[rec.ptr] = rec
        elif kind == "D":  # the storage that was at this address died
            rec = self.store.get(entry[1])
            if rec is not None:
                if rec.pre:
                    self._drop(entry[1])
                else:
                    self._forget_holds(rec)
                    self.dirty[entry[1]] = rec
        elif kind == "P":  # known from before the probe: (P, ptr, nbytes, stage, is_param)
            rec = self._known(entry[1], entry[2], entry[3])
            rec.param = rec.param or entry[4]
        elif kind == "C":  # a cache the runtime reads (memtags.seen): (C, marker, ptr, nbytes, stage)
            self._known(entry[2], entry[3], entry[4]).default = "other"  # "other" when nothing holds it
        elif kind == "S":  # assign_stage
            self._known(entry[1], entry[2], None).stage = entry[3]
        elif kind == "F":  # the pass open from here on: (F, marker, category of what it allocates)
            self.default_now = entry[2]

    def reading(self, grads: frozenset[int] | None, stage: Any) -> tuple[dict, dict, None]:
        if grads is not None and grads != self.grads:
            for ptr in grads ^ self.grads:
                rec = self.store.get(ptr)
                if rec is not None:
                    self.dirty[ptr] = rec
            self.grads = grads
        for ptr, rec in self.dirty.items():
            if self.store.get(ptr) is rec:
                self._count(rec, self._category(ptr, rec))
        self.dirty.clear()
        self.stage_now = stage
        by_stage = {str(s): dict(row) for s, row in self.by_stage.items()}
        return dict(self.totals), by_stage, None

    def _category(self, ptr: int, rec: _Rec) -> tuple[str, Any]:
        if rec.param:
            return "parameters", rec.stage
        if ptr in self.grads:
            return "gradients", rec.stage
        best = None
        for hold, count in rec.holds.items():
            if count > 0 and (best is None or RANK[hold[0]] > RANK[best[0]]):
                best = hold
        if best is None:
            return rec.default, rec.stage
        return best[0], best[1] if best[1] is not None else rec.stage
