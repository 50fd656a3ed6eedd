"""`render_perfetto`: a trace in the Chrome trace-event format that Perfetto and chrome://tracing open.

Pure function of the trace; standard library only.

Layout:
- one process per pipeline stage (stage 0 when the trace has none), one thread
  (track) per phase: "forward", "ordinary", "dx", "dw", "prefire";
- complete slices ("X") for each handle's forward, each engine visit (backward
  entered -> grads routed / released) and each replay, nested inside the visit
  that triggered it; a track never holds two slices that overlap without nesting;
- a flow arrow from a `released` event to every later `replay_refused` of the same
  handle (why the replay was refused);
- one counter track ("C") per memory category when the trace has memory samples.
"""
from __future__ import annotations

from typing import Any

from ckpt_viz.events import Event

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
        self.stacks: dict[tuple[int, int], list[tuple[Any, str, int, dict]]] = {}

    def open(self, pid: int, tid: int, key: Any, name: str, t_ns: int, args: dict) -> None:
        self.stacks.setdefault((pid, tid), []).append((key, name, t_ns, args))

    def close(self, pid: int, tid: int, key: Any, t_ns: int, extra: dict | None = None) -> bool:
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


def render_perfetto(events: list[Event], memory: list[Any] = (), meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the Chrome trace-event JSON object (a dict with "traceEvents")."""
    events = list(events)
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ms", "metadata": dict(meta or {})}
    origin = events[0].t_ns
    tracks = _Tracks(origin)
    visits: dict[int, tuple[int, int]] = {}  # handle -> (pid, tid) of its open engine visit
    replays: dict[int, tuple[int, int]] = {}  # handle -> where its open replay slice is
    releases: dict[int, int] = {}
    flows: list[dict[str, Any]] = []
    stages: set[int] = set()
    for e in events:
        pid = _stage(e)
        stages.add(pid)
        h = e.handle_id
        ts = _us(e.t_ns, origin)
        args = {"seq": e.seq, **({"site": e.site} if e.site else {})}
        if e.kind == "forward_started":
            tracks.open(pid, _tid("forward"), ("fwd", h), f"F {_label(e)}", e.t_ns, args)
        elif e.kind in ("forward_finished", "forward_failed"):
            tracks.close(pid, _tid("forward"), ("fwd", h), e.t_ns, {"end": e.kind})
        elif e.kind == "backward_entered":
            track = e.phase if e.phase in ("dx", "dw") else "ordinary"
            visits[h] = (pid, _tid(track))
            name = {"dx": "DX", "dw": "DW"}.get(track, "B")
            tracks.open(pid, _tid(track), ("visit", h), f"{name} {_label(e)}", e.t_ns, args)
        elif e.kind == "replay_started":
            if h in visits:
                where = visits[h]
            elif e.data.get("trigger") == "prefire":
                where = (pid, _tid("prefire"))
            else:  # a non-reentrant recompute inside the outer backward
                where = (pid, _tid(e.phase if e.phase in ("dx", "dw") else "ordinary"))
            replays[h] = where
            tracks.open(*where, ("replay", h), f"replay {_label(e)}", e.t_ns,
                        {**args, "trigger": e.data.get("trigger")})
        elif e.kind in ("replay_finished", "replay_failed") and h in replays:
            tracks.close(*replays.pop(h), ("replay", h), e.t_ns, {"end": e.kind})
        elif e.kind in ("grads_routed", "released", "error") and h in visits:
            tracks.close(*visits.pop(h), ("visit", h), e.t_ns, {"end": e.kind})
        if e.kind == "released":
            releases[h] = e.seq
            flows.append({"ph": "s", "id": e.seq, "name": "released", "cat": "release", "pid": pid,
                          "tid": _tid("forward"), "ts": ts})
            tracks.events.append({"ph": "i", "s": "t", "name": f"released {_label(e)}", "pid": pid,
                                  "tid": _tid("forward"), "ts": ts, "args": {**args, "reason": e.data.get("reason")}})
        elif e.kind == "replay_refused":
            tracks.events.append({"ph": "i", "s": "t", "name": f"replay refused {_label(e)}", "pid": pid,
                                  "tid": _tid("forward"), "ts": ts, "args": {**args, "reason": e.data.get("reason")}})
            if h in releases:
                flows.append({"ph": "f", "bp": "e", "id": releases[h], "name": "released", "cat": "release",
                              "pid": pid, "tid": _tid("forward"), "ts": ts})
    tracks.finish(events[-1].t_ns)
    out = tracks.events + flows
    for sample in memory or ():
        for category, nbytes in sample.bytes_by_category.items():
            out.append({"ph": "C", "name": f"memory: {category}", "pid": _MEMORY_PID, "tid": 0,
                        "ts": _us(sample.t_ns, origin), "args": {"bytes": nbytes}})
    names = [{"ph": "M", "name": "process_name", "pid": s, "tid": 0, "args": {"name": f"stage {s}"}}
             for s in sorted(stages)]
    names += [{"ph": "M", "name": "thread_name", "pid": s, "tid": _tid(t), "args": {"name": t}}
              for s in sorted(stages) for t in TRACKS]
    if memory:
        names.append({"ph": "M", "name": "process_name", "pid": _MEMORY_PID, "tid": 0, "args": {"name": "memory"}})
    return {"traceEvents": names + out, "displayTimeUnit": "ms", "metadata": dict(meta or {})}
