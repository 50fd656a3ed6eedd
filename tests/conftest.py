"""Shared fixtures: a fixed seed, fresh runtime state, a private temp folder, a recorder, a tiny model, gpu auto-skip."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime.reset import reset_state

# `tests/models.py` is imported as `models` by the test files.
sys.path.insert(0, os.path.dirname(__file__))

from models import Stack  # noqa: E402


@pytest.fixture(autouse=True)
def seed() -> int:
    """Every test starts from the same global RNG state."""
    torch.manual_seed(0)
    return 0


@pytest.fixture(autouse=True)
def fresh_runtime_state() -> None:
    """Every test starts without the sessions, memory hook or handle numbering an earlier test left."""
    reset_state()


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`tempfile` (and child processes, through TMPDIR) use a folder of this test's own, not /tmp.

    So a test that looks for what it left in the temp folder (the sandbox's `ckpt_viz_sandbox_*`)
    never sees another process's folders. Separate from `tmp_path`, whose contents tests assert.
    """
    folder = tmp_path_factory.mktemp("tempdir")
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


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
