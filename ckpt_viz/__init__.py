"""ckpt_viz: see, step through and debug PyTorch activation checkpointing with split DX/DW backward.

`import ckpt_viz` imports neither torch nor a chart library, so a saved trace opens without them.
The names that run models (torch) or build charts (altair) load on first use: see `_LAZY`; so do the
submodules `ckpt_viz.pipelining` and `ckpt_viz.hf` (`_SUBMODULES`).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ckpt_viz import lessons  # the lessons: loader, runner, glossary, runs (torch-free at import)
from ckpt_viz.bus import subscribe, tag
from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES
from ckpt_viz.debug.divergence import replay_checks_note
from ckpt_viz.diagnose import Diagnosis, Finding, diagnose, diagnose_all, diagnose_handle, diagnose_handle_in, explain
from ckpt_viz.errors import (
    CheckpointError,
    CheckpointUsageError,
    CkptVizError,
    GraphReleasedError,
    HandleReleasedError,
    PhaseNotSetError,
    TraceError,
)
from ckpt_viz.events import EVENT_KINDS, RELEASE_REASONS, Event
from ckpt_viz.lessons.glossary import SPLIT_COST
from ckpt_viz.recording import Recording, record
from ckpt_viz.render import palette  # the one palette and vocabulary (NOTE [ One palette ])
from ckpt_viz.render.eventlog import describe_event, event_rows, filter_events, rows_text
from ckpt_viz.render.graph import (
    GRAPH_LEGEND,
    TORCHVIZ_LEGEND,
    collapse_runs,
    refused_handles,
    render_graph,
    render_torchviz_view,
)
from ckpt_viz.render.perfetto import render_perfetto
from ckpt_viz.render.phases import aligned_seq, phase_spans
from ckpt_viz.render.routing import input_words, pass_title, release_words, render_routing, routing_at
from ckpt_viz.render.routing_table import routing_rows
from ckpt_viz.render.text import format_event, render_text
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from ckpt_viz.trace import Trace
from ckpt_viz.trace.cache import derived, event_data
from ckpt_viz.trace.index import TraceIndex, event_column, event_counts
from ckpt_viz.trace.lifecycle import STATE_MEANINGS, STATES, Lifecycle, Transition, lifecycle

if TYPE_CHECKING:  # what `_LAZY` loads, spelled out for type checkers and editors
    from ckpt_viz.render.memory import format_bytes, memory_peak, memory_table, other_note, render_memory, render_peaks
    from ckpt_viz.render.svg import dot_svg
    from ckpt_viz.render.swimlane import render_lifecycles
    from ckpt_viz.render.timeline import (
        planned_vs_executed,
        render_stage_memory,
        render_timeline,
        stage_memory_rows,
        timeline_actions,
    )
    from ckpt_viz.run.pipeline import microbatch_choices
    from ckpt_viz.run.scenarios import MODES, run_scenario
    from ckpt_viz.run.schedules import SCHEDULES
    from ckpt_viz.run.zoo import BUILTIN_MODELS, DEFAULT_MODEL, build_builtin
    from ckpt_viz.usermodel.sandbox import EXTRA_KEYS, record_in_subprocess
    from ckpt_viz.usermodel.warm import WarmSandbox

# name -> the module that defines it, imported on first access (PEP 562). These modules import torch or
# altair, or (the sandbox) run as `python -m`, which warns when the package has already imported the module.
_LAZY = {
    "BUILTIN_MODELS": "ckpt_viz.run.zoo",
    "DEFAULT_MODEL": "ckpt_viz.run.zoo",
    "EXTRA_KEYS": "ckpt_viz.usermodel.sandbox",
    "MODES": "ckpt_viz.run.scenarios",
    "SCHEDULES": "ckpt_viz.run.schedules",
    "WarmSandbox": "ckpt_viz.usermodel.warm",
    "build_builtin": "ckpt_viz.run.zoo",
    "dot_svg": "ckpt_viz.render.svg",
    "format_bytes": "ckpt_viz.render.memory",
    "memory_peak": "ckpt_viz.render.memory",
    "memory_table": "ckpt_viz.render.memory",
    "microbatch_choices": "ckpt_viz.run.pipeline",
    "planned_vs_executed": "ckpt_viz.render.timeline",
    "other_note": "ckpt_viz.render.memory",
    "record_in_subprocess": "ckpt_viz.usermodel.sandbox",
    "render_lifecycles": "ckpt_viz.render.swimlane",
    "render_memory": "ckpt_viz.render.memory",
    "render_peaks": "ckpt_viz.render.memory",
    "render_stage_memory": "ckpt_viz.render.timeline",
    "render_timeline": "ckpt_viz.render.timeline",
    "run_scenario": "ckpt_viz.run.scenarios",
    "stage_memory_rows": "ckpt_viz.render.timeline",
    "timeline_actions": "ckpt_viz.render.timeline",
}

__all__ = [
    "BROKEN_SCENARIO_NAMES",
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "EVENT_KINDS",
    "EXTRA_KEYS",
    "GRAPH_LEGEND",
    "MODES",
    "RELEASE_REASONS",
    "SCHEDULES",
    "SPLIT_COST",
    "STATES",
    "STATE_MEANINGS",
    "TORCHVIZ_LEGEND",
    "CheckpointError",
    "CheckpointUsageError",
    "CkptVizError",
    "Diagnosis",
    "Event",
    "Finding",
    "GraphReleasedError",
    "HandleReleasedError",
    "Lifecycle",
    "PhaseNotSetError",
    "Recording",
    "RunRequest",
    "Trace",
    "TraceError",
    "TraceIndex",
    "Transition",
    "WarmSandbox",
    "aligned_seq",
    "build_builtin",
    "collapse_runs",
    "derived",
    "describe_event",
    "diagnose",
    "diagnose_all",
    "diagnose_handle",
    "diagnose_handle_in",
    "dot_svg",
    "event_column",
    "event_counts",
    "event_data",
    "event_rows",
    "explain",
    "filter_events",
    "format_bytes",
    "format_event",
    "input_words",
    "lessons",
    "lifecycle",
    "memory_peak",
    "memory_table",
    "microbatch_choices",
    "obtain_trace",
    "other_note",
    "palette",
    "pass_title",
    "phase_spans",
    "planned_vs_executed",
    "record",
    "record_in_subprocess",
    "refused_handles",
    "release_words",
    "render_graph",
    "render_lifecycles",
    "render_memory",
    "render_peaks",
    "render_perfetto",
    "render_routing",
    "render_stage_memory",
    "render_text",
    "render_timeline",
    "render_torchviz_view",
    "replay_checks_note",
    "routing_at",
    "routing_rows",
    "rows_text",
    "run_scenario",
    "stage_memory_rows",
    "subscribe",
    "tag",
    "timeline_actions",
]


# Public submodules that import torch (or transformers), reachable as `ckpt_viz.pipelining` after `import ckpt_viz`:
# imported on first access, like the names of `_LAZY`.
_SUBMODULES = ("hf", "pipelining")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")  # the import binds it here too
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
