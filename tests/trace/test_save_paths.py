"""Each way a trace comes to be saved round-trips: a recording (whole, read midway, edited), a loaded trace
(untouched: its packed columns written again; edited: the edit is saved), and a merge's output.

See NOTE [ Saving fast ] in ckpt_viz/trace/document.py. No torch: events go through the real bus.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from test_packed import runs_trace
from test_trace import make_trace

from ckpt_viz import TraceError, bus
from ckpt_viz.cli.merge import merge_traces
from ckpt_viz.events import Event
from ckpt_viz.trace import Trace
from ckpt_viz.trace import document as trace_document
from ckpt_viz.trace import io as trace_io
from ckpt_viz.trace import packed as trace_packed
from ckpt_viz.trace.rows import RecordedEvents


def recorded(trace: Trace, *, until: int | None = None, events: RecordedEvents | None = None) -> RecordedEvents:
    """`trace`'s events emitted through the bus into a recording's channel, one tag() block per tags object."""
    events = RecordedEvents() if events is None else events
    channel = bus.open_channel(rows=events.keep)
    try:
        for e in trace.events[:until]:
            with bus.tag(**e.tags):
                bus.emit(e.kind, handle_id=e.handle_id, mode=e.mode, phase=e.phase, session_id=e.session_id,
                         site=e.site, data=dict(e.data))
    finally:
        channel.close()
    return events


def _round_trip(tmp_path: Path, trace: Trace, name: str = "t.json.gz") -> Trace:
    trace.save(tmp_path / name)
    return Trace.load(tmp_path / name)


@pytest.mark.parametrize("make", [runs_trace, make_trace], ids=["runs", "varied"])
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_recording_round_trips_without_building_events(tmp_path: Path, make: Any, suffix: str) -> None:
    events = recorded(make())
    trace = Trace(events=events, memory=make().memory, meta=make().meta)
    loaded = _round_trip(tmp_path, trace, "t" + suffix)
    assert events.pending == len(events)  # saved from the kept values
    assert loaded == trace and list(loaded.memory) == list(trace.memory)


def test_a_recording_read_midway_and_edited_saves_what_it_holds(tmp_path: Path) -> None:
    source = make_trace(120)
    events = recorded(source, until=50)
    assert events[10].kind == source.events[10].kind  # a read midway builds the first 50 Events
    events[3] = dataclasses.replace(events[3], data={"edited": 1}, tags={"stage": 9})
    recorded(Trace(events=source.events[50:]), events=events)  # the recording goes on
    assert events.pending == 70
    trace = Trace(events=events)
    loaded = _round_trip(tmp_path, trace)
    assert loaded == trace and loaded.events[3].data == {"edited": 1} and loaded.events[3].tags == {"stage": 9}
    assert [e.seq for e in loaded.events] == list(range(120))


def test_an_untouched_loaded_trace_writes_its_packed_columns_again(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    trace = runs_trace(40)
    loaded = _round_trip(tmp_path, trace, "t.json")
    monkeypatch.setattr(trace_document, "pack_runs", _never)  # nothing is packed again
    monkeypatch.setattr(trace_document, "pack_data", _never)
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "t.json").read_bytes()
    assert Trace.load(tmp_path / "again.json") == trace


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("packed again")


@pytest.mark.parametrize("edit", ["set", "append", "delete", "memory"])
def test_an_edited_loaded_trace_saves_the_edit(tmp_path: Path, edit: str) -> None:
    loaded = _round_trip(tmp_path, runs_trace(40))
    if edit == "set":
        loaded.events[17] = dataclasses.replace(loaded.events[17], handle_id=999, session_id="new", tags={"x": 1})
    elif edit == "append":
        loaded.events.append(dataclasses.replace(loaded.events[-1], seq=len(loaded.events), data={"n": 2}))
    elif edit == "delete":
        del loaded.events[5]
    else:
        loaded = Trace(events=loaded.events, memory=make_trace().memory, meta=loaded.meta)
    again = _round_trip(tmp_path, loaded, "again.json.gz")
    assert again == loaded and list(again.memory) == list(loaded.memory)
    if edit == "set":
        assert again.events[17].handle_id == 999 and again.events[17].tags == {"x": 1}


def test_a_merged_trace_round_trips(tmp_path: Path) -> None:
    ranks = {}
    for rank in (0, 1):
        source = runs_trace(8 + rank)
        header = {"rank": rank, "run_id": "r", "world_size": 2, "clock": {"offset_to_rank0_ns": 3}}
        ranks[rank] = Trace(events=source.events, meta={**source.meta, "distributed": header})
    merged = merge_traces(ranks, "the test")
    assert len({id(e.tags) for e in merged.events}) == len(merged.events)  # a tags dict per event
    assert _round_trip(tmp_path, merged) == merged


def test_tags_equal_but_not_shared_share_a_run(tmp_path: Path) -> None:
    trace = runs_trace(20)
    copies = Trace(events=[dataclasses.replace(e, tags=dict(e.tags)) for e in trace.events])
    copies.save(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["events"]["columns"]["tags"]["runs"] == [8] * 20 and len(doc["events"]["tables"]["tags"]) == 20
    assert Trace.load(tmp_path / "t.json").events == trace.events


@pytest.mark.parametrize("values", [[3] * 40 + [3.0] * 40, [1] * 40 + [True] * 40, ["a"] * 40 + [None] * 40])
def test_runs_look_at_every_type_where_a_run_holds_a_number(values: list[Any]) -> None:
    packed = trace_packed.pack_runs(values)
    if type(packed) is dict:
        assert [type(v) for v in trace_packed.unpack_runs(packed)] == [type(v) for v in values]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_the_pieces_make_the_bytes_of_the_whole_document(tmp_path: Path, suffix: str) -> None:
    trace = make_trace(300)
    trace.save(tmp_path / ("t" + suffix))
    raw = (tmp_path / ("t" + suffix)).read_bytes()
    if suffix.endswith(".gz"):
        raw = gzip.decompress(raw)
    assert raw == trace_io._encode(trace_document.to_document(trace))


def test_a_failed_save_stops_its_gzip_thread(tmp_path: Path) -> None:
    import threading

    bad = Trace(events=make_trace().events, meta={"model": object()})
    before = threading.active_count()
    with pytest.raises(Exception, match="cannot save"):
        bad.save(tmp_path / "t.json.gz")
    assert threading.active_count() == before and not (tmp_path / "t.json.gz").exists()


@pytest.mark.parametrize("first, second", [({"stage": 1}, {"stage": True}), ({"x": 0.0}, {"x": -0.0}),
                                           ({"a": 1, "b": 2}, {"b": 2, "a": 1}), ({"t": (1,)}, {"t": (True,)})])
def test_tags_json_tells_apart_stay_apart(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> None:
    for runs in (True, False):  # as runs (a block each), and one fresh dict per event (a merged trace)
        events = [Event(seq=i, t_ns=i, kind="error", tags=dict(first if (i // 40 if runs else i % 2) else second))
                  for i in range(80)]
        trace_io.save(Trace(events=events), tmp_path / "t.json")
        loaded = Trace.load(tmp_path / "t.json")
        assert [json.dumps(e.tags) for e in loaded.events] == [json.dumps(e.tags) for e in events]


@pytest.mark.parametrize("bad", [5, None, [1, 2], "ab"])
def test_data_that_is_not_an_object_is_refused_on_save(tmp_path: Path, bad: Any) -> None:
    events = [Event(seq=i, t_ns=i, kind="error", data={"where": "x"}) for i in range(100)]
    events[70] = dataclasses.replace(events[70], data=bad)
    with pytest.raises(TraceError, match=r"events\[70\]\.data is .*expected an object"):
        Trace(events=events).save(tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()
