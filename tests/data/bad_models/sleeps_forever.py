"""Fixture (sandbox): starts a grandchild that sleeps, then sleeps itself; both must be killed on timeout.

The grandchild's pid goes to the file named by $CKPT_VIZ_TEST_PIDFILE, when set.
"""
import os
import subprocess
import sys
import time


def make_model():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    pidfile = os.environ.get("CKPT_VIZ_TEST_PIDFILE")
    if pidfile:
        with open(pidfile, "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
    while True:
        time.sleep(1)
