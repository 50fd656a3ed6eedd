"""Record a real torch.distributed.pipelining run with ckpt_viz: one trace file per rank, merged into one.

Run on one machine with two processes (CPU, gloo), either way:

    torchrun --standalone --nproc-per-node 2 examples/pipelining_torchrun.py --out traces/ --schedule ZBVZeroBubble
    ckpt-viz merge traces/                  # one trace with every rank, clocks aligned and checked

    ckpt-viz record --distributed --nproc-per-node 2 --out traces/ examples/pipelining_torchrun.py --steps 2
                                            # torchrun, recording and merge in one command

Each rank builds the same model, keeps its stages (a linear, then a block checkpointed with ckpt_viz's
reentrant checkpoint), and hands them to a torch schedule through `ckpt_viz.pipelining.PipelineStage`,
which runs the schedule's I action as DX and its W action as DW. `ckpt_viz.distributed.enable(out)`
records the rank (every schedule step is tagged with its number) and writes `<out>/<run id>/rank-<R>.json`
when the process group is destroyed, with a header (`trace.meta["distributed"]`: run id, world size,
host, clock anchors and offsets against rank 0, the planned schedule order). Under `ckpt-viz record
--distributed` the rank is already recorded and the call does nothing. Under SLURM, Ray Train or another
launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, the script runs unchanged. Open the
merged trace with `ckpt-viz app` (Saved trace, then "Schedule timeline").
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining as tp

import ckpt_viz.distributed
from ckpt_viz.pipelining import PipelineStage
from ckpt_viz.runtime import checkpoint

# schedule name -> (torch class, stages per rank, V placement: rank r holds stages r and 2*world-1-r)
SCHEDULES = {
    "GPipe": ("ScheduleGPipe", 1, False),
    "1F1B": ("Schedule1F1B", 1, False),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", 2, False),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", 2, False),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", 2, True),
}


class Chunk(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.block = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, torch.tanh(self.inp(x)), use_reentrant=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="traces", help="folder for <run id>/rank-<R>.json")
    parser.add_argument("--schedule", default="ZBVZeroBubble", choices=sorted(SCHEDULES))
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--width", type=int, default=16)
    args = parser.parse_args()

    ckpt_viz.distributed.enable(args.out)  # before or after init_process_group; a no-op when already recording
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    name, per_rank, v = SCHEDULES[args.schedule]
    total = world * per_rank
    mine = [rank, 2 * world - 1 - rank] if v else [rank + k * world for k in range(per_rank)]

    torch.manual_seed(0)  # every rank builds the same model and keeps its own chunks
    chunks = nn.ModuleList(Chunk(args.width) for _ in range(total))
    stages = [PipelineStage(chunks[i], i, total, torch.device("cpu")) for i in mine]
    schedule = getattr(tp, name)(stages[0] if per_rank == 1 else stages, args.microbatches,
                                 loss_fn=nn.functional.mse_loss)

    losses: list[torch.Tensor] = []
    for step in range(args.steps):  # ckpt_viz tags each schedule.step() with its number
        chunks.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(2 * args.microbatches, args.width, generator=gen)
        y = torch.randn(2 * args.microbatches, args.width, generator=gen)
        inputs = (x,) if 0 in mine else ()
        target = {"target": y, "losses": losses} if total - 1 in mine else {}
        schedule.step(*inputs, **target)
    if losses:
        last = sum(float(v.detach()) for v in losses[-args.microbatches:])
        print(f"rank {rank}: loss of the last step {last:.6f}", flush=True)
    dist.destroy_process_group()  # every rank writes its trace file here


if __name__ == "__main__":
    main()
