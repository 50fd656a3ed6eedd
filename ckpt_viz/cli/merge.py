"""`ckpt-viz merge DIR`: the per-rank trace files of one distributed run as one trace with a rank dimension.

Owns `find_rank_files`, `merge_traces` (pure: rank traces in, merged trace and its alignment report
out) and `merge_command`. Standard library only (torch-free): it reads the files that
`ckpt_viz.distributed.save_rank_trace` wrote (`<dir>/<run id>/rank-<R>.json`, header in
`meta["distributed"]`) and writes the merged trace atomically (`Trace.save`).

NOTE [ Merging rank traces ]
  1. Clocks: rank r's event time t (its monotonic ns) becomes rank 0's clock as t + offset(t).
     offset is the header's Cristian estimate `clock.offset_to_rank0_ns`; when the header also
     holds an end anchor (`clock_end`, measured again at save time) the offset is fitted as a
     line between the two (drift). A header without an offset falls back to the wall-clock
     anchors (NTP): offset = (wall_r - mono_r) - (wall_0 - mono_0).
  2. The alignment is checked by the pipeline's own order: a stage receives only what another
     stage sent, so the first event of F(s+1, m) comes after the last event of F(s, m), and the
     first event of I|B(s-1, m) after the last event of I|B(s, m) (same step). Each such edge
     between two ranks has a slack (consumer's first event minus producer's last event);
     a negative slack is a receive before its send, i.e. a clock error of at least that much.
     Only a slack below minus the two ranks' offset uncertainty counts: a Cristian offset is
     known to within half its round trip (`clock.rtt_ns` / 2), and a producer's last event is
     written after its send returned, when the consumer may already have its data (a few
     microseconds on a busy machine).
  3. Events are merged in aligned-time order (ties: rank, then the rank's own order), renumbered
     seq 0..N-1, and keep their tags with `rank` set. Handle ids are per rank in the files;
     they are renumbered (rank, id) -> one id, in order of first appearance, in `handle_id`,
     in the session events' `handles` and `frames`, and in the graph snapshots' nodes; the
     seqs a `replay_refused` names (`last_release_seq`, `collected_seq`) are renumbered too.
  4. Memory: each rank's samples are kept as they are, renumbered and aligned like its events,
     with `MemorySample.rank` set (stage indices in `by_stage` are global). The run's reading
     at a point is the sum of every rank's latest sample: `ckpt_viz.analysis.memory.memory`
     sums them, `rank_memory` keeps them apart.
  5. Headers are checked before use: every field the merge reads has its type (a wrong one
     is refused naming the field and the file), `world_size` is at most `MAX_WORLD_SIZE`
     and every file's rank is below it, and the run id is a plain name.
  6. Partial runs (`--partial`, NOTE [ Partial runs ] in ckpt_viz/distributed.py): the
     ranks present are merged; `meta["distributed"]["missing_ranks"]` lists the ranks
     without a file and `meta["partial"]` = {"missing_ranks", "ranks": {rank: that rank's
     own `meta["partial"]`}}. The clocks are rank 0's when it is present, else those of
     the lowest rank present (each offset is to rank 0's clock, so they stay consistent).
     Without `--partial` a missing rank is refused, as before.
  7. Meta: each field of the merged `meta` is combined from every rank's (`_merged_meta`):
     `sources` joined, `replay_checks` summed (with each rank's counts under `by_rank`),
     `stages` the sorted union, `partial` as in rule 6, `schedule` / `microbatches` from
     the headers; any other field is kept when every rank has the same value, and
     otherwise moved to `meta["by_rank"][field] = {rank: value}` (never rank 0's alone).
"""
from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable
from typing import Any

import msgspec

from ckpt_viz.errors import TraceError
from ckpt_viz.events import Event, ReplayRefused, SessionActivated, SessionCleared, SessionDeactivated
from ckpt_viz.trace import GraphSnapshot, MemorySample, Trace

__all__ = ["MAX_WORLD_SIZE", "check_order", "find_rank_files", "merge_command", "merge_run", "merge_traces",
           "merged_meta", "rank_headers"]

_API = "ckpt-viz merge"
_RANK_FILE = re.compile(r"^rank-(\d+)\.json(\.gz)?$")


_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # ckpt_viz.distributed's run ids (NOTE [ Run ids ])
MAX_WORLD_SIZE = 65536  # NOTE [ Merging rank traces ], rule 5




def _is_int(value: Any) -> bool:
    return type(value) is int


def _check(ok: bool, field: str, value: Any, expected: str, file: str) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise _fail(f"{file}: meta.distributed.{field} is {type(value).__name__} {shown}, expected {expected}.",
                    "this rank file was not written by ckpt_viz.distributed.save_rank_trace, or was edited: "
                    "record the run again.")


def _check_header(header: dict[str, Any], file: str) -> None:
    """NOTE [ Merging rank traces ], rule 5: the type of each field the merge reads."""
    run_id = header.get("run_id")
    _check(isinstance(run_id, str) and bool(_PLAIN.fullmatch(run_id)), "run_id", run_id,
           "a plain name (letters, digits, '.', '_', '-'; at most 128 characters)", file)
    world = header.get("world_size")
    _check(_is_int(world) and 1 <= world <= MAX_WORLD_SIZE, "world_size", world,
           f"an int from 1 to {MAX_WORLD_SIZE}", file)
    rank = header.get("rank")
    _check(_is_int(rank) and 0 <= rank < world, "rank", rank, f"an int from 0 to {world - 1} (world_size {world})",
           file)
    for name in ("clock", "clock_end"):
        clock = header.get(name)
        if clock is None and name == "clock_end":
            continue
        _check(isinstance(clock, dict), name, clock, "an object", file)
        for key in ("mono_ns", "wall_ns", "offset_to_rank0_ns", "rtt_ns"):
            value = clock.get(key)
            _check(value is None or (_is_int(value) and abs(value) < 2**63), f"{name}.{key}", value,
                   "an int (nanoseconds) or null", file)
    for name, ok, expected in (
            ("schedule", lambda v: v is None or isinstance(v, str), "a string or null"),
            ("microbatches", lambda v: v is None or (_is_int(v) and v >= 0), "an int >= 0 or null"),
            ("stages", lambda v: v is None or (isinstance(v, list) and all(_is_int(i) and 0 <= i < 2**31 for i in v)),
             "a list of stage indices or null"),
            ("planned_order", lambda v: v is None or (isinstance(v, dict) and all(
                isinstance(k, str) and isinstance(a, list) and all(x is None or isinstance(x, str) for x in a)
                for k, a in v.items())), "an object of lists of action names, or null")):
        value = header.get(name)
        _check(ok(value), name, value, expected, file)


def listed(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 10 else f"[{', '.join(map(str, ranks[:10]))}, ...] ({len(ranks)} in all)"


def rank_headers(traces: dict[int, Trace], where: str, files: dict[int, str] | None = None,
             partial: bool = False) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """(each rank's header, the ranks without a file); see NOTE [ Merging rank traces ], rules 5 and 6."""
    headers = {}
    for rank, trace in traces.items():
        file = (files or {}).get(rank) or f"rank {rank}'s trace in '{where}'"
        header = trace.meta.get("distributed")
        if not isinstance(header, dict):
            raise _fail(f"{file} has no distributed header (meta['distributed']).",
                        "write rank files with ckpt_viz.distributed.save_rank_trace (or record with "
                        "`ckpt-viz record --distributed`).")
        _check_header(header, file)
        if header["rank"] != rank:
            raise _fail(f"the file of rank {rank} in '{where}' holds rank {header['rank']!r}'s trace.",
                        "keep the rank-<R>.json names that save_rank_trace wrote.")
        headers[rank] = header
    run_ids = {h["run_id"] for h in headers.values()}
    if len(run_ids) > 1:
        raise _fail(f"the rank files in '{where}' come from different runs ({', '.join(sorted(run_ids))}).",
                    "merge the files of one run only: each run writes its own <run id> folder.")
    worlds = {h["world_size"] for h in headers.values()}
    if len(worlds) > 1:
        raise _fail(f"the rank files in '{where}' disagree on the world size ({sorted(worlds)}).",
                    "merge the files of one run only.")
    (world,) = worlds
    missing = [r for r in range(world) if r not in headers]  # world <= MAX_WORLD_SIZE: checked above
    if missing and not partial:
        raise _fail(f"run {next(iter(run_ids))} in '{where}' is partial: ranks {listed(missing)} are missing "
                    f"(world size {world}, found {listed(sorted(headers))}).",
                    f"pass --partial to merge the ranks present (`ckpt-viz merge --partial {where}`), wait for every "
                    "rank to finish (each writes its file at exit), or look for the rank that failed in the "
                    "launcher's log.")
    return headers, missing

def merged_meta(traces: dict[int, Trace], headers: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each field of the merged `meta` from every rank's; see NOTE [ Merging rank traces ], rule 7."""
    ranks = sorted(traces)
    metas = {r: traces[r].meta for r in ranks}
    meta: dict[str, Any] = {}
    by_rank: dict[str, dict[str, Any]] = {}
    keys = list(dict.fromkeys(k for r in ranks for k in metas[r]))
    for key in keys:
        held = {r: metas[r][key] for r in ranks if key in metas[r]}
        if key in ("distributed", "by_rank"):
            continue
        if key == "sources":
            meta[key] = {site: line for value in held.values() if isinstance(value, dict)
                         for site, line in value.items()}
        elif key == "replay_checks":
            meta[key] = _summed_checks(held)
        elif key == "stages":
            meta[key] = sorted({s for value in held.values() if isinstance(value, list) for s in value
                                if _is_int(s)})
        elif key == "partial":
            meta[key] = {str(r): value for r, value in held.items()}
        elif len(held) == len(ranks) and all(value == held[ranks[0]] for value in held.values()):
            meta[key] = held[ranks[0]]
        else:
            by_rank[key] = {str(r): value for r, value in held.items()}
    for key, value in (("schedule", _agreed(headers, "schedule")), ("microbatches", _agreed(headers, "microbatches"))):
        if value is not None:
            meta[key] = value
            by_rank.pop(key, None)
    meta.setdefault("mode", "distributed-pipeline")
    if by_rank:
        meta["by_rank"] = by_rank
    return meta


def _agreed(headers: dict[int, dict[str, Any]], key: str) -> Any:
    """The headers' `key` when every rank gives the same one, else None."""
    values = {repr(h.get(key)) for h in headers.values()}
    return next(iter(headers.values())).get(key) if len(values) == 1 else None


def _summed_checks(held: dict[int, Any]) -> dict[str, Any]:
    """`replay_checks` of the ranks that ran checks: counts summed, each rank's under `by_rank`."""
    counts = {r: c for r, c in held.items() if isinstance(c, dict)}
    policies = {c.get("policy") for c in counts.values()}
    total: dict[str, Any] = {"policy": policies.pop() if len(policies) == 1 else "mixed", "checked": 0, "skipped": 0,
                             "skipped_regions": {}, "by_rank": {}}
    for key in ("first_checks", "budget"):  # the same constants in every rank of one ckpt_viz: the largest
        numbers = [c.get(key) for c in counts.values()
                   if isinstance(c.get(key), (int, float)) and not isinstance(c.get(key), bool)]
        if numbers:
            total[key] = max(numbers)
    for rank, c in counts.items():
        checked = c.get("checked") if _is_int(c.get("checked")) else 0
        skipped = c.get("skipped") if _is_int(c.get("skipped")) else 0
        total["checked"] += checked
        total["skipped"] += skipped
        total["by_rank"][str(rank)] = {"checked": checked, "skipped": skipped}
        regions = c.get("skipped_regions")
        for name, n in (regions.items() if isinstance(regions, dict) else ()):
            if _is_int(n):
                total["skipped_regions"][name] = total["skipped_regions"].get(name, 0) + n
    return total


def _fail(what: str, tip: str) -> TraceError:
    return TraceError(f"{_API}: {what}\nTip: {tip}")


def find_rank_files(folder: str) -> tuple[str, dict[int, str]]:
    """(run folder, {rank: file}) of `folder`: a run folder itself, or a folder holding exactly one run folder."""
    if not os.path.isdir(folder):
        raise _fail(f"'{folder}' is not a folder.", "pass the --out folder of the distributed run "
                    "(it holds <run id>/rank-<R>.json), or one <run id> folder inside it.")

    def ranks_in(path: str) -> dict[int, str]:
        found = {}
        for name in sorted(os.listdir(path)):
            match = _RANK_FILE.match(name)
            if match and os.path.isfile(os.path.join(path, name)):
                found[int(match.group(1))] = os.path.join(path, name)
        return found

    files = ranks_in(folder)
    if files:
        return folder, files
    runs = [d for d in sorted(os.listdir(folder))
            if os.path.isdir(os.path.join(folder, d)) and ranks_in(os.path.join(folder, d))]
    if not runs:
        raise _fail(f"'{folder}' holds no rank files (rank-<R>.json), neither directly nor in a run folder.",
                    "record with `ckpt-viz record --distributed`, CKPT_VIZ_DISTRIBUTED_DIR or "
                    "ckpt_viz.distributed.enable(dir), then pass that folder.")
    if len(runs) > 1:
        raise _fail(f"'{folder}' holds {len(runs)} runs ({', '.join(runs)}); one merge takes one run.",
                    f"pass one of them, e.g. `ckpt-viz merge {os.path.join(folder, runs[-1])}`.")
    path = os.path.join(folder, runs[0])
    return path, ranks_in(path)


def _uncertainty(header: dict[str, Any]) -> int:
    """How far a rank's Cristian offset may be off: half its round trip, the larger of its two anchors' (rule 2)."""
    rtts = [c.get("rtt_ns") for c in (header.get("clock") or {}, header.get("clock_end") or {})]
    return max([r // 2 for r in rtts if isinstance(r, int) and r > 0], default=0)


def _offset_fn(header: dict[str, Any], base: dict[str, Any]) -> tuple[Any, str]:
    """(t -> offset_ns, how it was measured); see NOTE [ Merging rank traces ], rule 1."""
    clock = header.get("clock") or {}
    offset = clock.get("offset_to_rank0_ns")
    end = header.get("clock_end") or {}
    end_offset = end.get("offset_to_rank0_ns")
    if isinstance(offset, int) and isinstance(end_offset, int) and end.get("mono_ns", 0) > clock.get("mono_ns", 0):
        t0, t1 = clock["mono_ns"], end["mono_ns"]
        slope = (end_offset - offset) / (t1 - t0)
        return (lambda t: offset + round(slope * (t - t0))), "offset against rank 0 with a drift fit (two anchors)"
    if isinstance(offset, int):
        return (lambda t: offset), "offset against rank 0 (one anchor)"
    base_clock = base.get("clock") or {}
    try:
        wall = (clock["wall_ns"] - clock["mono_ns"]) - (base_clock["wall_ns"] - base_clock["mono_ns"])
    except (KeyError, TypeError):
        return (lambda t: 0), "none (no offset, no anchors): clocks taken as one"
    return (lambda t: wall), "wall-clock anchors (NTP)"


def _spans(events: Iterable[Event]) -> dict[tuple, list[int]]:
    """(step, stage, microbatch, action) -> [first t_ns, last t_ns, rank] of the events inside that action."""
    spans: dict[tuple, list[int]] = {}
    for e in events:
        tags = e.tags
        action = tags.get("action")
        if action not in ("F", "I", "W", "B"):
            continue
        key = (tags.get("step"), tags.get("stage"), tags.get("microbatch"), action)
        span = spans.get(key)
        if span is None:
            spans[key] = [e.t_ns, e.t_ns, tags.get("rank")]
        else:
            span[0], span[1] = min(span[0], e.t_ns), max(span[1], e.t_ns)
    return spans


def check_order(events: list[Event], uncertainty_ns: dict[int, int] | None = None) -> dict[str, Any]:
    """The send-before-receive check of NOTE [ Merging rank traces ], rule 2, on aligned events; `uncertainty_ns`:
    rank -> how far its offset to rank 0 may be off (half its round trip; 0 when not given)."""
    spans = _spans(events)
    known = uncertainty_ns or {}
    checked, bad, worst = 0, [], None
    within = 0  # receives before their send by less than the offsets' uncertainty
    slack_by_pair: dict[str, int] = {}
    for (step, stage, mb, action), (first, _, rank) in spans.items():
        if not isinstance(stage, int):
            continue
        if action == "F":
            producers = [(step, stage - 1, mb, "F")]
        elif action in ("I", "B"):
            producers = [(step, stage + 1, mb, "I"), (step, stage + 1, mb, "B")]
        else:
            continue
        for key in producers:
            producer = spans.get(key)
            if producer is None or producer[2] == rank:
                continue
            slack = first - producer[1]
            checked += 1
            pair = f"{producer[2]}->{rank}"
            slack_by_pair[pair] = min(slack, slack_by_pair.get(pair, slack))
            if slack < -(known.get(producer[2], 0) + known.get(rank, 0)):
                bad.append({"receiver": f"{stage}{action}{mb}", "sender": f"{key[1]}{key[3]}{mb}", "step": step,
                            "slack_ns": slack})
            elif slack < 0:
                within += 1
            if worst is None or slack < worst:
                worst = slack
    return {"edges_checked": checked, "receives_before_send": len(bad), "within_uncertainty": within,
            "uncertainty_ns": {str(r): u for r, u in sorted(known.items())}, "min_slack_ns": worst,
            "min_slack_ns_by_ranks": dict(sorted(slack_by_pair.items())), "violations": bad[:20]}


def merge_traces(traces: dict[int, Trace], where: str = "the run", *, files: dict[int, str] | None = None,
                 partial: bool = False) -> Trace:
    """One trace of every rank's events, aligned to rank 0's clock; see NOTE [ Merging rank traces ].

    `meta["distributed"]` of the result holds the run id, world size, every rank's header,
    how each clock was aligned, and the send-before-receive check (`alignment`).

    Args:
        traces: rank -> its trace.
        where: the run folder, for messages; `files`: rank -> its file, for messages.
        partial: merge the ranks present when some have no file (rule 6); else refuse.

    Raises:
        TraceError: a header field of the wrong type, ranks of several runs, or (without `partial`) a missing rank.
    """
    if not traces:
        raise _fail(f"no rank traces to merge in '{where}'.", "pass the folder that holds rank-<R>.json files.")
    headers, missing = rank_headers(traces, where, files, partial)
    base = headers[min(headers)]  # rank 0's clock, through each offset (rule 6)
    aligned: list[tuple[int, int, int, Event]] = []  # (t, rank, order, event)
    clocks, offsets = {}, {}
    for rank in sorted(traces):
        offset, how = _offset_fn(headers[rank], base) if rank else ((lambda t: 0), "the reference clock")
        offsets[rank], clocks[str(rank)] = offset, how
        for order, e in enumerate(traces[rank].events):
            aligned.append((e.t_ns + offset(e.t_ns), rank, order, e))
    aligned.sort(key=lambda item: item[:3])
    handle_ids: dict[tuple[int, int], int] = {}

    def hid(rank: int, h: Any) -> Any:
        if not isinstance(h, int):
            return h
        return handle_ids.setdefault((rank, h), len(handle_ids))

    new_seq: dict[tuple[int, int], int] = {}
    events: list[Event] = []
    for seq, (t, rank, _, e) in enumerate(aligned):
        new_seq[rank, e.seq] = seq
        renumbered: dict[str, Any] = {}
        if isinstance(e, (SessionActivated, SessionDeactivated, SessionCleared)):
            renumbered["handles"] = tuple(hid(rank, h) for h in e.handles)
        if isinstance(e, SessionCleared):
            renumbered["frames"] = tuple(hid(rank, h) for h in e.frames)
        if isinstance(e, ReplayRefused):
            renumbered["last_release_seq"] = new_seq.get((rank, e.last_release_seq))  # earlier: renumbered
            renumbered["collected_seq"] = new_seq.get((rank, e.collected_seq))
        events.append(msgspec.structs.replace(e, seq=seq, t_ns=t, handle_id=hid(rank, e.handle_id),
                                              tags={**e.tags, "rank": rank}, **renumbered))
    memory = _merge_memory(traces, offsets, new_seq)
    graphs = []
    for rank in sorted(traces):
        for g in traces[rank].graphs:
            if (rank, g.seq) not in new_seq and g.seq >= 0:
                continue
            nodes = tuple(msgspec.structs.replace(n, handle_id=hid(rank, n.handle_id)) for n in g.nodes)
            graphs.append(GraphSnapshot(seq=new_seq.get((rank, g.seq), -1), label=f"rank {rank}: {g.label}",
                                        nodes=nodes, edges=g.edges, torchviz=g.torchviz))
    graphs.sort(key=lambda g: g.seq)
    meta = merged_meta(traces, headers)
    meta["distributed"] = {
        "run_id": base.get("run_id"), "world_size": base.get("world_size"), "merged": True,
        "ranks": sorted(headers), "headers": {str(r): headers[r] for r in sorted(headers)},
        "stages_by_rank": {str(r): headers[r].get("stages") for r in sorted(headers)},
        "planned_order": _planned(headers), "clock_alignment": clocks,
        "alignment": check_order(events, {r: _uncertainty(h) for r, h in headers.items()}),
        "missing_ranks": missing}
    if missing or "partial" in meta:
        meta["partial"] = {"missing_ranks": missing, "ranks": meta.pop("partial", {})}
    return Trace(events=events, memory=memory, graphs=graphs, meta=meta)


def _planned(headers: dict[int, dict[str, Any]]) -> dict[str, list] | None:
    """Every rank's planned order (the same dict in every header; rank 0's when present)."""
    for rank in sorted(headers):
        planned = headers[rank].get("planned_order")
        if planned:
            return planned
    return None


def _merge_memory(traces: dict[int, Trace], offsets: dict[int, Any],
                  new_seq: dict[tuple[int, int], int]) -> list[MemorySample]:
    """See NOTE [ Merging rank traces ], rule 4."""
    readings = []
    for rank, trace in traces.items():
        offset = offsets[rank]
        for order, s in enumerate(trace.memory):
            seq = new_seq.get((rank, s.seq))
            if seq is not None:
                readings.append((seq, rank, order, msgspec.structs.replace(s, seq=seq, t_ns=s.t_ns + offset(s.t_ns),
                                                                           rank=rank)))
    readings.sort(key=lambda r: r[:3])
    return [r[3] for r in readings]


def merge_run(folder: str, *, partial: bool = False) -> tuple[Trace, str]:
    """(merged trace, run folder) of the run in `folder` (see `find_rank_files`); `partial` as in `merge_traces`."""
    run, files = find_rank_files(folder)
    traces = {rank: Trace.load(path) for rank, path in files.items()}
    return merge_traces(traces, run, files=files, partial=partial), run


def _describe(trace: Trace, run: str, output: str) -> str:
    dist = trace.meta["distributed"]
    check = dist["alignment"]
    missing = dist.get("missing_ranks") or []
    merged = dist["world_size"] - len(missing)
    lines = [f"merged {merged} {'ranks' if merged != 1 else 'rank'} of run {dist['run_id']} ({run}): "
             f"{len(trace.events)} events, {len({e.handle_id for e in trace.events if e.handle_id is not None})} "
             f"handles -> {output}"]
    if missing:
        lines.append(f"  PARTIAL: ranks {listed(missing)} of {dist['world_size']} left no file (marked missing in "
                     "meta.distributed.missing_ranks)")
    for rank, ending in sorted(((trace.meta.get("partial") or {}).get("ranks") or {}).items()):
        if isinstance(ending, dict):
            lines.append(f"  rank {rank} ended early: {ending.get('reason')}"
                         + (f" {ending['signal']}" if ending.get("signal") else "")
                         + (f" ({ending['error']})" if ending.get("error") else ""))
    for rank, how in dist["clock_alignment"].items():
        lines.append(f"  rank {rank} clock: {how}")
    if not check["edges_checked"]:
        lines.append("  clock check: no send/receive pair between ranks was recorded (nothing to check)")
    elif check["receives_before_send"]:
        lines.append(f"  clock check FAILED: {check['receives_before_send']} of {check['edges_checked']} receives "
                     f"come before their send (worst by {-check['min_slack_ns'] / 1000:.1f} us): the clocks are off "
                     "by at least that much; times between ranks are not reliable.")
    elif check.get("within_uncertainty"):
        lines.append(f"  clock check: every receive comes after its send within the clock offsets' uncertainty "
                     f"({check['edges_checked']} send/receive pairs between ranks; {check['within_uncertainty']} "
                     f"before it by up to {-check['min_slack_ns'] / 1000:.1f} us, less than the two ranks' offsets "
                     "may be off: half of each one's measured round trip)")
    else:
        lines.append(f"  clock check: every receive comes after its send ({check['edges_checked']} send/receive "
                     f"pairs between ranks, smallest gap {check['min_slack_ns'] / 1000:.1f} us)")
    return "\n".join(lines)


def merge_command(args: argparse.Namespace) -> int:
    from ckpt_viz.trace.files import check_writable

    run, files = find_rank_files(args.dir)
    output = args.output or os.path.join(run, "merged.json")
    check_writable(output, _API)
    traces = {rank: Trace.load(path) for rank, path in files.items()}
    trace = merge_traces(traces, run, files=files, partial=getattr(args, "partial", False))
    trace.save(output)
    print(_describe(trace, run, output))
    return 0 if not trace.meta["distributed"]["alignment"]["receives_before_send"] else 1
