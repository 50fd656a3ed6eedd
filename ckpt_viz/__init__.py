"""ckpt_viz: see, step through and debug PyTorch activation checkpointing with split DX/DW backward."""
from ckpt_viz.bus import subscribe, tag
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
from ckpt_viz.recording import Recording, record
from ckpt_viz.trace import Trace

__all__ = [
    "EVENT_KINDS",
    "RELEASE_REASONS",
    "CheckpointError",
    "CheckpointUsageError",
    "CkptVizError",
    "Event",
    "GraphReleasedError",
    "HandleReleasedError",
    "PhaseNotSetError",
    "Recording",
    "Trace",
    "TraceError",
    "record",
    "subscribe",
    "tag",
]
