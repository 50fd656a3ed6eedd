"""The headers of a distributed run's rank files, checked before a merge uses them (NOTE [ Merging rank traces ]).

Owns `rank_headers` (each rank's `meta["distributed"]`, its fields' types and bounds, one run, the ranks
without a file) for `ckpt-viz merge`. Standard library only (torch-free); reads what
`ckpt_viz.distributed.save_rank_trace` wrote. See rules 5 and 6 of NOTE [ Merging rank traces ] in
ckpt_viz/cli/merge.py.
"""
from __future__ import annotations

import re
from typing import Any

from ckpt_viz.errors import TraceError
from ckpt_viz.trace import Trace

__all__ = ["MAX_WORLD_SIZE", "listed", "rank_headers"]

_API = "ckpt-viz merge"
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # ckpt_viz.distributed's run ids (NOTE [ Run ids ])
MAX_WORLD_SIZE = 65536  # NOTE [ Merging rank traces ], rule 5


def _fail(what: str, tip: str) -> TraceError:
    return TraceError(f"{_API}: {what}\nTip: {tip}")


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
