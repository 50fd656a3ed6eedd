"""The sandbox panel, driven headless with AppTest: limits, uploads, a run in progress, Cancel, errors, Try again.

Each AppTest is a session with its own warm sandbox (one torch import in a child, 2-8 s): the spare
started ahead (NOTE [ Spare sandbox ] in app/ui/sandbox.py) or one it starts; runs of a model file
are forks of it (about a second each).
"""
from __future__ import annotations

import gc
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckpt_viz.usermodel.load import ModelLoadError, load_model
from procs import live_processes

ROOT = Path(__file__).resolve().parent.parent.parent
APP = str(ROOT / "app" / "streamlit_app.py")
EXAMPLE = ROOT / "examples" / "user_model.py"
BAD = ROOT / "tests" / "data" / "bad_models"
pytestmark = pytest.mark.slow

sys.path.insert(0, str(ROOT / "app"))  # the modules AppTest runs the app with (`streamlit run` puts app/ there)
from ui import sandbox  # noqa: E402


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _app(**state: object) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def _errors(at: AppTest) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def _plain(markdown: str) -> str:
    """Markdown written by `ui.text.md` as the browser shows it (escapes and word joiners gone)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u2060", "").replace("\u00a0", " ")


def _box(at: AppTest) -> sandbox.SessionSandbox:
    return at.session_state[sandbox.KEY]


def _upload(at: AppTest, name: str, text: str) -> AppTest:
    return at.file_uploader(key="src_py").upload(name, text.encode(), "text/x-python").run()


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_limits_show_before_the_first_upload_and_stay_across_uploads() -> None:
    at = _app(src_kind="Model file (.py)", src_file_how="Upload")
    assert at.number_input(key="src_timeout").value == 60 and at.number_input(key="src_memory").value == 4096
    assert any("Pick a source" in i.value for i in at.info)  # nothing uploaded yet, the limits already there
    at.number_input(key="src_timeout").set_value(45)
    at.number_input(key="src_memory").set_value(3072).run()
    source = EXAMPLE.read_text()
    at = _upload(at, "first_model.py", source)
    assert not _errors(at), _errors(at)
    folder = _box(at).folder / "model"
    assert [p.name for p in folder.iterdir()] == ["first_model.py"]
    at = _upload(at, "second_model.py", source + "\n# edited\n")
    assert not _errors(at), _errors(at)
    assert (at.number_input(key="src_timeout").value, at.number_input(key="src_memory").value) == (45, 3072)
    config = at.session_state["run_config"]
    assert (config.timeout_s, config.memory_mb, config.name) == (45.0, 3072, "second_model.py")
    assert [p.name for p in folder.iterdir()] == ["second_model.py"]  # the first upload was replaced
    # The user's file name on the page, never the temporary upload path.
    shown = [_plain(m.value) for m in at.markdown] + [_plain(c.value) for c in at.caption]
    assert any("second_model.py" in text for text in shown), shown
    assert not any("ckpt_viz_uploads" in text for text in shown), shown
    # Leaving the source and coming back keeps the limits too.
    at.radio(key="src_kind").set_value("Saved trace").run()
    at.radio(key="src_kind").set_value("Model file (.py)").run()
    assert (at.number_input(key="src_timeout").value, at.number_input(key="src_memory").value) == (45, 3072)
    # The session ends: its upload folder and its warm process go with it.
    session, warm = _box(at).folder, _box(at).warm
    assert session.exists() and warm.alive
    del at, folder
    gc.collect()
    assert not session.exists()
    assert not warm.alive


@pytest.mark.serial  # Cancel stops the run within 2 s (wall clock)
def test_cancel_stops_a_looping_file_within_two_seconds_and_try_again_reruns_only_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(src_kind="Model file (.py)", src_file_how="Path", src_ref=f"{EXAMPLE}:make_model")
    assert not _errors(at), _errors(at)
    good = at.session_state["run_config"]
    kept = _box(at).runs[good]
    monkeypatch.setattr(sandbox, "WAIT_S", 1.0)  # the page stops waiting after 1 s and polls (as in a browser)
    at.text_input(key="src_ref").set_value(f"{BAD / 'sleeps_forever.py'}:make_model").run()
    assert [b.label for b in at.button if b.key == "sandbox_cancel"] == ["Cancel"]
    running = next(_plain(i.value) for i in at.info if "Running" in i.value)
    assert "sleeps_forever.py" in running and re.search(r": \d+\.\d s \(time limit 60 s per mode\)", running)
    warm = _box(at).warm
    assert len(_children(warm._pid)) == 1  # the run's child, forked from the warm process
    time.sleep(1.0)
    start = time.monotonic()
    at.button(key="sandbox_cancel").click().run()
    assert time.monotonic() - start < 2.0
    assert _children(warm._pid) == []  # the child was killed
    (message,) = [_plain(e.value) for e in at.error]
    assert "was cancelled after" in message and "sleeps" in message
    assert [b.label for b in at.button if b.key == "retry"] == ["Try again"]
    # The app stays usable: the good run is still there (not recorded again); Try again re-runs only this one.
    bad = at.session_state["run_config"]
    at.button(key="retry").click().run()
    assert any("Running" in i.value for i in at.info)  # it runs again
    assert _box(at).runs[good] is kept and bad not in _box(at).runs
    at.button(key="sandbox_cancel").click().run()
    at.text_input(key="src_ref").set_value(f"{EXAMPLE}:make_model").run()
    assert not _errors(at), _errors(at)
    assert _box(at).runs[good] is kept


def test_an_error_keeps_its_line_breaks() -> None:
    ref = f"{BAD / 'factory_raises.py'}:make_model"
    with pytest.raises(ModelLoadError) as expected:
        load_model(ref)  # the same message as the sandbox's, in-process
    at = _app(src_kind="Model file (.py)", src_file_how="Path", src_ref=ref)
    (shown,) = [e.value for e in at.error]
    lines = [_plain(line) for line in shown.split("  \n")]
    assert lines == str(expected.value).splitlines()
    assert len(lines) >= 3 and lines[-1].startswith("Tip: ")


def test_compare_on_a_model_file_runs_every_mode_in_one_child() -> None:
    at = _app(src_kind="Model file (.py)", src_file_how="Upload")
    at = _upload(at, "user_model.py", EXAMPLE.read_text())
    assert not _errors(at), _errors(at)
    warm = _box(at).warm
    runs_before = warm._runs
    at.switch_page("views/compare.py").run()
    assert not _errors(at), _errors(at)
    assert warm._runs == runs_before + 1  # the three modes not yet recorded: one child
    assert warm.starts == 1
    modes = at.multiselect(key="compare_modes").value
    assert all(at.session_state["run_config"].with_mode(m) in _box(at).runs for m in modes)


def test_sessions_never_see_each_others_runs_or_files() -> None:
    first = _upload(_app(src_kind="Model file (.py)", src_file_how="Upload"), "mine.py", EXAMPLE.read_text())
    second = _app(src_kind="Model file (.py)", src_file_how="Upload")
    assert not _errors(first), _errors(first)
    assert _box(first).folder != _box(second).folder and _box(first).warm is not _box(second).warm
    assert _box(second).runs == {} and not (_box(second).folder / "model" / "mine.py").exists()


PEEK = '''import os
def make_model():
    raise RuntimeError(f"peek={{os.path.exists({path!r})}}")
'''


def test_a_session_takes_a_spare_sandbox_started_ahead_and_no_other_session_gets_it() -> None:
    from ckpt_viz.usermodel.isolation import bwrap_problem

    sandbox.prestart()
    assert sandbox.spares_ready(180)
    ((folder, warm),) = sandbox._SPARES._spares
    first = _app(src_kind="Model file (.py)", src_file_how="Upload")
    assert _box(first).warm is warm and _box(first).folder == folder and warm.stage == "ready"
    first = _upload(first, "mine.py", EXAMPLE.read_text())
    assert not _errors(first), _errors(first)
    assert warm.starts == 1 and sandbox._SPARES._spares == []  # no new start for it; handed out once
    mine = folder / "model" / "mine.py"
    assert mine.exists()
    assert sandbox.spares_ready(180)  # the next spare: once the first session's run was done
    ((other_folder, other_warm),) = sandbox._SPARES._spares
    second = _app(src_kind="Model file (.py)", src_file_how="Upload")
    assert _box(second).warm is other_warm and other_warm is not warm and other_folder != folder
    assert other_warm._pid != warm._pid
    second = _upload(second, "peek.py", PEEK.format(path=str(mine)))
    (shown,) = [_plain(e) for e in _errors(second)]
    if bwrap_problem() is None:
        assert "peek=False" in shown, shown  # the other session's upload is not in this sandbox's view
    del first
    gc.collect()
    assert not folder.exists() and not warm.alive  # the spare went with the session that took it
    assert other_warm.alive


@pytest.mark.serial  # Cancel ends the wait within 2 s (wall clock)
def test_a_sandbox_still_starting_says_so_and_cancel_stops_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "SPARES", 0)  # the session starts its own warm process: the wait is seen
    monkeypatch.setattr(sandbox, "WAIT_S", 0.5)
    at = _app(src_kind="Model file (.py)", src_file_how="Path", src_ref=f"{EXAMPLE}:make_model")
    running = next(_plain(i.value) for i in at.info if "Running" in i.value)
    assert "This session's sandbox is still starting: " in running, running
    assert re.search(r"starting: (starting|importing torch|importing torch\._dynamo|warming up) \(\d+\.\d s so far",
                     running), running
    start = time.monotonic()
    at.button(key="sandbox_cancel").click().run()
    assert time.monotonic() - start < 2.0
    (message,) = [_plain(e.value) for e in at.error]
    assert "was cancelled after" in message and "while the sandbox was starting" in message, message
    warm = _box(at).warm
    assert warm.wait_started(120) and warm.starts == 1  # the start went on; Try again uses it
    at.button(key="retry").click().run()
    assert not _errors(at), _errors(at)
    assert warm.starts == 1 and at.session_state["run_config"] in _box(at).runs


APP_PROCESS = '''import sys, time
sys.path.insert(0, {app!r})
from ui import sandbox
sandbox.PRESTART_S = 0.0
sandbox.prestart()
assert sandbox.spares_ready(180)
((folder, warm),) = sandbox._SPARES._spares
print(folder, flush=True)
sys.stdin.readline()  # alive until the test has looked (it closes stdin to let an "exits" app end)
if sys.argv[1] == "killed":
    time.sleep(120)
'''


@pytest.mark.serial  # the spare sandbox's processes gone from the process table within 5 s (wall clock)
@pytest.mark.parametrize("end", ["exits", "killed"])
def test_an_app_that_ends_leaves_no_spare_sandbox_running(end: str, tmp_path: Path) -> None:
    script = tmp_path / "app_process.py"
    script.write_text(APP_PROCESS.format(app=str(ROOT / "app")))
    proc = subprocess.Popen([sys.executable, str(script), end], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        folder = Path(proc.stdout.readline().strip())
        marker = f"ckpt_viz_sandbox_{proc.pid}_"  # the warm process's folder, in its command line and bubblewrap's
        assert folder.is_dir() and live_processes(marker)
        if end == "killed":
            proc.kill()  # no atexit: bubblewrap's --die-with-parent ends the sandbox
        proc.stdin.close()  # an "exits" app now ends normally (atexit)
        assert proc.wait(60) == (0 if end == "exits" else -9)
    finally:
        proc.kill()
    deadline = time.monotonic() + 5
    while live_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_processes(marker) == []
    if end == "exits":
        assert not folder.exists()  # removed at exit (an app killed outright: by the next app's sweep)
    else:
        shutil.rmtree(folder, ignore_errors=True)
