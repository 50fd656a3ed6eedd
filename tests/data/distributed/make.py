"""Regenerate this folder's rank files: a real 2-rank gloo run of examples/pipelining_torchrun.py under
ZBVZeroBubble (one step, 4 micro-batches), recorded by `ckpt-viz record --distributed --no-merge`.

    .venv/bin/python tests/data/distributed/make.py

Writes rank-0.json.gz and rank-1.json.gz (schema of the ckpt_viz that runs it), read by
tests/distributed/test_merge.py without torch.distributed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def main() -> None:
    from ckpt_viz.trace import Trace

    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "ckpt_viz", "record", "--distributed", "--nproc-per-node", "2", "--out", out,
                   "--no-merge", "examples/pipelining_torchrun.py", "--schedule", "ZBVZeroBubble", "--steps", "1"]
        subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        (run,) = os.listdir(out)
        for rank in range(2):
            trace = Trace.load(Path(out, run, f"rank-{rank}.json"))
            trace.save(HERE / f"rank-{rank}.json.gz")
            print(f"wrote {HERE / f'rank-{rank}.json.gz'}: {len(trace.events)} events, {len(trace.memory)} samples")


if __name__ == "__main__":
    main()
