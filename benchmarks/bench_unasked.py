"""What does the unasked-accumulation check cost a run that nobody records? (NOTE [ Unasked accumulation ])

A step is forward + full backward of N small residual blocks, each under ckpt_viz's reentrant checkpoint
outside any scope (the path the check sits on), one torch thread. Cases, interleaved round by round:
  checked    `unasked.pending` True: no warning yet in this process, every backward of a handle asks
             the engine whether the backward is filtered (one C call)
  flag only  `unasked.pending` False: warned once already, one flag check per backward
Prints median step times, their paired ratio, and Python bytecodes per step (load-independent). Run it
with another checkout's interpreter to count that checkout's bytecodes too (it has no `unasked` module:
only the "flag only" row, which is then its plain runtime).

    python benchmarks/bench_unasked.py [--blocks 16] [--repeats 200] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
from torch import nn

from _common import format_table, interleaved, opcodes_per_step, paired_ratio, stable_threads
from ckpt_viz.runtime import checkpoint

try:
    from ckpt_viz.runtime import unasked
except ImportError:  # a checkout before the check: its plain runtime
    unasked = None


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats = 5 if args.quick else args.repeats
    stable_threads()
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(args.width) for _ in range(args.blocks))
    x = torch.randn(8, args.width, requires_grad=True)

    def step() -> None:
        h = x
        for block in blocks:
            h = checkpoint(block, h, use_reentrant=True)
        h.sum().backward()

    def with_pending(value: bool):
        def run() -> None:
            unasked.pending = value
            step()
        return run

    cases = {"flag only": with_pending(False), "checked": with_pending(True)} if unasked else {"flag only": step}
    times = interleaved(cases, repeats=repeats)
    rows = []
    for name, run in cases.items():
        rows.append([name, f"{statistics.median(times[name]):.3f}", f"{opcodes_per_step(run):.0f}"])
    print(f"torch {torch.__version__}, {args.blocks} blocks, width {args.width}, {repeats} rounds, "
          f"ckpt_viz from {sys.modules['ckpt_viz'].__file__}")
    print(format_table(["case", "median ms/step", "bytecodes/step"], rows))
    if unasked:
        ratio = paired_ratio(times["checked"], times["flag only"])
        per = (statistics.median(times["checked"]) - statistics.median(times["flag only"])) / args.blocks * 1000
        print(f"checked / flag only (paired median ratio): {ratio:.4f}; about {per:.2f} us per checkpoint backward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
