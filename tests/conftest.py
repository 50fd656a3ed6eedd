"""Shared fixtures: a fixed seed, a recorder, a tiny model, and the gpu auto-skip."""
from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest
import torch

import ckpt_viz

# `tests/models.py` is imported as `models` by the test files.
sys.path.insert(0, os.path.dirname(__file__))

from models import Stack  # noqa: E402


@pytest.fixture(autouse=True)
def seed() -> int:
    """Every test starts from the same global RNG state."""
    torch.manual_seed(0)
    return 0


@pytest.fixture
def recorder() -> Iterator[ckpt_viz.Recording]:
    """A `ckpt_viz.record()` block open for the whole test; read `recorder.trace`."""
    with ckpt_viz.record() as rec:
        yield rec


@pytest.fixture
def mlp2() -> Stack:
    """Two checkpointed tanh blocks, 4 -> 5 -> 3, parameters captured by closure."""
    return Stack.mlp([4, 5, 3], seed=0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA is unavailable")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
