"""Fixture: a syntax error on line 6."""
import torch


def make_model():
    model = torch.nn.Linear(2 2)
    return model, torch.randn(1, 2)
