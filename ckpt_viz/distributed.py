"""Per-rank facts of a torch.distributed run, for one trace file per rank (issue 15).

Owns `rank_header` (run id, world size, rank, host, clock anchors, the offset of this
rank's monotonic clock against rank 0, the planned schedule order),
`save_rank_trace`, which writes `<folder>/<run_id>/rank-<R>.json` with the header in
`trace.meta["distributed"]`, and `enable(folder)` (also the environment variable
CKPT_VIZ_DISTRIBUTED_DIR, and `python -m ckpt_viz.distributed SCRIPT`, which is what
`ckpt-viz record --distributed` hands to torchrun): see NOTE [ Recording a rank ]; how a rank that
ends badly still writes its file is NOTE [ Partial runs ] in ckpt_viz/rank_endings.py.
Imports torch.distributed; never the UI or the renderers.

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
  4. The ping-pong needs CPU send/recv: on a group whose backend is not gloo (NCCL) it
     runs over a gloo group made for it (`new_group(backend="gloo")`, collective too).

NOTE [ Recording a rank ]
  1. `enable(folder)` opens one `ckpt_viz.record()` for the rest of the process (memory
     sampled, no graph snapshots). It is called before or after `init_process_group`:
     the rank header is collective, so it is taken by every rank right after the group
     exists (a wrapped `init_process_group`, or at once when it already exists).
  2. It wraps the `step` of torch's pipeline schedules: each call is tagged `step=k`
     (counted per process) and the last schedule stepped gives the header its name,
     micro-batches, stages and planned order; its stages' parameters are counted in
     their stage's row of the memory samples (`by_stage`).
  3. The file is written once: inside a wrapped `destroy_process_group` (every rank calls
     it, so a second clock measurement, `clock_end`, is taken there for the merge's
     drift fit), else at interpreter exit (no second measurement).
  4. The model name is the script's, the mode "pipeline"; `trace.meta["distributed"]`
     holds the header.

NOTE [ Run ids ]
  1. The run id names the folder a rank file goes in, so it is a plain name:
     letters, digits, ".", "_" and "-", starting with a letter or digit, at most 128
     characters. TORCHELASTIC_RUN_ID (torchrun's --rdzv-id) and `run_id=` are made one
     (`plain_run_id`: other characters become "_"; what is left empty gets a name from
     a hash of the text), and every rank takes rank 0's.
  2. `save_rank_trace` refuses a header whose run id is not a plain name or whose rank is
     not an int, and checks that the file it writes is inside the folder it was given
     (a symlinked run folder pointing elsewhere is refused).
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import os
import re
import runpy
import socket
import sys
import time
import uuid
from os import PathLike
from typing import Any

import torch
import torch.distributed as dist

from ckpt_viz.errors import CheckpointUsageError
from ckpt_viz.rank_endings import RankEnding, catch_endings

__all__ = ["DIR_ENV", "clock_offset_to_rank0", "enable", "enabled", "plain_run_id", "planned_order", "rank_header",
           "save_rank_trace"]

DIR_ENV = "CKPT_VIZ_DISTRIBUTED_DIR"  # set it (or call enable) to record every rank into this folder
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def plain_run_id(value: Any) -> str:
    """`value` as a plain folder name (NOTE [ Run ids ], rule 1): the same text gives the same name."""
    text = str(value)
    if _PLAIN.fullmatch(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip("._-")[:128]
    if _PLAIN.fullmatch(cleaned):
        return cleaned
    return "run-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


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
    if group is None and str(dist.get_backend()) != "gloo":  # See NOTE [ Clock offset ], rule 4.
        group = dist.new_group(backend="gloo")
    shared = [plain_run_id(run_id or os.environ.get("TORCHELASTIC_RUN_ID") or uuid.uuid4().hex[:12])]
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
    """Write `trace` with `header` in `meta["distributed"]` to `<folder>/<run_id>/rank-<R>.json`; return the path.

    The trace's meta gets a model and mode when it has none (the script's name, "pipeline").
    """
    from ckpt_viz.trace import run_meta

    argv0 = os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "")
    script = os.path.splitext(argv0)[0] if argv0.endswith(".py") else "distributed"
    defaults = run_meta(model=script, mode="pipeline", schedule=header.get("schedule"),
                        microbatches=header.get("microbatches"), stages=header.get("stages"))
    for key, value in defaults.items():
        if trace.meta.get(key) is None:
            trace.meta[key] = value
    run_id, rank = header.get("run_id"), header.get("rank")
    if not (isinstance(run_id, str) and _PLAIN.fullmatch(run_id)):
        raise CheckpointUsageError(
            f"ckpt_viz.distributed.save_rank_trace: the header's run_id {run_id!r} is not a plain name (letters, "
            "digits, '.', '_', '-'; at most 128 characters), and it names the folder the file goes in.\nTip: pass "
            "run_id=ckpt_viz.distributed.plain_run_id(...) to rank_header, or a plain name.")
    if type(rank) is not int or rank < 0:
        raise CheckpointUsageError(
            f"ckpt_viz.distributed.save_rank_trace: the header's rank is {rank!r}, expected an int >= 0.\nTip: "
            "use the header rank_header() returned.")
    trace.meta["distributed"] = header
    root = os.path.realpath(os.fspath(folder))
    path = os.path.join(root, run_id, f"rank-{rank}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.dirname(os.path.realpath(path)) != os.path.join(root, run_id):  # NOTE [ Run ids ], rule 2
        raise CheckpointUsageError(
            f"ckpt_viz.distributed.save_rank_trace: {os.path.join(os.fspath(folder), run_id)} leads outside "
            f"{os.fspath(folder)} (a link), so rank {rank}'s file would be written elsewhere.\nTip: remove the "
            "link, or pass another folder.")
    trace.save(path)
    return os.path.join(os.fspath(folder), run_id, f"rank-{rank}.json")


# ---------------------------------------------------------------- enable (NOTE [ Recording a rank ])

class _Rank(RankEnding):
    """The one recording of this process, its header, the schedule last stepped, and how the run ended."""

    def __init__(self, folder: str) -> None:
        import ckpt_viz

        self.folder = folder
        self.header: dict[str, Any] | None = None
        self.schedule: Any = None
        self.steps = 0
        self.saved: str | None = None
        super().__init__()
        self.recording = ckpt_viz.record(memory=True)
        self.recording.__enter__()

    def take_header(self) -> None:
        if self.header is None and dist.is_initialized():
            self.header = rank_header()

    def _save(self, end_clock: bool, partial: dict[str, Any] | None, exc: BaseException | None) -> str | None:
        if self.saved is not None:
            return self.saved
        partial = partial or self.failure
        exc = exc or self.failed
        end_clock = end_clock and partial is None  # the others may be gone (rank_endings.py NOTE [ Partial runs ], 2)
        if end_clock:  # in destroy_process_group, where every rank is: init_process_group was called unwrapped
            self.take_header()
        if self.header is None:
            sys.stderr.write("ckpt_viz.distributed: no trace written for this process: its rank header needs the "
                             "process group, which never existed or was destroyed unseen.\nTip: call "
                             "ckpt_viz.distributed.enable() before `from torch.distributed import ...`, or use "
                             "torch.distributed.init_process_group / destroy_process_group through the module.\n")
            self.saved = ""
            return None
        header = dict(self.header)
        if end_clock and dist.is_initialized():
            dist.barrier()
            offset, rtt = clock_offset_to_rank0()
            header["clock_end"] = {"mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns(),
                                   "offset_to_rank0_ns": offset, "rtt_ns": rtt}
        if self.schedule is not None:
            later = rank_facts(self.schedule)
            header.update(later)
        header["steps"] = self.steps
        try:
            self.recording.__exit__(type(exc) if exc is not None else None, exc,
                                    exc.__traceback__ if exc is not None else None)
        except Exception as problem:  # closing from the watcher thread (rank_endings.py): keep what it holds
            sys.stderr.write(f"ckpt_viz.distributed: the recording did not close cleanly ({problem!r}); "
                             "writing what it holds.\n")
        finally:
            trace = self.recording.trace
            if partial is not None:
                trace.meta["partial"] = partial
            self.saved = save_rank_trace(trace, self.folder, header)
        return self.saved


_STATE: dict[str, _Rank] = {}


def rank_facts(schedule: Any) -> dict[str, Any]:
    """The schedule's facts of a rank header: name, micro-batches, this rank's stages, planned order."""
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    classes = sorted({f"{type(s).__module__}.{type(s).__qualname__}" for s in stages if s is not None})
    return {"schedule": type(schedule).__name__, "microbatches": getattr(schedule, "_n_microbatches", None),
            "stages": [s.stage_index for s in stages if s is not None], "planned_order": planned_order(schedule),
            "stage_classes": classes}


def enabled() -> bool:
    """Whether `enable` (or CKPT_VIZ_DISTRIBUTED_DIR) records this process."""
    return "rank" in _STATE


def enable(folder: str | PathLike[str] | None = None) -> None:
    """Record this rank for the rest of the process and write `<folder>/<run id>/rank-<R>.json` at the end.

    For launchers of your own (multi-node torchrun, SLURM, Ray Train's TorchTrainer): call it in every
    rank, before or after `init_process_group`, then run `ckpt-viz merge <folder>`. A second call does
    nothing. See NOTE [ Recording a rank ].

    Args:
        folder: where the rank files go; default the environment variable CKPT_VIZ_DISTRIBUTED_DIR.

    Raises:
        CheckpointUsageError: no folder given and the environment variable is not set.
    """
    if enabled():
        return
    folder = os.fspath(folder) if folder is not None else os.environ.get(DIR_ENV, "")
    if not folder:
        raise CheckpointUsageError(
            f"ckpt_viz.distributed.enable: no folder for the rank traces (none given, {DIR_ENV} is not set).\n"
            "Tip: call enable('traces/') or set CKPT_VIZ_DISTRIBUTED_DIR=traces/ in every rank's environment.")
    rank = _STATE["rank"] = _Rank(folder)
    _wrap_torch()
    rank.take_header()
    atexit.register(_save_at_exit)
    catch_endings(rank)


def _save_at_exit() -> None:
    rank = _STATE.get("rank")
    if rank is not None:
        rank.save(end_clock=False)


def _wrap_torch() -> None:
    if getattr(dist.init_process_group, "_ckpt_viz", False):
        return
    init, destroy = dist.init_process_group, dist.destroy_process_group

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        if "rank" in _STATE:
            _STATE["rank"].take_header()
        return result

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        rank = _STATE.get("rank")
        if rank is not None and not args and not kwargs.get("group"):
            rank.save(end_clock=True)
        return destroy(*args, **kwargs)

    init_process_group._ckpt_viz = destroy_process_group._ckpt_viz = True  # type: ignore[attr-defined]
    dist.init_process_group, dist.destroy_process_group = init_process_group, destroy_process_group
    from torch.distributed.pipelining import schedules

    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        cls.step = _counted(cls.step)


def _counted(step: Any) -> Any:
    from ckpt_viz.bus import tag

    @functools.wraps(step)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        rank = _STATE.get("rank")
        if rank is None:
            return step(self, *args, **kwargs)
        if rank.schedule is not self:  # a new schedule: count each stage's parameters in its by_stage row
            for stage in getattr(self, "_stages", None) or [getattr(self, "_stage", None)]:
                if stage is not None:
                    rank.recording.assign_stage(list(stage.submod.parameters()), stage.stage_index)
        rank.schedule = self
        with tag(step=rank.steps):
            rank.in_step = rank.steps
            try:
                return step(self, *args, **kwargs)
            except BaseException as exc:
                rank.note_failure(exc, rank.steps)
                raise
            finally:
                rank.in_step = None
                rank.steps += 1

    return counted


def _main(argv: list[str]) -> int:
    """`python -m ckpt_viz.distributed SCRIPT [ARGS...]`: run SCRIPT with this rank recorded (see `enable`)."""
    if not argv:
        sys.stderr.write("usage: python -m ckpt_viz.distributed SCRIPT [ARGS...] (with CKPT_VIZ_DISTRIBUTED_DIR set)\n")
        return 2
    enable()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":  # the imported module's state, shared with the script's own `import ckpt_viz.distributed`
    from ckpt_viz.distributed import _main as _main_of_module

    sys.exit(_main_of_module(sys.argv[1:]))
