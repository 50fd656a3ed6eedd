"""One rank of the 2-rank gloo pipelines of test_pipelining.py (started by torch.multiprocessing.spawn).

Every rank builds the same seeded model, takes its stages, runs each schedule of `CASES` for
`STEPS` steps inside `ckpt_viz.record()`, and writes per schedule: the trace with its rank header
(`<case>/<run id>/rank-<r>.json`, `ckpt_viz.distributed.save_rank_trace`) and the gradients after every
step (`<case>-rank<r>.pt`).
"""
from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining as tp

import ckpt_viz
from ckpt_viz.distributed import rank_header, save_rank_trace
from ckpt_viz.pipelining import PipelineStage
from ckpt_viz.runtime import checkpoint

WIDTH = 8
BATCH = 8
MICROBATCHES = 4
STEPS = 2
SEED = 0

# case name -> (torch schedule class, stages per rank, V placement, STATIC example inputs)
CASES: dict[str, tuple[str, int, bool, bool]] = {
    "GPipe": ("ScheduleGPipe", 1, False, False),
    "1F1B": ("Schedule1F1B", 1, False, False),
    "1F1B-static": ("Schedule1F1B", 1, False, True),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", 2, False, False),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", 2, False, False),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", 2, True, False),
    "LoopedBFS": ("ScheduleLoopedBFS", 2, False, False),
    "DualPipeV": ("ScheduleDualPipeV", 2, True, False),
    "ZBVZeroBubble-nonreentrant": ("ScheduleZBVZeroBubble", 2, True, False),
    "1F1B-nonreentrant": ("Schedule1F1B", 1, False, False),
}
NONREENTRANT = {"ZBVZeroBubble-nonreentrant", "1F1B-nonreentrant"}  # the stages checkpoint with use_reentrant=False


class Chunk(nn.Module):
    """One pipeline stage: a linear outside any checkpoint, then a checkpointed block."""

    def __init__(self, reentrant: bool = True) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        return checkpoint(self.block, x, use_reentrant=self.reentrant)


class Model(nn.Module):
    def __init__(self, stages: int, reentrant: bool = True) -> None:
        super().__init__()
        self.chunks = nn.ModuleList(Chunk(reentrant) for _ in range(stages))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for chunk in self.chunks:
            x = chunk(x)
        return x


def build(stages: int, reentrant: bool = True) -> Model:
    torch.manual_seed(SEED)
    return Model(stages, reentrant)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target)


def stage_indices(rank: int, world: int, per_rank: int, v: bool) -> list[int]:
    if v:
        return [rank, 2 * world - 1 - rank]
    return [rank + k * world for k in range(per_rank)]


def reference(case: str, world: int) -> list[dict[str, torch.Tensor]]:
    """The gradients of every step in one process, on the full batch, without pipelining or checkpoints."""
    _, per_rank, _, _ = CASES[case]
    model = build(world * per_rank)
    out = []
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        x, y = batch(step)
        loss_fn(model(x), y).backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return out


def run_case(case: str, rank: int, world: int, out_dir: str) -> None:
    schedule_name, per_rank, v, static = CASES[case]
    total = world * per_rank
    model = build(total, reentrant=case not in NONREENTRANT)
    mine = stage_indices(rank, world, per_rank, v)
    stages = []
    for index in mine:
        example = None
        if static:  # the stage's input example; never requires grad here (the trap is handled by the stage)
            example = (torch.empty(BATCH // MICROBATCHES, WIDTH),)
        kwargs = {}
        if static:
            kwargs["output_args"] = (torch.empty(BATCH // MICROBATCHES, WIDTH),)
        stages.append(PipelineStage(model.chunks[index], index, total, torch.device("cpu"),
                                    input_args=example, **kwargs))
    cls = getattr(tp, schedule_name)
    schedule = cls(stages[0] if per_rank == 1 else stages, MICROBATCHES, loss_fn=loss_fn)
    header = rank_header(schedule)  # collective: the run id comes from rank 0
    grads = []
    with ckpt_viz.record() as rec:
        for step in range(STEPS):
            model.zero_grad(set_to_none=True)
            x, y = batch(step)
            args = (x,) if 0 in mine else ()
            kwargs = {"target": y} if total - 1 in mine else {}
            with ckpt_viz.tag(step=step):
                schedule.step(*args, **kwargs)
            grads.append({f"chunks.{i}.{n}": p.grad.clone()
                          for i in mine for n, p in model.chunks[i].named_parameters() if p.grad is not None})
    trace = rec.trace
    # What each stage still holds after the last step: all of it should have been consumed (stage 0's bwd_cache
    # entries are never sent anywhere; torch's own stage leaves them too, holding no tensor).
    leftover = {s.stage_index: {"slots": len(s._slots), "dw_runner": len(s.dw_runner),
                                "bwd_cache_tensors": sum(g is not None for v in s.bwd_cache.values() for g in v),
                                "fwd_cache": len(s.fwd_cache), "backward_state": len(s.backward_state)}
                for s in stages}
    trace.meta.update(schedule=case, leftover=leftover)
    save_rank_trace(trace, os.path.join(out_dir, case), header)
    torch.save(grads, os.path.join(out_dir, f"{case}-rank{rank}.pt"))


def worker(rank: int, world: int, out_dir: str, port: int, cases: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for case in cases:
            run_case(case, rank, world, out_dir)
            dist.barrier()
    except BaseException:
        with open(os.path.join(out_dir, f"error-rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        sys.stderr.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
