"""examples/pipelining_torchrun.py under `ckpt-viz record --distributed` (real torchrun --standalone, 2 ranks, gloo).

The command runs torchrun with each rank as `python -m ckpt_viz.distributed SCRIPT` (recorded through
CKPT_VIZ_DISTRIBUTED_DIR, the script's own `enable(--out)` then doing nothing), and merges the rank files.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ckpt_viz import Trace

# serial: the merge checks the ranks' clocks (every receive after its send), aligned from round trips that a busy
# machine stretches unevenly
pytestmark = [pytest.mark.slow, pytest.mark.serial]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "pipelining_torchrun.py")


def test_example_runs_under_ckpt_viz_record_distributed(tmp_path) -> None:
    out = tmp_path / "traces"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("CKPT_VIZ_DISTRIBUTED_DIR", None)
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_viz", "record", "--distributed", "--nproc-per-node", "2", "--out", str(out),
         EXAMPLE, "--schedule", "ZBVZeroBubble", "--steps", "1", "--out", str(tmp_path / "unused")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert not (tmp_path / "unused").exists()  # the script's enable(--out) did nothing: the rank was recorded already
    (run_id,) = os.listdir(out)
    assert sorted(os.listdir(out / run_id)) == ["merged.json", "rank-0.json", "rank-1.json"]
    for rank in range(2):
        trace = Trace.load(out / run_id / f"rank-{rank}.json")
        header = trace.meta["distributed"]
        assert (header["run_id"], header["rank"], header["world_size"]) == (run_id, rank, 2)
        assert header["stages"] == [rank, 3 - rank] and header["schedule"] == "ScheduleZBVZeroBubble"
        assert header["steps"] == 1 and header["planned_order"]
        assert "clock_end" in header  # measured again in destroy_process_group: the merge fits drift
        assert (trace.meta["model"], trace.meta["mode"]) == ("pipelining_torchrun", "pipeline")
        replays = [e for e in trace if e.kind == "replay_started"]
        assert {e.tags["rank"] for e in replays} == {rank} and {e.tags["step"] for e in replays} == {0}
        assert {(e.tags["action"], e.phase) for e in replays if e.tags["microbatch"] >= 0} == (
            {("W", "dw"), ("I", "dx")} if rank == 0 else {("I", "dx")})
    merged = Trace.load(out / run_id / "merged.json")
    assert {e.tags["rank"] for e in merged} == {0, 1}
    check = merged.meta["distributed"]["alignment"]
    assert check["edges_checked"] > 0 and check["receives_before_send"] == 0
    assert "every receive comes after its send" in done.stdout
    chunk_bytes = 3 * (16 * 16 + 16) * 4  # a stage: three 16x16 linears with biases (the example's default width)
    latest = {s.rank: s for s in merged.memory}  # each rank keeps its own samples (NOTE [ Merging rank traces ])
    assert set(latest) == {0, 1}
    assert {stage: row["parameters"] for s in latest.values() for stage, row in s.by_stage.items()} == dict.fromkeys(
        "0123", chunk_bytes)


def test_example_runs_under_plain_torchrun(tmp_path) -> None:
    """The script's own `ckpt_viz.distributed.enable(--out)` (before init_process_group) records every rank."""
    out = tmp_path / "traces"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("CKPT_VIZ_DISTRIBUTED_DIR", None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE,
         "--out", str(out), "--schedule", "GPipe", "--steps", "1", "--microbatches", "2"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    (run_id,) = os.listdir(out)
    assert sorted(os.listdir(out / run_id)) == ["rank-0.json", "rank-1.json"]
    for rank in range(2):
        header = Trace.load(out / run_id / f"rank-{rank}.json").meta["distributed"]
        assert (header["rank"], header["stages"], header["schedule"]) == (rank, [rank], "ScheduleGPipe")
    assert "rank 1: loss of the last step" in done.stdout
