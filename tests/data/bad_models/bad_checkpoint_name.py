"""Fixture: checkpoint names a submodule that does not exist ("block.0" for "blocks.0")."""
import torch
from torch import nn


def make_model():
    model = nn.Module()
    model.blocks = nn.ModuleList([nn.Linear(2, 2)])
    model.forward = lambda x: model.blocks[0](x)
    return {"model": model, "inputs": torch.randn(1, 2), "checkpoint": ["block.0"]}
