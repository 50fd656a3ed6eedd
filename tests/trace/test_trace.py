"""Trace files: round trips, atomic saves, and a clear TraceError for every kind of bad file.

No torch: traces are built by hand. Every file test runs with the stdlib json and,
when installed, with orjson (the optional speed-up must not change what is read or
written, nor any error message).
"""
from __future__ import annotations

import ast
import gzip
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from old_layout import as_schema1

from ckpt_viz import TraceError
from ckpt_viz.events import EVENT_KINDS, Event
from ckpt_viz.trace import EventColumns, GraphSnapshot, MemoryColumns, MemorySample, Trace, run_meta
from ckpt_viz.trace import io as trace_io

ROOT = Path(__file__).resolve().parent.parent.parent
BACKENDS = ["stdlib", "orjson"] if trace_io._orjson is not None else ["stdlib"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the stdlib json only, then (if installed) with orjson."""
    if request.param == "stdlib":
        monkeypatch.setattr(trace_io, "_orjson", None)
    return request.param


def make_trace(n_events: int = 40) -> Trace:
    """A hand-made trace touching every field: kinds, modes, phases, tags, sites, sessions, data."""
    kinds = ["handle_created", "forward_started", "tensor_packed", "phase_set", "replay_started",
             "grads_routed", "released", "error"]
    datas: list[dict[str, Any]] = [{}, {"reason": "dw_complete"}, {"targets": [0]}, {"old": "ordinary", "new": "dx"},
                                   {"trigger": "prefire", "nested": {"shape": [2, 3], "ok": True, "x": 1.5}}]
    tag_sets = [{}, {"stage": 0, "microbatch": 1}, {"stage": 1, "microbatch": 1}]
    events = [
        Event(seq=i, t_ns=1_000_000 + 37 * i, kind=kinds[i % len(kinds)], handle_id=None if i % 5 == 0 else i % 7,
              mode=(None, "reentrant", "nonreentrant", "exclude")[i % 4], phase=(None, "ordinary", "dx", "dw")[i % 3],
              session_id=(None, "mb1", 3, 2.5, True)[i % 5], tags=tag_sets[i % 3],
              site=None if i % 6 == 0 else f"train.py:{10 + i % 4}", thread_id=1234 + i % 2, data=dict(datas[i % 5]))
        for i in range(n_events)
    ]
    memory = [MemorySample(seq=i, t_ns=1_000_000 + 37 * i, bytes_by_category={"parameters": 64, "activations": 8 * i},
                           device_allocated=None if i % 2 else 4096,
                           by_stage={"0": {"activations": i}} if i % 3 else {})
              for i in range(0, n_events, 4)]
    graphs = [GraphSnapshot(seq=5, label="after forward", nodes=[
        {"id": 0, "name": "SumBackward0", "kind": "backward", "handle_id": None, "dx_reached": True,
         "dw_reached": False, "shape": None},
        {"id": 1, "name": "CheckpointFunctionBackward", "kind": "checkpoint", "handle_id": 2, "dx_reached": True,
         "dw_reached": True, "shape": None, "split": True},
        {"id": 2, "name": "weight", "kind": "leaf", "handle_id": None, "dx_reached": False, "dw_reached": True,
         "shape": [4, 5]},
    ], edges=[[0, 1], [1, 2]])]
    meta = {"model": "mlp2", "mode": "reentrant", "schedule": None, "versions": {"python": "3.11"},
            "schema_version": 1}
    return Trace(events=events, memory=memory, graphs=graphs, meta=meta)


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_round_trip_keeps_every_field(tmp_path: Path, backend: str, suffix: str) -> None:
    trace = make_trace()
    path = tmp_path / f"trace{suffix}"
    trace.save(path)
    loaded = Trace.load(path)

    assert loaded == trace
    assert list(loaded.events) == trace.events
    assert [e.to_dict() for e in loaded.events] == [e.to_dict() for e in trace.events]
    assert list(loaded.memory) == trace.memory
    assert loaded.graphs == trace.graphs
    assert loaded.meta == trace.meta
    # Loaded traces keep events and memory as columns (see NOTE [ Rows stored as columns ]).
    assert isinstance(loaded.events, EventColumns) and isinstance(loaded.memory, MemoryColumns)


def test_gzip_file_is_gzip_and_plain_file_is_json(tmp_path: Path, backend: str) -> None:
    trace = make_trace()
    trace.save(tmp_path / "t.json.gz")
    trace.save(tmp_path / "t.json")

    raw_gz = (tmp_path / "t.json.gz").read_bytes()
    assert raw_gz[:2] == b"\x1f\x8b"
    with gzip.open(tmp_path / "t.json.gz", "rt", encoding="utf-8") as f:
        from_gz = json.load(f)
    with open(tmp_path / "t.json", encoding="utf-8") as f:
        from_plain = json.load(f)
    assert from_gz == from_plain
    assert list(from_plain)[:2] == ["format", "schema_version"]  # first, so `head` identifies a file
    assert from_plain["format"] == "ckpt_viz.trace" and from_plain["schema_version"] == 2


def test_files_are_identical_with_and_without_orjson(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if trace_io._orjson is None:
        pytest.skip("orjson is not installed")
    trace = make_trace()
    trace.save(tmp_path / "fast.json")
    monkeypatch.setattr(trace_io, "_orjson", None)
    trace.save(tmp_path / "plain.json")
    assert json.loads((tmp_path / "fast.json").read_bytes()) == json.loads((tmp_path / "plain.json").read_bytes())
    assert Trace.load(tmp_path / "fast.json") == Trace.load(tmp_path / "plain.json") == trace


def test_twenty_thousand_events_round_trip(tmp_path: Path, backend: str) -> None:
    trace = make_trace(20_000)
    trace.save(tmp_path / "big.json.gz")
    loaded = Trace.load(tmp_path / "big.json.gz")
    assert len(loaded.events) == 20_000 and len(loaded.memory) == 5_000
    assert loaded == trace


def test_empty_trace_round_trips(tmp_path: Path, backend: str) -> None:
    Trace().save(tmp_path / "empty.json")
    loaded = Trace.load(tmp_path / "empty.json")
    assert loaded == Trace()
    assert len(loaded) == 0 and loaded.kinds() == [] and loaded.handle_ids() == []


def test_irregular_seq_and_decreasing_t_ns_round_trip(tmp_path: Path, backend: str) -> None:
    events = [Event(seq=s, t_ns=t, kind="released", data={"reason": "explicit_release"})
              for s, t in [(3, 900), (7, 100), (8, 5), (20, 10**15)]]
    trace = Trace(events=events)
    trace.save(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["events"]["columns"]["seq"] == [3, 7, 8, 20]
    assert doc["events"]["columns"]["t_ns_delta"] == [900, -800, -95, 10**15 - 5]
    assert Trace.load(tmp_path / "t.json") == trace


def test_consecutive_seq_is_stored_as_a_start(tmp_path: Path) -> None:
    make_trace(12).save(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["events"]["columns"]["seq"] == {"start": 0}
    assert doc["events"]["count"] == 12


def test_json_has_no_tuples_nan_or_int_keys(tmp_path: Path, backend: str) -> None:
    # NOTE [ Trace file format, schema 2 ], rule 4: what JSON cannot hold comes back changed, never lost silently
    # into an unreadable file.
    trace = Trace(events=[Event(seq=0, t_ns=1, kind="grads_routed",
                                data={"shape": (2, 3), "norm": float("nan"), "inf": float("inf")})])
    trace.save(tmp_path / "t.json")
    text = (tmp_path / "t.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    event = Trace.load(tmp_path / "t.json").events[0]
    assert event.data == {"shape": [2, 3], "norm": None, "inf": None}


def test_to_dict_from_dict_without_files() -> None:
    trace = make_trace()
    doc = json.loads(json.dumps(trace.to_dict()))
    assert Trace.from_dict(doc) == trace
    with pytest.raises(TraceError, match=r"^ckpt_viz\.Trace\.from_dict: .*field 'meta' is missing"):
        Trace.from_dict({k: v for k, v in doc.items() if k != "meta"})
    with pytest.raises(TraceError, match=r"^ckpt_viz\.Trace\.to_dict: .*memory\[0\] is 'x' \(a string\)"):
        Trace(memory=["x"]).to_dict()  # type: ignore[list-item]


def test_saving_a_loaded_trace_gives_the_same_document(tmp_path: Path, backend: str) -> None:
    make_trace().save(tmp_path / "a.json")
    Trace.load(tmp_path / "a.json").save(tmp_path / "b.json")
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())


# ---------------------------------------------------------------- loaded traces behave like lists

def test_queries_on_loaded_trace_match_the_original(tmp_path: Path) -> None:
    trace = make_trace(60)
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")

    assert loaded.kinds() == trace.kinds()
    assert loaded.handle_ids() == trace.handle_ids() == [1, 2, 3, 4, 6, 0, 5]
    for kind in ("released", "error", "tensor_packed", "memory_sampled"):
        assert loaded.count(kind) == trace.count(kind)
    assert trace.count("released") == 7  # i % 8 == 6 for i < 60
    assert loaded.of_kind("released", "error") == trace.of_kind("released", "error")
    assert loaded.for_handle(3) == trace.for_handle(3)
    assert loaded.events[-1] == trace.events[-1] and loaded.events[5] == trace.events[5]
    assert loaded.events[10:13] == trace.events[10:13]
    assert loaded.memory[-1] == trace.memory[-1] and loaded.memory[1:3] == trace.memory[1:3]
    with pytest.raises(IndexError):
        loaded.events[60]


def test_loaded_events_turn_into_a_list_on_first_write(tmp_path: Path) -> None:
    trace = make_trace(10)
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    extra = Event(seq=10, t_ns=5, kind="error", data={"where": "record"})

    loaded.extend([extra])
    loaded.events.append(extra)
    assert loaded.events.materialized
    assert list(loaded.events) == [*trace.events, extra, extra]
    assert loaded.count("error") == trace.count("error") + 2
    del loaded.events[0]
    assert loaded.events[0] == trace.events[1]


# ---------------------------------------------------------------- atomic save

def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_failed_serialization_keeps_previous_file(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "trace.json"
    make_trace().save(path)
    before = path.read_bytes()
    bad = make_trace()
    bad.events[3] = Event(seq=3, t_ns=1, kind="error", data={"dtype": object()})

    with pytest.raises(TraceError) as info:
        bad.save(path)
    message = str(info.value)
    assert message.startswith(f"ckpt_viz.Trace.save: cannot save to '{path}': events[3].data.dtype")
    assert "cannot be written as JSON" in message and "\nTip: " in message
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failed_write_keeps_previous_file_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            failing: str) -> None:
    path = tmp_path / "trace.json.gz"
    make_trace().save(path)
    before = path.read_bytes()

    def boom(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(trace_io.os, failing, boom)
        with pytest.raises(OSError, match="No space left"):
            make_trace(80).save(path)
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []
    assert Trace.load(path) == make_trace()


def test_failed_first_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(trace_io.os, "fsync", boom)
    with pytest.raises(OSError, match="Input/output error"):
        make_trace().save(tmp_path / "new.json")
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_unknown_kind_and_writes_nothing(tmp_path: Path, backend: str) -> None:
    trace = Trace(events=[Event(seq=0, t_ns=1, kind="tensor_teleported")])
    with pytest.raises(TraceError, match=r"events\[0\]\.kind is 'tensor_teleported' \(a string\), an unknown event "
                                         r"kind(.|\n)*\nTip: a hand-built trace or a runtime hook put a wrong value"):
        trace.save(tmp_path / "t.json")
    with pytest.raises(TraceError, match=r"events\[1\]\.site is a list, expected a string or null"):
        Trace(events=[Event(seq=0, t_ns=1, kind="error"), Event(seq=1, t_ns=2, kind="error", site=["x"])]).save(
            tmp_path / "t.json")  # type: ignore[arg-type]
    with pytest.raises(TraceError, match=r"events\[0\]\.t_ns is 1\.5 \(a number\), expected an integer"):
        Trace(events=[Event(seq=0, t_ns=1.5, kind="error")]).save(tmp_path / "t.json")  # type: ignore[arg-type]
    with pytest.raises(TraceError, match=r"events\[1\] is an object, not a ckpt_viz\.events\.Event"):
        not_an_event: Any = {"seq": 1}
        Trace(events=[Event(seq=0, t_ns=1, kind="error"), not_an_event]).save(tmp_path / "t.json")
    with pytest.raises(TraceError, match=r"memory\.bytes_by_category has an unknown category 'weights'"):
        Trace(memory=[MemorySample(seq=0, t_ns=0, bytes_by_category={"weights": 1})]).save(tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []


def test_save_keeps_an_existing_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    make_trace().save(path)
    os.chmod(path, 0o640)
    make_trace(8).save(path)
    assert (path.stat().st_mode & 0o777) == 0o640


# ---------------------------------------------------------------- bad files

def _good_doc(tmp_path: Path) -> dict[str, Any]:
    make_trace().save(tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text())


def _expect_load_error(path: Path, *phrases: str) -> str:
    with pytest.raises(TraceError) as info:
        Trace.load(path)
    message = str(info.value)
    assert message.startswith(f"ckpt_viz.Trace.load: cannot read '{path}': "), message
    assert "\nTip: " in message and message.endswith("."), message
    for phrase in phrases:
        assert phrase in message, message
    return message


def test_missing_file(tmp_path: Path, backend: str) -> None:
    _expect_load_error(tmp_path / "nope.json", "no such file")


def test_folder_instead_of_file(tmp_path: Path) -> None:
    _expect_load_error(tmp_path, "it is a folder")


@pytest.mark.parametrize("content", [b"", b"  \n\t "])
def test_empty_file(tmp_path: Path, backend: str, content: bytes) -> None:
    (tmp_path / "t.json").write_bytes(content)
    _expect_load_error(tmp_path / "t.json", "the file is empty")


def test_empty_gzip(tmp_path: Path) -> None:
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(b""))
    _expect_load_error(tmp_path / "t.json.gz", "the file is empty")


@pytest.mark.parametrize("content", [b"hello, world", b'{"format": "ckpt_viz.trace", "schema_version": 1,,}',
                                     b"\xff\xfe\x00garbage", b'{"format": NaN}'])
def test_not_json(tmp_path: Path, backend: str, content: bytes) -> None:
    (tmp_path / "t.json").write_bytes(content)
    _expect_load_error(tmp_path / "t.json", "it is not valid JSON")


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99, 0.999])
def test_truncated_json(tmp_path: Path, backend: str, cut: float) -> None:
    make_trace().save(tmp_path / "t.json")
    raw = (tmp_path / "t.json").read_bytes()
    (tmp_path / "t.json").write_bytes(raw[:int(len(raw) * cut)])
    _expect_load_error(tmp_path / "t.json", "the JSON is truncated", "cut short")


def test_truncated_gzip(tmp_path: Path, backend: str) -> None:
    make_trace(400).save(tmp_path / "t.json.gz")
    raw = (tmp_path / "t.json.gz").read_bytes()
    (tmp_path / "t.json.gz").write_bytes(raw[:len(raw) // 2])
    _expect_load_error(tmp_path / "t.json.gz", "the gzip data is truncated")


def test_corrupt_gzip(tmp_path: Path, backend: str) -> None:
    make_trace(400).save(tmp_path / "t.json.gz")
    raw = bytearray((tmp_path / "t.json.gz").read_bytes())
    raw[-8] ^= 0xFF  # the CRC-32 of the trailer no longer matches the data
    (tmp_path / "t.json.gz").write_bytes(bytes(raw))
    _expect_load_error(tmp_path / "t.json.gz", "not a valid gzip file, or it is corrupt")


def test_pickle_is_refused_not_unpickled(tmp_path: Path, backend: str) -> None:
    (tmp_path / "t.pkl").write_bytes(pickle.dumps(make_trace()))
    _expect_load_error(tmp_path / "t.pkl", "looks like a Python pickle", "never unpickles")


@pytest.mark.parametrize("doc, phrase", [
    ({"events": []}, 'it has no "format" field'),
    ({"format": "chrome.trace", "schema_version": 1}, "it has \"format\": 'chrome.trace' (a string)"),
    ([1, 2, 3], "the top level is a list"),
    ("ckpt_viz.trace", "the top level is 'ckpt_viz.trace' (a string)"),
])
def test_wrong_format_marker(tmp_path: Path, backend: str, doc: Any, phrase: str) -> None:
    (tmp_path / "t.json").write_text(json.dumps(doc))
    message = _expect_load_error(tmp_path / "t.json", "it is not a ckpt_viz trace", phrase)
    assert "Tip: open a file written by ckpt_viz.Trace.save" in message or "the top level" in message


def test_newer_schema_version(tmp_path: Path, backend: str) -> None:
    doc = _good_doc(tmp_path)
    doc["schema_version"] = 3
    doc["events"] = "a layout this version does not know"
    (tmp_path / "t.json").write_text(json.dumps(doc))
    message = _expect_load_error(tmp_path / "t.json", "written by a newer ckpt_viz",
                                 "schema_version 3; this ckpt_viz reads up to 2")
    assert "Tip: upgrade ckpt_viz" in message


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set doc[a][b][c] for path "a.b.c" (an int part indexes a list)."""
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return apply


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]
    return apply


def _first_context_of(kind_index: int) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        row = doc["events"]["columns"]["context"][4]
        doc["events"]["tables"]["context"][row][kind_index] = "tensor_teleported" if kind_index == 0 else "sideways"
    return apply


BAD_DOCS = [
    (_delete("schema_version"), "field 'schema_version' is missing"),
    (_set("schema_version", "1"), "field 'schema_version' is '1' (a string), expected an integer"),
    (_set("schema_version", 0), "field 'schema_version' is 0, expected 1 to 2"),
    (_delete("meta"), "field 'meta' is missing"),
    (_set("meta", [1]), "field 'meta' is a list, expected an object"),
    (_delete("events"), "field 'events' is missing"),
    (_delete("events.columns.handle_id"), "field 'events.columns.handle_id' is missing"),
    (_delete("events.tables.tags"), "field 'events.tables.tags' is missing"),
    (_set("events.count", 41), "field 'events.columns.t_ns_delta' has 40 values but events.count is 41"),
    (_set("events.count", True), "field 'events.count' is True (a boolean), expected an integer"),
    (_set("events.columns.handle_id.3", "h3"), "events[3].handle_id is 'h3' (a string), expected an integer or null"),
    (_set("events.columns.t_ns_delta.2", 1.5), "events[2].t_ns (stored as t_ns_delta) is 1.5 (a number)"),
    (_set("events.columns.session_id.6", {"id": 1}), "events[6].session_id is an object"),
    (_set("events.columns.context.5", 99), "events[5].context is 99, but events.tables.context has"),
    (_set("events.columns.tags.7", -1), "events[7].tags is -1, but events.tables.tags has 3 entries"),
    (_set("events.columns.seq", {"begin": 0}), "field 'events.columns.seq.start' is missing"),
    (_set("events.context_fields", ["kind"]), "field 'events.context_fields' is ['kind']"),
    (_first_context_of(0), "events[4].kind is 'tensor_teleported' (a string), an unknown event kind (known: "
                           + ", ".join(EVENT_KINDS)),
    (_first_context_of(1), "events[4].mode is 'sideways' (a string), an unknown mode"),
    (_set("events.tables.context.0", ["error", None]), "events.tables.context[0] is a list, expected a list of 5"),
    (_set("memory.bytes_by_category.weights", [0] * 10), "memory.bytes_by_category has an unknown category 'weights'"),
    (_set("memory.bytes_by_category.activations.2", -8), "memory[2].bytes_by_category.activations is -8, expected 0"),
    (_set("memory.columns.device_allocated.1", "4k"), "memory[1].device_allocated is '4k' (a string)"),
    (_set("memory.columns.by_stage.1", {"0": {"activations": "x"}}), "memory[1].by_stage['0'] has 'activations'"),
    (_delete("memory.columns.by_stage"), "field 'memory.columns.by_stage' is missing"),
    (_set("graphs.0.nodes.1.kind", "tensor"), "graphs[0].nodes[1].kind is 'tensor' (a string), an unknown node kind"),
    (_delete("graphs.0.nodes.2.dw_reached"), "field 'graphs[0].nodes[2].dw_reached' is missing"),
    (_set("graphs.0.nodes.0.dx_reached", 1), "graphs[0].nodes[0].dx_reached is 1 (an integer), expected true or"),
    (_set("graphs.0.edges.1", [1, 9]), "graphs[0].edges[1] refers to node 9, which is not in graphs[0].nodes"),
]


# Only in schema 1, where data is one object per event (schema 2 packs it: see BAD_PACKED_DOCS).
BAD_SCHEMA1_DOCS = [
    (_set("events.columns.data.4", [1]), "events[4].data is a list, expected an object"),
    (_set("events.columns.data.4", {"nbytes": -1}), "events[4].data.nbytes is -1 (an integer), expected 0 to 2**63-1"),
    (_set("events.columns.handle_id", {"values": [1], "runs": [40]}), "field 'events.columns.handle_id' is an "
                                                                      "object, expected a list"),
]


@pytest.mark.parametrize("schema", [1, 2])
@pytest.mark.parametrize("mutate, phrase", BAD_DOCS + BAD_SCHEMA1_DOCS,
                         ids=[phrase[:40] for _, phrase in BAD_DOCS + BAD_SCHEMA1_DOCS])
def test_missing_or_ill_typed_field(tmp_path: Path, backend: str, mutate: Callable[[dict[str, Any]], None],
                                    phrase: str, schema: int) -> None:
    # The same checks guard files of the old layout (schema 1, read by the old reader) and of the new one.
    if schema == 2 and (mutate, phrase) in BAD_SCHEMA1_DOCS:
        pytest.skip("a schema 1 layout")
    doc = _good_doc(tmp_path)
    if schema == 1:
        doc = as_schema1(doc)
    mutate(doc)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _expect_load_error(tmp_path / "t.json", phrase)


def test_bad_field_in_gzip_file_is_reported_the_same(tmp_path: Path, backend: str) -> None:
    doc = _good_doc(tmp_path)
    doc["events"]["columns"]["handle_id"][3] = "h3"
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    _expect_load_error(tmp_path / "t.json.gz", "events[3].handle_id is 'h3'")


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (keys and list indexes), parents before children."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:3]):  # the first few rows of each column are enough
            found += _paths(value, (*prefix, i))
    return found


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats(allow_nan=False)
                           | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                      max_size=3), max_leaves=5)


def edit_and_load(doc: dict, path: tuple, data: st.DataObject, tmp_path: Path) -> Trace | None:
    """Delete the node at `path` or replace it with any JSON value, save, load: the trace, or None after a
    TraceError in the form every load error has."""
    node: Any = doc
    for part in path[:-1]:
        node = node[part]
    if data.draw(st.booleans()) and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(JSON_VALUES)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    try:
        return Trace.load(tmp_path / "t.json")
    except TraceError as err:
        assert str(err).startswith("ckpt_viz.Trace.load: cannot read ") and "\nTip: " in str(err)
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_edit_loads_or_raises_trace_error(tmp_path: Path, data: st.DataObject) -> None:
    # Whatever one edit does to a valid file, load either raises TraceError or gives a trace whose
    # events and memory samples can all be read: validation leaves no hole for a crash later.
    doc = json.loads(json.dumps(make_trace(12).to_dict()))
    loaded = edit_and_load(doc, data.draw(st.sampled_from(_paths(doc)[1:])), data, tmp_path)
    if loaded is None:
        return
    assert len(list(loaded.events)) == doc["events"]["count"]
    assert len(list(loaded.memory)) == doc["memory"]["count"]
    loaded.kinds(), loaded.handle_ids(), loaded.count("error")


# ---------------------------------------------------------------- no pickle, no torch

def test_trace_modules_never_import_pickle_or_torch() -> None:
    for path in sorted((ROOT / "ckpt_viz" / "trace").glob("*.py")):
        name = path.name
        tree = ast.parse(path.read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"pickle", "marshal", "shelve", "dill", "torch"}, (name, imported)


def test_loading_a_trace_does_not_import_torch(tmp_path: Path) -> None:
    make_trace().save(tmp_path / "t.json.gz")
    code = ("import sys, ckpt_viz; from ckpt_viz.trace import Trace; "
            f"t = Trace.load({str(tmp_path / 't.json.gz')!r}); assert len(t.events) == 40; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_run_meta_names_versions_and_schema() -> None:
    meta = run_meta(model="mlp2", mode="reentrant", schedule="1F1B", microbatches=4)
    assert meta["model"] == "mlp2" and meta["mode"] == "reentrant" and meta["schedule"] == "1F1B"
    assert meta["schema_version"] == trace_io.SCHEMA_VERSION == 2
    assert meta["versions"]["python"] == sys.version.split()[0]
    assert meta["microbatches"] == 4
    json.dumps(meta)  # plain data


def test_memory_sample_total_and_defaults() -> None:
    sample = MemorySample(seq=3, t_ns=9, bytes_by_category={"parameters": 10, "activations": 32})
    assert sample.total_nbytes == 42
    assert sample.device_allocated is None and sample.by_stage == {}
