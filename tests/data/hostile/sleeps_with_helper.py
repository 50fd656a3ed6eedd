"""Hostile model: starts a helper that sleeps, then sleeps itself; both must end when the run ends.

The helper's command line ends with this file's path, so a test can look for it.
"""
import subprocess
import sys
import time


def make_model():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", __file__])
    print("helper started", flush=True)
    while True:
        time.sleep(1)
