"""No sandbox process or upload folder outlives its session by more than Streamlit's session timeout plus 60 s
(issue 25, finding 4; NOTE [ Session end ] in app/ui/session_end.py).

A real `streamlit run` server on 127.0.0.1 with its disconnected-session timeout shortened to 10 s
(`server.disconnectedSessionTTL`, through its environment variable) and a temporary folder of its
own, and real Chromium: three sessions each upload a model file and run it in their own warm
sandbox; the pages close; the test then watches the processes and the folders from outside. The
spare warm sandbox the app keeps started for the next session (NOTE [ Spare sandbox ]) belongs to
no session: it is told apart by its upload folder, which holds no model file.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from browser import CHROMIUM, CHROMIUM_ARGS, settle, streamlit_server
from procs import live_processes

ROOT = Path(__file__).resolve().parent.parent.parent
MODEL = ROOT / "examples" / "user_model.py"
TTL_S = 10
SESSIONS = 3

# serial: it watches the process table for the sessions' sandboxes, against a wall-clock bound (TTL + 60 s).
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.serial,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is missing (apt-get install chromium)")]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def _session_sandboxes(tmp: Path) -> dict[str, list[int]]:
    """Each warm sandbox a session owns (its folder, by the bubblewrap process that binds a session's upload folder
    holding a model file) -> the live processes of it (bubblewrap's, the warm process and its runs)."""
    uploads = tmp / "ckpt_viz_uploads"
    owned: dict[str, list[int]] = {}
    processes = live_processes(str(tmp))
    for pid in processes:
        args = _cmdline(pid)
        if not args or not args[0].endswith("bwrap"):
            continue
        bound = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--ro-bind" and args[i + 1].startswith(
            str(uploads))]
        folder = args[args.index("--chdir") + 1] if "--chdir" in args else ""
        if folder and any(Path(b).is_dir() and any(Path(b).iterdir()) for b in bound):
            owned[folder] = [p for p in processes if folder in "\0".join(_cmdline(p)) or p == pid]
    return owned


def _session_uploads(tmp: Path) -> list[Path]:
    """Upload folders holding a model file (a spare's has an empty model folder)."""
    uploads = tmp / "ckpt_viz_uploads"
    return [f for f in uploads.iterdir() if (f / "model").is_dir() and any((f / "model").iterdir())] \
        if uploads.is_dir() else []


def _upload_and_run(context, url: str) -> None:
    from playwright.sync_api import expect

    page = context.pages[0] if context.pages else context.new_page()
    page.goto(url, timeout=60_000)
    settle(page, 180_000)
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Model file (.py)", exact=True).click()
    expect(sidebar.get_by_text("Time limit (s)")).to_be_visible(timeout=60_000)
    settle(page)
    sidebar.get_by_text("Upload", exact=True).click()
    dropzone = sidebar.locator('[data-testid="stFileUploaderDropzoneInput"]')
    expect(dropzone).to_have_count(1, timeout=60_000)
    dropzone.set_input_files(str(MODEL))
    expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible(timeout=180_000)
    expect(page.locator('[data-testid="stMetric"]').filter(has_text="Handles")).to_contain_text("3", timeout=180_000)


def test_sandboxes_and_uploads_end_within_the_session_timeout_plus_60_s(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), "STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL": str(TTL_S)}
    with streamlit_server(tmp_path / "streamlit.log", env=env) as url, sync_playwright() as p:
        contexts = []
        try:
            for i in range(SESSIONS):
                context = p.chromium.launch_persistent_context(
                    str(tmp_path / f"profile{i}"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                    viewport={"width": 1500, "height": 1000})
                contexts.append(context)
                _upload_and_run(context, url)
            sandboxes, uploads = _session_sandboxes(tmp), _session_uploads(tmp)
            assert len(sandboxes) == SESSIONS and all(sandboxes.values()), sandboxes  # one each, running
            assert len(uploads) == SESSIONS, uploads
        finally:
            for context in contexts:
                context.close()  # the tabs close: Streamlit sees each session disconnect
        closed = time.monotonic()
        watched = [pid for pids in sandboxes.values() for pid in pids]
        deadline = closed + TTL_S + 60
        while time.monotonic() < deadline:
            alive = [pid for pid in watched if os.path.exists(f"/proc/{pid}") and _cmdline(pid) != [""]]
            alive = [pid for pid in alive if pid in live_processes(str(tmp))]
            if not alive and not any(u.exists() for u in uploads):
                break
            time.sleep(1)
        gone_s = time.monotonic() - closed
        left = [(pid, " ".join(_cmdline(pid))[:200]) for pid in watched if pid in live_processes(str(tmp))]
        assert left == [], f"{gone_s:.0f} s after the pages closed"
        assert [u for u in uploads if u.exists()] == [], f"{gone_s:.0f} s after the pages closed"
        assert _session_sandboxes(tmp) == {} and _session_uploads(tmp) == []
        assert gone_s <= TTL_S + 60
        print(f"session sandboxes and uploads gone {gone_s:.0f} s after the pages closed (timeout {TTL_S} s)")
        log = (tmp_path / "streamlit.log").read_text()
        assert "Traceback" not in log, log[-3000:]
