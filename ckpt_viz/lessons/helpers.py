"""What the lessons' scripts share: record a built-in model, read a trace's peak and replays. Torch-free at import."""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

from ckpt_viz.trace import Trace

__all__ = ["builtin", "kib", "peak", "peak_by_category", "replays"]


@lru_cache(maxsize=64)
def builtin(model: str, mode: str, **options) -> Trace:
    """Record the built-in `model` in `mode`, with memory samples and graph snapshots (once per process: a
    built-in run records the same trace every time, and several lessons read the same run)."""
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    return obtain_trace(RunRequest("builtin", model, mode=mode, **options))


def peak(trace: Trace) -> int:
    """The largest total of live bytes over the run."""
    return max(sum(s.bytes_by_category.values()) for s in trace.memory)


def peak_by_category(trace: Trace) -> dict[str, int]:
    """The bytes of each memory category at the run's peak."""
    best = max(trace.memory, key=lambda s: sum(s.bytes_by_category.values()))
    return dict(best.bytes_by_category)


def replays(trace: Trace) -> Counter:
    """How many times each handle replayed: {handle id: count}."""
    return Counter(e.handle_id for e in trace.of_kind("replay_started"))


def kib(nbytes: int) -> str:
    from ckpt_viz.render.memory import format_bytes

    return format_bytes(nbytes)
