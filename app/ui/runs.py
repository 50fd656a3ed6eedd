"""The run on show: `RunConfig` (what to show), the one cached loader, and `current()` for the pages.

`load_run(config)` records or reads a run once, through `ckpt_viz.obtain_trace` (the same
dispatch as `ckpt-viz record`), and keeps its trace, its `TraceIndex` or its error. Pages call
`current()`, then the cursor (cursor.py), then renderers. The sidebar that builds the
`RunConfig` is in source.py. No torch at import: `obtain_trace` loads it only for a built-in
run, so a saved trace opens without torch.

NOTE [ Big traces ]
  1. A loaded trace keeps its events as columns (ckpt_viz.trace, NOTE [ Rows stored as
     columns ]). Nothing here loops over all events on a rerun: the loader builds the
     `TraceIndex` once, `Run.cached` computes whole-trace figures once per trace, and
     the per-cursor views of a big trace read `cursor.window(...)`: the events around
     the cursor.
  3. Every figure derived from a trace is cached by the trace object, never by the run's
     settings (`Run.cached` goes through `ckpt_viz.derived`, as the renderers do). When
     the loader's cache drops a source and it is recorded or read again, its figures are
     computed again from the trace on show: the chart and the tables cannot disagree.
  2. For a trace read from a file (or from the sandbox child), the loader pauses the
     cyclic garbage collector while it builds, then freezes (gc.freeze) what it built.
     A million-event trace holds a million `data` dicts, and every full collection
     walks them all: that made building the TraceIndex 3-4 times slower (2.3 s ->
     0.6 s measured) and added to every rerun. The trace's objects hold no reference
     cycles, so reference counting still frees them when the cache drops the trace.
     A built-in run is small, and its torch garbage must stay collectable: not frozen.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import re
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import streamlit as st

from ckpt_viz import (
    CkptVizError,
    Finding,
    Lifecycle,
    RunRequest,
    Trace,
    TraceIndex,
    derived,
    diagnose,
    diagnose_handle_in,
    event_column,
    event_counts,
    lifecycle,
    obtain_trace,
)

DEFAULT_MODE = "split-reentrant"
CONFIG = "run_config"  # the session key of the sidebar's RunConfig


@dataclass(frozen=True)
class RunConfig:
    """What to show: the cache key of `load_run`.

    Attributes:
        source: "builtin", "user" (a model file, run in a sandboxed child) or "trace" (a saved file).
        target: the built-in model's name, the model reference "file.py:factory", or the trace file path.
        mode, schedule, microbatches: how to run the model (not used for a saved trace).
        stamp: (mtime_ns, size) of the file, so that an edited file is read or run again.
        timeout_s, memory_mb: the sandbox's limits for a model file.
        name: the user's name of an uploaded file (shown instead of its temporary path).
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

    @property
    def runs_model(self) -> bool:
        return self.source != "trace"

    def with_mode(self, mode: str) -> RunConfig:
        return replace(self, mode=mode)

    @property
    def request(self) -> RunRequest:
        """What `obtain_trace` runs or reads for this config (memory and graphs always on)."""
        return RunRequest(self.source, self.target, mode=self.mode, schedule=self.schedule,
                          microbatches=self.microbatches, timeout_s=self.timeout_s, memory_mb=self.memory_mb)

    @property
    def label(self) -> str:
        if self.source == "trace":
            return Path(self.target).name
        name = self.target if self.source == "builtin" else \
            self.name or Path(self.target.rpartition(":")[0] or self.target).name
        pipe = f" · {self.schedule} × {self.microbatches} mb" if self.mode == "pipeline" else ""
        return f"{name} · {self.mode}{pipe}"


@dataclass(frozen=True)
class Run:
    """A loaded run: the trace and its index."""

    config: RunConfig
    trace: Trace
    index: TraceIndex

    def cached(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(self.trace, *args)`, computed once per trace object (See NOTE [ Big traces ], rule 3).

        `args` must be plain values with a stable repr; the result must not refer to the trace.
        """
        code = getattr(fn, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
        name = f"app:{fn.__module__}.{fn.__qualname__}@{where}{args!r}"
        return derived(self.trace, name, lambda trace: fn(trace, *args))


@dataclass(frozen=True)
class Loaded:
    run: Run | None = None
    error: BaseException | None = None


# -- the loader --


def kind_counts(trace: Trace) -> Counter[str]:
    """How many events of each kind; once per trace (`ckpt_viz.event_counts`: counted in C where it can be)."""
    return event_counts(trace, "kind")


def jump_positions(trace: Trace, kind: str) -> list[int]:
    """The positions of the events of `kind`, in order; once per trace."""
    def build(t: Trace) -> list[int]:
        kinds = event_column(t, "kind")
        return list(itertools.compress(range(len(kinds)), map(kind.__eq__, kinds)))  # no Python loop per event
    return derived(trace, f"app:jump_positions:{kind}", build)


def next_position(trace: Trace, kind: str, after: int) -> int | None:
    """The position of the first event of `kind` after position `after`, or None: a scan from `after`
    in C (list.index), so a jump button costs nothing until the trace has events of that kind."""
    if not kind_counts(trace)[kind]:
        return None
    try:
        return event_column(trace, "kind").index(kind, after + 1)
    except ValueError:
        return None


def run_diagnosis(trace: Trace) -> list[Finding]:
    """`diagnose(trace)`, the same findings, with a loaded trace's events built once: `diagnose` reads the events
    in four passes (its `Facts`, the sessions never cleared, the errors, the divergences), and each pass over a
    loaded trace's columns builds every `Event` and its data dict again (a million events: about 4 s a pass).
    Here they are built once into a list, in a trace of the same events, memory, graphs and meta, whose lifecycle
    is the loaded trace's own (the same events: no second lifecycle pass), with the collector paused while the
    million objects are made (none is cyclic; reference counting frees them after). Pages call it through
    `Run.cached`: once per trace, shared by the Overview, Handles and Debugger pages."""
    events = trace.events
    if isinstance(events, list):
        return diagnose(trace)
    enabled = gc.isenabled()
    gc.disable()
    try:
        built = Trace(events=list(events), memory=trace.memory, graphs=trace.graphs, meta=trace.meta)
        derived(built, "lifecycle", lambda _built: lifecycle(trace))
        return diagnose(built)
    finally:
        if enabled:
            gc.enable()


# What `Facts` reads beside a handle's own events: the run's errors and its session events (debug/findings.py).
_CONTEXT_KINDS = ("error", "session_cleared", "session_activated", "session_deactivated")


def handle_diagnosis(trace: Trace, handle_id: int) -> Finding:
    """`diagnose_handle(trace, handle_id)`, the same `Finding`, from the handle's own events and the run's errors and
    session events alone (found in C: list.index on the handle column, the kind positions cached per trace), instead
    of `Facts` over every event of the trace (on a million events about 10 s). `handle_finding` reads only
    `by_handle[handle_id]`, the errors, clears and activations, the trace's lifecycle and sources: a `Facts` over
    this subset, in seq order, holds exactly those."""
    handles = event_column(trace, "handle_id")
    positions: set[int] = set()
    i = -1
    with contextlib.suppress(ValueError):
        while True:
            i = handles.index(handle_id, i + 1)
            positions.add(i)
    for kind in _CONTEXT_KINDS:
        positions.update(jump_positions(trace, kind))
    events = trace.events
    return diagnose_handle_in(trace, [events[p] for p in sorted(positions)], handle_id)


@st.cache_resource(max_entries=16, show_spinner="Loading the run…")
def load_run(config: RunConfig) -> Loaded:
    """Record (or read) the run of `config` once; later calls return the same objects.

    Failures are cached too, so a broken model file is not re-run on every rerun;
    editing the file changes `config.stamp` and runs it again.
    """
    try:
        # A file's trace may be huge (See NOTE [ Big traces ], rule 2); a built-in run is small and makes
        # torch garbage that the collector must still see.
        with _gc_paused() if config.source != "builtin" else contextlib.nullcontext():
            trace = obtain_trace(config.request)
            return Loaded(run=Run(config, trace, TraceIndex.of(trace)))
    except Exception as err:  # shown on the page; the app keeps working
        return Loaded(error=err)


def handle_lifecycle(run: Run) -> Lifecycle:
    """`lifecycle(run.trace)`, built (on first use: the index does not) as the loader builds: with the collector
    paused and what it built frozen for a file's trace (See NOTE [ Big traces ], rule 2)."""
    if run.config.source == "builtin" or run.index.lifecycle_built:
        return lifecycle(run.trace)
    with _gc_paused():
        return lifecycle(run.trace)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # what was just built is long-lived: keep it out of every later collection
        if enabled:
            gc.enable()


# -- what the pages call --


_MARKDOWN = re.compile(r"([\\`*$<>\[\]|~#])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def as_markdown(text: str) -> str:
    """Plain text for st.error/st.info: its line breaks and indents kept, nothing read as markdown."""
    escaped = _MARKDOWN.sub(lambda m: "\\" + m.group(0), text)
    lines = [re.sub(r"^ +", lambda m: "\u00a0" * len(m.group(0)), line) for line in escaped.splitlines()]
    return "  \n".join(lines)


def show_error(err: BaseException, config: RunConfig | None = None) -> None:
    """The error's message (written for users, its lines kept) and, folded, its traceback; "Try again"
    records or reads `config` again (and only it)."""
    from ui.sandbox import forget, shown

    st.error(as_markdown(shown(str(err) or type(err).__name__, config)))
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
    from ckpt_viz import DEFAULT_MODEL  # torch: first use

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
    return loaded.run


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

            st.warning(as_markdown(f"Mode {mode!r} failed: {shown(str(loaded.error), config)}"))
        elif not len(loaded.run.trace):
            st.caption(f"Mode {mode!r} recorded no events (nothing to compare).")
        else:
            runs[mode] = loaded.run
    return runs
