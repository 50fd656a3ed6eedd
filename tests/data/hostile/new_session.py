"""Hostile model: leaves a process in a new session and a double-forked daemon behind, then loads normally.

Their command lines end with this file's path, so a test can look for survivors.
"""
import os
import subprocess
import sys

SLEEP = "import time; time.sleep(600)"


def make_model():
    import torch

    subprocess.Popen([sys.executable, "-c", SLEEP, __file__], start_new_session=True)
    if os.fork() == 0:  # the classic daemon: fork, setsid, fork again, parent exits
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", SLEEP, __file__])
        os._exit(0)
    os.wait()
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4)), torch.randn(2, 4)
