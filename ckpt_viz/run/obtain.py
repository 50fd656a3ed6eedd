"""`obtain_trace(request)`: the one way to get a trace, used by `ckpt-viz record` and the app.

Owns `RunRequest` (what to run or read, and how) and the dispatch over its three sources:
a built-in model (recorded here), a model file (recorded in the sandboxed child) and a
saved trace (read). No torch at import: a built-in run imports the scenarios on first
use, so opening a saved trace never loads torch.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_viz import bus
from ckpt_viz.errors import CkptVizError
from ckpt_viz.trace import Trace

__all__ = ["SOURCES", "RunRequest", "obtain_trace"]

SOURCES: tuple[str, ...] = ("builtin", "user", "trace", "broken")
_API = "ckpt_viz.obtain_trace"


@dataclass(frozen=True)
class RunRequest:
    """What to run (or read) and how.

    Attributes:
        source: "builtin" (a model of `BUILTIN_MODELS`), "user" (a model file, run in a
            sandboxed child), "trace" (a saved trace file) or "broken" (a broken run to explore,
            `ckpt_viz.run.broken.BROKEN`: it uses its own mode).
        target: the built-in model's name, the model reference "file.py:factory", the trace file path,
            or the broken run's name.
        mode: one of `MODES` (not used for a saved trace).
        schedule, microbatches: for mode "pipeline".
        seed: the RNG seed of the run (and of the built-in model's weights).
        memory, graphs: record memory samples and graph snapshots.
        timeout_s, memory_mb: the sandbox's limits for a model file.
        plan: also profile the model for the planner (`ckpt_viz.plan.profile_spec` on a fresh
            model; a pipeline: one of its micro-batches) and attach the profile to the trace
            (`meta["plan_profile"]`); a model file's is made in its sandboxed child.
    """

    source: str
    target: str
    mode: str = "split-reentrant"
    schedule: str = "1F1B"
    microbatches: int = 4
    seed: int = 0
    memory: bool = True
    graphs: bool = True
    timeout_s: float = 60.0
    memory_mb: int = 4096
    plan: bool = False

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise CkptVizError(f"{_API}: unknown source {self.source!r}; expected one of "
                               f"{', '.join(map(repr, SOURCES))}.\nTip: 'builtin' runs a model of BUILTIN_MODELS, "
                               "'user' a model file, 'trace' reads a saved trace, 'broken' records a broken run to "
                               "explore.")


def obtain_trace(request: RunRequest, *, listen: Callable[[Any], None] | None = None) -> Trace:
    """Record the run `request` describes, or read its saved trace.

    Args:
        request: what to run or read.
        listen: called with every event while a built-in run records (a progress display).

    Raises:
        CkptVizError: an unknown model, mode or schedule; the sandbox's errors for a model
            file; TraceError for a trace file that cannot be read.
    """
    if request.source == "trace":
        return Trace.load(request.target)
    if request.source == "broken":
        from ckpt_viz.run.broken import record_broken  # torch: first use

        unsubscribe = bus.subscribe(listen) if listen is not None else None
        try:
            return record_broken(request.target, seed=request.seed, memory=request.memory, graphs=request.graphs)
        finally:
            if unsubscribe is not None:
                unsubscribe()
    if request.source == "user":
        from ckpt_viz.usermodel.sandbox import EXTRA_KEYS, record_in_subprocess

        extra = {"seed": request.seed, "microbatches": request.microbatches, "schedule": request.schedule,
                 "memory": request.memory, "graphs": request.graphs, "plan_profile": request.plan}
        return record_in_subprocess(request.target, request.mode, timeout_s=request.timeout_s,
                                    memory_mb=request.memory_mb, extra={k: v for k, v in extra.items()
                                                                        if k in EXTRA_KEYS})
    from ckpt_viz.run.scenarios import run_scenario  # torch: first use
    from ckpt_viz.run.zoo import build_builtin

    spec = build_builtin(request.target, seed=request.seed)
    unsubscribe = bus.subscribe(listen) if listen is not None else None
    try:
        trace = run_scenario(spec, request.mode, seed=request.seed, microbatches=request.microbatches,
                             schedule=request.schedule, memory=request.memory, graphs=request.graphs)
    finally:
        if unsubscribe is not None:
            unsubscribe()
    if request.plan:
        from ckpt_viz.plan.profile import attach, profile_spec

        microbatch = request.microbatches if request.mode == "pipeline" else None
        attach(trace, profile_spec(build_builtin(request.target, seed=request.seed), seed=request.seed,
                                   microbatch=microbatch))
    return trace
