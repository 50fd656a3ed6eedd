"""Per-rank facts of a torch.distributed run, for one trace file per rank (issue 15).

Owns `rank_header` (run id, world size, rank, host, clock anchors, the offset of this
rank's monotonic clock against rank 0, the planned schedule order) and
`save_rank_trace`, which writes `<folder>/<run_id>/rank-<R>.json` with the header in
`trace.meta["distributed"]`. Imports torch.distributed; never the UI or the renderers.

NOTE [ Clock offset ]
  1. `rank_header` is collective: every rank of the group calls it, in the same
     order relative to other collectives. Rank 0 broadcasts the run id and serves
     a Cristian ping-pong to every other rank in turn (`rounds` round trips).
  2. Rank r sends its monotonic t0, rank 0 answers with its own monotonic t_s, rank
     r reads t1; the round with the smallest t1 - t0 gives offset = t_s - (t0+t1)/2:
     add it to rank r's `t_ns` to get rank 0's clock. Its error is at most half that
     round trip (`clock.rtt_ns`). Rank 0's offset is 0.
  3. The anchors `{mono_ns, wall_ns}` are read right after a barrier, so a merge can
     fall back to wall clocks (NTP) when the offset is unusable.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from os import PathLike
from typing import Any

import torch
import torch.distributed as dist

from ckpt_viz.errors import CheckpointUsageError

__all__ = ["clock_offset_to_rank0", "planned_order", "rank_header", "save_rank_trace"]


def _require_group(api: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise CheckpointUsageError(
            f"{api}: torch.distributed has no process group in this process.\n"
            "Tip: call torch.distributed.init_process_group(...) first (torchrun sets the environment for it).")


def clock_offset_to_rank0(rounds: int = 16, group: Any = None) -> tuple[int, int]:
    """(offset_ns, rtt_ns): add offset_ns to this rank's monotonic ns to get rank 0's; see NOTE [ Clock offset ].

    Collective over `group` (default: the world). Needs a backend with CPU send/recv (gloo).
    """
    _require_group("ckpt_viz.distributed.clock_offset_to_rank0")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buf = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        for peer in range(1, world):
            peer_global = dist.get_global_rank(group, peer) if group is not None else peer
            for _ in range(rounds):
                dist.recv(buf, peer_global, group=group)
                buf[0] = time.monotonic_ns()
                dist.send(buf, peer_global, group=group)
        return 0, 0
    root = dist.get_global_rank(group, 0) if group is not None else 0
    best: tuple[int, int] | None = None
    for _ in range(rounds):
        t0 = time.monotonic_ns()
        buf[0] = t0
        dist.send(buf, root, group=group)
        dist.recv(buf, root, group=group)
        t1 = time.monotonic_ns()
        rtt, offset = t1 - t0, int(buf[0]) - (t0 + t1) // 2
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    assert best is not None  # rounds >= 1
    return best


def planned_order(schedule: Any) -> dict[str, list[str | None]] | None:
    """The schedule's planned compute actions per rank, as torch spells them ("0F1", "3W0"), or None."""
    order = getattr(schedule, "pipeline_order", None)
    if not order:
        return None
    return {str(rank): [str(a) if a is not None else None for a in actions] for rank, actions in order.items()}


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def rank_header(schedule: Any = None, *, run_id: str | None = None, rounds: int = 16,
                group: Any = None) -> dict[str, Any]:
    """This rank's header: collective over `group` (every rank calls it); see NOTE [ Clock offset ].

    Args:
        schedule: a torch.distributed.pipelining schedule (its planned order is recorded), or None.
        run_id: shared by all ranks; default TORCHELASTIC_RUN_ID, else a fresh id broadcast by rank 0.
        rounds: ping-pong round trips per rank for the clock offset.
    """
    _require_group("ckpt_viz.distributed.rank_header")
    shared = [run_id or os.environ.get("TORCHELASTIC_RUN_ID") or uuid.uuid4().hex[:12]]
    dist.broadcast_object_list(shared, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    offset, rtt = clock_offset_to_rank0(rounds, group)
    dist.barrier(group=group)
    anchor = {"mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    return {
        "run_id": str(shared[0]),
        "world_size": dist.get_world_size(group),
        "rank": dist.get_rank(group),
        "local_rank": int(os.environ.get("LOCAL_RANK", dist.get_rank(group))),
        "node_rank": int(os.environ.get("GROUP_RANK", 0)),
        "backend": str(dist.get_backend(group)),
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid": os.getpid(),
        "clock": {**anchor, "offset_to_rank0_ns": offset, "rtt_ns": rtt},
        "schedule": type(schedule).__name__ if schedule is not None else None,
        "microbatches": getattr(schedule, "_n_microbatches", None),
        "stages": [s.stage_index for s in stages if s is not None],
        "planned_order": planned_order(schedule),
    }


def save_rank_trace(trace: Any, folder: str | PathLike[str], header: dict[str, Any]) -> str:
    """Write `trace` with `header` in `meta["distributed"]` to `<folder>/<run_id>/rank-<R>.json`; return the path."""
    trace.meta["distributed"] = header
    path = os.path.join(os.fspath(folder), header["run_id"], f"rank-{header['rank']}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    trace.save(path)
    return path
