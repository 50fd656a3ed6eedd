"""Generator of the distributed mistakes corpus: real 2-rank gloo runs on CPU, recorded and saved as traces.

    python tests/data/mistakes/make.py [NAME ...] [--out DIR]      (default: every scenario, into this folder)

Each scenario spawns 2 ranks (torch.multiprocessing, gloo) from a fresh interpreter, records them with
ckpt_viz, and writes `<name>.json.gz` here: the merged trace (`ckpt-viz merge`, `--partial` where a rank died),
its `meta["mistake"]` saying what was done and what came out. Regenerate after a change of the trace format;
tests/distributed/test_mistakes.py checks the saved files and (slow) runs this generator again.

Scenarios:
  stock-stage-1f1b, stock-stage-zero-bubble
      torch's STOCK torch.distributed.pipelining.PipelineStage (one wrong import) with ckpt_viz's reentrant
      checkpoint inside the stage modules, under Schedule1F1B and ScheduleInterleavedZeroBubble. The run
      finishes (rc 0); the gradients are wrong against an unchecked single-process reference: metadata
      inference and the I action call torch.autograd.grad, and each unscoped checkpoint's replay writes
      `.grad` of its captured parameters (`unasked_grads_accumulated` events).
  rank-killed-sigterm
      ckpt_viz's stage under Schedule1F1B, recorded with ckpt_viz.distributed.enable; rank 1 gets SIGTERM
      in its second step's forward. Both ranks write partial files (rank 1 from its SIGTERM handler; rank 0,
      then stuck in a gloo receive, when spawn terminates it), merged with --partial.
  rank-killed-sigkill
      The same, with SIGKILL: rank 1 leaves no file; rank 0's is partial; the merge marks rank 1 missing.
      `rank-killed-sigkill.rank-0.json.gz` keeps rank 0's own file too (explain on a single rank file).
  dw-builder
      ckpt_viz's stage with a `dw_builder` (the stage module defers its weight gradients in a custom
      autograd.Function, as torch's test_schedule_with_weight_update_mlp_e2e does) and a reentrant
      checkpoint, under ScheduleInterleavedZeroBubble, STATIC shapes (DYNAMIC metadata inference would run
      the deferring backward once more on empty tensors, torch's own stage alike, and the extra queued entry
      would shift every micro-batch's dW); the W actions run the built runners (`dw_runner_called`) and
      the gradients match the reference.
  dw-builder-1f1b
      The same under Schedule1F1B: its B actions call `dw_builder()()` right after the full backward.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2
WIDTH = 8
BATCH = 8
MICROBATCHES = 4
STEPS = 2
SCENARIOS = ("stock-stage-1f1b", "stock-stage-zero-bubble", "rank-killed-sigterm", "rank-killed-sigkill",
             "dw-builder", "dw-builder-1f1b")
KILL_STEP = 1  # the step in whose forward rank 1 is killed


# ---------------------------------------------------------------- the model (every rank builds the same)

def _model(stages: int, deferred: bool = False):
    import torch
    from torch import nn

    from ckpt_viz.runtime import checkpoint

    class DeferredLinear(torch.autograd.Function):
        """y = x @ w.T + b whose backward returns dX only and queues what dW needs on the module."""

        @staticmethod
        def forward(ctx, x, weight, bias, owner):
            ctx.save_for_backward(x, weight)
            ctx.owner = owner
            return x @ weight.t() + bias

        @staticmethod
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            ctx.owner.queue.append((x.detach(), grad.detach()))
            return grad @ weight, None, None, None

    class Chunk(nn.Module):
        """One stage: a linear outside any checkpoint (deferred dW with `deferred`), then a checkpointed block."""

        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(WIDTH, WIDTH)
            self.block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))
            self.deferred = False
            self.queue: list = []

        def forward(self, x):
            if self.deferred:
                x = torch.tanh(DeferredLinear.apply(x, self.inp.weight, self.inp.bias, self))
            else:
                x = torch.tanh(self.inp(x))
            return checkpoint(self.block, x, use_reentrant=True)

        def compute_dw(self) -> None:
            """The dW the deferred backward queued, oldest first (one entry per micro-batch)."""
            x, grad = self.queue.pop(0)
            for param, value in ((self.inp.weight, grad.t() @ x), (self.inp.bias, grad.sum(0))):
                param.grad = value if param.grad is None else param.grad + value

    torch.manual_seed(0)
    chunks = nn.ModuleList(Chunk() for _ in range(stages))
    for chunk in chunks:
        chunk.deferred = deferred
    return chunks


def _batch(step: int):
    import torch

    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen)


def _loss(output, target):
    import torch

    return torch.nn.functional.mse_loss(output, target)


def reference(stages: int) -> list[dict]:
    """Each step's gradients in one process, on the full batch, with no pipeline and no checkpoint."""
    import torch

    chunks = _model(stages)
    out = []
    for step in range(STEPS):
        chunks.zero_grad(set_to_none=True)
        x, y = _batch(step)
        for chunk in chunks:
            x = chunk.block(torch.tanh(chunk.inp(x)))
        _loss(x, y).backward()
        out.append({n: p.grad.clone() for n, p in chunks.named_parameters()})
    return out


# ---------------------------------------------------------------- one rank

SETUPS = {  # name -> (torch schedule, stages per rank, stage class: "torch" / "ckpt_viz", dw_builder)
    "stock-stage-1f1b": ("Schedule1F1B", 1, "torch", False),
    "stock-stage-zero-bubble": ("ScheduleInterleavedZeroBubble", 2, "torch", False),
    "rank-killed-sigterm": ("Schedule1F1B", 1, "ckpt_viz", False),
    "rank-killed-sigkill": ("Schedule1F1B", 1, "ckpt_viz", False),
    "dw-builder": ("ScheduleInterleavedZeroBubble", 2, "ckpt_viz", True),
    "dw-builder-1f1b": ("Schedule1F1B", 1, "ckpt_viz", True),
}


def worker(rank: int, name: str, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      TORCHELASTIC_RUN_ID=name)
    torch.set_num_threads(1)
    killed = name.startswith("rank-killed")
    if killed:  # the real path of a recorded run: enable() writes the rank file however the rank ends
        import ckpt_viz.distributed

        ckpt_viz.distributed.enable(os.path.join(out, "ranks"))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        _run(rank, name, out, killed)
    except BaseException:
        with open(os.path.join(out, f"error-rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    if not killed:
        dist.destroy_process_group()


def _run(rank: int, name: str, out: str, killed: bool) -> None:
    import torch
    from torch.distributed import pipelining as tp

    import ckpt_viz
    from ckpt_viz.bus import current_tags
    from ckpt_viz.distributed import rank_header, save_rank_trace
    from ckpt_viz.pipelining import PipelineStage

    schedule_name, per_rank, stage_kind, with_builder = SETUPS[name]
    total = WORLD * per_rank
    chunks = _model(total, deferred=with_builder)
    mine = [rank + k * WORLD for k in range(per_rank)]
    cls = tp.PipelineStage if stage_kind == "torch" else PipelineStage
    stages = []
    for index in mine:
        extra = {}
        if with_builder:  # STATIC shapes: DYNAMIC metadata inference would run the deferring backward once more,
            example = (torch.empty(BATCH // MICROBATCHES, WIDTH),)  # and its queued entry would shift every dW
            extra = {"dw_builder": (lambda chunk=chunks[index]: chunk.compute_dw), "input_args": example,
                     "output_args": example}
        stages.append(cls(chunks[index], index, total, torch.device("cpu"), **extra))
    schedule = getattr(tp, schedule_name)(stages[0] if per_rank == 1 else stages, MICROBATCHES, loss_fn=_loss)
    if killed and rank == 1:
        how = signal.SIGTERM if name.endswith("sigterm") else signal.SIGKILL

        def kill(module, args) -> None:
            if current_tags().get("step") == KILL_STEP:
                os.kill(os.getpid(), how)

        chunks[mine[0]].register_forward_pre_hook(kill)
    if killed:  # recorded by enable(): steps are counted and tagged there
        for step in range(STEPS):
            _step(schedule, chunks, mine, total, step)
        return
    header = rank_header(schedule)
    grads = []
    with ckpt_viz.record(model=chunks) as rec:
        for step in range(STEPS):
            with ckpt_viz.tag(step=step):
                _step(schedule, chunks, mine, total, step)
            grads.append({f"{i}.{n}": p.grad.clone() for i in mine for n, p in chunks[i].named_parameters()
                          if p.grad is not None})
    save_rank_trace(rec.trace, os.path.join(out, "ranks"), header)
    torch.save(grads, os.path.join(out, f"grads-rank{rank}.pt"))


def _step(schedule, chunks, mine: list[int], total: int, step: int) -> None:
    chunks.zero_grad(set_to_none=True)
    x, y = _batch(step)
    args = (x,) if 0 in mine else ()
    kwargs = {"target": y} if total - 1 in mine else {}
    schedule.step(*args, **kwargs)


# ---------------------------------------------------------------- a scenario: spawn, merge, describe

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(name: str, out: str) -> None:
    """Run `name`'s 2 ranks (called in a fresh interpreter, see `record`); a killed rank is expected."""
    import torch.multiprocessing as mp

    try:
        mp.spawn(worker, args=(name, out, _free_port()), nprocs=WORLD)
    except mp.ProcessExitedException as exc:
        if not name.startswith("rank-killed"):
            raise
        with open(os.path.join(out, "spawn.txt"), "w") as f:
            f.write(str(exc))


def record(name: str, dest: str = HERE, timeout_s: float = 240) -> str:
    """Run scenario `name` and write `<dest>/<name>.json.gz` (the merged trace); return its path."""
    from ckpt_viz import Trace
    from ckpt_viz.cli.merge import merge_run

    work = tempfile.mkdtemp(prefix=f"ckpt-viz-{name}-")
    try:
        code = f"import sys; sys.path.insert(0, {HERE!r}); import make; make.spawn(sys.argv[1], sys.argv[2])"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("CKPT_VIZ_DISTRIBUTED_DIR", None)
        done = subprocess.run([sys.executable, "-c", code, name, work], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: the ranks failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        ranks = os.path.join(work, "ranks")
        merged, run = merge_run(ranks, partial=name.startswith("rank-killed"))
        merged.meta["mistake"] = _describe(name, work, run)
        os.makedirs(dest, exist_ok=True)
        path = os.path.join(dest, f"{name}.json.gz")
        merged.save(path)
        if name == "rank-killed-sigkill":
            Trace.load(os.path.join(run, "rank-0.json")).save(os.path.join(dest, f"{name}.rank-0.json.gz"))
        return path
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _describe(name: str, work: str, run: str) -> dict:
    """`meta["mistake"]`: the scenario, and for the runs that finish, how far the gradients are from the reference."""
    schedule_name, per_rank, stage_kind, with_builder = SETUPS[name]
    facts = {"name": name, "schedule": schedule_name, "stage": f"{stage_kind}.PipelineStage",
             "dw_builder": with_builder, "world_size": WORLD, "microbatches": MICROBATCHES, "steps": STEPS,
             "rank_files": sorted(os.listdir(run))}
    if name.startswith("rank-killed"):
        facts["killed"] = {"rank": 1, "signal": "SIGTERM" if name.endswith("sigterm") else "SIGKILL",
                           "step": KILL_STEP}
        return facts
    import torch

    want = reference(WORLD * per_rank)
    worst = [0.0] * STEPS
    for rank in range(WORLD):
        for step, grads in enumerate(torch.load(os.path.join(work, f"grads-rank{rank}.pt"))):
            for key, got in grads.items():
                worst[step] = max(worst[step], float((got - want[step][key]).abs().max()))
    facts["max_abs_grad_error_by_step"] = worst
    facts["grads_match_reference"] = max(worst) <= 1e-5
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[[], *SCENARIOS], default=[], metavar="NAME")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args(argv)
    for name in args.names or SCENARIOS:
        path = record(name, args.out)
        print(f"{name}: {path}  {json.dumps(_summary(path))}")
    return 0


def _summary(path: str) -> dict:
    from ckpt_viz import Trace

    trace = Trace.load(path)
    mistake = trace.meta["mistake"]
    return {"events": len(trace.events), "unasked": trace.count("unasked_grads_accumulated"),
            "missing_ranks": trace.meta["distributed"]["missing_ranks"],
            "max_abs_grad_error_by_step": mistake.get("max_abs_grad_error_by_step")}


if __name__ == "__main__":
    sys.exit(main())
