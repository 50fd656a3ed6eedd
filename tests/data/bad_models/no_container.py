"""Fixture: no nn.ModuleList or nn.Sequential and no "checkpoint" key."""
import torch
from torch import nn


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 3)
        self.fc2 = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_model():
    return TwoLayers(), torch.randn(2, 3)
