"""The trace's record types: a memory reading, a graph snapshot, and the vocabularies they use.

Plain frozen dataclasses and tuples; standard library only. The column storage a
loaded trace keeps them in is `ckpt_viz.trace.columns`; the `Trace` that holds them
is `ckpt_viz.trace.model`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "CONTEXT_FIELDS",
    "MEMORY_CATEGORIES",
    "NODE_KINDS",
    "GraphSnapshot",
    "MemorySample",
    "TraceParts",
]

MEMORY_CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer_state",
    "optimizer_step",
    "activations",
    "checkpoint_inputs",
    "replay_activations",
    "excluded_outputs",
    "inputs",
    "outputs",
    "other",
)
NODE_KINDS: tuple[str, ...] = ("backward", "leaf", "checkpoint", "trigger", "input")
# The Event fields an EventColumns stores together, as one index into tables["context"].
CONTEXT_FIELDS: tuple[str, ...] = ("kind", "mode", "phase", "site", "thread_id")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySample:
    """Bytes held, by category, right after event `seq`.

    Attributes:
        seq: the event this reading belongs to.
        t_ns: monotonic nanoseconds of the reading.
        bytes_by_category: bytes per category in `MEMORY_CATEGORIES`; a category
            that was not measured is absent.
        device_allocated: the allocator's own total (e.g. `torch.cuda.memory_allocated()`), or None.
        by_stage: pipeline stage (as a string) -> bytes by category, for tensors
            made under `tag(stage=...)`; empty outside pipelines.
    """

    seq: int
    t_ns: int
    bytes_by_category: dict[str, int] = field(default_factory=dict)
    device_allocated: int | None = None
    by_stage: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def total_nbytes(self) -> int:
        """The sum over the categories."""
        return sum(self.bytes_by_category.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSnapshot:
    """The autograd graph as plain data at one point of the run.

    Attributes:
        seq: the event this snapshot belongs to.
        label: what the UI shows, e.g. "after forward".
        nodes: dicts with keys id (int or str), name, kind (one of `NODE_KINDS`),
            handle_id (int or None), dx_reached (bool), dw_reached (bool) and
            shape (list of ints or None). Extra keys are kept.
        edges: [src, dst] node-id pairs, in the direction gradients flow.
        torchviz: the DOT source `torchviz.make_dot` drew of the same graph at
            snapshot time (see `ckpt_viz.probe.graph`), or None (older traces,
            torchviz missing), so a saved trace shows it without torch.

    JSON has no tuples: a tuple shape or edge comes back from a file as a list.
    """

    seq: int
    label: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    edges: list[list[Any]] = field(default_factory=list)
    torchviz: str | None = None


class TraceParts(Protocol):
    """What the file format reads of a trace: the four fields of `ckpt_viz.trace.Trace`.

    `ckpt_viz.trace.document` and `ckpt_viz.trace.io` work on these parts (and hand
    back a dict of them), so they never import the `Trace` class: the dependency goes
    one way, from `Trace.save`/`Trace.load` to the file format.
    """

    events: Sequence[Any]
    memory: Sequence[Any]
    graphs: Sequence[Any]
    meta: dict[str, Any]
