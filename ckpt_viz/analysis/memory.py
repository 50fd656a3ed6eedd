"""Memory over the run, derived once: bytes by category at every sample, the totals, the peak and its
top categories, the reading at a cursor, per rank and per pipeline stage, and the tables in words.

    facts = memory(trace)
    facts.peak          -> MemoryPeak(seq=61, t_ns=..., total=1_474_560, by_category={...}, top=(...))
    facts.at(seq)       -> {"parameters": ..., "activations": ...}   the last reading at or before seq
    memory_table(facts.at(seq)) -> rows {category, size, share, what it is} in words
    rank_memory(trace)  -> {rank: MemoryFacts}   (a merged distributed trace)
    rank_trace(trace, r) -> the trace with rank r's samples alone (what a memory chart of one rank draws)
    stage_memory(trace) -> [StageReading(rank, stage, seq, t_ns, nbytes, us), ...]

Memory is a step function: the memory at an event is that of the last sample at or before it. In a
merged trace each rank keeps its own samples (`MemorySample.rank`); the run's reading is the sum of
every rank's latest one (NOTE [ Merging rank traces ], rule 4, in ckpt_viz/cli/merge.py). What each
category counts: NOTE [ Memory categories ] in ckpt_viz/probe/memory.py. Standard library only.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from ckpt_viz.analysis._cache import derived
from ckpt_viz.analysis.words import CATEGORY_MEANINGS, category_word, format_bytes
from ckpt_viz.trace import MemorySample, Trace
from ckpt_viz.vocabulary import MEMORY_CATEGORIES, MemoryCategory

__all__ = ["OTHER_NOTABLE", "MemoryFacts", "MemoryPeak", "StageReading", "memory", "memory_table", "other_note",
           "rank_memory", "rank_trace", "stage_memory", "stage_peaks"]

OTHER_NOTABLE = 0.2  # "other" this share of the total or more gets a note (see `other_note`)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPeak:
    """The sample with the most bytes in all (the first such).

    Attributes:
        seq / t_ns: where it was read.
        total: its bytes in all.
        by_category: its bytes by category.
        top: its three largest categories, largest first, as (category, bytes).
        x: its place on the event axis (`MemoryFacts.x`).
    """

    seq: int
    t_ns: int
    total: int
    by_category: dict[str, int]
    top: tuple[tuple[str, int], ...]
    x: float = 0.0


@dataclass(frozen=True, slots=True)
class MemoryFacts:
    """Bytes by category at every sample of a run (or of one rank), in order.

    `x` places each sample on the event axis: several samples share the seq of the event before them (module
    boundaries, the allocator's high-water marks: ckpt_viz/recording.py NOTE rule 2), so the k-th of n samples
    of seq s sits at s + k/n, in time order, between its event and the next; a chart drawn over x shows each
    sample once, where a chart over seq would stack the samples of one event on each other.
    """

    seqs: tuple[int, ...] = ()
    x: tuple[float, ...] = ()
    t_ns: tuple[int, ...] = ()
    categories: tuple[str, ...] = ()  # measured somewhere, in `MEMORY_CATEGORIES` order
    by_category: dict[str, tuple[int, ...]] = field(default_factory=dict)
    totals: tuple[int, ...] = ()
    peak: MemoryPeak | None = None

    def __len__(self) -> int:
        return len(self.seqs)

    def index_at(self, seq: int | None) -> int | None:
        """The position of the last sample at or before `seq` (None: the last sample); None if there is none."""
        if not self.seqs:
            return None
        if seq is None:
            return len(self.seqs) - 1
        i = bisect_right(self.seqs, seq) - 1
        return i if i >= 0 else None

    def at(self, seq: int | None) -> dict[str, int]:
        """Bytes by category as of `seq` (empty before the first sample)."""
        i = self.index_at(seq)
        return {} if i is None else {c: self.by_category[c][i] for c in self.categories}

    def total_at(self, seq: int | None) -> int:
        """Bytes in all as of `seq` (0 before the first sample)."""
        i = self.index_at(seq)
        return 0 if i is None else self.totals[i]


@dataclass(frozen=True, slots=True)
class StageReading:
    """Bytes held by one pipeline stage after a sample with a by-stage reading; `us`: microseconds from the
    trace's first event (the schedule timeline's x)."""

    rank: int | None
    stage: str
    seq: int
    t_ns: int
    nbytes: int
    us: float = 0.0


def _facts(samples: list[MemorySample]) -> MemoryFacts:
    if not samples:
        return MemoryFacts()
    names = {c for s in samples for c in s.bytes_by_category}
    categories = tuple([c for c in MEMORY_CATEGORIES if c in names] + sorted(names - set(MEMORY_CATEGORIES)))
    by_category: dict[str, tuple[int, ...]] = {
        c: tuple(s.bytes_by_category.get(c, 0) for s in samples) for c in categories}
    totals = tuple(map(sum, zip(*by_category.values()))) if by_category else (0,) * len(samples)
    i = max(range(len(totals)), key=totals.__getitem__)
    reading: dict[str, int] = {c: by_category[c][i] for c in categories}
    top = tuple(sorted(((c, b) for c, b in reading.items() if b > 0), key=lambda cb: -cb[1])[:3])
    seqs = tuple(s.seq for s in samples)
    x = _positions(seqs)
    peak = MemoryPeak(seq=samples[i].seq, t_ns=samples[i].t_ns, total=totals[i], by_category=reading, top=top,
                      x=x[i])
    return MemoryFacts(seqs=seqs, x=x, t_ns=tuple(s.t_ns for s in samples),
                       categories=categories, by_category=by_category, totals=totals, peak=peak)


def _positions(seqs: tuple[int, ...]) -> tuple[float, ...]:
    """Each sample's place on the event axis: the k-th of n samples of one seq at seq + k/n."""
    counts: dict[int, int] = {}
    for s in seqs:
        counts[s] = counts.get(s, 0) + 1
    seen: dict[int, int] = {}
    out = []
    for s in seqs:
        k = seen.get(s, 0)
        seen[s] = k + 1
        out.append(s + k / counts[s])
    return tuple(out)


def _summed(samples: list[MemorySample]) -> list[MemorySample]:
    """A merged trace's samples as the run's: after each rank's sample, the sum of every rank's latest one."""
    latest: dict[int | None, MemorySample] = {}
    out = []
    for s in samples:
        latest[s.rank] = s
        total: dict[MemoryCategory, int] = {}
        for reading in latest.values():
            for c, b in reading.bytes_by_category.items():
                total[c] = total.get(c, 0) + b
        out.append(MemorySample(seq=s.seq, t_ns=s.t_ns, bytes_by_category=total))
    return out


def memory(trace: Trace) -> MemoryFacts:
    """The run's memory facts (every rank summed in a merged trace), computed once per trace."""
    def build(t: Trace) -> MemoryFacts:
        samples = t.memory
        if any(s.rank is not None for s in samples):
            samples = _summed(samples)
        return _facts(samples)
    return derived(trace, "memory", build)


def rank_memory(trace: Trace) -> dict[int, MemoryFacts]:
    """Each rank's own memory facts (a merged distributed trace); {} when the samples carry no rank."""
    def build(t: Trace) -> dict[int, MemoryFacts]:
        by_rank: dict[int, list[MemorySample]] = {}
        for s in t.memory:
            if s.rank is not None:
                by_rank.setdefault(s.rank, []).append(s)
        return {r: _facts(by_rank[r]) for r in sorted(by_rank)}
    return derived(trace, "rank_memory", build)


def stage_memory(trace: Trace) -> list[StageReading]:
    """Bytes held per pipeline stage after each sample with a by-stage reading, in order."""
    def build(t: Trace) -> list[StageReading]:
        origin = t.events[0].t_ns if t.events else 0
        return [StageReading(s.rank, str(stage), s.seq, s.t_ns, sum(cats.values()), (s.t_ns - origin) / 1000.0)
                for s in t.memory for stage, cats in s.by_stage.items()]
    return derived(trace, "stage_memory", build)


def memory_table(bytes_by_category: dict[str, int]) -> list[dict[str, str]]:
    """Table rows {category, size, share, what it is} in words ("1.5 KiB", "12%")."""
    total = sum(bytes_by_category.values())
    order = [c for c in MEMORY_CATEGORIES if c in bytes_by_category] + [
        c for c in bytes_by_category if c not in MEMORY_CATEGORIES]
    return [{"category": category_word(c), "size": format_bytes(bytes_by_category[c]),
             "share": f"{100 * bytes_by_category[c] / total:.0f}%" if total else "-",
             "what it is": CATEGORY_MEANINGS.get(c, "")} for c in order]


def other_note(bytes_by_category: dict[str, int]) -> str | None:
    """A sentence when "other" is at least `OTHER_NOTABLE` of the total, saying what it holds; else None."""
    total, other = sum(bytes_by_category.values()), bytes_by_category.get("other", 0)
    if not total or other < OTHER_NOTABLE * total:
        return None
    return (f"\"other\" is {100 * other / total:.0f}% of the total here ({format_bytes(other)}): "
            f"{CATEGORY_MEANINGS['other']} Pass the model and its inputs to record(model=..., tensors=...) and run "
            "the loss inside the block so they are counted as such.")


def rank_trace(trace: Trace, rank: int) -> Trace:
    """The run as rank `rank` measured it: every event (so seqs and the cursor are the merged trace's) and that
    rank's memory samples alone, so `memory(rank_trace(t, r))` is `rank_memory(t)[r]`'s reading and every memory
    chart draws one rank; the same object on every call while `trace` is unchanged."""
    def build(t: Trace) -> Trace:
        return Trace(events=t.events, memory=[s for s in t.memory if s.rank == rank], meta=t.meta)
    return derived(trace, ("rank_trace", rank), build)


def stage_peaks(trace: Trace) -> dict[str, int]:
    """The most bytes each pipeline stage held at once (its peak over `stage_memory`), by stage in order;
    {} for a run without by-stage readings. In a merged trace a stage's readings are its rank's."""
    def build(t: Trace) -> dict[str, int]:
        peaks: dict[str, int] = {}
        for reading in stage_memory(t):
            peaks[reading.stage] = max(peaks.get(reading.stage, 0), reading.nbytes)
        return dict(sorted(peaks.items(), key=lambda kv: (len(kv[0]), kv[0])))
    return derived(trace, "stage_peaks", build)
