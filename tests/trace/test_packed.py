"""Schema 2's packed columns (runs, data by key): round trips, the old layout still read, clear errors.

See NOTE [ Packed columns ] in ckpt_viz/trace/packed.py. No torch: traces are built by hand.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from old_layout import as_schema1
from test_trace import _expect_load_error, _paths, edit_and_load, make_trace

from ckpt_viz.events import Event
from ckpt_viz.trace import Trace
from ckpt_viz.trace.packed import DataColumn

FILES = Path(__file__).parent / "files"

_LIFE = (("handle_created", None, {"split": True, "input_count": 2}), ("tensor_packed", None, {"nbytes": 4096}),
         ("phase_set", "dx", {"old": "ordinary", "new": "dx"}), ("replay_started", "dx", {"trigger": "backward"}),
         ("grads_routed", "dx", {"targets": [0]}), ("released", "dw", {"reason": "dw_complete"}),
         ("memory_sampled", None, {}), ("node_collected", None, {"released": True}))


def runs_trace(n_handles: int = 12) -> Trace:
    """Events as a recording makes them: a handle's events in a row, one tags object per block, data by kind."""
    events = []
    for h in range(n_handles):
        tags = {"stage": h % 2, "microbatch": h // 2}
        for kind, phase, data in _LIFE:
            seq = len(events)
            events.append(Event(seq=seq, t_ns=10_000 + 7 * seq, kind=kind, handle_id=h, mode="reentrant", phase=phase,
                                session_id=f"mb{h // 2}" if phase else None, tags=tags, site="train.py:9",
                                thread_id=77, data=dict(data)))
    return Trace(events=events, meta={"model": "hand-built"})


def _saved(tmp_path: Path, trace: Trace, name: str = "t.json") -> dict[str, Any]:
    trace.save(tmp_path / name)
    return json.loads((tmp_path / name).read_text())


# ---------------------------------------------------------------- the old layout

def test_a_schema_1_file_still_loads(tmp_path: Path) -> None:
    # tests/trace/files/schema1.json was written by the schema 1 writer (make_trace(40), before schema 2).
    old = json.loads((FILES / "schema1.json").read_text())
    assert old["schema_version"] == 1 and type(old["events"]["columns"]["data"]) is list
    loaded = Trace.load(FILES / "schema1.json")
    assert loaded == make_trace(40) and loaded.meta == make_trace(40).meta
    assert [e.to_dict() for e in loaded.events] == [e.to_dict() for e in make_trace(40).events]
    assert _saved(tmp_path, loaded) == _saved(tmp_path, make_trace(40), "fresh.json")  # saved again: schema 2


def test_the_old_layout_of_a_new_trace_reads_the_same(tmp_path: Path) -> None:
    doc = _saved(tmp_path, runs_trace())
    (tmp_path / "old.json").write_text(json.dumps(as_schema1(doc)))
    assert Trace.load(tmp_path / "old.json") == Trace.load(tmp_path / "t.json") == runs_trace()


# ---------------------------------------------------------------- round trips of each packing

def test_runs_and_data_by_context_round_trip(tmp_path: Path) -> None:
    trace = runs_trace()
    doc = _saved(tmp_path, trace)
    columns = doc["events"]["columns"]
    assert columns["handle_id"] == {"values": list(range(12)), "runs": [8] * 12}
    assert columns["tags"] == {"values": list(range(12)), "runs": [8] * 12}
    assert columns["data"]["shape"] == "context"  # the keys follow from the context: no column of shapes
    assert "nbytes" not in json.dumps(columns["data"]["values"])  # keys are stored once, not per event
    loaded = Trace.load(tmp_path / "t.json")
    assert loaded == trace and [e.data for e in loaded.events] == [e.data for e in trace.events]
    assert _saved(tmp_path, loaded, "again.json") == doc


def test_data_with_other_keys_in_one_context_gets_a_shape_column(tmp_path: Path) -> None:
    events = [Event(seq=i, t_ns=i, kind="error", data={"where": "x"} if i % 3 else {"where": "y", "extra": i})
              for i in range(100)]
    doc = _saved(tmp_path, Trace(events=events))
    data = doc["events"]["columns"]["data"]
    assert data["keys"] == [["where", "extra"], ["where"]] and len(data["shape"]) == 100
    assert Trace.load(tmp_path / "t.json") == Trace(events=events)


def test_same_keys_in_another_order_keep_their_order(tmp_path: Path) -> None:
    events = [Event(seq=i, t_ns=i, kind="error", data={"a": 1, "b": 2} if i % 2 else {"b": 3, "a": 4})
              for i in range(70)]
    Trace(events=events).save(tmp_path / "t.json")
    loaded = [e.data for e in Trace.load(tmp_path / "t.json").events]
    assert loaded == [e.data for e in events]
    assert [list(d) for d in loaded] == [list(e.data) for e in events]


def test_data_with_int_keys_is_kept_as_objects(tmp_path: Path) -> None:
    # NOTE [ Packed columns ], rule 5: JSON turns int keys into strings, as in schema 1.
    events = [Event(seq=i, t_ns=i, kind="error", data={1: "one"}) for i in range(70)]
    doc = _saved(tmp_path, Trace(events=events))
    assert type(doc["events"]["columns"]["data"]) is list
    assert [e.data for e in Trace.load(tmp_path / "t.json").events] == [{"1": "one"}] * 70


@pytest.mark.parametrize("values", [[1] * 40 + [True] * 40, [0.0] * 40 + [-0.0] * 40, [None, "a"] * 40])
def test_runs_never_merge_values_json_tells_apart(tmp_path: Path, values: list[Any]) -> None:
    events = [Event(seq=i, t_ns=i, kind="error", session_id=v) for i, v in enumerate(values)]
    Trace(events=events).save(tmp_path / "t.json")
    loaded = [e.session_id for e in Trace.load(tmp_path / "t.json").events]
    assert [(type(v), repr(v)) for v in loaded] == [(type(v), repr(v)) for v in values]


class _Events(Sequence):
    """A sequence of events that is not a list (like a recording's RecordedEvents)."""

    def __init__(self, events: list[Event]) -> None:
        self._events = events

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, i: Any) -> Any:
        return self._events[i]


@pytest.mark.parametrize("wrap", [tuple, _Events, iter], ids=["tuple", "Sequence", "iterator"])
def test_save_takes_any_sequence_of_events(tmp_path: Path, wrap: Any) -> None:
    trace = runs_trace()
    Trace(events=wrap(trace.events), meta=trace.meta).save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json") == trace


# ---------------------------------------------------------------- the lazy data column

def test_loaded_data_reads_like_a_list_of_fresh_dicts(tmp_path: Path) -> None:
    for trace in (runs_trace(), make_trace(200)):
        trace.save(tmp_path / "t.json")
        loaded = Trace.load(tmp_path / "t.json")
        column = loaded.events.columns["data"]
        expected = [e.data for e in trace.events]
        assert isinstance(column, DataColumn) and len(column) == len(expected)
        assert list(column) == expected and column == expected
        assert [column[i] for i in range(len(expected))] == expected and column[-1] == expected[-1]
        assert column[5:9] == expected[5:9]
        column[1]["mutated"] = True  # a read is a fresh dict: the trace does not change
        assert column[1] == expected[1] and loaded.events[1].data == expected[1]
        with pytest.raises(IndexError):
            column[len(expected)]


# ---------------------------------------------------------------- bad packed files

def _runs_doc(tmp_path: Path) -> dict[str, Any]:
    return _saved(tmp_path, runs_trace(), "good.json")


def _shape_doc(tmp_path: Path) -> dict[str, Any]:
    return _saved(tmp_path, make_trace(200), "good.json")  # data keys vary inside a context: a shape column


def _edit(path: str, value: Any) -> Any:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc["events"]["columns"]
        for part in parents:
            node = node[int(part)] if part.lstrip("-").isdigit() else node[part]
        node[int(last) if last.lstrip("-").isdigit() else last] = value
    return apply


BAD_PACKED = [
    (_runs_doc, _edit("handle_id.runs.3", 0), "events.columns.handle_id.runs[3] is 0, expected a run length"),
    (_runs_doc, _edit("handle_id.runs.3", 9), "field 'events.columns.handle_id' has runs adding up to 97"),
    (_runs_doc, _edit("handle_id.runs.3", True), "events.columns.handle_id.runs[3] is True (a boolean)"),
    (_runs_doc, _edit("handle_id.values", [0]), "field 'events.columns.handle_id' has values and runs that are not"),
    (_runs_doc, _edit("handle_id.values.2", "h2"), "events[16].handle_id is 'h2' (a string), expected an integer"),
    (_runs_doc, _edit("handle_id.values.2", -2), "events[16].handle_id is -2, expected an id"),
    (_runs_doc, _edit("tags.values.3", 99), "events[24].tags is 99, but events.tables.tags has 12 entries"),
    (_runs_doc, _edit("handle_id.start", 1), "field 'events.columns.handle_id' is an object, expected a list or"),
    (_runs_doc, _edit("data.values.1.0.3", 2**63), "events[25].data.nbytes is 9223372036854775808, expected 0"),
    (_runs_doc, _edit("data.values.1.0.3", "4k"), "events[25].data.nbytes is '4k' (a string), expected 0 to"),
    (_runs_doc, _edit("data.values.1.0", [4096]), "events.columns.data.values[1] has 1 values of 'nbytes', but 12"),
    (_runs_doc, _edit("data.keys.1", ["nbytes", "nbytes"]), "events.columns.data.keys[1] is a list, expected a list"),
    (_runs_doc, _edit("data.keys", [["split"]]), "field 'events.columns.data' has keys and values that are not"),
    (_runs_doc, _edit("data.extra", 1), "field 'events.columns.data' has the fields"),
    (_shape_doc, _edit("data.shape.7", 9), "events[7].data (its shape) is 9, expected an index into"),
    (_shape_doc, _edit("data.shape.7", None), "events[7].data (its shape) is null, expected an index into"),
    (_shape_doc, _edit("data.shape", [0]), "field 'events.columns.data.shape' has 1 values but the count is 200"),
    (_shape_doc, _edit("data.values.2", [[]]), "events.columns.data.values[2] has 0 values of 'targets', but 40"),
]


@pytest.mark.parametrize("good, mutate, phrase", BAD_PACKED, ids=[p[:40] for _, _, p in BAD_PACKED])
def test_bad_packed_columns_are_refused_naming_the_event(tmp_path: Path, good: Any, mutate: Any,
                                                          phrase: str) -> None:
    doc = good(tmp_path)
    mutate(doc)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _expect_load_error(tmp_path / "t.json", phrase)


def test_a_non_finite_number_in_packed_data_is_refused(tmp_path: Path) -> None:
    doc = _shape_doc(tmp_path)
    doc["events"]["columns"]["data"]["values"][4][1][3] = "INF"  # shape 4 is trigger/nested; its row 3 is event 19
    (tmp_path / "t.json").write_text(json.dumps(doc).replace('"INF"', "1e999", 1))
    _expect_load_error(tmp_path / "t.json", "events[19].data.nested is inf (a number), expected a finite number")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_edit_of_packed_columns_loads_or_raises_trace_error(tmp_path: Path, data: st.DataObject) -> None:
    # As test_trace's single-edit test, on a document whose columns are run-packed and whose data is packed.
    trace = data.draw(st.sampled_from([runs_trace(9), make_trace(80)]))
    doc = json.loads(json.dumps(trace.to_dict()))
    path = data.draw(st.sampled_from([p for p in _paths(doc)[1:] if p[:2] == ("events", "columns")]))
    loaded = edit_and_load(doc, path, data, tmp_path)
    if loaded is None:
        return
    events = list(loaded.events)
    assert len(events) == doc["events"]["count"]
    assert all(type(e.data) is dict for e in events) and [loaded.events[i] for i in range(len(events))] == events
    loaded.kinds(), loaded.handle_ids(), loaded.count("error")


class _FieldEvents(_Events):
    """A sequence that can also hand out one field of every event, as a recording's RecordedEvents does."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__(events)
        self.built = 0

    def __getitem__(self, i: Any) -> Any:
        self.built += 1
        return super().__getitem__(i)

    def column(self, name: str) -> list[Any]:
        return [getattr(e, name) for e in self._events]


def test_save_reads_a_recordings_events_by_field(tmp_path: Path) -> None:
    trace = runs_trace()
    events = _FieldEvents(trace.events)
    Trace(events=events, meta=trace.meta).save(tmp_path / "t.json")
    assert events.built == 0  # no event was read one by one
    assert Trace.load(tmp_path / "t.json") == trace


def test_save_of_a_recording_builds_no_event(tmp_path: Path) -> None:
    rows = pytest.importorskip("ckpt_viz.trace.rows")
    from ckpt_viz.events import ROW_FIELDS

    trace = runs_trace()
    recorded = rows.RecordedEvents()
    keep = getattr(recorded, "keep", None)
    if keep is None:
        pytest.skip("RecordedEvents has no keep() sink in this version")
    for e in trace.events:
        keep(tuple(getattr(e, name) for name in ROW_FIELDS))
    Trace(events=recorded, meta=trace.meta).save(tmp_path / "t.json")
    assert recorded.pending == len(trace.events)  # saved from the kept fields
    assert Trace.load(tmp_path / "t.json") == trace == Trace(events=recorded, meta=trace.meta)


# ---------------------------------------------------------------- the context column checked once for two uses

def _context_doc(tmp_path: Path) -> dict[str, Any]:
    doc = _saved(tmp_path, runs_trace(), "good.json")
    columns = doc["events"]["columns"]
    # A plain context column (no runs: each event has the next context), data stored by context, and four or
    # more events per table entry: the context check counts the indexes and the data check reads those counts.
    assert type(columns["context"]) is list and columns["data"]["shape"] == "context"
    assert len(doc["events"]["tables"]["context"]) * 4 < len(columns["context"])
    return doc


BAD_CONTEXT = [
    (_edit("context.5", -1), "events[5].context is -1, but events.tables.context has 8 entries"),
    (_edit("context.5", 8), "events[5].context is 8, but events.tables.context has 8 entries"),
    (_edit("context.5", True), "events[5].context is True (a boolean), expected an index into events.tables.context"),
    (_edit("context.5", 1.0), "events[5].context is 1.0 (a number), expected an index into events.tables.context"),
    # A valid index whose data shape has one event more: the counts of the context check find it.
    (_edit("context.5", 1), "events.columns.data.values[1] has 12 values of 'nbytes', but 13 events have that"),
]


@pytest.mark.parametrize("mutate, phrase", BAD_CONTEXT, ids=[p[:40] for _, p in BAD_CONTEXT])
def test_a_bad_context_index_is_refused_naming_the_event(tmp_path: Path, mutate: Any, phrase: str) -> None:
    doc = _context_doc(tmp_path)
    mutate(doc)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _expect_load_error(tmp_path / "t.json", phrase)


# ---------------------------------------------------------------- t_ns kept as differences

def test_times_read_like_the_list_they_add_up_to() -> None:
    import itertools
    import random

    from ckpt_viz.trace.columns import Times

    rng = random.Random(3)
    deltas = [1_700_000_000_000_000_000] + [rng.randrange(0, 5_000) for _ in range(10_000)]  # 3 blocks of 4,096
    expected = list(itertools.accumulate(deltas))
    times = Times(deltas)
    assert len(times) == len(expected) and list(times) == expected and times == expected
    for i in (0, 1, 4095, 4096, 4097, 8191, 8192, 10_000, -1, -4097, -10_001):
        assert times[i] == expected[i], i
    for bad in (10_001, -10_002):
        with pytest.raises(IndexError):
            times[bad]
    assert times._list is None  # rows read one at a time so far
    for i in range(300):  # past 256 such reads the list is built
        assert times[i * 33] == expected[i * 33]
    assert times._list == expected
    assert all(times[i] == expected[i] for i in rng.sample(range(len(expected)), 300))
    times = Times(deltas)
    assert times[4090:4100] == expected[4090:4100] and times[::-1] == expected[::-1]  # a slice builds the list
    assert times[5000] == expected[5000] and list(times) == expected and Times([]) == [] and list(Times([])) == []


def test_a_loaded_trace_keeps_its_times_as_differences_and_saves_them_again(tmp_path: Path) -> None:
    from ckpt_viz.trace.columns import Times

    trace = runs_trace()
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    times = loaded.events.columns["t_ns"]
    assert type(times) is Times and times == [e.t_ns for e in trace.events]
    assert [e.t_ns for e in loaded.events] == [e.t_ns for e in trace.events] and loaded == trace
    assert loaded.events[50].t_ns == trace.events[50].t_ns and loaded.events[-1] == trace.events[-1]
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "t.json").read_bytes()


# ---------------------------------------------------------------- session_id and tags kept as runs

def test_runs_read_like_the_list_they_stand_for() -> None:
    import random

    from ckpt_viz.trace.packed import Runs, unpack_runs

    rng = random.Random(5)
    values = [rng.choice([None, "mb1", 3, True, 2.5]) for _ in range(400)]
    runs = [rng.randrange(1, 9) for _ in values]
    expected = unpack_runs({"values": values, "runs": runs})
    column = Runs(values, runs)
    assert len(column) == len(expected) and list(column) == expected and column == expected
    for i in (0, 1, runs[0] - 1, runs[0], len(expected) - 1, -1, -len(expected)):
        assert column[i] is expected[i], i
    for bad in (len(expected), -len(expected) - 1):
        with pytest.raises(IndexError):
            column[bad]
    assert column._list is None  # rows read one at a time so far
    for i in range(300):  # past 256 such reads the list is built
        assert column[i] is expected[i]
    assert column._list == expected
    column = Runs(values, runs)
    assert column[10:20] == expected[10:20] and column[::-1] == expected[::-1]  # a slice builds the list
    assert Runs([], []) == [] and len(Runs([], [])) == 0 and list(Runs([], [])) == []


def test_a_loaded_trace_keeps_session_and_tags_as_runs_and_saves_them_again(tmp_path: Path) -> None:
    from ckpt_viz import event_column
    from ckpt_viz.trace.packed import Runs

    trace = runs_trace()
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    columns = loaded.events.columns
    assert type(columns["session_id"]) is Runs and type(columns["tags"]) is Runs
    assert columns["session_id"] == [e.session_id for e in trace.events]
    assert event_column(loaded, "tags") == [e.tags for e in trace.events]
    assert loaded.events[37] == trace.events[37] and loaded.events[-1] == trace.events[-1] and loaded == trace
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "t.json").read_bytes()


# ---------------------------------------------------------------- ranges read off the distinct values

def _memory_doc(tmp_path: Path) -> dict[str, Any]:
    doc = _saved(tmp_path, make_trace(40), "good.json")
    doc["memory"]["columns"]["device_allocated"][0] = None  # a null among the values: skipped by the range
    doc["memory"]["bytes_by_category"]["activations"][0] = None
    return doc


def _memory_edit(path: str, value: Any) -> Any:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc["memory"]
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return apply


BAD_RANGES = [
    (_memory_doc, _memory_edit("columns.device_allocated.2", -1), "memory[2].device_allocated is -1, expected 0 to"),
    (_memory_doc, _memory_edit("columns.device_allocated.2", 2**63), "memory[2].device_allocated is 9223372036854775"),
    (_memory_doc, _memory_edit("bytes_by_category.activations.3", 2**63),
     "memory[3].bytes_by_category.activations is 9223372036854775808, expected 0 to 2**63-1 bytes"),
    (_runs_doc, _edit("handle_id.runs.3", 97), "events.columns.handle_id.runs[3] is 97, expected a run length from 1"),
    (_runs_doc, _edit("handle_id.runs.3", -8), "events.columns.handle_id.runs[3] is -8, expected a run length from 1"),
]


@pytest.mark.parametrize("good, mutate, phrase", BAD_RANGES, ids=[p[:40] for _, _, p in BAD_RANGES])
def test_a_value_out_of_range_is_refused_naming_it(tmp_path: Path, good: Any, mutate: Any, phrase: str) -> None:
    doc = good(tmp_path)
    mutate(doc)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    _expect_load_error(tmp_path / "t.json", phrase)


def test_nulls_among_byte_counts_load(tmp_path: Path) -> None:
    doc = _memory_doc(tmp_path)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    loaded = Trace.load(tmp_path / "t.json")
    assert loaded.memory[0].device_allocated is None and "activations" not in loaded.memory[0].bytes_by_category


def test_a_non_finite_number_among_integer_data_is_refused(tmp_path: Path) -> None:
    # The finite-number check looks at the types of all data values at once; a float among the ints of one
    # key (input_count of shape 0, row 3: event 24) is still found and named.
    doc = _runs_doc(tmp_path)
    doc["events"]["columns"]["data"]["values"][0][1][3] = "NEGINF"
    (tmp_path / "t.json").write_text(json.dumps(doc).replace('"NEGINF"', "-1e999", 1))
    _expect_load_error(tmp_path / "t.json", "events[24].data.input_count is -inf (a number), expected a finite number")
