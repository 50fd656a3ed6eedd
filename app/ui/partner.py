"""The run the Compare page sets beside the sidebar's: a saved trace (by path or uploaded) or a built-in run, kept in
the URL's query parameter `vs` so that a reload or a shared link compares the same two runs.

    vs=trace:runs/after.json.gz                        a saved trace, by path
    vs=builtin:mlp:none                                a built-in model in a mode
    vs=builtin:pipeline:pipeline:ZB-H1:4               ... a pipeline run: schedule and micro-batches

`partner_picker(run)` draws the controls, reads and writes `vs`, and returns the partner's `RunConfig` (None until
one is picked). An uploaded trace is not put in the URL: its file lives in this session's folder only.
"""
from __future__ import annotations

import os

import streamlit as st

from ui.runs import Run, RunConfig

VS = "vs"
KINDS = ("Saved trace (path)", "Saved trace (upload)", "Built-in run")


def partner_param() -> str | None:
    """The `vs` query parameter (swap for the URL-state helper of app/ui once it lands)."""
    return st.query_params.get(VS)


def set_partner_param(value: str | None) -> None:
    """Write (or, with None, remove) the `vs` query parameter."""
    if value is None:
        st.query_params.pop(VS, None)
    elif st.query_params.get(VS) != value:
        st.query_params[VS] = value


def _stamp(path: str) -> tuple[int, int]:
    try:
        info = os.stat(path)
    except OSError:
        return (0, 0)
    return (info.st_mtime_ns, info.st_size)


def parse_vs(value: str) -> RunConfig | None:
    """The `RunConfig` a `vs` value names, or None when it names none this page offers (see the module
    docstring): a built-in model, mode and schedule of the catalog, 1 to 16 micro-batches."""
    from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
    from ckpt_viz.run.schedules import SCHEDULES
    from ckpt_viz.vocabulary import RUN_MODES

    kind, _, rest = value.partition(":")
    if kind == "trace" and rest:
        return RunConfig("trace", rest, mode="", stamp=_stamp(rest))
    parts = rest.split(":")
    if kind != "builtin" or len(parts) < 2 or parts[0] not in BUILTIN_MODEL_NAMES or parts[1] not in RUN_MODES:
        return None
    if len(parts) == 2 and parts[1] != "pipeline":
        return RunConfig("builtin", parts[0], mode=parts[1])
    if len(parts) == 4 and parts[1] == "pipeline" and parts[2] in SCHEDULES and parts[3].isdigit() \
            and 1 <= int(parts[3]) <= 16:
        return RunConfig("builtin", parts[0], mode="pipeline", schedule=parts[2], microbatches=int(parts[3]))
    return None


def vs_of(config: RunConfig) -> str | None:
    """The `vs` value of a partner config (None for an upload, which the URL cannot reopen)."""
    if config.source == "trace":
        return None if config.name else f"trace:{config.target}"
    pipe = f":{config.schedule}:{config.microbatches}" if config.mode == "pipeline" else ""
    return f"builtin:{config.target}:{config.mode}{pipe}"


def _seed_widgets(config: RunConfig | None, run: Run) -> None:
    """Set the controls from the URL's partner on the first draw (a reload, a shared link)."""
    if "vs_kind" in st.session_state:
        return
    if config is not None and config.source == "trace":
        st.session_state.update(vs_kind=KINDS[0], vs_path=config.target)
    elif config is not None:
        st.session_state.update(vs_kind=KINDS[2], vs_model=config.target, vs_mode=config.mode,
                                vs_schedule=config.schedule, vs_microbatches=config.microbatches)
    else:
        builtin = run.config.source == "builtin"
        st.session_state.update(vs_kind=KINDS[2] if builtin else KINDS[0],
                                vs_model=run.config.target if builtin else "mlp",
                                vs_mode="none" if run.config.mode != "none" else "split-reentrant")


def partner_picker(run: Run) -> RunConfig | None:
    """Draw the partner's controls (see the module docstring); its `RunConfig`, or None until one is picked."""
    from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
    from ckpt_viz.run.schedules import SCHEDULES
    from ckpt_viz.vocabulary import RUN_MODES

    param = partner_param()
    from_url = parse_vs(param) if param else None
    if param and from_url is None:
        st.warning("The link's partner `vs` is not one this page knows, so it is left out. Tip: pick the run to "
                   "compare with below (vs=trace:PATH or vs=builtin:MODEL:MODE).")
    _seed_widgets(from_url, run)
    kind = st.radio("Compare with", KINDS, horizontal=True, key="vs_kind")
    config: RunConfig | None = None
    if kind == KINDS[0]:
        path = st.text_input("Trace file path", key="vs_path", placeholder="runs/after.json.gz").strip()
        config = RunConfig("trace", path, mode="", stamp=_stamp(path)) if path else None
    elif kind == KINDS[1]:
        upload = st.file_uploader("Trace (.json or .json.gz)", type=["json", "gz"], key="vs_upload")
        if upload is not None:
            from ui.sandbox import session_sandbox

            path = str(session_sandbox().store_upload(upload, "partner"))
            config = RunConfig("trace", path, mode="", stamp=_stamp(path), name=upload.name)
    else:
        left, middle, right, last = st.columns(4)
        model = left.selectbox("Built-in model", BUILTIN_MODEL_NAMES, key="vs_model")
        mode = middle.selectbox("Mode", RUN_MODES, key="vs_mode")
        if mode == "pipeline":
            schedule = right.selectbox("Schedule", SCHEDULES, key="vs_schedule")
            microbatches = last.number_input("Micro-batches", 1, 16, 4, key="vs_microbatches")
            config = RunConfig("builtin", model, mode=mode, schedule=schedule, microbatches=int(microbatches))
        else:
            config = RunConfig("builtin", model, mode=mode)
    set_partner_param(vs_of(config) if config is not None else None)
    return config
