"""Hostile model: connects to a Unix socket that exists on the host (issue 25, finding 6: a Docker or D-Bus
socket reachable through the read-only view). The socket's path is in `socket.txt` beside this file.

The outcome ("connected", or the errno's name) goes into the error it raises.
"""
import errno
import os
import socket
from pathlib import Path


def make_model():
    path = Path(__file__).with_name("socket.txt").read_text().strip()
    seen = [f"exists={os.path.exists(path)}", f"in /run: {sorted(os.listdir('/run'))}"]  # Docker, D-Bus live there
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        seen.append(f"socket(AF_UNIX): {errno.errorcode.get(exc.errno, exc.errno)}")
    else:
        try:
            s.connect(path)
            s.sendall(b"hello from the sandbox")
            seen.append("connected")
        except OSError as exc:
            seen.append(f"connect: {errno.errorcode.get(exc.errno, exc.errno)}")
        finally:
            s.close()
    raise RuntimeError("unix socket " + "; ".join(seen))
