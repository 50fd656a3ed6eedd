"""torch's own pipelining tests, run with ckpt_viz.pipelining.PipelineStage on 2 gloo ranks (torch_upstream.py).

The tests read torch's test sources from the folder in CKPT_VIZ_TORCH_PIPELINING_TESTS (a checkout's
test/distributed/pipelining, of the torch version pinned in constraints.txt); without it they are skipped, since
this repository keeps no copy of torch's tests. Each runs once with torch's own stage too: the test itself
passes there, so a failure with ours is ours.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

WORLD = 2
TESTS = os.environ.get("CKPT_VIZ_TORCH_PIPELINING_TESTS", "")
HERE = os.path.dirname(os.path.abspath(__file__))
needs_sources = pytest.mark.skipif(
    not os.path.isfile(os.path.join(TESTS, "test_schedule_multiproc.py")),
    reason="set CKPT_VIZ_TORCH_PIPELINING_TESTS to torch's test/distributed/pipelining folder")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_upstream(test: str, stage: str, out: str, module: str = "test_schedule_multiproc") -> dict[int, str]:
    """Each rank's result of torch's `test` ("Class.method") with `stage` ("ckpt_viz" or "torch")."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import torch_upstream as u; "
            "import torch.multiprocessing as mp; "
            "mp.spawn(u.run, args=(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:9]), nprocs=int(sys.argv[2]))")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, HERE, str(WORLD), str(_free_port()), TESTS, module, test, stage, out],
                   capture_output=True, text=True, timeout=300, env=env)
    results = {}
    for rank in range(WORLD):
        path = os.path.join(out, f"rank{rank}.txt")
        results[rank] = open(path).read() if os.path.exists(path) else "no result written"
    return results


@needs_sources
@pytest.mark.parametrize("stage", ["ckpt_viz", "torch"])
def test_schedule_with_weight_update_mlp_e2e(stage: str, tmp_path) -> None:
    """dw_builder: the W action runs the runner the builder made in I (ckpt_viz.pipelining NOTE [ dw_builder ])."""
    results = run_upstream("ScheduleTest.test_schedule_with_weight_update_mlp_e2e", stage, str(tmp_path))
    assert results == dict.fromkeys(range(WORLD), "ok"), "\n".join(results.values())
