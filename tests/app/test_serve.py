"""Where the app listens: loopback wherever `streamlit run` is started, unless the user asks otherwise.

The app runs uploaded model files, so a server on every interface would be remote code execution.
The settings live in app/.streamlit/config.toml, beside the entry point, which Streamlit reads
whatever the working folder is. These tests start the real server from another folder and read
the kernel's table of listening sockets.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
APP = ROOT / "app" / "streamlit_app.py"
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp*


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) of sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == LISTEN:
                found.add(address)
    return found


def _serve(cwd: Path, *extra: str) -> tuple[subprocess.Popen, int, Path]:
    port = _free_port()
    log = cwd / "streamlit.log"
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port), *extra],
                            cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not _listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"streamlit did not start (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, port, log


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
def test_started_from_another_folder_the_app_listens_on_loopback_only(tmp_path: Path) -> None:
    # A working folder whose own config asks for every interface: the app's config wins.
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "config.toml").write_text('[server]\naddress = "0.0.0.0"\n')
    proc, port, _ = _serve(tmp_path)
    try:
        assert _listening(port) == {"0100007F"}  # 127.0.0.1, and nothing on 0.0.0.0 or ::
    finally:
        _stop(proc)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
def test_an_explicit_address_is_honoured(tmp_path: Path) -> None:
    proc, port, _ = _serve(tmp_path, "--server.address", "0.0.0.0")
    try:
        assert _listening(port) == {"00000000"}
    finally:
        _stop(proc)


def test_the_app_config_sets_xsrf_and_no_usage_statistics() -> None:
    import tomllib

    config = tomllib.loads((APP.parent / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    assert config["server"]["enableXsrfProtection"] is True
    assert config["browser"]["gatherUsageStats"] is False
