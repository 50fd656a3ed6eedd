"""Hostile model: connects to the port written in port.txt beside it (the test's listener on 127.0.0.1)."""
import socket
from pathlib import Path


def make_model():
    port = int(Path(__file__).with_name("port.txt").read_text())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"exfiltrated")
    raise RuntimeError(f"connected to 127.0.0.1:{port}")
