"""What every page shares: the source picker, the cached loader, the time cursor and the downloads.

Owns the app's state: the `RunConfig` the sidebar builds (stored in session state), the
single cached loader `load_run(config)` (trace, `TraceIndex`, or the error), and the
cursor position. Pages call `current()` and `cursor_bar(run)`, then renderers.
No torch at import: the model list, modes and schedules (torch-side modules) are imported
when a model source is drawn, so a saved trace opens without torch. Built-in models run
through `ckpt_viz.scenarios` in the loader; user model files only through `ckpt_viz.sandbox`.

NOTE [ State that survives page changes ]
  1. Streamlit scopes a widget's identity to the page that draws it, so a widget drawn
     by a page forgets its value on a page change. The source picker is therefore drawn
     by the entrypoint (`source_sidebar`, before `pg.run()`), where it keeps its value,
     uploaded files included.
  2. The cursor is drawn by each page, so its truth lives in a plain session key,
     CURSOR = (config, position); the slider's key is set from it before the slider is
     drawn, and the slider and the step buttons write it back in callbacks.
  3. A new source or mode resets the cursor to the end of the run.

NOTE [ Big traces ]
  1. A loaded trace keeps its events as columns (ckpt_viz.trace, NOTE [ Rows stored as
     columns ]). Nothing here loops over all events on a rerun: the loader builds the
     `TraceIndex` once, `Run.cached` computes whole-trace figures once per trace, and
     the per-cursor views of a big trace read `window(...)`: the events around the cursor.
  2. For a trace read from a file (or from the sandbox child), the loader pauses the
     cyclic garbage collector while it builds, then freezes (gc.freeze) what it built.
     A million-event trace holds a million `data` dicts, and every full collection
     walks them all: that made building the TraceIndex 3-4 times slower (2.3 s ->
     0.6 s measured) and added to every rerun. The trace's objects hold no reference
     cycles, so reference counting still frees them when the cache drops the trace.
     A built-in run is small, and its torch garbage must stay collectable: not frozen.
"""
from __future__ import annotations

import bisect
import contextlib
import gc
import json
import linecache
import os
import re
import tempfile
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import streamlit as st

from ckpt_viz import CkptVizError, Trace
from ckpt_viz.render.index import TraceIndex, event_column
from ckpt_viz.render.text import format_event

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("Built-in model", "Model file (.py)", "Saved trace")
DEFAULT_MODE = "split-reentrant"
COMPARE_MODES = ("none", "nonreentrant", "reentrant", "split-reentrant")
CONFIG = "run_config"
CURSOR = "cursor"
WINDOW = 2_000  # events either side of the cursor that per-cursor views read on a big trace
JUMP_KINDS = {"replay": "replay_started", "release": "released"}
_UPLOADS = Path(tempfile.gettempdir()) / "ckpt_viz_uploads"


@dataclass(frozen=True)
class RunConfig:
    """What to show: the cache key of `load_run`.

    Attributes:
        source: "builtin", "user" (a model file, run in a sandboxed child) or "trace" (a saved file).
        target: the built-in model's name, the model reference "file.py:factory", or the trace file path.
        mode, schedule, microbatches: how to run the model (not used for a saved trace).
        stamp: (mtime_ns, size) of the file, so that an edited file is read or run again.
        timeout_s, memory_mb: the sandbox's limits for a model file.
    """

    source: str
    target: str
    mode: str = DEFAULT_MODE
    schedule: str = "1F1B"
    microbatches: int = 2
    stamp: tuple[int, int] = (0, 0)
    timeout_s: float = 60.0
    memory_mb: int = 4096

    @property
    def runs_model(self) -> bool:
        return self.source != "trace"

    def with_mode(self, mode: str) -> "RunConfig":
        return replace(self, mode=mode)

    @property
    def label(self) -> str:
        if self.source == "trace":
            return Path(self.target).name
        name = self.target if self.source == "builtin" else Path(self.target.rpartition(":")[0] or self.target).name
        pipe = f" · {self.schedule} × {self.microbatches} mb" if self.mode == "pipeline" else ""
        return f"{name} · {self.mode}{pipe}"


@dataclass(frozen=True)
class Run:
    """A loaded run: the trace, its index, and where the jump buttons go."""

    config: RunConfig
    trace: Trace
    index: TraceIndex
    marks: dict[str, list[int]] = field(default_factory=dict)  # jump name -> event positions

    def cached(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(self.trace, *args)`, computed once per trace (args must be hashable plain values)."""
        code = getattr(fn, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
        return _derived(self.config, f"{fn.__module__}.{fn.__qualname__}@{where}", args, fn, self.trace)


@dataclass(frozen=True)
class Loaded:
    run: Run | None = None
    error: BaseException | None = None


# -- the loader --


def _record(config: RunConfig) -> Trace:
    extra = {"schedule": config.schedule, "microbatches": config.microbatches} if config.mode == "pipeline" else {}
    if config.source == "builtin":
        from ckpt_viz.scenarios import run_scenario
        from ckpt_viz.zoo import build_builtin

        return run_scenario(build_builtin(config.target), config.mode, memory=True, graphs=True, **extra)
    if config.source == "user":
        from ckpt_viz.sandbox import EXTRA_KEYS, record_in_subprocess

        extra.update({k: True for k in ("memory", "graphs") if k in EXTRA_KEYS})  # when the sandbox takes them
        return record_in_subprocess(config.target, config.mode, timeout_s=config.timeout_s,
                                    memory_mb=config.memory_mb, extra=extra)
    return Trace.load(config.target)


def _marks(trace: Trace) -> dict[str, list[int]]:
    kinds = event_column(trace, "kind")  # shared with the TraceIndex: read once
    return {name: [i for i, k in enumerate(kinds) if k == kind] for name, kind in JUMP_KINDS.items()}


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
            trace = _record(config)
            return Loaded(run=Run(config, trace, TraceIndex(trace), _marks(trace)))
    except Exception as err:  # noqa: BLE001  shown on the page; the app keeps working
        return Loaded(error=err)


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


@st.cache_resource(max_entries=64, show_spinner="Computing…")
def _derived(config: RunConfig, name: str, args: tuple, _fn: Callable[..., Any], _trace: Trace) -> Any:
    return _fn(_trace, *args)


def show_error(err: BaseException) -> None:
    """The error's message (written for users) and, folded, its traceback."""
    st.error(str(err) or type(err).__name__)
    text = getattr(err, "traceback", "") or (
        "" if isinstance(err, CkptVizError) else "".join(traceback.format_exception(type(err), err, err.__traceback__)))
    if text:
        with st.expander("Traceback"):
            st.code(text, language="text")
    if st.button("Try again", key="retry"):
        load_run.clear()
        st.rerun()


def current() -> Run:
    """The run the sidebar picked; shows the problem and stops the page when there is none."""
    config = st.session_state[CONFIG] if CONFIG in st.session_state else _default_config()
    if config is None:
        st.info("Pick a source in the sidebar: a built-in model, a model file, or a saved trace.")
        st.stop()
    loaded = load_run(config)
    if loaded.error is not None:
        show_error(loaded.error)
        st.stop()
    return loaded.run


def runs_for_modes(config: RunConfig, modes: list[str]) -> dict[str, Run]:
    """One run per mode of the same model; a mode that fails is reported and left out."""
    runs = {}
    for mode in modes:
        loaded = load_run(config.with_mode(mode))
        if loaded.error is not None:
            st.warning(f"Mode {mode!r} failed: {loaded.error}")
        elif not len(loaded.run.trace):
            st.caption(f"Mode {mode!r} recorded no events (nothing to compare).")
        else:
            runs[mode] = loaded.run
    return runs


# -- the source picker (drawn by the entrypoint; see NOTE [ State that survives page changes ], rule 1) --


def _default_config() -> RunConfig:
    from ckpt_viz.zoo import DEFAULT_MODEL

    return RunConfig("builtin", DEFAULT_MODEL)


def _stamp(path: str) -> tuple[int, int]:
    try:
        info = os.stat(path)
    except OSError:
        return (0, 0)
    return (info.st_mtime_ns, info.st_size)


def _store_upload(upload: Any) -> Path:
    """Write an uploaded file once to a temporary folder (named by its upload id); return its path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", upload.name) or "upload"
    path = _UPLOADS / re.sub(r"[^A-Za-z0-9_-]", "_", str(upload.file_id)) / safe
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(upload.getbuffer())
    return path


def _example_ref() -> str:
    example = ROOT / "examples" / "user_model.py"
    where = os.path.relpath(example) if not os.path.relpath(example).startswith("..") else str(example)
    return f"{where}:make_model"


def _model_file(sb: Any) -> RunConfig | None:
    how = sb.radio("Model file", ("Path", "Upload"), horizontal=True, key="src_file_how")
    if how == "Path":
        ref = sb.text_input("Model reference", _example_ref(), key="src_ref",
                            help="path/to/file.py:factory (a bare file.py means factory make_model)").strip()
    else:
        upload = sb.file_uploader("Model file (.py)", type=["py"], key="src_py")
        factory = sb.text_input("Factory function", "make_model", key="src_factory").strip()
        if upload is None:
            return None
        ref = f"{_store_upload(upload)}:{factory or 'make_model'}"
    limits = sb.expander("Sandbox limits")
    timeout_s = limits.number_input("Time limit (s)", 5, 600, 60, step=5, key="src_timeout")
    memory_mb = limits.number_input("Memory limit (MB)", 1024, 262144, 4096, step=512, key="src_memory")
    return RunConfig("user", ref, stamp=_stamp(ref.rpartition(":")[0] or ref), timeout_s=float(timeout_s),
                     memory_mb=int(memory_mb))


def _trace_file(sb: Any) -> RunConfig | None:
    how = sb.radio("Trace file", ("Upload", "Path"), horizontal=True, key="src_trace_how")
    if how == "Upload":
        upload = sb.file_uploader("Trace (.json or .json.gz)", type=["json", "gz"], key="src_trace_upload")
        path = str(_store_upload(upload)) if upload is not None else ""
    else:
        path = sb.text_input("Trace file path", "", key="src_trace_path", placeholder="runs/trace.json.gz").strip()
    return RunConfig("trace", path, mode="", stamp=_stamp(path)) if path else None


def source_sidebar() -> RunConfig | None:
    """Draw the one source picker in the sidebar and store its `RunConfig` for the pages."""
    sb = st.sidebar
    sb.subheader("Source")
    kind = sb.radio("Source", SOURCES, key="src_kind", label_visibility="collapsed")
    if kind == SOURCES[0]:
        from ckpt_viz.zoo import BUILTIN_MODELS, DEFAULT_MODEL, build_builtin  # noqa: F401  (torch: first use)

        names = list(BUILTIN_MODELS)
        model = sb.selectbox("Built-in model", names, index=names.index(DEFAULT_MODEL), key="src_model",
                             help="Small seeded models; each shows one thing about checkpointing.")
        config: RunConfig | None = RunConfig("builtin", model)
    elif kind == SOURCES[1]:
        config = _model_file(sb)
    else:
        config = _trace_file(sb)
    if kind != SOURCES[2]:
        from ckpt_viz.pipeline import SCHEDULES
        from ckpt_viz.scenarios import MODES

        mode = sb.selectbox("Mode", MODES, index=MODES.index(DEFAULT_MODE), key="src_mode",
                            help="How the checkpointed blocks run; split-* runs DX and DW as two passes.")
        if mode == "pipeline":
            schedule = sb.selectbox("Schedule", SCHEDULES, index=SCHEDULES.index("1F1B"), key="src_schedule")
            microbatches = sb.number_input("Micro-batches", 1, 16, 2, key="src_microbatches")
            config = config and replace(config, schedule=schedule, microbatches=int(microbatches))
        config = config and config.with_mode(mode)
    st.session_state[CONFIG] = config
    return config


# -- the time cursor (see NOTE [ State that survives page changes ], rules 2 and 3) --


def _set_cursor(config: RunConfig, position: int) -> None:
    st.session_state[CURSOR] = (config, position)


def _from_slider(config: RunConfig) -> None:
    _set_cursor(config, int(st.session_state["cursor_slider"]))


def cursor_position(run: Run) -> int:
    """The cursor's event position in `run` (the last event when the run is new)."""
    n = len(run.index.seqs)
    config, position = st.session_state.get(CURSOR, (None, None))
    if config != run.config or position is None:
        position = n - 1
    position = min(max(int(position), 0), n - 1)
    _set_cursor(run.config, position)
    return position


def cursor_bar(run: Run) -> int:
    """Draw the time cursor (slider and step buttons); return the event seq at the cursor."""
    n = len(run.index.seqs)
    if n == 0:
        st.info("This trace holds no events.")
        st.stop()
    p = cursor_position(run)
    with st.container(border=True):
        if n > 1:
            st.session_state["cursor_slider"] = p
            st.slider(f"Time cursor: event position (0 to {n - 1:,})", 0, n - 1, key="cursor_slider",
                      on_change=_from_slider, args=(run.config,))
        row = st.container(horizontal=True, gap="small", vertical_alignment="center")
        steps = (("first", "First", ":material/first_page:", 0), ("prev", "−1", ":material/chevron_left:", p - 1),
                 ("next", "+1", ":material/chevron_right:", p + 1), ("last", "Last", ":material/last_page:", n - 1))
        for key, label, icon, target in steps:
            target = min(max(target, 0), n - 1)
            row.button(label, key=f"cursor_{key}", icon=icon, on_click=_set_cursor, args=(run.config, target),
                       disabled=target == p)
        for name, positions in run.marks.items():
            i = bisect.bisect_right(positions, p)
            target = positions[i] if i < len(positions) else None
            row.button(f"Next {name}", key=f"cursor_next_{name}", icon=":material/skip_next:", on_click=_set_cursor,
                       args=(run.config, target if target is not None else p), disabled=target is None)
        seq = run.index.seqs[p]
        st.code(format_event(run.trace.events[p], site=True), language=None, width="stretch")
    return seq


def window(run: Run, seq: int, radius: int = WINDOW) -> Trace:
    """The run's trace, or on a big trace a trace of the events within `radius` positions of `seq`.

    Only the events: the views that read a window (lifecycles, handle lists) need nothing else.
    """
    n = len(run.index.seqs)
    if n <= 2 * radius + 1:
        return run.trace
    p = run.index.position(seq)
    return Trace(events=run.trace.events[max(0, p - radius):p + radius + 1], meta=dict(run.trace.meta))


def source_line(site: str) -> str | None:
    """The line of code at `site` ("file:line"), numbered, when the file can be read from here."""
    file, _, line = site.rpartition(":")
    if not file or not line.isdigit():
        return None
    for base in (Path.cwd(), ROOT):
        path = base / file
        if path.is_file():
            text = linecache.getline(str(path), int(line)).rstrip()
            return f"{line}: {text.strip()}" if text else None
    return None


def show_chart(render: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Build an altair chart with `render(*args, **kwargs)`, show it, and return it (for a download).

    Same picture as st.altair_chart, without altair's JSON-schema validation of every
    data row (about 2 s for a 5,000-row chart, on each cursor move); the renderers'
    charts are validated by their own tests.
    """
    import altair as alt
    from altair.utils.schemapi import debug_mode

    with debug_mode(False):
        chart = render(*args, **kwargs)
    with alt.theme.enable("none"):  # as st.altair_chart does: no fixed 300 px view from altair's default theme
        spec = chart.to_dict(validate=False)
    # Fit the width to the page; keep the renderer's height for the plot (a lane chart sizes it by its lanes).
    spec.setdefault("autosize", {"type": "fit-x", "contains": "padding"})
    st.vega_lite_chart(spec, width="stretch")
    return chart


# -- downloads (built when clicked: a callable `data` runs only then) --


def _trace_bytes(run: Run) -> bytes:
    if run.config.source == "trace" and Path(run.config.target).is_file():
        return Path(run.config.target).read_bytes()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        run.trace.save(path)
        return path.read_bytes()


def perfetto_bytes(run: Run) -> bytes:
    from ckpt_viz.render.perfetto import render_perfetto

    return json.dumps(render_perfetto(run.trace.events, run.trace.memory, run.trace.meta)).encode()


def svg_bytes(dot: str) -> bytes:
    """A DOT source drawn as SVG by the graphviz binary (server side)."""
    import graphviz

    return graphviz.Source(dot).pipe(format="svg")


def png_bytes(chart: Any) -> bytes:
    """An altair chart as PNG (vl-convert, no browser)."""
    import altair as alt
    import vl_convert

    with alt.data_transformers.disable_max_rows():
        spec = chart.to_json()
    return vl_convert.vegalite_to_png(spec, scale=2)


def _stem(run: Run) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run.config.label.replace(" · ", "_")).strip("_") or "trace"


def download_trace_buttons(run: Run) -> None:
    """Trace JSON (opens in this app) and Perfetto JSON (opens in ui.perfetto.dev)."""
    a, b = st.columns(2)
    a.download_button("Trace JSON", lambda: _trace_bytes(run), file_name=f"{_stem(run)}.json",
                      mime="application/json", on_click="ignore", key="dl_trace", icon=":material/download:")
    b.download_button("Perfetto JSON", lambda: perfetto_bytes(run), file_name=f"{_stem(run)}.perfetto.json",
                      mime="application/json", on_click="ignore", key="dl_perfetto", icon=":material/download:",
                      help="Open it in ui.perfetto.dev or chrome://tracing")


def download_svg_button(dot: str, name: str, key: str) -> None:
    st.download_button("Graph SVG", lambda: svg_bytes(dot), file_name=f"{name}.svg", mime="image/svg+xml",
                       on_click="ignore", key=key, icon=":material/download:")


def download_png_button(chart: Any, name: str, key: str) -> None:
    st.download_button("Chart PNG", lambda: png_bytes(chart), file_name=f"{name}.png", mime="image/png",
                       on_click="ignore", key=key, icon=":material/download:")
