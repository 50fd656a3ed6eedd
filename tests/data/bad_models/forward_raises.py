"""Fixture: forward fails on line 14 (the second block gets the wrong width)."""
import torch
from torch import nn


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 3), nn.Linear(4, 3)])

    def forward(self, x):
        h = self.blocks[0](x)
        if h.shape[-1] != 4:
            raise ValueError(f"block 1 expects width 4, got {h.shape[-1]}")
        return self.blocks[1](h)


def make_model():
    return Broken(), torch.randn(2, 4)
