"""Fixture: defines build() but not make_model()."""
import torch


def build():
    return torch.nn.Linear(2, 2), torch.randn(1, 2)
