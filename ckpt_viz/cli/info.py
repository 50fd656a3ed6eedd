"""`ckpt-viz info` and `ckpt-viz export`: read a saved trace (torch is never imported)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["export_command", "info_command", "summarize"]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def summarize(trace: Any) -> str:
    """The text `ckpt-viz info` prints: handles, replays, releases, peak memory by category, problems."""
    meta = trace.meta or {}
    lines = [f"model {meta.get('model', '?')}  mode {meta.get('mode', '?')}"
             + (f"  schedule {meta['schedule']}" if meta.get("schedule") else ""),
             f"{len(trace.events)} events, {len(trace.memory)} memory samples, {len(trace.graphs)} graph snapshots"]
    created: dict[int, str] = {}
    replays: dict[int, int] = {}
    reasons: dict[int, str] = {}
    kinds: dict[str, int] = {}
    for e in trace.events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
        if e.kind == "handle_created":
            created[e.handle_id] = e.mode or "?"
        elif e.kind == "replay_started":
            replays[e.handle_id] = replays.get(e.handle_id, 0) + 1
        elif e.kind == "released":
            reasons[e.handle_id] = e.data.get("reason", "?")
    lines.append(f"handles: {len(created)} "
                 f"({', '.join(f'{m} {list(created.values()).count(m)}' for m in sorted(set(created.values())))})")
    if created:
        counts = sorted(set(replays.get(h, 0) for h in created))
        lines.append(f"replays per handle: {', '.join(f'{c} x{[replays.get(h, 0) for h in created].count(c)}' for c in counts)}"
                     f"  (total {sum(replays.values())})")
        by_reason: dict[str, int] = {}
        for h in created:
            by_reason[reasons.get(h, "not released")] = by_reason.get(reasons.get(h, "not released"), 0) + 1
        lines.append("released: " + ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items())))
    if trace.memory:
        peak = max(trace.memory, key=lambda s: sum(s.bytes_by_category.values()))
        total = sum(peak.bytes_by_category.values())
        lines.append(f"peak memory {_fmt_bytes(total)} at event {peak.seq}:")
        for category, nbytes in sorted(peak.bytes_by_category.items(), key=lambda kv: -kv[1]):
            if nbytes:
                lines.append(f"  {category:<20} {_fmt_bytes(nbytes):>12}")
    lines.append("events: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    from ckpt_viz.diagnose import diagnose_all

    problems = diagnose_all(trace)
    lines.append(f"problems: {len(problems)}" if problems else "problems: none")
    lines.extend(f"  h{d.handle_id}: {d.code}: {d.summary}" for d in problems)
    return "\n".join(lines)


def info_command(args: argparse.Namespace) -> int:
    from ckpt_viz.trace import Trace

    print(summarize(Trace.load(args.trace)))
    return 0


def export_command(args: argparse.Namespace) -> int:
    from ckpt_viz.render.perfetto import render_perfetto
    from ckpt_viz.trace import Trace

    if not args.perfetto:
        print("ckpt-viz export: nothing to export.\nTip: pass --perfetto out.json", file=sys.stderr)
        return 2
    trace = Trace.load(args.trace)
    doc = render_perfetto(trace.events, trace.memory, trace.meta)
    target = Path(args.perfetto)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, target)
    print(f"wrote {target}: {len(doc['traceEvents'])} trace events (open it at ui.perfetto.dev or chrome://tracing)")
    return 0
