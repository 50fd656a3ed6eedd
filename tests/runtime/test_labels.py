"""A region's label (NOTE [ Region labels ] in ckpt_viz/runtime/labels.py): the module's name in the model on the
stack, looked for once per module and remembered, found or not; the model given to `record` names it always."""
from __future__ import annotations

import torch
from torch import nn

from ckpt_viz.recording import record
from ckpt_viz.runtime import checkpoint


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return x


def _labels(run, **kwargs) -> list[str | None]:  # type: ignore[no-untyped-def]
    with record(**kwargs) as rec:
        run().sum().backward()
    return [e.label for e in rec.trace.of_kind("handle_created")]


def test_a_block_is_named_in_the_module_whose_forward_runs_it() -> None:
    model, x = Stack(), torch.randn(2, 4, requires_grad=True)
    assert _labels(lambda: model(x)) == ["blocks.0", "blocks.1"]
    assert _labels(lambda: model(x)) == ["blocks.0", "blocks.1"]  # remembered


def test_a_block_run_from_a_plain_loop_keeps_its_class_name_and_that_is_remembered() -> None:
    model, x = Stack(), torch.randn(2, 4, requires_grad=True)

    def loop() -> torch.Tensor:
        y = x
        for block in model.blocks:
            y = checkpoint(block, y, use_reentrant=True)
        return y

    assert _labels(loop) == ["Sequential", "Sequential"]
    # looked for once: a later run inside the parent's forward does not rename it (rule 2)
    assert _labels(lambda: model(x)) == ["Sequential", "Sequential"]
    # the model given to record() names every module, whatever was remembered
    assert _labels(lambda: model(x), model=model) == ["blocks.0", "blocks.1"]
