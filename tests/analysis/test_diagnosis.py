"""One diagnosis per trace, whichever way it is asked: `diagnose(trace, h)` is the whole run's findings of handle h,
`diagnose_handle(trace, h)` the same finding of that handle, and a saved-then-loaded trace gives the recorded one's
(every handle of every broken run, and a big synthetic trace); a handle's releases are its release transitions.

(Re-homed from tests/app/test_handle_diagnosis.py, whose page-side twins `ui.runs.run_diagnosis` and
`ui.runs.handle_diagnosis` are gone: the pages call these functions.)
"""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from ckpt_viz.analysis.diagnosis import diagnose, diagnose_handle, explain, format_findings
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.run.broken import broken_scenarios, record_broken
from ckpt_viz.trace import Trace
from traces import synthetic_trace


def _loaded(trace: Trace, path: Path) -> Trace:
    trace.save(path)
    return Trace.load(path)


@pytest.mark.parametrize("name", sorted(broken_scenarios()))
def test_one_handle_as_the_whole_run_says(name: str, tmp_path: Path) -> None:
    recorded = record_broken(name)
    loaded = _loaded(recorded, tmp_path / "t.json.gz")
    found = diagnose(recorded)
    assert diagnose(loaded) == found  # events compare by value: the loaded trace tells the same story
    assert diagnose(recorded) is not found and diagnose(recorded) == found  # a copy each call, of one result
    for trace in (recorded, loaded):
        handles = trace.handle_ids()
        assert handles, name
        for h in handles:
            mine = [d for d in found if d.handle_id == h]
            assert diagnose(trace, h) == mine, (name, h)
            one = diagnose_handle(trace, h)  # the handle's refusal or leak: one of the run's findings, or "ok"
            assert (one in mine) if not one.ok else (one.code == "ok" and one not in found), (name, h)
    assert broken_scenarios()[name].expected_code in {d.code for d in diagnose(loaded)}, name
    title = str(loaded.meta.get("model") or "this run")
    assert explain(loaded, file=io.StringIO()).startswith(format_findings(found, title=title))


def test_a_big_trace_of_many_handles(tmp_path: Path) -> None:
    trace = _loaded(synthetic_trace(20_000), tmp_path / "big.json.gz")
    handles = trace.handle_ids()
    assert len(handles) > 1_000
    found = diagnose(trace)
    for h in handles[:40] + handles[-40:] + [handles[len(handles) // 2]]:
        one = diagnose_handle(trace, h)
        assert (one in found) if not one.ok else (one not in found), h


@pytest.mark.parametrize("name", ["released-by-hand", "dx-after-dw", "outputs-dropped", "replayed-twice"])
def test_releases_are_the_release_transitions(name: str, tmp_path: Path) -> None:
    recorded = record_broken(name)
    for trace in (recorded, _loaded(recorded, tmp_path / "t.json")):
        life = lifecycle(trace)
        seen = 0
        for h in [*trace.handle_ids(), -1, 10**9]:
            releases = [t for t in life.transitions(h) if t.state == "released"]
            assert life.releases(h) == releases, (name, h)
            assert life.released(h) == (releases[0] if releases else None), (name, h)
            seen += bool(releases)
        assert seen, name  # some handle was released
