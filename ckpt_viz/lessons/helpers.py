"""What the lessons' checks share: a trace's peak, replays and recompute time, and figures in words.
Torch-free at import.

The figures are the analysis's (`ckpt_viz.analysis`), the ones the app's pages state beside a lesson;
these helpers only pick them out and write them as a student reads them ("1.5 KiB", "3.2 ms", "21%").
"""
from __future__ import annotations

from functools import lru_cache

from ckpt_viz.analysis.lifecycle import lifecycle, recompute_time
from ckpt_viz.analysis.memory import MemoryPeak, memory
from ckpt_viz.analysis.words import format_bytes
from ckpt_viz.errors import LessonError
from ckpt_viz.trace import Trace

__all__ = ["builtin", "kib", "ms", "peak", "peak_by_category", "percent", "recompute_ms", "replays"]


@lru_cache(maxsize=64)
def builtin(model: str, mode: str, **options) -> Trace:
    """Record the built-in `model` in `mode`, with memory samples and graph snapshots (once per process: a
    built-in run records the same trace every time)."""
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    return obtain_trace(RunRequest("builtin", model, mode=mode, **options))


def _peak(trace: Trace) -> MemoryPeak:
    found = memory(trace).peak
    if found is None:
        raise LessonError("ckpt_viz.lessons: the run has no memory samples, so it has no peak.\n"
                          "Tip: record it with memory=True and mark points with rec.mark(...).")
    return found


def peak(trace: Trace) -> int:
    """The largest total of live bytes over the run (`ckpt_viz.analysis.memory`'s peak)."""
    return _peak(trace).total


def peak_by_category(trace: Trace) -> dict[str, int]:
    """The bytes of each memory category at the run's peak."""
    return dict(_peak(trace).by_category)


def replays(trace: Trace) -> dict[int, int]:
    """How many times each handle that replayed did: {handle id: count} (the lifecycle's counts)."""
    life = lifecycle(trace)
    return {h: n for h in life.handle_ids if (n := life.replays(h))}


def recompute_ms(trace: Trace) -> str:
    """The time the run's replays took (`ckpt_viz.analysis.lifecycle.recompute_time`), in words."""
    return ms(recompute_time(trace).replay_ns)


def kib(nbytes: int) -> str:
    """Bytes in words: 1536 -> "1.5 KiB"."""
    return format_bytes(nbytes)


def ms(ns: int | float) -> str:
    """Nanoseconds in milliseconds, in words: 3_210_000 -> "3.2 ms" (below 0.1 ms: "0.04 ms")."""
    value = ns / 1e6
    return f"{value:.1f} ms" if value >= 0.1 or value == 0 else f"{value:.2f} ms"


def percent(share: float) -> str:
    """A share in words: 0.213 -> "21%"."""
    return f"{100 * share:.0f}%"
