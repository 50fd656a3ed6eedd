"""Fixture: a dict with a misspelt key."""
import torch


def make_model():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
    return {"model": model, "inputs": torch.randn(1, 2), "checkpiont": ["0"]}
