"""ckpt_viz: see, step through and debug PyTorch activation checkpointing with split DX/DW backward.

The names here are what a user calls or catches. `import ckpt_viz` imports neither torch nor a chart
library, so a saved trace opens without them: the names that run models load torch on first use
(`_LAZY`). The app and the lessons use the public submodules (`ckpt_viz.analysis`, `ckpt_viz.render`,
`ckpt_viz.trace`, `ckpt_viz.events`, `ckpt_viz.vocabulary`, ...), each with its own `__all__`.
"""
from __future__ import annotations as _annotations

import importlib as _importlib
import typing as _typing

from ckpt_viz.bus import tag
from ckpt_viz.errors import (
    CheckpointError,
    CheckpointUsageError,
    CkptVizError,
    GraphReleasedError,
    HandleReleasedError,
    PhaseNotSetError,
    RecordingError,
    TraceError,
)
from ckpt_viz.recording import Recording, record
from ckpt_viz.trace import Trace

if _typing.TYPE_CHECKING:  # what `_LAZY` loads, spelled out for type checkers and editors
    from ckpt_viz import hf, pipelining
    from ckpt_viz.analysis.diagnosis import diagnose, explain
    from ckpt_viz.analysis.findings import Finding
    from ckpt_viz.runtime import (
        backward_input,
        backward_weight,
        checkpoint,
        checkpoint_exclude_wrapper,
        clear_recompute_session,
        recompute_handle,
        recompute_handle_collector_ctx,
        recompute_session_ctx,
        reentrant_checkpoint_scope,
    )

# name -> the module that defines it (a module itself where the value is ""), imported on first access (PEP 562)
_LAZY = {
    "Finding": "ckpt_viz.analysis.findings",
    "diagnose": "ckpt_viz.analysis.diagnosis",
    "explain": "ckpt_viz.analysis.diagnosis",
    "backward_input": "ckpt_viz.runtime",
    "backward_weight": "ckpt_viz.runtime",
    "checkpoint": "ckpt_viz.runtime",
    "checkpoint_exclude_wrapper": "ckpt_viz.runtime",
    "clear_recompute_session": "ckpt_viz.runtime",
    "recompute_handle": "ckpt_viz.runtime",
    "recompute_handle_collector_ctx": "ckpt_viz.runtime",
    "recompute_session_ctx": "ckpt_viz.runtime",
    "reentrant_checkpoint_scope": "ckpt_viz.runtime",
}

__all__ = [
    "CheckpointError",
    "CheckpointUsageError",
    "CkptVizError",
    "Finding",
    "GraphReleasedError",
    "HandleReleasedError",
    "PhaseNotSetError",
    "Recording",
    "RecordingError",
    "Trace",
    "TraceError",
    "backward_input",
    "backward_weight",
    "checkpoint",
    "checkpoint_exclude_wrapper",
    "clear_recompute_session",
    "diagnose",
    "explain",
    "hf",
    "pipelining",
    "recompute_handle",
    "recompute_handle_collector_ctx",
    "recompute_session_ctx",
    "record",
    "reentrant_checkpoint_scope",
    "tag",
]


# Public submodules that import torch (or transformers), reachable as `ckpt_viz.pipelining` after `import ckpt_viz`:
# imported on first access, like the names of `_LAZY`.
_SUBMODULES = ("hf", "pipelining")


def __getattr__(name: str) -> _typing.Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # the import binds it here too
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _LAZY[name]
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
