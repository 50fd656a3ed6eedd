"""The view in the URL: the source, the cursor and the Compare page's partner run, as query parameters.

    ?model=transformer&mode=reentrant&cursor=34      a built-in model (`schedule`, `mb` for mode pipeline)
    ?broken=dx-after-dw&cursor=3                      a broken run
    ?file=examples/user_model.py:make_model&mode=...  a model file by path (`upload=model`: an uploaded one)
    ?trace=runs/a.json.gz&cursor=0                    a saved trace by path (`upload=trace`: an uploaded one)
    &vs=model:mlp@none                                Compare's partner run (`partner`, `set_partner`)

The page is the URL's path (Streamlit's navigation). A reload or a shared link opens the same view (an
upload cannot travel in a link: the picker opens on the upload, to be given again), and the browser's
back and forward buttons step through the views: Streamlit pushes a history entry for each change of
the query string the app writes.

NOTE [ The URL holds the view ]
  1. `restore()` runs first in every script run (the entrypoint, before the source picker is drawn). When
     the URL is not the one this session wrote last (a new session: a reload or a link; the back or
     forward button; an edited address), the URL wins: it sets the picker's widget state (only the keys
     whose value it changes; a value that is not an option of its widget counts as absent, its default)
     and keeps the cursor it names for the run it names (`pending_cursor`).
  2. A URL with none of these parameters names no view and changes nothing: Streamlit's navigation drops
     the query string on a page change (it keeps only parameters bound to widgets, and the cursor is
     drawn by each page, some in a fragment, so it cannot be bound), and the first page opens bare. The
     app writes the whole view back at once, so every URL it writes names the whole view. (A page
     change therefore makes two history entries, the bare one and the whole one: back from a page
     steps to the bare one first, which shows the same view.)
  3. `publish(config)` runs after the picker is drawn and `publish_cursor(config, seq)` wherever the
     cursor of the sidebar's run is read: each writes the view when it changed, in one update (one
     history entry), and remembers the URL it wrote. Parameters it does not own (`vs`) stay.
  4. A new source puts the cursor at 0 (NOTE [ State that survives page changes ] in cursor.py, rule 3).
"""
from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from ui.runs import CONFIG, DEFAULT_MODE, RunConfig

__all__ = ["PARTNER", "config_from_param", "config_param", "partner", "pending_cursor", "publish",
           "publish_cursor", "restore", "set_partner"]

PARTNER = "vs"  # Compare's partner run: `partner()` / `set_partner()`
_SOURCE_PARAMS = ("model", "broken", "file", "trace", "upload", "mode", "schedule", "mb")
_WRITTEN = "url_written"  # the query parameters this session wrote (or applied) last
_PENDING = "url_cursor"  # (source params, seq): a cursor the URL named, for the run it names
_CURSOR = "url_cursor_seen"  # (config, seq): the cursor of the sidebar's run, as its page last read it
_KINDS = {"builtin": "Built-in model", "user": "Model file (.py)", "trace": "Saved trace",
          "broken": "Broken runs to explore"}  # RunConfig.source -> the picker's words (ui.source.SOURCES)
_DEFAULT_SCHEDULE, _DEFAULT_MICROBATCHES = "1F1B", 4


def _example_ref() -> str:
    example = Path(__file__).resolve().parent.parent.parent / "examples" / "user_model.py"
    where = os.path.relpath(example)
    return f"{where if not where.startswith('..') else example}:make_model"


def _defaults() -> dict[str, object]:
    """The picker's widget keys and their defaults (as ui.source draws them)."""
    from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, DEFAULT_MODEL

    return {"src_kind": _KINDS["builtin"], "src_model": DEFAULT_MODEL, "src_mode": DEFAULT_MODE,
            "src_schedule": _DEFAULT_SCHEDULE, "src_microbatches": _DEFAULT_MICROBATCHES,
            "src_microbatches_file": _DEFAULT_MICROBATCHES, "src_broken": BROKEN_SCENARIO_NAMES[0],
            "src_file_how": "Path", "src_ref": _example_ref(), "src_trace_how": "Upload", "src_trace_path": ""}


def _source_params(params: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in params.items() if k in _SOURCE_PARAMS}


def _widget_values(params: dict[str, str]) -> dict[str, object]:
    """The picker's widget values the URL's source parameters ask for (NOTE rule 1)."""
    from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, BUILTIN_MODEL_NAMES
    from ckpt_viz.run.schedules import SCHEDULES
    from ckpt_viz.vocabulary import RUN_MODES

    values = _defaults()
    if "broken" in params:
        values["src_kind"] = _KINDS["broken"]
        if params["broken"] in BROKEN_SCENARIO_NAMES:
            values["src_broken"] = params["broken"]
    elif "file" in params or params.get("upload") == "model":
        values["src_kind"] = _KINDS["user"]
        values["src_file_how"] = "Path" if "file" in params else "Upload"
        if params.get("file"):
            values["src_ref"] = params["file"]
    elif "trace" in params or params.get("upload") == "trace":
        values["src_kind"] = _KINDS["trace"]
        values["src_trace_how"] = "Path" if "trace" in params else "Upload"
        values["src_trace_path"] = params.get("trace", "")
    elif params.get("model") in BUILTIN_MODEL_NAMES:
        values["src_model"] = params["model"]
    if params.get("mode") in RUN_MODES:
        values["src_mode"] = params["mode"]
    if params.get("schedule") in SCHEDULES:
        values["src_schedule"] = params["schedule"]
    if params.get("mb", "").isdigit() and 1 <= int(params["mb"]) <= 16:
        values["src_microbatches"] = values["src_microbatches_file"] = int(params["mb"])
    return values


def restore() -> None:
    """Apply the URL to the source picker and the cursor when this session did not write it (NOTE rules 1, 2)."""
    params = st.query_params.to_dict()
    state = st.session_state
    if state.get(_WRITTEN) == params or not any(k in params for k in (*_SOURCE_PARAMS, "cursor")):
        return
    defaults = _defaults()
    for key, value in _widget_values(params).items():
        if state.get(key, defaults[key]) != value:
            state[key] = value
    cursor = params.get("cursor", "")
    state[_PENDING] = (_source_params(params), int(cursor) if cursor.isdigit() else None)
    state[_WRITTEN] = params


def _params_of(config: RunConfig | None) -> dict[str, str]:
    """The source parameters of `config` (the picker's run); with no config (an upload not given yet, an empty
    path), those of the picker's choice."""
    if config is None:
        state = st.session_state
        kind = state.get("src_kind", _KINDS["builtin"])
        if kind == _KINDS["user"]:
            return {"upload": "model"} if state.get("src_file_how", "Path") == "Upload" else \
                {"file": str(state.get("src_ref", ""))}
        if kind == _KINDS["trace"]:
            return {"upload": "trace"} if state.get("src_trace_how", "Upload") == "Upload" else \
                {"trace": str(state.get("src_trace_path", ""))}
        return {}
    if config.source == "broken":
        return {"broken": config.target}
    if config.source == "trace":
        return {"upload": "trace"} if config.name else {"trace": config.target}
    out = {"upload": "model"} if config.source == "user" and config.name else \
        {"file" if config.source == "user" else "model": config.target}
    out["mode"] = config.mode
    if config.mode == "pipeline":
        out.update(schedule=config.schedule, mb=str(config.microbatches))
    return out


def _write(params: dict[str, str]) -> None:
    if params != st.query_params.to_dict():
        st.query_params.from_dict(params)  # one update: one history entry
    st.session_state[_WRITTEN] = params


def _cursor_of(config: RunConfig | None) -> str | None:
    """The cursor to write with the source: the URL's pending one for this run, else the last one this run's
    page read (`publish_cursor`), else 0 (a new run starts at its first event, rule 4); None without a run."""
    if config is None:
        return None
    pending = st.session_state.get(_PENDING)
    if pending is not None and pending[1] is not None and pending[0] == _params_of(config):
        return str(pending[1])
    seen = st.session_state.get(_CURSOR)
    return str(seen[1]) if seen is not None and seen[0] == config else "0"


def publish(config: RunConfig | None) -> None:
    """Write the picker's source, with its run's cursor, into the URL when the view changed (NOTE rules 2-4)."""
    params = st.query_params.to_dict()
    view = {**_params_of(config), **({"cursor": cursor} if (cursor := _cursor_of(config)) is not None else {})}
    kept = {k: v for k, v in params.items() if k not in _SOURCE_PARAMS and k != "cursor"}  # `vs` stays
    _write({**kept, **view})


def pending_cursor(config: RunConfig) -> int | None:
    """The cursor seq the URL named, once, when `config` is the sidebar's run and the run the URL names (None
    otherwise: it named none, or another run)."""
    pending = st.session_state.get(_PENDING)
    if pending is None or st.session_state.get(CONFIG) != config:
        return None
    del st.session_state[_PENDING]
    params, seq = pending
    return seq if params == _params_of(config) else None


def publish_cursor(config: RunConfig, seq: int) -> None:
    """Write the cursor of the sidebar's run (`config`) into the URL when it moved (NOTE rule 3). Another run's
    cursor (a lesson's own run) is not written."""
    if st.session_state.get(CONFIG) != config:
        return
    st.session_state[_CURSOR] = (config, seq)
    params = st.query_params.to_dict()
    if params.get("cursor") == str(seq):
        st.session_state[_WRITTEN] = params
        return
    _write({**params, "cursor": str(seq)})


# -- Compare's partner run (the `vs` parameter), for app/views/compare.py


def config_param(config: RunConfig) -> str:
    """A run as one parameter value: "model:mlp@none", "file:net.py:make_model@reentrant", "trace:runs/a.json",
    "broken:dx-after-dw"; a pipeline run adds "/<schedule>/<micro-batches>" to its mode. An uploaded file has
    no path to give: "upload:<kind>"."""
    if config.name:
        return f"upload:{'model' if config.source == 'user' else 'trace'}"
    if config.source in ("trace", "broken"):
        return f"{config.source}:{config.target}"
    mode = config.mode + (f"/{config.schedule}/{config.microbatches}" if config.mode == "pipeline" else "")
    return f"{'model' if config.source == 'builtin' else 'file'}:{config.target}@{mode}"


def config_from_param(text: str | None) -> RunConfig | None:
    """The run `config_param` wrote, or None for a value that names no run (checked as the picker checks)."""
    from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES, BUILTIN_MODEL_NAMES
    from ckpt_viz.run.schedules import SCHEDULES
    from ckpt_viz.vocabulary import RUN_MODES

    kind, _, rest = (text or "").partition(":")
    if kind == "trace" and rest:
        return RunConfig("trace", rest, mode="")
    if kind == "broken":
        return RunConfig("broken", rest, mode="") if rest in BROKEN_SCENARIO_NAMES else None
    if kind not in ("model", "file"):
        return None
    target, _, mode = rest.rpartition("@")
    mode, _, pipe = mode.partition("/")
    if mode not in RUN_MODES or not target or (kind == "model" and target not in BUILTIN_MODEL_NAMES):
        return None
    config = RunConfig("builtin" if kind == "model" else "user", target, mode=mode)
    if mode == "pipeline":
        schedule, _, mb = pipe.partition("/")
        if schedule not in SCHEDULES or not mb.isdigit() or not 1 <= int(mb) <= 16:
            return None
        config = RunConfig(config.source, target, mode=mode, schedule=schedule, microbatches=int(mb))
    return config


def partner() -> RunConfig | None:
    """Compare's partner run, from the URL's `vs` (None when absent or naming no run)."""
    return config_from_param(st.query_params.get(PARTNER))


def set_partner(config: RunConfig | None) -> None:
    """Write Compare's partner run into the URL's `vs` (None: remove it); one history entry when it changed."""
    params = st.query_params.to_dict()
    value = config_param(config) if config is not None else None
    if params.get(PARTNER) == value:
        return
    params.pop(PARTNER, None)
    _write({**params, **({PARTNER: value} if value is not None else {})})
