"""The 2-rank gloo spawn shared by the distributed tests (one spawn per session: it costs most of their time)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pipelining_worker as worker
import pytest

WORLD = 2
SPAWN_TIMEOUT_S = 150


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Spawned from a fresh interpreter started with -c: torch's spawn re-runs the parent's __main__ file in
    # each rank, and inside a full test run that can be another test's script (AppTest leaves the app's).
    folder = str(tmp_path_factory.mktemp("pipelining"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pipelining_worker as w; "
            "import torch.multiprocessing as mp; "
            "mp.spawn(w.worker, args=(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5].split(',')), "
            "nprocs=int(sys.argv[2]))")
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        argv = [sys.executable, "-c", code, here, str(WORLD), folder, str(_free_port()), ",".join(worker.CASES)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SPAWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {WORLD} spawned ranks did not finish within {SPAWN_TIMEOUT_S} s")
    assert proc.returncode == 0, f"the ranks failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return folder


