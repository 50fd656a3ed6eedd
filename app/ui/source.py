"""The source picker: the sidebar controls that build the `RunConfig` every page shows.

Drawn once, by the entrypoint (See NOTE [ State that survives page changes ] in cursor.py,
rule 1). A built-in model, a model file (by path or uploaded; run in the sandbox), or a saved
trace. The model list and the modes are `ckpt_viz.catalog`'s and `ckpt_viz.vocabulary`'s (no
torch); the micro-batch counts a built-in splits into load torch, only when a model source is drawn,
so a saved trace opens without torch.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import streamlit as st

from ui.runs import CONFIG, DEFAULT_MODE, RunConfig

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCES = ("Built-in model", "Model file (.py)", "Saved trace", "Broken runs to explore")


def _stamp(path: str) -> tuple[int, int]:
    try:
        info = os.stat(path)
    except OSError:
        return (0, 0)
    return (info.st_mtime_ns, info.st_size)


def _store_upload(upload: Any, kind: str) -> Path:
    """The uploaded file in this session's folder (one per kind: a new upload replaces the last one)."""
    from ui.sandbox import session_sandbox

    return session_sandbox().store_upload(upload, kind)


def _example_ref() -> str:
    example = ROOT / "examples" / "user_model.py"
    where = os.path.relpath(example) if not os.path.relpath(example).startswith("..") else str(example)
    return f"{where}:make_model"


def _model_file(sb: Any) -> RunConfig | None:
    from ui.sandbox import restore_limits, session_sandbox

    session_sandbox(warm=True)  # a spare started ahead, or its own warm process, started while the user picks
    restore_limits(src_timeout=60, src_memory=4096)  # kept while another source is shown, and across uploads
    limits = sb.expander("Sandbox limits", expanded=True)
    timeout_s = limits.number_input("Time limit (s)", 5, 600, step=5, key="src_timeout",
                                    help="Per mode. The run is stopped, and every process it started killed.")
    memory_mb = limits.number_input("Memory limit (MB)", 1024, 262144, step=512, key="src_memory",
                                    help="All of the run's processes together (torch itself needs about 1 GB).")
    how = sb.radio("Model file", ("Path", "Upload"), horizontal=True, key="src_file_how")
    name = ""
    if how == "Path":
        ref = sb.text_input("Model reference", _example_ref(), key="src_ref",
                            help="path/to/file.py:factory (a bare file.py means factory make_model)").strip()
    else:
        upload = sb.file_uploader("Model file (.py)", type=["py"], key="src_py")
        factory = sb.text_input("Factory function", "make_model", key="src_factory").strip()
        if upload is None:
            return None
        ref, name = f"{_store_upload(upload, 'model')}:{factory or 'make_model'}", upload.name
    return RunConfig("user", ref, stamp=_stamp(ref.rpartition(":")[0] or ref), timeout_s=float(timeout_s),
                     memory_mb=int(memory_mb), name=name)


def _trace_file(sb: Any) -> RunConfig | None:
    how = sb.radio("Trace file", ("Upload", "Path"), horizontal=True, key="src_trace_how")
    if how == "Upload":
        upload = sb.file_uploader("Trace (.json or .json.gz)", type=["json", "gz"], key="src_trace_upload")
        path = str(_store_upload(upload, "trace")) if upload is not None else ""
    else:
        path = sb.text_input("Trace file path", "", key="src_trace_path", placeholder="runs/trace.json.gz").strip()
    return RunConfig("trace", path, mode="", stamp=_stamp(path), name=upload.name if how == "Upload" and upload
                     else "") if path else None


# -- "Broken runs to explore" (the debugger's part of the picker: ckpt_viz.run.broken) --

def _broken_run(sb: Any) -> RunConfig:
    """A broken run: one recorded mistake for the Debugger page; it runs in its own mode."""
    from ckpt_viz.catalog import BROKEN_SCENARIO_NAMES

    name = sb.selectbox("Broken run", BROKEN_SCENARIO_NAMES, key="src_broken",
                        help="Each records one real mistake with the real runtime; open the Debugger page to see "
                             "what went wrong and how to fix it.")
    sb.caption("See the **Debugger** page for what went wrong.")
    return RunConfig("broken", name, mode="")


@st.cache_data(show_spinner=False)
def _microbatch_choices(model: str) -> tuple[int, ...]:
    """The micro-batch counts (1-16) the built-in `model` splits into; () when it has no pipeline stages."""
    from ckpt_viz.run.pipeline import microbatch_choices  # torch: first use
    from ckpt_viz.run.zoo import build_builtin

    return microbatch_choices(build_builtin(model))


def source_sidebar() -> RunConfig | None:
    """Draw the one source picker in the sidebar and store its `RunConfig` for the pages."""
    from ui.sandbox import prestart

    prestart()  # once per app: a warm sandbox starts ahead for the first model file (NOTE [ Spare sandbox ])
    sb = st.sidebar
    sb.subheader("Source")
    kind = sb.radio("Source", SOURCES, key="src_kind", label_visibility="collapsed")
    if kind == SOURCES[0]:
        from ckpt_viz.catalog import BUILTIN_MODEL_NAMES, DEFAULT_MODEL

        names = list(BUILTIN_MODEL_NAMES)
        model = sb.selectbox("Built-in model", names, index=names.index(DEFAULT_MODEL), key="src_model",
                             help="Small seeded models; each shows one thing about checkpointing.")
        config: RunConfig | None = RunConfig("builtin", model)
    elif kind == SOURCES[1]:
        config = _model_file(sb)
    elif kind == SOURCES[3]:
        st.session_state[CONFIG] = config = _broken_run(sb)
        return config
    else:
        config = _trace_file(sb)
    if kind != SOURCES[2]:
        from ckpt_viz.run.schedules import SCHEDULES
        from ckpt_viz.vocabulary import RUN_MODES

        # "pipeline" only for the built-ins split into stages, with the micro-batch counts that split their batch
        counts = _microbatch_choices(config.target) if config is not None and kind == SOURCES[0] else None
        modes = [m for m in RUN_MODES if m != "pipeline" or kind != SOURCES[0] or counts]
        if st.session_state.get("src_mode", DEFAULT_MODE) not in modes:  # a link's mode this model lacks
            st.session_state["src_mode"] = DEFAULT_MODE
        mode = sb.selectbox("Mode", modes, index=modes.index(DEFAULT_MODE), key="src_mode",
                            help="How the checkpointed blocks run; split-* runs DX and DW as two passes."
                                 + ("" if "pipeline" in modes else " Mode 'pipeline' needs a model split into "
                                    "stages: the built-in 'pipeline'."))
        if mode == "pipeline":
            schedule = sb.selectbox("Schedule", SCHEDULES, index=SCHEDULES.index("1F1B"), key="src_schedule")
            if counts and st.session_state.get("src_microbatches", 4) not in counts:  # a link's count it lacks
                st.session_state["src_microbatches"] = 4 if 4 in counts else counts[0]
            if counts:
                microbatches = sb.selectbox("Micro-batches", counts, index=counts.index(4) if 4 in counts else 0,
                                            key="src_microbatches", help="the counts that split this model's batch")
            else:
                microbatches = sb.number_input("Micro-batches", 1, 16, 4, key="src_microbatches_file",
                                               help="must divide the batch your model file returns")
            config = config and replace(config, schedule=schedule, microbatches=int(microbatches))
        config = config and config.with_mode(mode)
    st.session_state[CONFIG] = config
    return config
