"""Processes seen through /proc, for the sandbox tests: what is still running after a child was ended."""
from __future__ import annotations

import os
from pathlib import Path


def live_processes(marker: str) -> list[int]:
    """The pids of live (not zombie) processes other than this one with `marker` in their command line."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] if cmdline else "X"
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X") and int(entry) != os.getpid():
            found.append(int(entry))
    return found
