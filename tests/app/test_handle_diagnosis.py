"""The Handles page's finding for one handle (`ui.runs.handle_diagnosis`, read from the handle's own events and the
run's errors and session events) is `diagnose_handle`'s, which reads every event: for every handle of every broken
run, recorded and saved-then-loaded (the packed columns), and of a mixed big trace; and `diagnose(trace, h)` is the
whole run's findings filtered by handle (what the page now shows from the one diagnosis cached per trace);
`ui.runs.run_diagnosis` (a loaded trace's events built once for the four passes) gives `diagnose`'s findings."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckpt_viz.diagnose import diagnose, diagnose_all, diagnose_handle
from ckpt_viz.run.broken import BROKEN, record_broken
from ckpt_viz.trace import Trace

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def runs():
    sys.path.insert(0, str(ROOT / "app"))
    try:
        from ui import runs as module

        yield module
    finally:
        sys.path.remove(str(ROOT / "app"))


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_one_handle_as_the_whole_run_says(runs, name: str, tmp_path: Path) -> None:
    recorded = record_broken(name)
    recorded.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    for trace in (recorded, loaded):
        handles = trace.handle_ids()
        assert handles, name
        found = diagnose(trace)
        assert runs.run_diagnosis(trace) == found == diagnose_all(trace), name  # the pages' one diagnosis per trace
        for h in handles:
            assert runs.handle_diagnosis(trace, h) == diagnose_handle(trace, h), (name, h)
            assert [d for d in found if d.handle_id == h] == diagnose(trace, h), (name, h)
    assert BROKEN[name].expected_code in {d.code for d in diagnose(loaded)}, name  # a broken run: findings compared


def test_a_big_trace_of_many_handles(runs, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_trace_io import build_trace
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    build_trace(20_000).save(tmp_path / "big.json.gz")
    trace = Trace.load(tmp_path / "big.json.gz")
    handles = trace.handle_ids()
    assert len(handles) > 1_000
    assert runs.run_diagnosis(trace) == diagnose(trace)
    for h in handles[:40] + handles[-40:] + [handles[len(handles) // 2]]:
        assert runs.handle_diagnosis(trace, h) == diagnose_handle(trace, h), h


@pytest.mark.parametrize("name", ["released-by-hand", "dx-after-dw", "outputs-dropped", "replayed-twice"])
def test_releases_read_from_the_states_are_the_transitions(name: str, tmp_path: Path) -> None:
    """`Lifecycle.released` / `releases` (found with list.index on the states) are the release transitions."""
    from ckpt_viz.trace.lifecycle import lifecycle

    recorded = record_broken(name)
    recorded.save(tmp_path / "t.json")
    for trace in (recorded, Trace.load(tmp_path / "t.json")):
        life = lifecycle(trace)
        seen = 0
        for h in [*trace.handle_ids(), -1, 10**9]:
            releases = [t for t in life.transitions(h) if t.state == "released"]
            assert life.releases(h) == releases, (name, h)
            assert life.released(h) == (releases[0] if releases else None), (name, h)
            seen += bool(releases)
        assert seen, name  # some handle was released
