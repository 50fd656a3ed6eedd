"""Each way a trace comes to be saved round-trips: a recording (whole, read midway, edited; with memory samples), a
loaded trace (untouched: the same bytes again; edited: the edit is saved), and a merged distributed trace's shape
(ranks in tags and samples). Values JSON tells apart stay apart. No torch except where memory is recorded.
"""
from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_trace import make_trace

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.events import Error, EventBase, Released
from ckpt_viz.trace import MemorySample, Trace


def _same(a: Trace, b: Trace) -> bool:
    return (a.events, a.memory, a.graphs, a.meta) == (b.events, b.memory, b.graphs, b.meta)


def _round_trip(tmp_path: Path, trace: Trace, name: str = "t.json.gz") -> Trace:
    trace.save(tmp_path / name)
    return Trace.load(tmp_path / name)


def _emit_all(source: Trace) -> None:
    """`source`'s events emitted again through the bus, each in a tag() block of its tags."""
    common = set(EventBase.__struct_fields__)
    for e in source.events:
        fields = {n: getattr(e, n) for n in e.__struct_fields__ if n not in common}
        with bus.tag(**e.tags):
            bus.emit(type(e), handle_id=e.handle_id, mode=e.mode, phase=e.phase, session_id=e.session_id,
                     site=e.site, capture_site=False, **fields)


def _without_clock(events: list[Any]) -> list[Any]:
    return [msgspec.structs.replace(e, t_ns=0, thread_id=0) for e in events]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_recording_round_trips(tmp_path: Path, suffix: str) -> None:
    source = make_trace(120)
    with ckpt_viz.record() as rec:
        _emit_all(source)
    assert _without_clock(rec.trace.events) == _without_clock(source.events)
    loaded = _round_trip(tmp_path, rec.trace, "t" + suffix)
    assert _same(loaded, rec.trace)


def test_a_recording_read_midway_and_edited_saves_what_it_holds(tmp_path: Path) -> None:
    source = make_trace(120)
    with ckpt_viz.record() as rec:
        _emit_all(Trace(events=source.events[:50]))
        midway = _round_trip(tmp_path, rec.trace, "midway.json")  # saved while the block is still open
        rec.trace.events[3] = msgspec.structs.replace(rec.trace.events[3], tags={"stage": 9}, site="edited.py:1")
        _emit_all(Trace(events=source.events[50:]))  # the recording goes on
    assert len(midway.events) == 50
    assert midway.events == [*rec.trace.events[:3], midway.events[3], *rec.trace.events[4:50]]
    loaded = _round_trip(tmp_path, rec.trace)
    assert _same(loaded, rec.trace) and loaded.events[3].tags == {"stage": 9} and loaded.events[3].site == "edited.py:1"
    assert [e.seq for e in loaded.events] == list(range(120))


def test_a_recording_with_memory_saves_its_samples(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from ckpt_viz.runtime import checkpoint

    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4, requires_grad=True)
    with ckpt_viz.record(memory=True, tensors=(w, x)) as rec:
        out = checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=True)
        out.sum().backward()
    assert rec.trace.memory and all(isinstance(s, MemorySample) for s in rec.trace.memory)
    loaded = _round_trip(tmp_path, rec.trace)
    assert _same(loaded, rec.trace)


def test_an_untouched_loaded_trace_writes_the_same_bytes_again(tmp_path: Path) -> None:
    trace = make_trace(40)
    loaded = _round_trip(tmp_path, trace, "t.json")
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "t.json").read_bytes()
    loaded.save(tmp_path / "again.json.gz")
    assert gzip.decompress((tmp_path / "again.json.gz").read_bytes()) == (tmp_path / "t.json").read_bytes()


@pytest.mark.parametrize("edit", ["set", "append", "delete", "memory"])
def test_an_edited_loaded_trace_saves_the_edit(tmp_path: Path, edit: str) -> None:
    loaded = _round_trip(tmp_path, make_trace(40))
    if edit == "set":
        loaded.events[17] = msgspec.structs.replace(loaded.events[17], handle_id=999, session_id="new", tags={"x": 1})
    elif edit == "append":
        loaded.events.append(Released(seq=40, t_ns=5, handle_id=1, reason="explicit_release"))
    elif edit == "delete":
        del loaded.events[5]
    else:
        loaded = Trace(events=loaded.events, memory=make_trace(8).memory, meta=loaded.meta)
    again = _round_trip(tmp_path, loaded, "again.json.gz")
    assert _same(again, loaded)
    if edit == "set":
        assert again.events[17].handle_id == 999 and again.events[17].tags == {"x": 1}


def test_a_merged_traces_shape_round_trips(tmp_path: Path) -> None:
    # What `ckpt-viz merge` writes: each rank's events with a `rank` tag and a tags object per event, each rank's
    # samples with their rank, and the header of the run.
    events, memory = [], []
    for seq in range(40):
        rank = seq % 2
        events.append(Error(seq=seq, t_ns=seq * 10 + rank, where="w", type="T",
                            tags={"rank": rank, "stage": rank, "microbatch": seq // 8}))
        memory.append(MemorySample(seq=seq, t_ns=seq * 10, bytes_by_category={"activations": seq}, rank=rank))
    meta = {"distributed": {"run_id": "r-1", "world_size": 2, "ranks": [0, 1], "missing_ranks": []}}
    merged = Trace(events=events, memory=memory, meta=meta)
    assert _same(_round_trip(tmp_path, merged), merged)


@pytest.mark.parametrize("first, second", [({"stage": 1}, {"stage": True}), ({"x": 0.0}, {"x": -0.0}),
                                           ({"a": 1, "b": 2}, {"b": 2, "a": 1}), ({"x": 1}, {"x": 1.0}),
                                           ({"s": "1"}, {"s": 1}), ({"n": None}, {})])
def test_values_json_tells_apart_stay_apart(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> None:
    for blocks in (True, False):  # a block of events each, and alternating
        events = [Error(seq=i, t_ns=i, where="w", type="T",
                        tags=dict(first if (i // 40 if blocks else i % 2) else second)) for i in range(80)]
        loaded = _round_trip(tmp_path, Trace(events=events), "t.json")
        assert [json.dumps(e.tags) for e in loaded.events] == [json.dumps(e.tags) for e in events]
        for e in events[:2]:
            e2 = loaded.events[e.seq]
            assert [type(v) for v in e2.tags.values()] == [type(v) for v in e.tags.values()]


def test_a_failed_save_leaves_no_file_and_no_thread(tmp_path: Path) -> None:
    bad = Trace(events=make_trace().events, meta={"model": object()})
    before = threading.active_count()
    with pytest.raises(ckpt_viz.TraceError, match="cannot be written as JSON"):
        bad.save(tmp_path / "t.json.gz")
    assert threading.active_count() == before and list(tmp_path.iterdir()) == []
