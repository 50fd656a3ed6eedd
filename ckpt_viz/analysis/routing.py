"""DX/DW routing of one backward pass, as of a cursor: which handles replayed, where their gradients
went, what DW released; and who feeds whom among the checkpoint regions.

    r = routing_at(trace, seq)      -> Routing(phase="dx", handles=(3, 2, 1, 0), targets={3: (0,)}, ...)
    routing_rows(trace, seq)        -> one row per handle of that pass, in words
    handle_flow(snapshot, handles)  -> [("loss", 3, True), (3, 2, True), ...]
    reach_after(trace, snapshot)    -> Reach(dx={0, 1, ...}, dw={...}, missed_dw=(0, 1, 2))

The backward passes themselves are `ckpt_viz.analysis.passes` (NOTE [ Backward passes ]). Standard
library only; the drawing is `ckpt_viz.render.routing`.

NOTE [ Routing at a cursor ]
  1. `routing_at(trace, c)` describes the pass containing c, or the last one before c, as of c: a cursor
     in the middle of DX shows the handles routed so far. A handle is "replayed" once its replay finished
     (or stopped early), "replaying" before.
  2. Before any backward pass there is none (`Routing.start_seq` is None); `waiting` then says what the
     run is doing (the forward, or a backward of no checkpoint) so a page never calls a running backward
     "not started".

NOTE [ The flow of DX ]
  1. DX goes from block to block: the gradient of one region's input is the gradient of the output of the
     region that produced it. The graph snapshot taken last at or before the pass says who feeds whom: from
     each region, follow the edges through nodes of no region until another region, the model input, or a
     dead end.
  2. Without a snapshot covering the pass's handles (graphs=False, a pipeline stage's own graph), the
     handles are chained in the order the pass reached them, drawn dashed.

NOTE [ Reach that happened ]
  1. A snapshot's `dx_reached` / `dw_reached` say what a DX / DW pass *would* reach, read from the graph
     when the snapshot was taken, before the backward call it precedes. `reach_after(trace, snapshot, seq)`
     says what the backward calls after it did reach, as of the cursor `seq`: the calls of its window, from
     the snapshot to the next snapshot (or the end of the run).
  2. Nodes of no handle keep the snapshot's flags; so do the nodes of a handle the trace never created (it
     existed before the recording), of a non-reentrant frame that packed nothing (no unpack can show its
     reach), of torch's own checkpoint (observed: it emits no routing) and of any other kind of handle.
  3. A handle's nodes (its region and its backward trigger) were reached by DX (DW) when the window holds
     the handle's DX (DW) work: a `grads_routed`, a release by the backward (`dw_complete`,
     `ordinary_backward_complete`) or, for a non-reentrant frame, a `tensor_unpacked`; each counts in its
     part of the step (`ckpt_viz.analysis.passes`: DX, DW, or B for both).
  4. A window judges only what it was due to do for the handle. A split reentrant handle last set to phase
     dw awaits DW; set to dx, DX until its DX ran, then DW (its DW call may forget to set the phase). Any
     other handle (a split one still in phase ordinary too) awaits the parts the window's backward passes
     ran (a full backward, B: both). So a pipeline's first stage, whose DX reaches nothing (its input needs
     no gradient), is not blamed for it.
  5. Nothing is judged before every backward pass of the window has ended at the cursor, nor in a window
     without one: until then the snapshot's flags stand. A part awaited and not done is missed: its nodes
     lose that flag. A flag is never added to a node the snapshot did not mark.
  Example: tests/data/mistakes/missing-trigger. The snapshot before `torch.autograd.backward(loss,
  inputs=params)` marks h0-h2's checkpoint nodes and triggers reached by DW; the call reached none of them
  (no trigger among its inputs), so once it ended `missed_dw` is (0, 1, 2) and their nodes lose DW.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from ckpt_viz.analysis._cache import derived
from ckpt_viz.analysis.handles import created_events
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.passes import passes
from ckpt_viz.analysis.words import reason_word
from ckpt_viz.events import GradsRouted, PhaseSet, Released
from ckpt_viz.trace import GraphSnapshot, Trace

__all__ = ["Reach", "Routing", "handle_flow", "input_words", "no_pass_words", "pass_title", "reach_after",
           "routing_at", "routing_rows", "snapshot_before", "snapshot_relation"]

_PHASE_TITLE = {"dx": "DX pass (input grads)", "dw": "DW pass (weight grads)", "ordinary": "full backward"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """One backward pass as of a cursor (NOTE [ Routing at a cursor ]).

    Attributes:
        phase, start_seq, end_seq, site, stage, microbatch, rank: the pass (None when there is none yet).
        complete: the pass ended by the cursor.
        handles: entered or replayed, in order.
        replaying / replayed: replay started and not finished by the cursor / finished.
        targets: handle -> indices of its inputs that received gradients.
        explicit_params: handle -> indices of its parameter inputs given gradients.
        discarded: handle -> activation grads DW computed and dropped.
        captured / captured_missed: handle -> parameter names (or shapes) whose .grad its inner backward
            accumulated / did not.
        released, release_reasons, refused: what the pass released (and why), and whose replay it refused.
        waiting: with no pass yet, what the run is doing ("the forward", ...); else "".
    """

    phase: str | None = None
    start_seq: int | None = None
    end_seq: int | None = None
    site: str | None = None
    stage: Any = None
    microbatch: Any = None
    rank: Any = None
    complete: bool = True
    handles: tuple[int, ...] = ()
    replaying: tuple[int, ...] = ()
    replayed: tuple[int, ...] = ()
    targets: dict[int, tuple[int, ...]] = field(default_factory=dict)
    explicit_params: dict[int, tuple[int, ...]] = field(default_factory=dict)
    discarded: dict[int, tuple[int, ...]] = field(default_factory=dict)
    captured: dict[int, tuple[str, ...]] = field(default_factory=dict)
    captured_missed: dict[int, tuple[str, ...]] = field(default_factory=dict)
    released: tuple[int, ...] = ()
    release_reasons: dict[int, str] = field(default_factory=dict)
    refused: tuple[int, ...] = ()
    waiting: str = ""


_WAITING = {"F": "the forward", "DX": "a DX pass that reached no checkpoint yet",
            "DW": "a DW pass that reached no checkpoint yet", "B": "a backward that reached no checkpoint yet"}


def routing_at(trace: Trace, cursor: int | None) -> Routing:
    """The backward pass containing `cursor` (or the last one before it), as of `cursor`."""
    step = passes(trace)
    if cursor is None:
        cursor = step.backwards[-1].end_seq if step.backwards else (step.seqs[-1] if step.seqs else 0)
    chosen = step.backward_at(cursor)
    if chosen is None:
        part = step.part_at(cursor)
        return Routing(waiting=_WAITING.get(part, "") if part is not None else "")
    handles: list[int] = []
    replaying: list[int] = []
    replayed: list[int] = []
    targets: dict[int, tuple[int, ...]] = {}
    explicit: dict[int, tuple[int, ...]] = {}
    discarded: dict[int, tuple[int, ...]] = {}
    captured: dict[int, tuple[str, ...]] = {}
    missed: dict[int, tuple[str, ...]] = {}
    released: list[int] = []
    reasons: dict[int, str] = {}
    refused: list[int] = []
    events = trace.events
    for i in chosen.positions:
        e = events[i]
        if e.seq > cursor:
            break
        h = e.handle_id
        if h is None:
            continue
        if h not in handles and e.kind in ("backward_entered", "replay_started", "grads_routed", "tensor_unpacked"):
            handles.append(h)
        if e.kind == "replay_started" and h not in replaying and h not in replayed:
            replaying.append(h)
        elif e.kind in ("replay_finished", "early_stopped") and h in replaying:
            replaying.remove(h)
            replayed.append(h)
        elif isinstance(e, GradsRouted):
            targets[h] = e.targets
            explicit[h] = e.explicit_params
            if e.discarded_activations:
                discarded[h] = e.discarded_activations
            names = [(c.name or f"tensor{tuple(c.shape)}", c.accumulated) for c in e.captured]
            if names:
                captured[h] = tuple(n for n, hit in names if hit)
                missed[h] = tuple(n for n, hit in names if not hit)
        elif isinstance(e, Released):
            released.append(h)
            reasons[h] = e.reason
        elif e.kind == "replay_refused":
            refused.append(h)
    return Routing(phase=chosen.phase, start_seq=chosen.start_seq, end_seq=min(chosen.end_seq, cursor),
                   site=chosen.site, stage=chosen.stage, microbatch=chosen.microbatch, rank=chosen.rank,
                   complete=chosen.end_seq <= cursor, handles=tuple(handles), replaying=tuple(replaying),
                   replayed=tuple(replayed), targets=targets, explicit_params=explicit, discarded=discarded,
                   captured=captured, captured_missed=missed, released=tuple(released), release_reasons=reasons,
                   refused=tuple(refused))


def pass_title(r: Routing) -> str:
    """What the pass is, in words: phase, pipeline rank, stage and micro-batch, events, call site."""
    if r.start_seq is None:
        return f"no backward pass yet ({r.waiting} is running)" if r.waiting else "no backward pass yet"
    parts = [_PHASE_TITLE.get(r.phase or "ordinary", "backward pass")]
    where = [f"{name} {value}" for name, value in (("rank", r.rank), ("stage", r.stage), ("micro-batch", r.microbatch))
             if value is not None]
    if where:
        parts.append(", ".join(where))
    parts.append(f"events {r.start_seq}–{r.end_seq}" + ("" if r.complete else " (running)"))
    if r.site:
        parts.append(r.site)
    return " · ".join(parts)


def input_words(trace: Trace, h: int, index: int, *, parameter: bool = False) -> str:
    """A checkpoint input in words: "the block's input (512, 32)" or "input 2 of 3 (4, 4)"."""
    created = created_events(trace).get(h)
    inputs = created.inputs if created is not None else ()
    mask = created.param_input_mask if created is not None else ()
    shape = inputs[index].shape if index < len(inputs) else None
    size = f"({', '.join(str(d) for d in shape)})" if shape is not None else ""
    if parameter or (index < len(mask) and mask[index]):
        return f"parameter input {index + 1} {size}".rstrip()
    if len(inputs) <= 1:
        return f"the block's input {size}".rstrip()
    return f"input {index + 1} of {len(inputs)} {size}".rstrip()


def snapshot_before(trace: Trace, seq: int) -> GraphSnapshot | None:
    """The last graph snapshot at or before `seq` (the first one when none is)."""
    before = [g for g in trace.graphs if g.seq <= seq]
    return before[-1] if before else (trace.graphs[0] if trace.graphs else None)


def handle_flow(snapshot: GraphSnapshot | None, handles: Sequence[int]) -> list[tuple[Any, Any, bool]]:
    """Who feeds whom among `handles` (NOTE [ The flow of DX ]): (from, to, from the graph) triples.

    `to` is a handle id or "input" (the model input). The first handle also gets ("loss", first, ...).
    Triples from the graph have True; the fallback chain False.
    """
    if not handles:
        return []
    flow: list[tuple[Any, Any, bool]] = []
    if snapshot is not None:
        flow = _graph_flow(snapshot, set(handles))
    if not flow or not {h for edge in flow for h in edge[:2]} >= set(handles):
        chain: list[Any] = ["loss", *handles]
        return [(a, b, False) for a, b in pairwise(chain)]
    return flow


def _graph_flow(snapshot: GraphSnapshot, wanted: set[int]) -> list[tuple[Any, Any, bool]]:
    region = {n.id: n.handle_id for n in snapshot.nodes
              if n.kind != "trigger" and n.handle_id is not None and not n.replay}
    kind = {n.id: n.kind for n in snapshot.nodes}
    inner = {n.id for n in snapshot.nodes if n.replay}  # a retained replay: not the outer graph
    empty = {n.id for n in snapshot.nodes if n.shape is not None and 0 in n.shape}
    children: dict[Any, list[Any]] = {}
    has_parent: set[Any] = set()
    for s, d in snapshot.edges:
        children.setdefault(s, []).append(d)
        has_parent.add(d)

    def reached(starts: list[Any], owner: Any) -> list[Any]:
        found: list[Any] = []  # handle ids and "input"
        stack, seen = list(starts), set()
        while stack:
            nid = stack.pop()
            if nid in seen or nid in inner:
                continue
            seen.add(nid)
            h = region.get(nid)
            if h is not None and h != owner:
                found.append(h)
            elif h is None and kind.get(nid) == "input" and nid not in empty:
                found.append("input")
            elif h is None or h == owner:
                stack.extend(children.get(nid, ()))
        return found

    flow: list[tuple[Any, Any, bool]] = []
    roots = [n for n in children if n not in has_parent and n not in region]
    for h in reached(roots, None):
        if h in wanted and ("loss", h, True) not in flow:
            flow.append(("loss", h, True))
    for h in sorted(wanted, key=str):
        members = [nid for nid, owner in region.items() if owner == h]
        for to in reached(members, h):
            if (to in wanted or to == "input") and (h, to, True) not in flow:
                flow.append((h, to, True))
    return flow


def _state(h: int, r: Routing) -> str:
    if h in r.refused:
        return "replay refused"
    if h in r.released:
        return "released: " + reason_word(r.release_reasons.get(h))
    if h in r.replayed:
        return "replayed here"
    return "replaying" if h in r.replaying else "reached (no replay in this pass)"


def routing_rows(trace: Trace, cursor: int | None) -> list[dict[str, str]]:
    """Per handle of the pass at `cursor`: its state in the pass, where its DX went (and on to whom), its DW."""
    r = routing_at(trace, cursor)
    if r.start_seq is None:
        return []
    flow = handle_flow(snapshot_before(trace, r.start_seq), r.handles)
    onward = {a: b for a, b, _ in flow if a != "loss"}
    rows = []
    for h in r.handles:
        explicit = set(r.explicit_params.get(h, ()))
        if r.phase == "dw":
            dx = "none (DW pass)"
        elif h not in r.targets:
            dx = "not routed yet"
        else:
            words = [input_words(trace, h, i) for i in r.targets[h] if i not in explicit]
            dx = ", ".join(words) if words else "no inputs got a gradient"
            if words and h in onward:
                dx += ", on to " + ("the model input" if onward[h] == "input" else f"h{onward[h]}")
        rows.append({
            "handle": f"h{h}",
            "in this pass": _state(h, r),
            "DX went to": dx,
            "DW to parameter inputs": ", ".join(input_words(trace, h, i, parameter=True) for i in sorted(explicit))
            or "none",
            "parameters given .grad": ", ".join(r.captured.get(h, ())) or "none",
            "DX dropped (DW pass)": ", ".join(input_words(trace, h, i) for i in r.discarded.get(h, ())) or "none",
        })
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class Reach:
    """What the backward calls after a graph snapshot reached, as of a cursor (NOTE [ Reach that happened ]).

    Attributes:
        dx / dw: the ids of the snapshot's nodes reached by DX (input grads) / by DW (weight grads).
        missed_dx / missed_dw: the handles whose DX / DW the snapshot's flags promised and the run did not do.
    """

    dx: frozenset[Any]
    dw: frozenset[Any]
    missed_dx: tuple[int, ...] = ()
    missed_dw: tuple[int, ...] = ()


_DONE: dict[str, frozenset[str]] = {"DX": frozenset(("dx",)), "DW": frozenset(("dw",)), "B": frozenset(("dx", "dw"))}
_REACHING_RELEASES = frozenset(("dw_complete", "ordinary_backward_complete"))


def _work(trace: Trace) -> dict[str, Any]:
    """Per handle, its backward work (rule 3) as (seq, parts done) and its phases as (seq, phase); the handles
    that packed a tensor."""
    def build(t: Trace) -> dict[str, Any]:
        step = passes(t)
        work: dict[int, list[tuple[int, frozenset[str]]]] = {}
        phases: dict[int, list[tuple[int, str]]] = {}
        packed: set[int] = set()
        for i, e in enumerate(t.events):
            h = e.handle_id
            if h is None:
                continue
            if e.kind == "tensor_packed":
                packed.add(h)
            elif isinstance(e, PhaseSet):
                phases.setdefault(h, []).append((e.seq, e.new))
            elif isinstance(e, GradsRouted) or e.kind == "tensor_unpacked" or (
                    isinstance(e, Released) and e.reason in _REACHING_RELEASES):
                done = _DONE.get(step.of_event[i])
                if done:
                    work.setdefault(h, []).append((e.seq, done))
        return {"work": work, "phases": phases, "packed": packed}
    return derived(trace, "reach_work", build)


def reach_after(trace: Trace, snapshot: GraphSnapshot, seq: int | None = None) -> Reach:
    """Which of `snapshot`'s nodes the backward calls after it did reach by DX and by DW, as of `seq`.

    See NOTE [ Reach that happened ]: a handle's nodes keep a flag only if the handle's DX (DW) ran when it was
    due; every other node keeps the snapshot's flags.

    Args:
        trace: the run the snapshot belongs to.
        snapshot: one of `trace.graphs` (e.g. `snapshot_before(trace, seq)`).
        seq: the cursor (None: the end of the run).

    Returns:
        The nodes reached by DX and by DW, and the handles whose DX / DW was missed.
    """
    dx = {n.id for n in snapshot.nodes if n.dx_reached}
    dw = {n.id for n in snapshot.nodes if n.dw_reached}
    kept = Reach(dx=frozenset(dx), dw=frozenset(dw))
    step = passes(trace)
    end = min((g.seq for g in trace.graphs if g.seq > snapshot.seq), default=None)
    window = [b for b in step.backwards if b.start_seq >= snapshot.seq and (end is None or b.start_seq < end)]
    if not window or (seq is not None and max(b.end_seq for b in window) > seq):  # rule 5
        return kept
    ran: set[str] = set()
    for b in window:
        for i in b.positions:
            ran |= _DONE.get(step.of_event[i], frozenset())
    facts = _work(trace)
    created = created_events(trace)
    missed: dict[str, set[int]] = {"dx": set(), "dw": set()}
    for h in {n.handle_id for n in snapshot.nodes if n.handle_id is not None}:
        c = created.get(h)
        if c is None or c.runtime != "ckpt_viz" or c.mode not in ("reentrant", "nonreentrant") or (
                c.mode == "nonreentrant" and h not in facts["packed"]):  # rule 2
            continue
        work = facts["work"].get(h, ())
        before = {p for s, done in work if s < snapshot.seq for p in done}
        inside = {p for s, done in work if s >= snapshot.seq and (end is None or s < end) for p in done}
        phase = next((new for s, new in reversed(facts["phases"].get(h, ())) if s < snapshot.seq), "ordinary")
        if c.mode == "reentrant" and c.split and phase == "dw":  # rule 4
            due = {"dw"}
        elif c.mode == "reentrant" and c.split and phase == "dx":
            due = {"dx"} if "dx" not in before else {"dw"}
        else:
            due = ran
        for part in due - inside:
            missed[part].add(h)
    if not missed["dx"] and not missed["dw"]:
        return kept
    for n in snapshot.nodes:
        if n.handle_id in missed["dx"]:
            dx.discard(n.id)
        if n.handle_id in missed["dw"]:
            dw.discard(n.id)
    return Reach(dx=frozenset(dx), dw=frozenset(dw), missed_dx=tuple(sorted(missed["dx"])),
                 missed_dw=tuple(sorted(missed["dw"])))


def no_pass_words(trace: Trace, r: Routing) -> str:
    """What runs at a cursor where no backward pass has reached a checkpoint yet (`r.start_seq` is None), in a
    sentence built from `r.waiting` (NOTE [ Routing at a cursor ], rule 2): a running backward is never called
    "not started"."""
    if not lifecycle(trace).handle_ids:
        return "This run has no checkpoint handle: no backward pass routes gradients through a checkpoint."
    if r.waiting == "the forward":
        return "The forward is running here: no backward pass has started yet. Move the cursor forward."
    if r.waiting:
        return (f"{r.waiting[0].upper()}{r.waiting[1:]} is running here: its routing shows once it reaches a "
                "checkpoint. Move the cursor forward.")
    return "No backward pass has reached a checkpoint by this point. Move the cursor forward."


def snapshot_relation(trace: Trace, seq: int) -> str:
    """Where the graph snapshot shown at cursor `seq` (`snapshot_before`) was taken relative to the cursor, in
    words: "taken at seq 12, 9 seqs before the cursor (seq 21): the last one by then"; "" when the trace has
    none."""
    snapshot = snapshot_before(trace, seq)
    if snapshot is None:
        return ""
    if snapshot.seq == seq:
        return f"taken at seq {seq}, at the cursor"
    if snapshot.seq > seq:
        return (f"taken at seq {snapshot.seq}, {snapshot.seq - seq:,} seqs after the cursor (seq {seq}): none was "
                "taken by then")
    return (f"taken at seq {snapshot.seq}, {seq - snapshot.seq:,} seqs before the cursor (seq {seq}): the last one "
            "by then")
