"""Fixture: forward returns a Python float, not a tensor."""
import torch
from torch import nn


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 2)])

    def forward(self, x):
        return self.layers[0](x).detach().sum().item()


def make_model():
    return Scalar(), torch.randn(1, 2)
