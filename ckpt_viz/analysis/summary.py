"""One run in figures: the counts, end states and peak that the Overview, Compare, Handles, `ckpt-viz info`
and the lessons all state, derived once from the lifecycle, the memory facts and the diagnosis.

    summary(trace) -> RunSummary(handles=4, replays=4, released=4, states={"released": 4}, peak=..., ...)

Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ckpt_viz.analysis._cache import derived
from ckpt_viz.analysis.diagnosis import diagnose
from ckpt_viz.analysis.handles import observed_mode
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.memory import MemoryPeak, memory
from ckpt_viz.trace import Trace
from ckpt_viz.vocabulary import State

__all__ = ["RunSummary", "summary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """The figures of one run.

    Attributes:
        model, mode, schedule: what ran (from the trace's meta; "" when not said).
        events: how many events the trace holds.
        handles: checkpoint regions (reentrant handles and non-reentrant frames) seen.
        replays: re-runs of a checkpointed forward, all handles together.
        released: handles released at the end (every reason, the lifecycle's derived ones included).
        states: handles per state at the end of the run.
        refused: refused replays.
        errors: `error` events.
        peak: the memory peak, or None without memory samples.
        findings: the diagnosis codes found, in order.
        partial: the run stopped early or lacks ranks.
    """

    model: str
    mode: str
    schedule: str
    events: int
    handles: int
    replays: int
    released: int
    states: dict[State, int] = field(default_factory=dict)
    refused: int
    errors: int
    peak: MemoryPeak | None
    findings: tuple[str, ...]
    partial: bool


def summary(trace: Trace) -> RunSummary:
    """The run's figures (see `RunSummary`), computed once per trace."""
    def build(t: Trace) -> RunSummary:
        life = lifecycle(t)
        states = life.counts_at(None)
        meta = t.meta
        named = meta.get("distributed")
        distributed = named if isinstance(named, dict) else {}
        return RunSummary(
            model=str(meta.get("model") or ""), mode=str(meta.get("mode") or observed_mode(t)),
            schedule=str(meta.get("schedule") or ""), events=len(t.events), handles=len(life.handle_ids),
            replays=life.replay_count(), released=states.get("released", 0), states=states,
            refused=sum(len(life.refusals(h)) for h in life.refused()), errors=t.count("error"),
            peak=memory(t).peak, findings=tuple(d.code for d in diagnose(t)),
            partial=bool(meta.get("partial") or distributed.get("missing_ranks")))
    return derived(trace, "summary", build)
