"""A model that changes its input in place: the trial forward must not change the factory's inputs."""
import torch


class AddsOne(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))

    def forward(self, x):
        with torch.no_grad():  # in place, as some preprocessing does (allowed on a leaf under no_grad)
            x.add_(1.0)
        return self.layers(x)


def make_model():
    return AddsOne(), torch.zeros(2, 3)
