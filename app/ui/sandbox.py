"""Model files in the app: one session's uploads, warm sandbox, runs, and the run in progress.

Every session has its own `SessionSandbox` (in its session state, so two sessions never see
each other's runs or files): its upload folder, its `WarmSandbox` (torch imported once, one
forked child per run; NOTE [ Warm child ] in ckpt_viz.usermodel.warm), the runs it recorded,
and at most one run in progress, in a thread, that the page shows with its elapsed time and a
Cancel button. The session's folder and warm process go when Streamlit ends the session (NOTE
[ Session end ] in ui/session_end.py), when the app exits, or, for an app killed outright, at the
next app's start.

NOTE [ Spare sandbox ]
  1. A warm sandbox takes seconds to start (Python, torch, a first recording: 3 s on an
     idle 2-core machine, 10-20 s on a loaded one), and a file uploaded the moment the
     source is picked used to wait for it. So the app keeps `SPARES` warm sandboxes
     started ahead, from `PRESTART_S` after its first page on (`prestart`; a start is
     mostly CPU, and the first page, a saved trace's too, should not share it), each with
     a fresh upload folder of its own that it alone has in view.
  2. A session that needs a warm sandbox takes a spare whole (its folder and its process)
     and no other session ever gets it: a spare is handed out once, so the isolation is
     that of a sandbox the session started itself (each session its own process, its own
     bubblewrap view, its own folder). It is ended with the session.
  3. The next spare starts once the one taken is ready and its session's first run is done
     (or `REFILL_S` later at most), so that it never competes with that first run for the
     CPU. Two sessions within the same few seconds: the second starts its own, as before.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import streamlit as st

from ckpt_viz.usermodel.warm import WarmSandbox
from ui.runs import Loaded, Run, RunConfig
from ui.session_end import on_end
from ui.text import md

UPLOADS = Path(tempfile.gettempdir()) / "ckpt_viz_uploads"
KEY = "sandbox_session"
WAIT_S: float | None = None  # how long a page waits for a run before it polls instead (None: until it ends)
_KEEP = 16  # runs kept per session
_LIVE: weakref.WeakSet[SessionSandbox] = weakref.WeakSet()
SPARES = 1  # warm sandboxes kept started for the next session (NOTE [ Spare sandbox ]); 0: none
REFILL_S = 20.0  # the longest the next spare waits for the session that took the last one to run
PRESTART_S = 3.0  # the first spare starts this long after the app's first page (which it would slow)


@dataclass
class Job:
    """A run in progress: one child for all of `configs` (the modes of one model file)."""

    configs: tuple[RunConfig, ...]
    started: float = field(default_factory=time.monotonic)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    results: dict[RunConfig, Loaded] = field(default_factory=dict)
    thread: threading.Thread | None = None


class SessionSandbox:
    """One session's model files: see the module docstring."""

    def __init__(self, session: str, spare: tuple[Path, WarmSandbox] | None = None) -> None:
        self.folder, self.warm = spare or _fresh(session)
        self.runs: OrderedDict[RunConfig, Loaded] = OrderedDict()
        self.job: Job | None = None
        self.uploaded: dict[str, str] = {}  # kind -> the upload's file id
        self.ran = threading.Event()  # its first run is done (the next spare may start: NOTE rule 3)
        self.closed = False
        _LIVE.add(self)

    def take_spare(self) -> None:
        """Swap the session's unstarted warm sandbox (and empty folder) for a spare, if one is there."""
        if self.warm.starts or self.uploaded.get("model") or self.job is not None:
            return
        spare = _SPARES.take(self.ran)
        if spare is not None:
            old = self.folder
            self.folder, self.warm = spare
            for item in old.iterdir():  # a trace uploaded before, kept
                if item.name != "model":
                    shutil.move(str(item), str(self.folder / item.name))
            shutil.rmtree(old, ignore_errors=True)

    def store_upload(self, upload: Any, kind: str) -> Path:
        """The upload as the one file of `kind` in this session's folder; a new upload replaces the last."""
        folder = self.folder / kind
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", upload.name) or "upload"
        path = folder / safe
        if self.uploaded.get(kind) != upload.file_id or not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.iterdir():  # the folder stays (the warm sandbox sees it), its file is replaced
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
            path.write_bytes(upload.getbuffer())
            self.uploaded[kind] = upload.file_id
        return path

    # -- runs --

    def start(self, configs: list[RunConfig]) -> Job:
        """Run `configs` (one model file, several modes) in one child, in a thread; cancel any other run."""
        if self.job is not None and not self.job.done.is_set():
            self.job.cancel.set()
        job = Job(tuple(configs))
        job.thread = threading.Thread(target=_record, args=(self.warm, job), daemon=True,
                                      name="ckpt_viz sandbox run")
        self.job = job
        job.thread.start()
        return job

    def finish(self, job: Job) -> None:
        """Keep a finished job's runs (the newest `_KEEP`)."""
        self.ran.set()
        for config, loaded in job.results.items():
            self.runs[config] = loaded
            self.runs.move_to_end(config)
        while len(self.runs) > _KEEP:
            self.runs.popitem(last=False)
        if self.job is job:
            self.job = None

    def close(self) -> None:
        self.closed = True
        if self.job is not None:
            self.job.cancel.set()
        self.warm.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __del__(self) -> None:  # the session's state was dropped: the session ended
        with contextlib.suppress(Exception):
            self.close()


def _record(warm: WarmSandbox, job: Job) -> None:
    first = job.configs[0]
    try:
        out = warm.record(first.target, [c.mode for c in job.configs], timeout_s=first.timeout_s,
                          memory_mb=first.memory_mb, cancel=job.cancel,
                          extra={"seed": 0, "microbatches": first.microbatches, "schedule": first.schedule,
                                 "memory": True, "graphs": True, "plan_profile": first.plan})
    except Exception as err:  # bad arguments, or the warm process could not start: every mode says so
        out = [err] * len(job.configs)
    for config, result in zip(job.configs, out, strict=True):
        if isinstance(result, BaseException):
            job.results[config] = Loaded(error=result)
        else:
            if config.name:  # the user's file name, not the temporary upload path
                result.meta["model"] = f"{config.name}:{config.target.rpartition(':')[2]}"
            job.results[config] = Loaded(run=Run(config, result))
    job.done.set()


def _fresh(session: str) -> tuple[Path, WarmSandbox]:
    """A new upload folder and a warm sandbox (not started) that has only its `model` folder in view."""
    folder = UPLOADS / f"{os.getpid()}_{re.sub(r'[^A-Za-z0-9_-]', '_', session)}_{uuid.uuid4().hex[:12]}"
    (folder / "model").mkdir(parents=True, exist_ok=True)
    return folder, WarmSandbox(readable=[str(folder / "model")])


class _Spares:
    """The warm sandboxes started ahead for the next sessions: NOTE [ Spare sandbox ]."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spares: list[tuple[Path, WarmSandbox]] = []
        self._refilling = self._planned = self._filled = self._closed = False

    def fill(self, first: bool = False) -> None:
        with self._lock:
            if not (first and self._filled):  # (the first: unless a session needed it sooner)
                self._fill()

    def _fill(self) -> None:
        self._refilling, self._filled = False, True
        while len(self._spares) < SPARES and not self._closed:
            folder, warm = _fresh("spare")
            warm.start()
            self._spares.append((folder, warm))

    def take(self, ran: threading.Event) -> tuple[Path, WarmSandbox] | None:
        """A spare for one session (the readiest), never to be handed out again; the next one starts
        after `ran` (that session's first run) is set, or `REFILL_S` at most."""
        with self._lock:
            if SPARES and not self._filled:
                self._fill()  # before `prestart`'s delay is over: the first start is this session's
            self._spares.sort(key=lambda spare: not spare[1].wait_started(0))
            spare = self._spares.pop(0) if self._spares and SPARES else None
            if spare is not None and not self._refilling:
                self._refilling = True
                threading.Thread(target=self._refill, args=(spare[1], ran), daemon=True,
                                 name="ckpt_viz spare sandbox").start()
        return spare

    def _refill(self, taken: WarmSandbox, ran: threading.Event) -> None:
        taken.wait_started(120)  # never two starts at once for one session's first page
        if ran.wait(REFILL_S):
            time.sleep(1.0)  # its page is drawn after its run
        self.fill()

    def wait(self, timeout_s: float) -> bool:
        """Wait until every spare has started (True), or `timeout_s` passes: a benchmark's "app up for a while"."""
        end = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spares, refilling = list(self._spares), self._refilling
            if not refilling and len(spares) >= SPARES and all(w.wait_started(0) for _, w in spares):
                return True
            if time.monotonic() > end:
                return False
            time.sleep(0.05)

    def close(self) -> None:
        with self._lock:
            spares, self._spares, self._closed = self._spares, [], True
        for folder, warm in spares:
            warm.close()
            shutil.rmtree(folder, ignore_errors=True)


_SPARES = _Spares()


def prestart() -> None:
    """Start the spare warm sandboxes `PRESTART_S` from now, in the background (the app's first page: NOTE
    [ Spare sandbox ], rule 1); at once when a session needs one before that."""
    if SPARES and not _SPARES._planned:
        _SPARES._planned = True
        timer = threading.Timer(PRESTART_S, _SPARES.fill, kwargs={"first": True})
        timer.daemon, timer.name = True, "ckpt_viz spare sandbox"
        timer.start()


def spares_ready(timeout_s: float) -> bool:
    """Whether the spare warm sandboxes have all started within `timeout_s` (benchmarks and tests)."""
    return _SPARES.wait(timeout_s)


def session_sandbox(*, warm: bool = False) -> SessionSandbox:
    """This session's `SessionSandbox`, made on first use; `warm`: it needs its warm process, which starts
    now (it imports torch while the user picks a file) unless a spare, started ahead, is there to take."""
    if KEY not in st.session_state or st.session_state[KEY].closed:
        from ui.session_end import session_id

        session = session_id()
        st.session_state[KEY] = SessionSandbox(session or str(id(st.session_state)))
        on_end(session, "sandbox", _closer(st.session_state[KEY]))  # See NOTE [ Session end ]
    box: SessionSandbox = st.session_state[KEY]
    if warm:
        box.take_spare()
        box.warm.start()
    return box


def _closer(box: SessionSandbox):
    """`box.close`, held weakly: a session state freed sooner still closes its box (`__del__`)."""
    ref = weakref.ref(box)

    def close() -> None:
        if (alive := ref()) is not None:
            alive.close()
    return close


def obtain(configs: list[RunConfig]) -> dict[RunConfig, Loaded]:
    """The runs of `configs` (model files) for this session: recorded once, in one child for all missing
    modes, while the page shows the elapsed time and a Cancel button. Stops the page while a run lasts."""
    box = session_sandbox(warm=True)
    job = box.job
    if job is not None and st.session_state.get("sandbox_cancel") and not job.done.is_set():
        job.cancel.set()  # the Cancel button: the child is killed at once
        job.done.wait(5)
    if job is not None and job.done.is_set():
        box.finish(job)
    missing = [c for c in configs if c not in box.runs]
    if missing:
        job = box.job
        if job is None or not set(missing) <= set(job.configs):
            job = box.start(missing)
        _wait(job, box)
    return {c: box.runs[c] for c in configs}


def forget(config: RunConfig) -> None:
    """Drop one run (Try again), so that only it is recorded again."""
    box = st.session_state.get(KEY)
    if box is not None:
        box.runs.pop(config, None)


def _progress(job: Job, warm: WarmSandbox) -> str:
    first = job.configs[0]
    modes = ", ".join(c.mode for c in job.configs)
    text = (f"Running **{md(first.name or Path(first.target.rpartition(':')[0]).name)}** in the sandbox "
            f"({md(modes)}): "
            f"{time.monotonic() - job.started:.1f} s (time limit {first.timeout_s:g} s per mode)")
    if warm.stage not in ("", "ready"):  # a silent wait would look like a slow model
        text += (f"  \nThis session's sandbox is still starting: {md(warm.stage)} ({warm.start_s:.1f} s so far, a "
                 "few seconds to start Python and torch once); the file runs as soon as it is ready.")
    return text


def _wait(job: Job, box: SessionSandbox) -> None:
    """Show the run's elapsed time and a Cancel button until it ends (or `WAIT_S`, then poll); both go when it
    ends (one placeholder holds them: a button drawn by this run would otherwise stay on the page under it)."""
    holder = st.empty()
    with holder.container():
        line = st.empty()
        st.button("Cancel", key="sandbox_cancel", help="Stop this run now (its processes are killed).",
                  on_click=job.cancel.set)  # first thing in the click's rerun, before the sidebar is drawn
    deadline = None if WAIT_S is None else time.monotonic() + WAIT_S
    while not job.done.wait(0.2):
        line.info(_progress(job, box.warm))  # a rerun (the Cancel click) interrupts the page here
        if deadline is not None and time.monotonic() > deadline:
            _poll(job, box.warm)
            st.stop()
    box.finish(job)
    holder.empty()


@st.fragment(run_every=0.5)
def _poll(job: Job, warm: WarmSandbox) -> None:
    if job.done.is_set():
        st.rerun(scope="app")
    st.caption(_progress(job, warm))


def restore_limits(**defaults: object) -> None:
    """Keep the values of widgets that are not drawn on every run (Streamlit drops those); the widgets
    then take their value from the session state (`defaults` the first time)."""
    for key, default in defaults.items():
        st.session_state[key] = st.session_state.get(key, default)


def shown(text: str, config: RunConfig | None) -> str:
    """`text` with an upload's temporary path replaced by the user's file name."""
    if config is None or not config.name:
        return text
    path = config.target.rpartition(":")[0] or config.target
    return text.replace(path, config.name)


def _sweep() -> None:
    """Remove upload folders of app processes that are gone (killed outright)."""
    with contextlib.suppress(OSError):
        for folder in UPLOADS.iterdir():
            pid = folder.name.split("_", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(folder, ignore_errors=True)


@atexit.register
def _close_all() -> None:
    _SPARES.close()
    for box in list(_LIVE):
        box.close()


_sweep()

__all__ = ["Job", "SessionSandbox", "forget", "obtain", "prestart", "restore_limits", "session_sandbox",
           "shown", "spares_ready"]
