"""What the lessons' scripts share: record a built-in model, read a trace's peak and replays. Torch-free at import."""
from __future__ import annotations

from collections import Counter

from ckpt_viz import RunRequest, Trace, format_bytes, memory_peak, obtain_trace


def builtin(model: str, mode: str, **options) -> Trace:
    """Record the built-in `model` in `mode`, with memory samples and graph snapshots."""
    return obtain_trace(RunRequest("builtin", model, mode=mode, **options))


def peak(trace: Trace) -> int:
    """The largest total of live bytes over the run."""
    return memory_peak(trace)["total"]


def peak_by_category(trace: Trace) -> dict[str, int]:
    """The bytes of each memory category at the run's peak."""
    best = max(trace.memory, key=lambda s: sum(s.bytes_by_category.values()))
    return dict(best.bytes_by_category)


def replays(trace: Trace) -> Counter:
    """How many times each handle replayed: {handle id: count}."""
    return Counter(e.handle_id for e in trace.of_kind("replay_started"))


def kib(nbytes: int) -> str:
    return format_bytes(nbytes)
