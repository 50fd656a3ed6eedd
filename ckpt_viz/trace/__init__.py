"""`Trace`: what a recorded run leaves behind: events, memory samples, graph snapshots and meta.

One representation in memory and one file format. The events are the typed events of
`ckpt_viz.events`; memory samples and graph snapshots are typed the same way (frozen msgspec
Structs, checked field by field when a file is read). `Trace.save` and `Trace.load` are the file
format (`ckpt_viz.trace._codec`: the document and its checks; `ckpt_viz.trace.files`: bounded
reads, atomic writes). Standard library and msgspec only, so the app opens a saved trace without torch.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from os import PathLike
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ckpt_viz.events import Count, Event, EventBase, Id, Name, Nanos, Shape
from ckpt_viz.vocabulary import Kind, MemoryCategory, NodeKind, Phase

_KIND = attrgetter("kind")

__all__ = [
    "MAX_SOURCE_CHARS",
    "MAX_SOURCE_SITES",
    "SCHEMA_VERSION",
    "GraphNode",
    "GraphSnapshot",
    "MemorySample",
    "TorchvizEdge",
    "TorchvizGraph",
    "TorchvizNode",
    "Trace",
    "run_meta",
]

SCHEMA_VERSION = 3  # 3: typed events (one object per event, tagged by kind); 2 was the packed columns
MAX_SOURCE_SITES = 4096  # meta["sources"]: lines of code kept per trace (ckpt_viz/recording.py NOTE rule 7)
MAX_SOURCE_CHARS = 400  # and characters kept per line

Bytes = Annotated[int, Meta(ge=0, le=2**56)]  # one category's bytes: sums of a few stay far below 2**63
StageName = Annotated[str, Meta(max_length=64)]


class MemorySample(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """Bytes held, by category, right after event `seq` (several samples may share a seq, in time order).

    Attributes:
        seq: the event this reading follows.
        t_ns: monotonic nanoseconds of the reading.
        bytes_by_category: bytes per category; a category not measured is absent.
        device_allocated: the allocator's own total (e.g. `torch.cuda.memory_allocated()`), or None.
        by_stage: pipeline stage (as a string) -> bytes by category, for tensors made under
            `tag(stage=...)`; empty outside pipelines.
        at: what happened at this reading when no event says it (a block boundary, a peak between events).
        rank: the rank whose reading it is, in a merged distributed trace; else None.
    """

    seq: Count
    t_ns: Nanos
    bytes_by_category: dict[MemoryCategory, Bytes] = {}
    device_allocated: Bytes | None = None
    by_stage: Annotated[dict[StageName, dict[MemoryCategory, Bytes]], Meta(max_length=4096)] = {}
    at: Name | None = None
    rank: Annotated[int, Meta(ge=0, le=1 << 20)] | None = None

    @property
    def total_nbytes(self) -> int:
        """The sum over the categories."""
        return sum(self.bytes_by_category.values())


NodeRef = Count | Annotated[str, Meta(max_length=64)]


class GraphNode(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One node of an autograd graph snapshot.

    Attributes:
        id: the node's id within its snapshot.
        name: the backward node's type (`MulBackward0`), a parameter's qualified name, "input" or
            "backward_trigger".
        kind: backward op, parameter leaf, checkpoint node, backward trigger or input leaf.
        handle_id: the checkpoint this node belongs to (its region), or None.
        dx_reached / dw_reached: a DX pass (towards inputs) / a DW pass (towards parameters and
            triggers) goes through it.
        shape: a leaf's shape.
        replay: a node of a retained reentrant replay (drawn inside its handle's region).
        exclude: the excluded region it belongs to, or None.
        split / phase: a checkpoint node's handle facts when the snapshot was taken.
    """

    id: NodeRef
    name: Name
    kind: NodeKind = "backward"
    handle_id: Id | None = None
    dx_reached: bool = False
    dw_reached: bool = False
    shape: Shape | None = None
    replay: bool = False
    exclude: Id | None = None
    split: bool | None = None
    phase: Phase | None = None


class TorchvizNode(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """One node as `torchviz.make_dot` drew it: its label and torchviz's fill colour, nothing else."""

    id: Annotated[str, Meta(max_length=32, pattern=r"^n[0-9]+$")]
    label: Annotated[str, Meta(max_length=1024)]
    fill: Literal["lightblue", "orange", "darkolivegreen1", "darkolivegreen3"] | None = None


class TorchvizEdge(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """One edge as `torchviz.make_dot` drew it: a view's base (dotted) or a saved tensor (no arrow), else plain."""

    tail: Annotated[str, Meta(max_length=32, pattern=r"^n[0-9]+$")]
    head: Annotated[str, Meta(max_length=32, pattern=r"^n[0-9]+$")]
    style: Literal["dotted", "undirected"] | None = None


class TorchvizGraph(msgspec.Struct, frozen=True, gc=False):
    """`torchviz.make_dot`'s own drawing of a snapshot's roots, as data (never DOT text: see NOTE
    [ make_dot as data ] in ckpt_viz/probe/makedot.py)."""

    nodes: Annotated[tuple[TorchvizNode, ...], Meta(max_length=1 << 20)]
    edges: Annotated[tuple[TorchvizEdge, ...], Meta(max_length=1 << 22)]


class GraphSnapshot(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """The autograd graph as plain data at one point of the run.

    Attributes:
        seq: the event this snapshot follows.
        label: what the UI shows, e.g. "before autograd.backward #1".
        nodes: the graph's nodes.
        edges: (src, dst) node-id pairs, in the direction gradients flow.
        torchviz: `torchviz.make_dot`'s drawing of the same roots at snapshot time, or None.
    """

    seq: Annotated[int, Meta(ge=-1, le=2**62)]
    label: Name
    nodes: tuple[GraphNode, ...] = ()
    edges: tuple[tuple[NodeRef, NodeRef], ...] = ()
    torchviz: TorchvizGraph | None = None


@dataclass(eq=False)
class Trace:
    """A recorded run.

    Attributes:
        events: every event in emission order (seq 0, 1, 2, ...).
        memory: memory readings by category, in order.
        graphs: autograd graph snapshots, in order.
        meta: facts about the run: model, mode, schedule, versions, sources... (see `run_meta`).
    """

    events: list[Event] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    graphs: list[GraphSnapshot] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # results derived from this trace, each computed once (ckpt_viz.analysis); never saved
    _derived: dict[Any, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_events(cls, events: Iterable[Event], **meta: Any) -> Trace:
        """A trace holding `events` (copied into a list) and `meta`."""
        return cls(events=list(events), meta=dict(meta))

    # -- simple queries (the analysis of a run is ckpt_viz.analysis)

    def of_kind(self, *kinds: Kind | type[EventBase]) -> list[Event]:
        """The events of the given kinds (names such as "replay_started", or event types), in order."""
        return list(compress(self.events, self._of_kinds(kinds)))

    def positions(self, *kinds: Kind | type[EventBase]) -> list[int]:
        """The positions in `events` of the events of the given kinds, in order."""
        return list(compress(range(len(self.events)), self._of_kinds(kinds)))

    def _of_kinds(self, kinds: tuple[Kind | type[EventBase], ...]) -> Iterator[bool]:
        # whether each event is of one of `kinds`, computed in C (map, attrgetter): no Python step per event
        wanted = {k if isinstance(k, str) else k.kind for k in kinds}
        return map(wanted.__contains__, map(_KIND, self.events))

    def count(self, kind: Kind | type[EventBase]) -> int:
        """How many events of `kind` the trace holds."""
        wanted = kind if isinstance(kind, str) else kind.kind
        return list(map(_KIND, self.events)).count(wanted)

    def for_handle(self, handle_id: int) -> list[Event]:
        """The events about one handle, in order."""
        return [e for e in self.events if e.handle_id == handle_id]

    def handle_ids(self) -> list[int]:
        """Handle ids in order of first appearance."""
        return list(dict.fromkeys(e.handle_id for e in self.events if e.handle_id is not None))

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    # -- files (ckpt_viz.trace._codec)

    def to_json(self) -> bytes:
        """The trace file's bytes (uncompressed JSON), as `save` writes them.

        Raises:
            TraceError: a value is not JSON.
        """
        from ckpt_viz.trace._codec import encode

        return encode(self)

    @classmethod
    def from_json(cls, data: bytes | str, *, name: str = "<bytes>") -> Trace:
        """Validate a trace file's JSON and build the trace.

        Raises:
            TraceError: it is not a trace, is too old or too new, or a field is missing, ill-typed or out of range.
        """
        from ckpt_viz.trace._codec import decode

        return decode(data.encode() if isinstance(data, str) else data, name, "ckpt_viz.Trace.from_json")

    def save(self, path: str | PathLike[str]) -> None:
        """Write the trace as JSON (gzip when `path` ends with ".gz"), atomically (NOTE [ Atomic save ]).

        Raises:
            TraceError: the folder is missing or not writable, or the disk is full (a TraceFileError, also an
                OSError); nothing is written then and an existing file is untouched.
        """
        from ckpt_viz.trace._codec import save

        save(self, path)

    @classmethod
    def load(cls, path: str | PathLike[str], *, max_bytes: int | None = None,
             max_events: int | None = None) -> Trace:
        """Read a trace written by `save` (gzip or not; the content decides), checking every field.

        Reads only a regular file, at most `max_bytes` of JSON (after gzip; default 1 GiB, or the environment
        variable CKPT_VIZ_TRACE_MAX_BYTES) with at most `max_events` events (default 5,000,000, or
        CKPT_VIZ_TRACE_MAX_EVENTS).

        Raises:
            TraceError: the file is missing, not a regular file, over a cap, empty, truncated, not a trace, of
                another schema version, or invalid; the message names the field and the file.
        """
        from ckpt_viz.trace._codec import load

        return load(path, max_bytes=max_bytes, max_events=max_events)


def run_meta(*, model: str, mode: str, schedule: str | None = None, **extra: Any) -> dict[str, Any]:
    """The `meta` dict of a run: what ran, how, and with which versions.

    torch's version is included only if torch is already imported (this module never imports it).
    """
    from ckpt_viz.trace._codec import package_version

    versions = {"python": sys.version.split()[0], "ckpt_viz": package_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(getattr(torch, "__version__", "unknown"))
    return {"model": model, "mode": mode, "schedule": schedule, "versions": versions, **extra}
