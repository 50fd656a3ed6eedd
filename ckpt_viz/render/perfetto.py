"""`render_perfetto`: a trace in the Chrome trace-event format that Perfetto and chrome://tracing open.

Pure function of the trace; standard library only.

Layout:
- one process per pipeline stage (stage 0 when the trace has none), one thread
  (track) per phase: "forward", "ordinary", "dx", "dw", "prefire";
- a trace whose events carry a `rank` tag (a merged multi-rank trace, `ckpt-viz merge`)
  instead has one process per rank and one track per stage of that rank; each schedule
  action (F, I, W, B: the events tagged with one step, stage, micro-batch and action)
  is a slice ("I mb2 (DX)") from its first event to its last, with the forwards,
  engine visits and replays of that action nested inside it (torch's metadata
  inference on the first step is one more: "META mb-1");
- complete slices ("X") for each handle's forward, each engine visit (backward
  entered -> grads routed / released) and each replay, nested inside the visit
  that triggered it; a track never holds two slices that overlap without nesting;
- a flow arrow from a `released` event to every later `replay_refused` of the same
  handle (why the replay was refused);
- memory counters ("C") when the trace has memory samples: one per category in a "memory"
  process; a merged trace's samples carry their rank, and each rank's counters are its own,
  in its process ("memory: activations" of rank 1), never summed over ranks; a sample's
  bytes per pipeline stage are one more counter per stage ("memory of stage 2"), in the
  stage's process (in-process runs) or its rank's.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ckpt_viz.events import Event
from ckpt_viz.trace import Trace

__all__ = ["TRACKS", "render_perfetto"]

TRACKS: tuple[str, ...] = ("forward", "ordinary", "dx", "dw", "prefire")
_MEMORY_PID = 1_000_000


def _us(t_ns: int, origin: int) -> float:
    return (t_ns - origin) / 1000.0


def _stage(event: Event) -> int:
    stage = event.tags.get("stage") if event.tags else None
    return int(stage) if isinstance(stage, int) else 0


def _label(event: Event) -> str:
    mb = event.tags.get("microbatch") if event.tags else None
    return f"h{event.handle_id}" + (f" mb{mb}" if mb is not None else "")


class _Tracks:
    """Open slices per (pid, tid); closes them as complete events and keeps nesting proper."""

    def __init__(self, origin: int) -> None:
        self.origin = origin
        self.events: list[dict[str, Any]] = []
        self.stacks: dict[tuple[int, int], list[tuple[Any, str, int, dict[str, Any]]]] = {}

    def open(self, pid: int, tid: int, key: Any, name: str, t_ns: int, args: dict[str, Any]) -> None:
        self.stacks.setdefault((pid, tid), []).append((key, name, t_ns, args))

    def close(self, pid: int, tid: int, key: Any, t_ns: int, extra: dict[str, Any] | None = None) -> bool:
        stack = self.stacks.get((pid, tid), [])
        if not any(k == key for k, *_ in stack):
            return False
        while stack:  # close inner slices first, so every slice nests inside its parent
            k, name, start, args = stack.pop()
            if extra and k == key:
                args = {**args, **extra}
            self.events.append({"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": _us(start, self.origin),
                                "dur": max(_us(t_ns, self.origin) - _us(start, self.origin), 0.001), "args": args})
            if k == key:
                return True
        return True

    def finish(self, t_ns: int) -> None:
        for (pid, tid), stack in self.stacks.items():
            while stack:
                key = stack[-1][0]
                self.close(pid, tid, key, t_ns, {"unfinished": True})


def _tid(name: str) -> int:
    return TRACKS.index(name) + 1


def _one_track(lane: int, name: str) -> int:
    return lane


_ACTION_NAMES = {"I": "I", "W": "W", "DX": "DX", "DW": "DW", "F": "F", "B": "B", "META": "META"}
_ACTION_PASS = {"I": " (DX)", "W": " (DW)", "META": " (metadata inference)"}


def _action_key(event: Event) -> tuple[Any, ...] | None:
    tags = event.tags or {}
    if tags.get("action") not in _ACTION_NAMES or not isinstance(tags.get("stage"), int):
        return None
    return (tags.get("rank"), tags.get("step"), tags["stage"], tags.get("microbatch"), tags["action"])


def _action_spans(events: list[Event]) -> tuple[dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]]]:
    """(first seq -> action key, last seq -> action key) of every schedule action of a ranked trace."""
    first: dict[tuple[Any, ...], int] = {}
    last: dict[tuple[Any, ...], int] = {}
    for e in events:
        key = _action_key(e)
        if key is not None:
            first.setdefault(key, e.seq)
            last[key] = e.seq
    return {v: k for k, v in first.items()}, {v: k for k, v in last.items()}


def render_perfetto(trace: Trace) -> dict[str, Any]:
    """The Chrome trace-event JSON object (a dict with "traceEvents") of `trace`: its events and memory counters."""
    events, memory, meta = list(trace.events), trace.memory, trace.meta
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ms", "metadata": dict(meta or {})}
    origin = events[0].t_ns
    tracks = _Tracks(origin)
    visits: dict[int | None, tuple[int, int]] = {}  # handle -> (pid, tid) of its open engine visit
    replays: dict[int | None, tuple[int, int]] = {}  # handle -> where its open replay slice is
    releases: dict[int | None, int] = {}
    flows: list[dict[str, Any]] = []
    stages: set[int] = set()
    ranked = any("rank" in (e.tags or {}) for e in events)
    lanes: dict[int, set[int]] = {}  # ranked: rank -> its stages
    opens, closes = _action_spans(events) if ranked else ({}, {})
    tid_of: Callable[[str], int]  # a phase track's tid
    for e in events:
        if ranked:  # one process per rank, one track per stage: every slice of a stage on it (nested)
            pid = int(e.tags.get("rank") or 0)
            stage = e.tags.get("stage")
            lane = stage + 1 if isinstance(stage, int) else 0  # 0: outside any stage (e.g. a late collection)
            lanes.setdefault(pid, set()).add(lane - 1)
            tid_of = functools.partial(_one_track, lane)  # the phase tracks fold into the stage's
            key = opens.get(e.seq)
            if key is not None:
                _, step, stage, mb, action = key
                tracks.open(pid, lane, ("action", key), f"{action} mb{mb}{_ACTION_PASS.get(action, '')}", e.t_ns,
                            {"step": step, "stage": stage, "microbatch": mb, "action": action, "seq": e.seq})
        else:
            pid, tid_of = _stage(e), _tid
            stages.add(pid)
        h = e.handle_id
        ts = _us(e.t_ns, origin)
        args = {"seq": e.seq, **({"site": e.site} if e.site else {})}
        if e.kind == "forward_started":
            tracks.open(pid, tid_of("forward"), ("fwd", h), f"F {_label(e)}", e.t_ns, args)
        elif e.kind in ("forward_finished", "forward_failed"):
            tracks.close(pid, tid_of("forward"), ("fwd", h), e.t_ns, {"end": e.kind})
        elif e.kind == "backward_entered":
            track = e.phase if e.phase in ("dx", "dw") else "ordinary"
            visits[h] = (pid, tid_of(track))
            name = {"dx": "DX", "dw": "DW"}.get(track, "B")
            tracks.open(pid, tid_of(track), ("visit", h), f"{name} {_label(e)}", e.t_ns, args)
        elif e.kind == "replay_started":
            if h in visits:
                where = visits[h]
            elif getattr(e, "trigger", None) == "prefire":
                where = (pid, tid_of("prefire"))
            else:  # a non-reentrant recompute inside the outer backward
                where = (pid, tid_of(e.phase if e.phase in ("dx", "dw") else "ordinary"))
            replays[h] = where
            tracks.open(*where, ("replay", h), f"replay {_label(e)}", e.t_ns,
                        {**args, "trigger": getattr(e, "trigger", None)})
        elif e.kind in ("replay_finished", "replay_failed") and h in replays:
            tracks.close(*replays.pop(h), ("replay", h), e.t_ns, {"end": e.kind})
        elif e.kind in ("grads_routed", "released", "error") and h in visits:
            tracks.close(*visits.pop(h), ("visit", h), e.t_ns, {"end": e.kind})
        if e.kind == "released":
            releases[h] = e.seq
            flows.append({"ph": "s", "id": e.seq, "name": "released", "cat": "release", "pid": pid,
                          "tid": tid_of("forward"), "ts": ts})
            reason = getattr(e, "reason", None)
            tracks.events.append({"ph": "i", "s": "t", "name": f"released {_label(e)}", "pid": pid,
                                  "tid": tid_of("forward"), "ts": ts, "args": {**args, "reason": reason}})
        elif e.kind == "replay_refused":
            reason = getattr(e, "reason", None)
            tracks.events.append({"ph": "i", "s": "t", "name": f"replay refused {_label(e)}", "pid": pid,
                                  "tid": tid_of("forward"), "ts": ts, "args": {**args, "reason": reason}})
            if h in releases:
                flows.append({"ph": "f", "bp": "e", "id": releases[h], "name": "released", "cat": "release",
                              "pid": pid, "tid": tid_of("forward"), "ts": ts})
        if ranked and e.seq in closes:
            tracks.close(pid, lane, ("action", closes[e.seq]), e.t_ns)
    tracks.finish(events[-1].t_ns)
    out = tracks.events + flows
    pooled = False  # a counter in the "memory" process
    for sample in memory or ():
        rank = getattr(sample, "rank", None)
        ts = _us(sample.t_ns, origin)
        pid = int(rank) if ranked and isinstance(rank, int) else _MEMORY_PID
        pooled = pooled or pid == _MEMORY_PID
        for category, nbytes in sample.bytes_by_category.items():
            out.append({"ph": "C", "name": f"memory: {category}", "pid": pid, "tid": 0, "ts": ts,
                        "args": {"bytes": nbytes}})
        for stage, cats in (getattr(sample, "by_stage", None) or {}).items():
            stage_pid = pid if pid != _MEMORY_PID else (int(stage) if str(stage).isdigit() else _MEMORY_PID)
            pooled = pooled or stage_pid == _MEMORY_PID
            out.append({"ph": "C", "name": f"memory of stage {stage}", "pid": stage_pid, "tid": 0, "ts": ts,
                        "args": {"bytes": sum(cats.values())}})
    if ranked:
        names = [{"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                  "args": {"name": f"rank {r} (stages {', '.join(str(s) for s in sorted(lanes[r]) if s >= 0)})"}}
                 for r in sorted(lanes)]
        names += [{"ph": "M", "name": "thread_name", "pid": r, "tid": st + 1,
                   "args": {"name": f"stage {st}" if st >= 0 else "outside any stage"}}
                  for r in sorted(lanes) for st in sorted(lanes[r])]
    else:
        names = [{"ph": "M", "name": "process_name", "pid": s, "tid": 0, "args": {"name": f"stage {s}"}}
                 for s in sorted(stages)]
        names += [{"ph": "M", "name": "thread_name", "pid": s, "tid": _tid(t), "args": {"name": t}}
                  for s in sorted(stages) for t in TRACKS]
    if pooled:
        names.append({"ph": "M", "name": "process_name", "pid": _MEMORY_PID, "tid": 0, "args": {"name": "memory"}})
    return {"traceEvents": names + out, "displayTimeUnit": "ms", "metadata": dict(meta or {})}
