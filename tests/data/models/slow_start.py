"""A model file whose factory pauses 3 s before it builds three checkpointed linear blocks: a sandboxed run long
enough for the app's Cancel button to be on screen while it runs, however busy the machine
(tests/app/test_browser_flows.py)."""
from __future__ import annotations

import time

import torch
from torch import nn

PAUSE_S = 3.0


def make_model() -> dict:
    time.sleep(PAUSE_S)
    return {"model": nn.Sequential(*(nn.Linear(8, 8) for _ in range(3))), "inputs": torch.randn(4, 8)}
