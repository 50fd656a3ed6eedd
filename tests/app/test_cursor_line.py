"""The cursor line names the handle at the cursor with its block's function, read from that handle's events only:
the same name as a table of every handle's `handle_created` (what the line read before), on a recorded run, the
same run saved and loaded (the packed data column), and a trace with a handle created twice."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckpt_viz.events import Event
from ckpt_viz.trace import Trace
from ckpt_viz.trace.cache import event_column, event_data

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def cursor():
    sys.path.insert(0, str(ROOT / "app"))
    try:
        from ui import cursor as module

        yield module
    finally:
        sys.path.remove(str(ROOT / "app"))


def _every_name(trace: Trace) -> dict[int, str]:
    handles, kinds, data = event_column(trace, "handle_id"), event_column(trace, "kind"), event_data(trace)
    names = {}
    for i, kind in enumerate(kinds):
        if kind == "handle_created" and handles[i] is not None and data(i, "function"):
            names[handles[i]] = str(data(i, "function"))
    return names


def _check(cursor, trace: Trace) -> None:
    names = _every_name(trace)
    assert names, "the trace names no function: the test would check nothing"
    for h in {*event_column(trace, "handle_id")}:
        assert cursor.handle_name(trace, h) == names.get(h), h


def test_the_name_is_the_last_handle_created_that_names_one(cursor, tmp_path: Path) -> None:
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    trace = run_scenario(build_builtin("mlp"), "split-reentrant", memory=False, graphs=False)
    _check(cursor, trace)
    trace.save(tmp_path / "t.json")
    _check(cursor, Trace.load(tmp_path / "t.json"))

    events = [Event(seq=0, t_ns=0, kind="handle_created", handle_id=3, data={"function": "a.first"}),
              Event(seq=1, t_ns=1, kind="replay_started", handle_id=3),
              Event(seq=2, t_ns=2, kind="handle_created", handle_id=3, data={"function": "a.second"}),
              Event(seq=3, t_ns=3, kind="handle_created", handle_id=3, data={}),
              Event(seq=4, t_ns=4, kind="handle_created", handle_id=4, data={})]
    made = Trace(events=events)
    _check(cursor, made)
    assert cursor.handle_name(made, 3) == "a.second" and cursor.handle_name(made, 4) is None
    assert cursor.handle_name(made, None) is None and cursor.handle_name(made, 99) is None
