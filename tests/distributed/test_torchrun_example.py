"""examples/pipelining_torchrun.py under real torchrun (--standalone, 2 processes, gloo): one trace per rank."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ckpt_viz import Trace

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "pipelining_torchrun.py")


def test_example_runs_under_torchrun(tmp_path) -> None:
    out = tmp_path / "traces"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE,
         "--out", str(out), "--schedule", "ZBVZeroBubble", "--steps", "1"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    (run_id,) = os.listdir(out)
    assert sorted(os.listdir(out / run_id)) == ["rank-0.json", "rank-1.json"]
    for rank in range(2):
        trace = Trace.load(out / run_id / f"rank-{rank}.json")
        header = trace.meta["distributed"]
        assert (header["run_id"], header["rank"], header["world_size"]) == (run_id, rank, 2)
        assert header["stages"] == [rank, 3 - rank]
        replays = [e for e in trace if e.kind == "replay_started"]
        assert {e.tags["rank"] for e in replays} == {rank}
        assert {(e.tags["action"], e.phase) for e in replays if e.tags["microbatch"] >= 0} == (
            {("W", "dw"), ("I", "dx")} if rank == 0 else {("I", "dx")})
        assert f"rank {rank}: {len(trace)} events -> " in done.stdout
