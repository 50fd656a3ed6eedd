"""Hostile model: starts four processes that each fill 700 MB, more than a 2048 MB limit holds in all.

Each helper's command line ends with this file's path, so a test can find and measure them.
"""
import subprocess
import sys

FILL = "import sys, time; block = b'\\x01' * (700 << 20); time.sleep(4)"


def make_model():
    import torch

    helpers = [subprocess.Popen([sys.executable, "-c", FILL, __file__]) for _ in range(4)]
    codes = [h.wait() for h in helpers]
    print("helpers ended with", codes, flush=True)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4)), torch.randn(2, 4)
