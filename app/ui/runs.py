"""The run on show: `RunConfig` (what to show), the one cached loader, and `current()` for the pages.

`load_run(config)` records or reads a run once, through `ckpt_viz.run.obtain.obtain_trace` (the
same dispatch as `ckpt-viz record`), and keeps its trace or its error. Pages call `current()`,
then the cursor (cursor.py), then `ckpt_viz.analysis` and one renderer. The sidebar that builds
the `RunConfig` is in source.py. No torch at import: `obtain_trace` loads it only for a run it
records, so a saved trace opens without torch.

NOTE [ Figures of a run ]
  1. Every figure of a run is `ckpt_viz.analysis`'s, computed once per trace and kept on it: the
     pages never compute one themselves, so the Overview, Compare, Handles and `ckpt-viz info`
     state the same counts, states and peak (`analysis.summary.summary`).
  2. The loader's cache holds `Loaded` objects; when it drops one, reference counting frees its
     trace and everything derived from it (events are msgspec structs the cyclic collector never
     tracks, and nothing here holds a cycle), so nothing grows with the number of runs shown.
"""
from __future__ import annotations

import hashlib
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import streamlit as st

from ckpt_viz.errors import CkptVizError
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from ckpt_viz.trace import Trace
from ui.text import md

DEFAULT_MODE = "split-reentrant"
CONFIG = "run_config"  # the session key of the sidebar's RunConfig


@dataclass(frozen=True)
class RunConfig:
    """What to show: the cache key of `load_run`.

    Attributes:
        source: "builtin", "user" (a model file, run in a sandboxed child), "trace" (a saved file) or
            "broken" (a broken run to explore).
        target: the built-in model's name, the model reference "file.py:factory", the trace file path, or
            the broken run's name.
        mode, schedule, microbatches: how to run the model (not used for a saved trace).
        stamp: (mtime_ns, size) of the file, so that an edited file is read or run again.
        timeout_s, memory_mb: the sandbox's limits for a model file.
        name: the user's name of an uploaded file (shown instead of its temporary path).
        plan: also profile the model for the planner (the Plan page's button; `RunRequest.plan`).
    """

    source: str
    target: str
    mode: str = DEFAULT_MODE
    schedule: str = "1F1B"
    microbatches: int = 4
    stamp: tuple[int, int] = (0, 0)
    timeout_s: float = 60.0
    memory_mb: int = 4096
    name: str = ""
    plan: bool = False

    @property
    def runs_model(self) -> bool:
        return self.source in ("builtin", "user")

    def with_mode(self, mode: str) -> RunConfig:
        return replace(self, mode=mode)

    @property
    def request(self) -> RunRequest:
        """What `obtain_trace` runs or reads for this config (memory and graphs always on)."""
        return RunRequest(self.source, self.target, mode=self.mode, schedule=self.schedule,
                          microbatches=self.microbatches, timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                          plan=self.plan)

    @property
    def label(self) -> str:
        """The run in words (plain text: pass it through `md` where markdown is read)."""
        if self.source == "trace":
            return self.name or Path(self.target).name
        if self.source == "broken":
            return f"broken run {self.target}"
        name = self.target if self.source == "builtin" else \
            self.name or Path(self.target.rpartition(":")[0] or self.target).name
        pipe = f" · {self.schedule} × {self.microbatches} mb" if self.mode == "pipeline" else ""
        return f"{name} · {self.mode}{pipe}"


@dataclass(frozen=True)
class Run:
    """A loaded run: its config and its trace; `memo` keeps the app's own lookups of this trace (the cursor's
    jump targets), which go with the run."""

    config: RunConfig
    trace: Trace
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Loaded:
    run: Run | None = None
    error: BaseException | None = None


@st.cache_resource(max_entries=16, show_spinner="Loading the run…")
def load_run(config: RunConfig) -> Loaded:
    """Record (or read) the run of `config` once; later calls return the same objects.

    Failures are cached too, so a broken model file is not re-run on every rerun;
    editing the file changes `config.stamp` and runs it again.
    """
    try:
        return Loaded(run=Run(config, obtain_trace(config.request)))
    except Exception as err:  # shown on the page; the app keeps working
        return Loaded(error=err)


# -- what the pages call --


def run_key(config: RunConfig, name: str) -> str:
    """The key of widget `name` for the run of `config`: a widget whose options are one run's own (its findings,
    its handles) gets a key per run, so its value and its callback never reach another run's page (a picker
    whose value outlived its run crashed the Debugger: issue 30)."""
    return f"{name}_{hashlib.sha1(repr(config).encode()).hexdigest()[:12]}"


def show_error(err: BaseException, config: RunConfig | None = None) -> None:
    """The error's message (written for users, its lines kept, shown as text) and, folded, its traceback;
    "Try again" records or reads `config` again (and only it)."""
    from ui.sandbox import forget, shown

    st.error(md(shown(str(err) or type(err).__name__, config)))
    text = getattr(err, "traceback", "") or (
        "" if isinstance(err, CkptVizError) else "".join(traceback.format_exception(type(err), err, err.__traceback__)))
    if text:
        with st.expander("Traceback"):
            st.code(shown(text, config), language="text")
    if st.button("Try again", key="retry"):
        if config is not None and config.source == "user":
            forget(config)
        elif config is not None:
            load_run.clear(config)
        st.rerun()


def _default_config() -> RunConfig:
    from ckpt_viz.catalog import DEFAULT_MODEL

    return RunConfig("builtin", DEFAULT_MODEL)


def current() -> Run:
    """The run the sidebar picked; shows the problem and stops the page when there is none."""
    config = st.session_state[CONFIG] if CONFIG in st.session_state else _default_config()
    if config is None:
        st.info("Pick a source in the sidebar: a built-in model, a model file, or a saved trace.")
        st.stop()
    loaded = _obtain([config])[config]
    if loaded.error is not None:
        show_error(loaded.error, config)
        st.stop()
    assert loaded.run is not None
    return loaded.run


def obtain_run(config: RunConfig) -> Loaded:
    """The run of `config` (not the sidebar's: e.g. the Plan page's profiled run), recorded once as `current()`'s."""
    return _obtain([config])[config]


def _obtain(configs: list[RunConfig]) -> dict[RunConfig, Loaded]:
    """Each config's run: a model file's from this session's sandbox (all its missing modes in one child),
    the others from the process-wide cache."""
    if configs and configs[0].source == "user":
        from ui.sandbox import obtain

        return obtain(configs)
    return {c: load_run(c) for c in configs}


def runs_for_modes(config: RunConfig, modes: list[str]) -> dict[str, Run]:
    """One run per mode of the same model; a mode that fails is reported and left out."""
    runs = {}
    got = _obtain([config.with_mode(mode) for mode in modes])
    for mode in modes:
        loaded = got[config.with_mode(mode)]
        if loaded.error is not None:
            from ui.sandbox import shown

            st.warning(md(f"Mode {mode!r} failed: {shown(str(loaded.error), config)}"))
        elif loaded.run is None or not len(loaded.run.trace):
            st.caption(md(f"Mode {mode!r} recorded no events (nothing to compare)."))
        else:
            runs[mode] = loaded.run
    return runs
