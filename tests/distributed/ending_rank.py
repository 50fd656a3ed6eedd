"""A rank recorded with ckpt_viz.distributed.enable that ends badly (run by test_partial_endings.py).

    python ending_rank.py OUT HOW        (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment)

HOW: "raise" (an uncaught exception after one step), "sigterm" (SIGTERM to itself in Python code),
"gloo-wait" (rank 0 waits in a gloo receive that never comes; rank 1 sleeps), "clean" (one step, exit).
Prints "ready" once it is where the test sends a signal.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import ckpt_viz
import ckpt_viz.distributed
from ckpt_viz.runtime import checkpoint

out, how = sys.argv[1], sys.argv[2]
ckpt_viz.distributed.enable(out)
dist.init_process_group("gloo")
block = torch.nn.Linear(4, 4)
with ckpt_viz.tag(step=0):
    checkpoint(block, torch.randn(2, 4, requires_grad=True), use_reentrant=True).sum().backward()
if how == "raise":
    raise ValueError("the training loop failed")
if how == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
if how == "gloo-wait":
    if dist.get_rank() == 0:
        print("ready", flush=True)
        dist.recv(torch.zeros(1), src=1)  # never sent: this rank waits inside gloo's C++
    else:
        time.sleep(60)
dist.destroy_process_group()
