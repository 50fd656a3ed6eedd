"""Rank files of runs that end badly (NOTE [ Partial runs ] in ckpt_viz/distributed.py), on real gloo groups.

One rank (world 1) that raises or gets SIGTERM (`step` is 0: no schedule stepped), and a rank waiting inside a
gloo receive (world 2) when SIGTERM comes: there Python cannot run the handler, and the watcher thread writes
the file.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ckpt_viz import Trace

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ending_rank.py")


def _env(rank: int, world: int, port: int) -> dict[str, str]:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "../outside", "OMP_NUM_THREADS": "1"}
    env.pop("CKPT_VIZ_DISTRIBUTED_DIR", None)
    return env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_file(out, rank: int = 0) -> Trace:
    assert os.listdir(out) == ["outside"]  # TORCHELASTIC_RUN_ID "../outside" made a plain name, inside `out`
    return Trace.load(out / "outside" / f"rank-{rank}.json")


@pytest.mark.parametrize("how", ["clean", "raise", "sigterm"])
def test_one_rank_ending(how: str, tmp_path) -> None:
    out = tmp_path / "traces"
    done = subprocess.run([sys.executable, SCRIPT, str(out), how], env=_env(0, 1, _port()), capture_output=True,
                          text=True, timeout=120)
    trace = _rank_file(out)
    assert trace.count("replay_started") == 1  # the step before the end is in the file
    if how == "clean":
        assert done.returncode == 0 and "partial" not in trace.meta
        assert "clock_end" in trace.meta["distributed"]
        return
    if how == "raise":
        assert done.returncode == 1 and "ValueError: the training loop failed" in done.stderr  # the hook chained
        assert trace.meta["partial"] == {"reason": "exception", "signal": None,
                                         "error": "ValueError: the training loop failed", "step": 0}
        (error,) = trace.of_kind("error")
        assert error.type == "ValueError"
    else:
        assert done.returncode == -signal.SIGTERM  # the default action still ends the process by the signal
        assert trace.meta["partial"] == {"reason": "signal", "signal": "SIGTERM", "error": None, "step": 0}
    assert "clock_end" not in trace.meta["distributed"]


def test_sigterm_while_waiting_in_gloo(tmp_path) -> None:
    out, port = tmp_path / "traces", _port()
    ranks = [subprocess.Popen([sys.executable, SCRIPT, str(out), "gloo-wait"], env=_env(r, 2, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        assert ranks[0].stdout.readline().strip() == "ready"
        time.sleep(3)  # well inside the receive by now
        ranks[0].send_signal(signal.SIGTERM)
        assert ranks[0].wait(timeout=60) == 128 + signal.SIGTERM  # the watcher thread saved and ended it
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    trace = _rank_file(out)
    assert trace.meta["partial"] == {"reason": "signal", "signal": "SIGTERM", "error": None, "step": 0}
    assert trace.count("replay_started") == 1
