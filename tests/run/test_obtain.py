"""`obtain_trace(request)`: one dispatch (built-in model, sandboxed model file, saved trace) for the CLI and the app."""
from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ckpt_viz import CkptVizError
from ckpt_viz.run.obtain import RunRequest, obtain_trace
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import build_builtin
from ckpt_viz.usermodel.load import load_model

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = f"{ROOT / 'examples' / 'user_model.py'}:make_model"


def _facts(trace) -> list[tuple]:
    """Every field of every event but its time, thread and site (the caller's line: each call is on its own)."""
    return [msgspec.structs.replace(e, t_ns=0, thread_id=0, site=None) for e in trace.events]


def test_a_built_in_request_records_the_run_scenario_trace() -> None:
    request = RunRequest("builtin", "pipeline", mode="pipeline", schedule="ZB-H1", microbatches=4)
    trace = obtain_trace(request)
    expected = run_scenario(build_builtin("pipeline"), "pipeline", schedule="ZB-H1", microbatches=4,
                            memory=True, graphs=True)
    assert _facts(trace) == _facts(expected)
    assert [m.bytes_by_category for m in trace.memory] == [m.bytes_by_category for m in expected.memory]
    assert len(trace.graphs) == len(expected.graphs) > 0
    assert trace.meta["schedule"] == "ZB-H1" and trace.meta["microbatches"] == 4


def test_the_listener_sees_every_event_of_a_built_in_run() -> None:
    seen: list = []
    trace = obtain_trace(RunRequest("builtin", "mlp", mode="split-nonreentrant", memory=False, graphs=False),
                         listen=seen.append)
    assert seen == trace.events and len(seen) > 0
    assert not trace.memory and not trace.graphs


def test_a_trace_request_reads_the_saved_trace(tmp_path: Path) -> None:
    trace = run_scenario(build_builtin("excluded"), "split-reentrant", memory=True)
    trace.save(tmp_path / "t.json.gz")
    read = obtain_trace(RunRequest("trace", str(tmp_path / "t.json.gz")))
    assert _facts(read) == _facts(trace)
    assert read.meta["model"] == "excluded"


def test_a_user_request_runs_the_model_file_in_the_sandbox() -> None:
    trace = obtain_trace(RunRequest("user", EXAMPLE, mode="reentrant", memory=False, graphs=False))
    expected = run_scenario(load_model(EXAMPLE), "reentrant")
    assert [e.kind for e in trace.events] == [e.kind for e in expected.events] and trace.count("handle_created") == 3
    assert trace.meta["sandbox"]["ref"] == EXAMPLE


def test_one_run_meta_for_every_mode() -> None:
    """Every mode's meta comes from `trace.run_meta`: the same keys, whatever ran."""
    single = obtain_trace(RunRequest("builtin", "pipeline", mode="reentrant", memory=False, graphs=False)).meta
    piped = obtain_trace(RunRequest("builtin", "pipeline", mode="pipeline", memory=False, graphs=False)).meta
    common = {"model", "mode", "schedule", "source", "description", "checkpoint", "seed", "versions"}
    assert common <= set(single) and common <= set(piped)
    assert set(single["versions"]) == set(piped["versions"]) == {"python", "ckpt_viz", "torch"}
    assert single["schedule"] is None and piped["schedule"] == "1F1B"


def test_an_unknown_source_is_refused_with_a_tip() -> None:
    with pytest.raises(CkptVizError, match=r"^ckpt_viz.obtain_trace: unknown source 'file'.*\nTip: "):
        RunRequest("file", "x.json")


def test_an_unknown_built_in_model_names_the_known_ones() -> None:
    with pytest.raises(CkptVizError, match=r"unknown built-in model 'nope'; expected one of .*mlp"):
        obtain_trace(RunRequest("builtin", "nope"))
