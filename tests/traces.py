"""Hand-built traces for the renderer tests: no torch, every seq known in advance.

`Builder` appends typed events with consecutive seqs (and, on request, a memory sample
after each); each event is checked against its kind's declaration as it is built
(`msgspec.convert`, as a trace file is read). The scenario functions return small traces
whose seqs the tests name directly; their comments list the seqs.
"""
from __future__ import annotations

from typing import Any

import msgspec

from ckpt_viz.events import EVENT_TYPES, Event
from ckpt_viz.trace import GraphSnapshot, MemorySample, Trace

CATEGORIES = ("parameters", "gradients", "activations", "checkpoint_inputs", "replay_activations")


def event_of(kind: str, **fields: Any) -> Event:
    """The typed event of `kind` with `fields` (lists and dicts as a trace file holds them), checked."""
    return msgspec.convert({k: v for k, v in fields.items() if v is not None}, EVENT_TYPES[kind])  # type: ignore


def snapshot_of(**fields: Any) -> GraphSnapshot:
    """A `GraphSnapshot` from plain lists and dicts (nodes as dicts, edges as pairs), checked."""
    return msgspec.convert(fields, GraphSnapshot)


class Builder:
    """Appends events with seq 0, 1, 2, ... and t_ns 1000 * seq."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.memory: list[MemorySample] = []
        self.graphs: list[GraphSnapshot] = []

    def ev(self, kind: str, h: int | None = None, *, phase: str | None = None, mode: str | None = None,
           sid: Any = None, tags: dict | None = None, site: str | None = None, **fields: Any) -> Event:
        seq = len(self.events)
        event = event_of(kind, seq=seq, t_ns=1000 * seq, handle_id=h, mode=mode, phase=phase, session_id=sid,
                         tags=tags or {}, site=site, **fields)
        self.events.append(event)
        return event

    def mem(self, **nbytes: int) -> MemorySample:
        """A sample at the last event's seq."""
        seq = self.events[-1].seq
        sample = MemorySample(seq=seq, t_ns=1000 * seq, bytes_by_category={c: nbytes.get(c, 0) for c in CATEGORIES})
        self.memory.append(sample)
        return sample

    def trace(self, **meta: Any) -> Trace:
        return Trace(events=self.events, memory=self.memory, graphs=self.graphs, meta=dict(meta))


def split_trace() -> Trace:
    """Two split reentrant handles through forward, DX and DW (with memory and one graph snapshot).

    Seqs: 0-2 h0 forward, 3-5 h1 forward, 6-7 phase dx, 8-11 DX h1 (replay 9-10, routed 11),
    12-15 DX h0, 16-17 phase dw, 18-20 DW h1 (released 20), 21-23 DW h0 (released 23),
    24-25 node_collected h1, h0.
    """
    b = Builder()
    params = 2048
    for h, mb in ((0, 0), (1, 1)):
        tags = {"stage": 0, "microbatch": mb}
        kw = {"mode": "reentrant", "phase": "ordinary", "tags": tags}
        b.ev("handle_created", h, site="model.py:10", function="Block.forward", split=True, collector="scope",
             input_count=1, **kw)
        b.mem(parameters=params, checkpoint_inputs=128 * h)
        b.ev("forward_started", h, **kw)
        b.mem(parameters=params, checkpoint_inputs=128 * h, activations=256)
        b.ev("forward_finished", h, non_differentiable=[], exclude_entries=0, **kw)
        b.mem(parameters=params, checkpoint_inputs=128 * (h + 1))
    for h in (0, 1):
        b.ev("phase_set", h, phase="dx", mode="reentrant", site="train.py:20", old="ordinary", new="dx")
        b.mem(parameters=params, checkpoint_inputs=256)
    replay = 0
    for h in (1, 0):
        kw = {"mode": "reentrant", "phase": "dx", "site": "train.py:21"}
        b.ev("backward_entered", h, split=True, retain_graph=False, **kw)
        b.mem(parameters=params, checkpoint_inputs=256, replay_activations=replay)
        b.ev("replay_started", h, trigger="backward", **kw)
        b.mem(parameters=params, checkpoint_inputs=256, replay_activations=replay + 300)
        b.ev("replay_finished", h, trigger="backward", **kw)
        replay += 512
        b.mem(parameters=params, checkpoint_inputs=256, replay_activations=replay)
        b.ev("grads_routed", h, targets=[0], explicit_params=[], activations=[0], **kw)
        b.mem(parameters=params, checkpoint_inputs=256, replay_activations=replay)
    for h in (0, 1):
        b.ev("phase_set", h, phase="dw", mode="reentrant", site="train.py:22", old="dx", new="dw")
        b.mem(parameters=params, checkpoint_inputs=256, replay_activations=replay)
    grads = 0
    for h in (1, 0):
        kw = {"mode": "reentrant", "phase": "dw", "site": "train.py:23"}
        b.ev("backward_entered", h, split=True, retain_graph=False, **kw)
        b.mem(parameters=params, gradients=grads, checkpoint_inputs=256, replay_activations=replay)
        captured = [{"name": f"blocks.{h}.weight", "shape": [4, 4], "accumulated": True},
                    {"name": None, "shape": [4], "accumulated": False}]
        b.ev("grads_routed", h, targets=[], explicit_params=[], discarded_activations=[0], captured=captured, **kw)
        grads += 1024
        b.mem(parameters=params, gradients=grads, checkpoint_inputs=256, replay_activations=replay)
        b.ev("released", h, reason="dw_complete", was_replayed=True, **kw)
        replay -= 512
        b.mem(parameters=params, gradients=grads, checkpoint_inputs=256, replay_activations=replay)
    for h in (1, 0):
        b.ev("node_collected", h, mode="reentrant", phase="dw", was_replayed=True, released=True)
        b.mem(parameters=params, gradients=grads)
    b.graphs.append(block_snapshot(2, seq=6, label="before DX"))
    return b.trace(model="hand-built", mode="split-reentrant")


def refused_trace() -> Trace:
    """An unscoped handle: an ordinary backward releases it, a second backward is refused.

    Seqs: 0 created, 1-2 forward, 3 entered, 4-5 replay, 6 routed, 7 released,
    8 entered again, 9 replay_refused, 10 error.
    """
    b = Builder()
    kw = {"mode": "reentrant", "phase": "ordinary"}
    b.ev("handle_created", 0, site="train.py:5", function="mlp", split=False, collector="unified", input_count=1,
         **kw)
    b.ev("forward_started", 0, **kw)
    b.ev("forward_finished", 0, non_differentiable=[], exclude_entries=0, **kw)
    for kind, data in (("backward_entered", {"split": False, "retain_graph": False}),
                       ("replay_started", {"trigger": "backward"}), ("replay_finished", {"trigger": "backward"}),
                       ("grads_routed", {"targets": [0], "explicit_params": [], "activations": [0]}),
                       ("released", {"reason": "ordinary_backward_complete", "was_replayed": True})):
        b.ev(kind, 0, site="train.py:8", **kw, **data)
    b.ev("backward_entered", 0, site="train.py:9", split=False, retain_graph=False, **kw)
    b.ev("replay_refused", 0, site="train.py:9", reason="released", last_release_reason="ordinary_backward_complete",
         last_release_seq=7, **kw)
    b.ev("error", 0, site="train.py:9", where="backward", type="HandleReleasedError",
         message="ckpt_viz.checkpoint (backward): Cannot replay a released reentrant checkpoint h0",
         code="released_by_ordinary_backward", **kw)
    return b.trace(model="hand-built", mode="reentrant")


def nonreentrant_trace() -> Trace:
    """Frame h0 (2 saved tensors) recomputed in a retaining session for DX, consumed in DW, then cleared.

    Seqs: 0 created, 1 forward_started, 2-3 packed, 4 finished, 5 activated (retain),
    6-7 replay, 8-9 unpacked (kept), 10 deactivated, 11 activated (no retain),
    12-13 unpacked (consumed), 14 deactivated, 15 cleared; frame h1: 16 created,
    17-18 replay, 19 unpacked (kept), 20 session_cleared listing h1.
    """
    b = Builder()
    kw = {"mode": "nonreentrant"}
    b.ev("handle_created", 0, site="model.py:3", function="Block.forward", collector="unified", **kw)
    b.ev("forward_started", 0, **kw)
    for i in range(2):
        b.ev("tensor_packed", 0, index=i, shape=[4, 4], dtype="float32", nbytes=64, **kw)
    b.ev("forward_finished", 0, saved_count=2, **kw)
    b.ev("session_activated", sid="s", site="train.py:30", retain_on_unpack=True, handles=[0])
    b.ev("replay_started", 0, sid="s", site="train.py:31", trigger="backward", key_source="session", **kw)
    b.ev("replay_finished", 0, sid="s", site="train.py:31", trigger="backward", saved_count=2, **kw)
    for i in range(2):
        b.ev("tensor_unpacked", 0, sid="s", index=i, key_source="session", retain=True, consumed=False, **kw)
    b.ev("session_deactivated", sid="s", site="train.py:30", handles=[0])
    b.ev("session_activated", sid="s", site="train.py:32", retain_on_unpack=False, handles=[0])
    for i in range(2):
        b.ev("tensor_unpacked", 0, sid="s", index=i, key_source="session", retain=False, consumed=True, **kw)
    b.ev("session_deactivated", sid="s", site="train.py:32", handles=[0])
    b.ev("session_cleared", sid="s", site="train.py:33", handles=[], frames=[0])
    b.ev("handle_created", 1, site="model.py:3", function="Block.forward", collector="unified", **kw)
    b.ev("replay_started", 1, sid="t", trigger="backward", key_source="session", **kw)
    b.ev("replay_finished", 1, sid="t", trigger="backward", saved_count=2, **kw)
    b.ev("tensor_unpacked", 1, sid="t", index=0, key_source="session", retain=True, consumed=False, **kw)
    b.ev("session_cleared", sid="t", handles=[], frames=[1])
    return b.trace(model="hand-built", mode="split-nonreentrant")


def block_snapshot(n: int, *, replay: bool = False, seq: int = 0, label: str = "snapshot") -> GraphSnapshot:
    """`n` identical reentrant regions in a chain: loss -> h(n-1) -> ... -> h0 -> input.

    Each region: a checkpoint node with its dummy input and backward trigger and,
    with `replay`, a retained replay (AddmmBackward0 -> blocks.i.weight, blocks.i.bias).
    Node ids: 0 SumBackward0, 1 head.weight, 2 the input, then per region from 3.
    """
    nodes: list[dict[str, Any]] = [
        {"id": 0, "name": "SumBackward0", "kind": "backward", "handle_id": None, "dx_reached": True,
         "dw_reached": True, "shape": None},
        {"id": 1, "name": "head.weight", "kind": "leaf", "handle_id": None, "dx_reached": False,
         "dw_reached": True, "shape": [4, 4]},
        {"id": 2, "name": "input", "kind": "input", "handle_id": None, "dx_reached": True, "dw_reached": False,
         "shape": [2, 4]},
    ]
    edges: list[list[int]] = [[0, 1]]
    parent = 0
    for h in reversed(range(n)):
        base = len(nodes)
        nodes.append({"id": base, "name": "_CheckpointBackward", "kind": "checkpoint", "handle_id": h,
                      "dx_reached": True, "dw_reached": True, "shape": None, "split": True, "phase": "dx"})
        nodes.append({"id": base + 1, "name": "input", "kind": "input", "handle_id": None, "dx_reached": True,
                      "dw_reached": False, "shape": [0]})
        nodes.append({"id": base + 2, "name": "backward_trigger", "kind": "trigger", "handle_id": h,
                      "dx_reached": False, "dw_reached": True, "shape": [0]})
        edges += [[parent, base], [base, base + 1], [base, base + 2]]
        if replay:
            inner = [("AddmmBackward0", "backward", None), (f"blocks.{h}.weight", "leaf", [4, 4]),
                     (f"blocks.{h}.bias", "leaf", [4])]
            for k, (name, kind, shape) in enumerate(inner):
                nodes.append({"id": base + 3 + k, "name": name, "kind": kind, "handle_id": h, "dx_reached": False,
                              "dw_reached": False, "shape": shape, "replay": True})
            edges += [[base, base + 3], [base + 3, base + 4], [base + 3, base + 5]]
        parent = base
    edges.append([parent, 2])
    return snapshot_of(seq=seq, label=label, nodes=nodes, edges=edges)


# Events that take a handle from its creation to each state (NOTE [ Handle states ]): (kind, phase, fields).
_TO_STATE: dict[str, list[tuple[str, str | None, dict[str, Any]]]] = {
    "recorded": [],
    "phase_dx": [("phase_set", "dx", {"old": "ordinary", "new": "dx"})],
    "phase_dw": [("phase_set", "dw", {"old": "ordinary", "new": "dw"})],
    "replaying": [("replay_started", "ordinary", {"trigger": "backward"})],
    "replayed": [("replay_started", "ordinary", {"trigger": "backward"}),
                 ("replay_finished", "ordinary", {"trigger": "backward"})],
    "retained": [("replay_started", "dx", {"trigger": "backward"}), ("replay_finished", "dx", {"trigger": "backward"}),
                 ("grads_routed", "dx", {"targets": [0]})],
    "released": [("replay_started", "ordinary", {"trigger": "backward"}),
                 ("replay_finished", "ordinary", {"trigger": "backward"}),
                 ("released", "ordinary", {"reason": "ordinary_backward_complete", "was_replayed": True})],
    "collected": [("node_collected", "ordinary", {})],
}


def with_states(snapshot: GraphSnapshot, states: dict[int, str], *, refused: tuple[int, ...] = ()) -> Trace:
    """A trace holding `snapshot` whose events put each handle of `states` in that state (the end of the trace),
    and refuse a replay of each handle of `refused` (after releasing it, unless `states` says otherwise)."""
    b = Builder()
    for h, state in states.items():
        b.ev("handle_created", h, mode="reentrant", phase="ordinary", function="Block.forward")
        for kind, phase, fields in _TO_STATE[state]:
            b.ev(kind, h, mode="reentrant", phase=phase, **fields)
    for h in refused:
        if h not in states:
            b.ev("handle_created", h, mode="reentrant", phase="ordinary", function="Block.forward")
            b.ev("released", h, mode="reentrant", phase="ordinary", reason="explicit_release")
        b.ev("replay_refused", h, mode="reentrant", phase="ordinary", reason="released")
    trace = b.trace(model="hand-built")
    trace.graphs = [snapshot]
    return trace


def synthetic_trace(n_events: int, *, concurrent: int = 1000, memory_every: int = 10) -> Trace:
    """`n_events` events: waves of `concurrent` split handles, each through 13 lifecycle steps, interleaved.

    In wave w, event i concerns handle w * concurrent + i % concurrent at step
    (i // concurrent) % 13, so about n_events / 13 handles in all; a memory sample
    every `memory_every` events.
    """
    steps = ("handle_created", "forward_started", "forward_finished", "phase_set", "backward_entered",
             "replay_started", "replay_finished", "grads_routed", "phase_set", "backward_entered", "grads_routed",
             "released", "node_collected")
    fields: list[dict[str, Any]] = [{} for _ in steps]
    fields[3], fields[8] = {"old": "ordinary", "new": "dx"}, {"old": "dx", "new": "dw"}
    fields[5] = fields[6] = {"trigger": "backward"}
    fields[11] = {"reason": "dw_complete", "was_replayed": True}
    types = [EVENT_TYPES[k] for k in steps]
    events = []
    memory = []
    wave_size = 13 * concurrent
    for i in range(n_events):
        step = (i // concurrent) % 13
        h = (i // wave_size) * concurrent + i % concurrent
        events.append(types[step](seq=i, t_ns=i, handle_id=h, mode="reentrant", phase="dx" if step < 8 else "dw",
                                  **fields[step]))
        if i % memory_every == 0:
            memory.append(MemorySample(seq=i, t_ns=i, bytes_by_category={"activations": i % 977, "parameters": 64}))
    return Trace(events=events, memory=memory, meta={"model": "synthetic"})


def typed_event(kind: str, **fields: Any) -> Event:
    """`event_of`, and a field its kind does not declare is an error (a test never passes a fact the event drops)."""
    unknown = set(fields) - set(EVENT_TYPES[kind].__struct_fields__)  # type: ignore[index]
    if unknown:
        raise TypeError(f"{kind} has no field(s) {sorted(unknown)}")
    return event_of(kind, **fields)


def kinds(trace: Trace) -> list[str]:
    """The kind of every event of `trace`, in order."""
    return [e.kind for e in trace.events]
