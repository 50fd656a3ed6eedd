"""An example model file for ckpt_viz: a small residual network with a custom loss.

Load it with either form (the second needs the repository root on sys.path):

    from ckpt_viz.usermodel.load import load_model
    spec = load_model("examples/user_model.py:make_model")
    spec = load_model("examples.user_model:make_model")

or record it safely in a child process (time and memory limits):

    from ckpt_viz.usermodel.sandbox import record_in_subprocess
    trace = record_in_subprocess("examples/user_model.py:make_model", "split-reentrant")

The factory takes no arguments and returns a dict (or just `(model, inputs)`):
    model       a torch.nn.Module
    inputs      a tensor, or a tuple of the positional arguments of model(...)
    loss        optional: output -> scalar tensor (default: sum of squares of the output)
    checkpoint  optional: qualified submodule names to checkpoint (default: the children
                of the model's first nn.ModuleList or nn.Sequential)
    stages      optional: stage submodule names, for mode "pipeline"
"""
from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    """x + MLP(LayerNorm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Residual(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> dict:
    """A 3-block residual MLP classifier with a cross-entropy loss."""
    model = Net()
    x = torch.randn(8, 16)
    target = torch.arange(8) % 4
    return {
        "model": model,
        "inputs": x,  # one tensor; use a tuple for several arguments
        "loss": lambda logits: nn.functional.cross_entropy(logits, target),
        "checkpoint": ["blocks.0", "blocks.1", "blocks.2"],  # the default would pick these too
    }
