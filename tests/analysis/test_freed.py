"""A trace no one holds is freed at once, by reference counting, after any analysis of it (issue 25: the app must
not grow; the results cached in the trace must not point back at it, or it waits for the cyclic collector)."""
from __future__ import annotations

import gc
import weakref

from ckpt_viz.analysis import claims, diagnosis, lifecycle, memory, passes, routing, summary
from ckpt_viz.trace import Trace
from traces import synthetic_trace


def test_a_trace_is_freed_by_reference_counting_after_every_analysis() -> None:
    text = synthetic_trace(2_000, concurrent=20).to_json()
    analyses = {
        "lifecycle": lifecycle.lifecycle, "held replays": lifecycle.held_replays,
        "recompute time": lifecycle.recompute_time, "claims": claims.run_claims, "summary": summary.summary,
        "diagnosis": diagnosis.diagnose, "a handle's finding": lambda t: diagnosis.diagnose_handle(t, 0),
        "memory": memory.memory, "backward passes": lambda t: passes.passes(t).backwards,
        "routing": lambda t: routing.routing_at(t, None),
    }
    enabled = gc.isenabled()
    gc.disable()  # only reference counting may free it
    try:
        for name, analyse in analyses.items():
            trace = Trace.from_json(text)
            analyse(trace)
            ref = weakref.ref(trace)
            del trace
            assert ref() is None, f"after {name}, the trace lives on in a reference cycle"
    finally:
        if enabled:
            gc.enable()
