"""`ckpt-viz info` and `ckpt-viz export`: read a saved trace (torch is never imported)."""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from ckpt_viz.recording import observed_mode
from ckpt_viz.trace.cache import event_column
from ckpt_viz.trace.lifecycle import STATE_MEANINGS, lifecycle

__all__ = ["export_command", "handle_states_block", "info_command", "summarize"]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def handle_states_block(trace: Any, at: int | None = None) -> list[str]:
    """The summary's "handle states" lines: how many handles are in each state at `at`, with its meaning."""
    head = f"handle states at {'the end' if at is None else f'event {at}'}:"
    return [head, *(f"  {state:<12} {n:>6}  {STATE_MEANINGS[state]}"
                    for state, n in lifecycle(trace).counts_at(at).items())]


def summarize(trace: Any, *, at: int | None = None) -> str:
    """The text `ckpt-viz info` prints: handles, replays, releases, states, peak memory by category, problems.

    Handle figures come from `ckpt_viz.trace.lifecycle`, as in the app: a non-reentrant frame
    counts as released (reason consumed or session_cleared) though no `released` event names it.

    Args:
        at: the event seq of the "handle states" block (inclusive); None: the end of the trace.
    """
    meta = trace.meta or {}
    mode = meta.get("mode") or observed_mode(trace)  # a record() block without model=: what its handles were
    lines = [f"model {meta.get('model', '?')}  mode {mode}"
             + (f"  schedule {meta['schedule']}" if meta.get("schedule") else ""),
             f"{len(trace.events)} events, {len(trace.memory)} memory samples, {len(trace.graphs)} graph snapshots"]
    if meta.get("partial"):  # a run stopped early (ckpt-viz record's time limit): say so before any figure
        lines.append(f"partial: {meta.get('partial_reason') or 'the run did not finish'}")
    life = lifecycle(trace)
    handles = life.handle_ids
    modes = event_column(trace, "mode")
    by_mode = Counter(modes[life.first_position(h)] or "?" for h in handles)
    lines.append(f"handles: {len(handles)} ({', '.join(f'{m} {n}' for m, n in sorted(by_mode.items()))})")
    blocks = Counter(e.data.get("function") for e in trace.events  # what each handle checkpointed, in order
                     if e.kind == "handle_created" and e.data.get("function"))
    if blocks:
        lines.append("blocks: " + ", ".join(name if n == 1 else f"{name} x{n}" for name, n in blocks.items()))
    if handles:
        replays = Counter(life.replays(h) for h in handles)
        lines.append(f"replays per handle: {', '.join(f'{c} x{n}' for c, n in sorted(replays.items()))}"
                     f"  (total {sum(life.replays(h) for h in handles)})")
        final = life.states_at(None)
        by_reason = Counter(life.reason_at(h, None) or "?" if final[h] == "released" else "not released"
                            for h in handles)
        lines.append("released: " + ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items())))
        lines.extend(handle_states_block(trace, at))
    if trace.memory:
        peak = max(trace.memory, key=lambda s: sum(s.bytes_by_category.values()))
        total = sum(peak.bytes_by_category.values())
        lines.append(f"peak memory {_fmt_bytes(total)} at event {peak.seq}:")
        for category, nbytes in sorted(peak.bytes_by_category.items(), key=lambda kv: -kv[1]):
            if nbytes:
                lines.append(f"  {category:<20} {_fmt_bytes(nbytes):>12}")
    kinds = Counter(event_column(trace, "kind"))
    lines.append("events: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    from ckpt_viz.diagnose import diagnose_all

    problems = diagnose_all(trace)
    lines.extend(_unobserved_lines(trace, meta, handles))
    if problems:
        lines.append(f"problems: {len(problems)}")
    elif handles:  # a partial trace, or one with unobserved regions, vouches only for what it holds
        lines.append("problems: none" + (" among the handles recorded"
                                         if meta.get("unobserved") or meta.get("partial") else ""))
    else:  # never "none" about a run nothing was seen of
        lines.append("problems: not checked: this trace holds no checkpoint handle")
        lines.append("  Tip: checkpoint inside the record() block (torch.utils.checkpoint, HF's "
                     "gradient_checkpointing_enable() or ckpt_viz.checkpoint); a run without checkpointing has "
                     "no handles to check.")
    lines.extend(f"  {'-' if d.handle_id is None else f'h{d.handle_id}'}: {d.code}: {d.summary}" for d in problems)
    if problems:
        lines.append("  (`ckpt-viz explain TRACE` tells what happened, in order, and the fix)")
    from ckpt_viz.debug.divergence import replay_checks_note

    note = replay_checks_note(trace)  # replays the divergence checks skipped: "none" says nothing of them
    if note:
        lines.append(note.splitlines()[0])
    return "\n".join(lines)


def _unobserved_lines(trace: Any, meta: dict[str, Any], handles: list[int]) -> list[str]:
    """What the recording could not see (meta "unobserved", NOTE [ Observing torch's checkpoint ], rule 4, in
    ckpt_viz/runtime/torch_observer.py), and, with no handle, the checkpoint nodes the graph snapshots show."""
    lines = []
    notes = meta.get("unobserved")
    for note in notes if isinstance(notes, list) else ():
        if isinstance(note, dict):
            count = note.get("count")
            lines.append(f"not observed: {note.get('what')}" + (f" ({count} calls)" if isinstance(count, int) else ""))
    if not handles:
        nodes = max((sum(1 for n in g.nodes if str(n.get("name", "")).startswith("CheckpointFunction"))
                     for g in trace.graphs), default=0)
        if nodes:
            lines.append(f"not observed: the graph snapshots hold {nodes} CheckpointFunctionBackward nodes that no "
                         "handle stands for (their forward ran before the record() block opened)")
    return lines


def info_command(args: argparse.Namespace) -> int:
    from ckpt_viz.trace import Trace

    print(summarize(Trace.load(args.trace), at=getattr(args, "at", None)))
    return 0


def export_command(args: argparse.Namespace) -> int:
    """Write the trace as Chrome trace-event JSON: the output folder is tried before the trace is read,
    and the file is written as `Trace.save` writes (fsync-ed, then renamed; `ckpt_viz.trace.files`)."""
    from ckpt_viz.render.perfetto import render_perfetto
    from ckpt_viz.trace import Trace
    from ckpt_viz.trace.files import check_writable, write_atomically

    if not args.perfetto:
        print("ckpt-viz export: nothing to export.\nTip: pass --perfetto out.json", file=sys.stderr)
        return 2
    check_writable(args.perfetto, "ckpt-viz export")
    trace = Trace.load(args.trace)
    doc = render_perfetto(trace.events, trace.memory, trace.meta)
    write_atomically(args.perfetto, json.dumps(doc).encode("ascii"), "ckpt-viz export")
    print(f"wrote {args.perfetto}: {len(doc['traceEvents'])} trace events "
          "(open it at ui.perfetto.dev or chrome://tracing)")
    return 0
