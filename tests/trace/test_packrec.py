"""The C packer of a recording's save (ckpt_viz/trace/csrc/packrec.c) against the Python it replaces.

NOTE [ Saving fast ] rule 5 in ckpt_viz/trace/document.py: the same bytes, or the same error, as the Python
path, on the same recording; the Python is the reference (monkeypatched to run alone).
"""
from __future__ import annotations

import random
import sys

import pytest

from ckpt_viz.errors import TraceError
from ckpt_viz.trace import Trace, document
from ckpt_viz.trace import io as trace_io
from ckpt_viz.trace.packed import by_context_limit
from ckpt_viz.trace.rows import RecordedEvents

_C = document.extension(document._PACKREC)
needs_c = pytest.mark.skipif(_C is None, reason="no C compiler: the Python path is the only one")

KINDS = ["handle_created", "forward_started", "forward_finished", "replay_started", "released", "phase_set"]
THREAD = 140_000_000_000_001


def _saved(trace: Trace, monkeypatch: pytest.MonkeyPatch, c: bool) -> bytes | str:
    """The file's bytes (uncompressed), or the error's type and message."""
    with monkeypatch.context() as m:
        if not c:
            m.setattr(document, "extension", lambda source: None)
        try:
            return trace_io._payload(trace, False)
        except Exception as err:  # compared between the two paths, whatever it is
            return f"{type(err).__name__}: {err}"


def _both(rows: list[tuple], monkeypatch: pytest.MonkeyPatch, built: int = 0) -> tuple[bytes | str, bytes | str]:
    def recording() -> Trace:
        recorded = RecordedEvents()
        for row in rows:
            recorded.keep(row)
        if built:
            recorded[built - 1]  # builds the Events so far: the Python path, for the C's "None"
        return Trace(events=recorded)

    return _saved(recording(), monkeypatch, True), _saved(recording(), monkeypatch, False)


def _row(t_ns: int, kind: str = "forward_started", handle_id=0, mode="reentrant", phase="ordinary",
         session_id=None, tags=None, site="train.py:1", thread_id=THREAD, data=None) -> tuple:
    return (t_ns, kind, handle_id, mode, phase, session_id, {} if tags is None else tags, site, thread_id,
            {} if data is None else data)


T_NS, KIND, HANDLE, SESSION, TAGS, SITE, DATA = 0, 1, 2, 5, 6, 7, 9  # positions in events.ROW_FIELDS


def _put(row: tuple, at: int, value: object) -> tuple:
    return (*row[:at], value, *row[at + 1:])


def _fresh_int(value: int) -> int:
    return int(str(value))  # an equal int that is another object (as the bus's thread ids are)


def _random_rows(rng: random.Random, n: int, odd: float, parts_only: bool = False) -> list[tuple]:
    """A recording of n events; `odd` is the chance of each unusual value (parts_only: only in the fields
    the C leaves to the Python one by one: handle_id, session_id, tags, data)."""
    sites = ["a.py:1", "b.py:2", None, "".join(["a.py", ":1"])]  # the last: equal to the first, another object
    tags_blocks = [{"stage": 0}, {"stage": 1, "microbatch": 2}, {}, {"stage": True}]
    shapes = {k: {"x": 1, "y": "s"} if i % 2 else {"duration_ns": 5} for i, k in enumerate(KINDS)}
    t, handle, session, tags, rows = 1_700_000_000_000_000, 0, None, tags_blocks[0], []

    def maybe(usual, *unusual, part=False):
        return rng.choice(unusual) if rng.random() < odd and (part or not parts_only) else usual

    for _ in range(n):
        t += rng.randrange(0, 5000)
        if rng.random() < 0.05:
            handle += 1
        if rng.random() < 0.1:
            session = rng.choice([None, "mb1", "mb2", 3, True] if rng.random() < 0.9 else [2.5])
        if rng.random() < 0.02:
            tags = rng.choice(tags_blocks)
        kind = rng.choice(KINDS)
        data = dict(shapes[kind])
        if rng.random() < odd / (4 if parts_only else 1):
            data = rng.choice([{"y": "s", "x": 1}, {"x": 1}, {"x": 1, "z": 2}, {1: "a"}, [("x", 1)], {},
                               {"".join(["dur", "ation_ns"]): 7}, {"x": float("nan"), "y": "s"},
                               {"bytes": -1}, {"mem_bytes": 5, "other": None}])
        rows.append(_row(
            maybe(t, _fresh_int(t), t + 2**64, True, -5, float(t)),
            maybe(kind, "".join(["rel", "eased"]), "no_such_kind", 7, None),
            maybe(handle, None, _fresh_int(handle + 10**20), True, "h", 1.0, [1], part=True),
            maybe("reentrant", None, "nonreentrant", 3),
            maybe(rng.choice(["ordinary", "dx", "dw", None]), "weird", b"dx"),
            maybe(session, _fresh_int(7), False, "mb1", float("inf"), part=True),
            maybe(tags, dict(tags), {"stage": 1.5}, {"bad": object()}, part=True),
            maybe(rng.choice(sites), "x" * 10, ["unhashable"], 12),
            maybe(THREAD if rng.random() < 0.9 else 7, _fresh_int(THREAD), 2**70, True, -1, "t"),
            data,
        ))
    return rows


@needs_c
@pytest.mark.parametrize("n", [64, 65, 200, 1023, 1024, 1025, 3000])
@pytest.mark.parametrize("odd", [0.0, 0.001, 0.02, 0.2])
@pytest.mark.parametrize("parts_only", [False, True])
def test_random_recordings_save_as_in_python(n, odd, parts_only, monkeypatch):
    for seed in range(3):
        rows = _random_rows(random.Random(seed * 1000 + n), n, odd, parts_only)
        c, python = _both(rows, monkeypatch)
        assert c == python, (seed, c[:300] if isinstance(c, str) else "bytes")


@needs_c
def test_the_usual_recording_is_packed_in_c(monkeypatch):
    rows = _random_rows(random.Random(5), 2000, 0.0)
    recorded = RecordedEvents()
    for row in rows:
        recorded.keep(row)
    parts = recorded.packed(lambda head, flat, size: _C.pack(flat, size, by_context_limit(size // 10), head))
    assert parts is not None
    seq, (deltas, context, table, handle_id, _, tags, data) = parts
    assert seq == range(2000) and len(deltas) == 2000
    assert type(tags) is dict and type(data) is dict and data["shape"] == "context"  # nothing left to Python
    assert type(handle_id) is dict and type(context) is list  # runs; a context a row rarely repeats
    assert [tuple(row) for row in table] == list(dict.fromkeys(row[1:2] + row[3:5] + row[7:9] for row in rows))
    assert recorded.pending == 2000  # no Event built


@needs_c
@pytest.mark.parametrize("case", ["changes_in_head", "runs_over_half", "bool_and_int", "odd_in_head",
                                  "odd_after_runs_over_half", "raising_eq", "fresh_tags", "many_contexts",
                                  "keys_differ", "deleted_built", "huge_t_ns", "short", "context_runs",
                                  "context_changes_in_head", "head_512", "head_513", "runs_half", "runs_half_1",
                                  "contexts_375", "contexts_376"])
def test_edges_save_as_in_python(case, monkeypatch):
    n = 3000
    rows = [_row(1000 + i, KINDS[i % 2], handle_id=i // 10, data={"k": i}) for i in range(n)]

    class Raises:
        __hash__ = object.__hash__

        def __eq__(self, other):
            raise ValueError("boom")

    if case == "changes_in_head":  # more than 512 changes in the first 1024 events, few runs after
        rows = [_put(r, HANDLE, i if i < 1024 else 0) for i, r in enumerate(rows)]
    elif case == "runs_over_half":
        rows = [_put(r, SESSION, i // 2 + (i % 4 == 3)) for i, r in enumerate(rows)]
    elif case == "bool_and_int":
        rows = [_put(r, SESSION, True if i == 2000 else i // 100) for i, r in enumerate(rows)]
    elif case == "odd_in_head":
        rows[700] = _put(rows[700], SESSION, Raises())
    elif case == "odd_after_runs_over_half":
        rows = [_put(r, HANDLE, i) for i, r in enumerate(rows)]
        rows[2500] = _put(rows[2500], HANDLE, Raises())
    elif case == "raising_eq":
        rows[1500] = _put(rows[1500], HANDLE, Raises())
    elif case == "fresh_tags":
        rows = [_put(r, TAGS, {"stage": i % 3}) for i, r in enumerate(rows)]
    elif case == "many_contexts":  # over by_context_limit: data by shape
        rows = [_put(r, SITE, f"s.py:{i % 400}") for i, r in enumerate(rows)]
    elif case == "keys_differ":
        rows[2999] = _put(rows[2999], DATA, {"j": 1})
    elif case == "huge_t_ns":
        rows = [_put(r, T_NS, r[0] + (2**63 if i > 1500 else 0)) for i, r in enumerate(rows)]
    elif case == "short":
        rows = rows[:63]
    elif case in ("head_512", "head_513"):  # pack_runs's quick look gives up above 512 changes in 1,024 values
        changes = int(case[-3:])
        rows = [_put(r, HANDLE, min(i, changes) if i < 1024 else changes) for i, r in enumerate(rows)]
    elif case in ("runs_half", "runs_half_1"):  # at most n // 2 runs pack: 1,500 runs of 3,000 events, or 1,501
        rows = [_put(r, HANDLE, i // 2) for i, r in enumerate(rows)]
        rows = [_put(r, HANDLE, 10**6) if case == "runs_half_1" and i == 2999 else r for i, r in enumerate(rows)]
    elif case in ("contexts_375", "contexts_376"):  # by_context_limit(3000) is 375: data by context up to it
        rows = [_put(_put(r, KIND, KINDS[0]), SITE, f"s.py:{i % int(case[-3:])}") for i, r in enumerate(rows)]
    elif case == "context_runs":
        rows = [_put(r, KIND, KINDS[i // 10 % 3]) for i, r in enumerate(rows)]
    elif case == "context_changes_in_head":
        rows = [_put(r, KIND, KINDS[i % 2 if i < 1024 else 0]) for i, r in enumerate(rows)]
    c, python = _both(rows, monkeypatch)
    assert c == python
    if case == "context_runs":
        assert b'"context":{"values":[0,1,2,0,' in c
    if case in ("head_512", "runs_half"):
        assert b'"handle_id":{"values":' in c
    if case.startswith("contexts_"):
        assert (b'"shape":"context"' in c) == (case == "contexts_375")
    if case in ("head_513", "runs_half_1"):
        assert b'"handle_id":[' in c
    if case == "deleted_built":  # Events built, then deleted: the seqs start after them
        def recording(c):
            recorded = RecordedEvents()
            for row in rows[:100]:
                recorded.keep(row)
            recorded[0]
            del recorded[:]
            for row in rows[100:]:
                recorded.keep(row)
            return _saved(Trace(events=recorded), monkeypatch, c)
        assert recording(True) == recording(False)
        assert b'"seq":{"start":100}' in recording(True)


@needs_c
@pytest.mark.parametrize("built", [1, 10, 63, 64, 499, 500])
@pytest.mark.parametrize("odd", [0.0, 0.02])
def test_built_events_saved_as_in_python(built, odd, monkeypatch):
    rows = _random_rows(random.Random(built), 500, odd, parts_only=True)
    c, python = _both(rows, monkeypatch, built=built)
    assert c == python and (isinstance(c, bytes) or odd)
    recorded = RecordedEvents()
    for row in rows:
        recorded.keep(row)
    recorded[built - 1]
    recorded[3] = "not an Event"  # written through the list protocol: the Python path (and its error)
    c, python = _saved(Trace(events=recorded), monkeypatch, True), _saved(Trace(events=recorded), monkeypatch, False)
    assert c == python


@needs_c
def test_errors_are_the_python_paths(monkeypatch, tmp_path):
    rows = [_row(1000 + i) for i in range(100)]
    rows[50] = _row(1050, site=["unhashable"])
    recorded = RecordedEvents()
    for row in rows:
        recorded.keep(row)
    with pytest.raises(TraceError, match=r"events\[50\]\.site is .*expected a string or null.*\nTip: "):
        Trace(events=recorded).save(tmp_path / "x.json.gz")
    rows[50] = _row(True)
    c, python = _both(rows, monkeypatch)
    assert c == python and "events[50].t_ns" in c


@needs_c
def test_no_reference_leaks():
    kind, value, tags, session = "forward_started", object(), {"stage": 1}, "mb1"
    objects = (kind, value, tags, session)

    def flat(unusual: int | None = None, what: object = None) -> list:
        rows = [_row(10**12 + i, kind, handle_id=i // 7, session_id=session, tags=tags, data={"v": value})
                for i in range(5000)]
        values = [v for row in rows for v in row]
        if unusual is not None:
            values[unusual] = what
        return values

    for values, size, left_to_python in [
        (flat(), 50_000, ()), (flat(), 49_990, ()), (flat(), 640, ()),
        (flat(99, [("v", value)]), 50_000, (6,)),  # data that is not a dict
        (flat(25, 1.5), 50_000, (4,)),  # a session_id of another type
        (flat(6006, dict(tags)), 50_000, ()),  # tags: another object, runs all the same
    ]:
        before = [sys.getrefcount(x) for x in objects]
        result = _C.pack(values, size, by_context_limit(size // 10))
        assert [i for i, part in enumerate(result) if type(part) is tuple] == list(left_to_python)
        del result
        assert [sys.getrefcount(x) for x in objects] == before
    values, head = flat(), flat()[:20_000]  # with the fields of built Events first
    before = [sys.getrefcount(x) for x in objects]
    result = _C.pack(values, 30_000, by_context_limit(5000), head)
    assert len(result[0]) == 5000
    del result
    assert [sys.getrefcount(x) for x in objects] == before
    values = flat(30, 1.5)  # a t_ns the Python refuses: None, the Python decides
    before = [sys.getrefcount(x) for x in objects]
    assert _C.pack(values, len(values), 625) is None
    assert [sys.getrefcount(x) for x in objects] == before


@needs_c
def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 10"):
        _C.pack([0] * 25, 25, 16)
    with pytest.raises(TypeError):
        _C.pack((0,) * 10, 10, 16)


def _python_number(tags: list, monkeypatch: pytest.MonkeyPatch) -> tuple:
    with monkeypatch.context() as m:
        m.setattr(document, "extension", lambda source: None)
        return document._number(tags)


@needs_c
@pytest.mark.parametrize("seed", range(12))
def test_tags_numbered_as_in_python(seed, monkeypatch):
    rng = random.Random(seed)
    pool = [{}, {"stage": 0}, {"stage": 1}, {"stage": True}, {"stage": 1, "mb": 2}, {"mb": 2, "stage": 1},
            {"stage": "1"}, {"stage": None}, {"stage": 10**30}, {"stage": False}, {"stage": 0, "mb": -1}]
    odd = [{"stage": 1.0}, {1: "a"}, {"stage": [1]}, {"stage": -0.0}, [("stage", 1)], None, {"s": b"x"}]
    for n in (0, 1, 65, 300, 5000):
        tags = [dict(rng.choice(pool)) if rng.random() < 0.5 else rng.choice(pool) for _ in range(n)]
        if seed % 3 and n:
            tags[rng.randrange(n)] = rng.choice(odd)
        numbered = _C.number_tags(tags)
        python = _python_number(tags, monkeypatch)
        if numbered is None:  # left to the Python: something odd is there
            assert seed % 3 and n
        else:
            assert numbered == python and type(numbered[0]) is list
        assert document._number(tags) == python


@needs_c
def test_the_cyclic_gc_is_left_as_it_was():
    import gc

    rows = [_row(1000 + i) for i in range(100)]
    flat = [v for row in rows for v in row]
    assert gc.isenabled()
    assert _C.pack(flat, len(flat), 16) is not None and gc.isenabled()
    gc.disable()
    try:
        assert _C.pack(flat, len(flat), 16) is not None and not gc.isenabled()
    finally:
        gc.enable()


@needs_c
@pytest.mark.parametrize("values", [[], [5], list(range(0, 10**6, 7)), [2**63 + 5, 3, -(2**70), 2**62, -(2**63)],
                                    [1, 2, True], [1, 2.0], [1, None]])
def test_deltas_as_in_python(values):
    if all(type(v) is int for v in values):
        assert _C.deltas(values) == document._deltas(values)
    else:
        assert _C.deltas(values) is None  # the Python checks and says what is wrong


@needs_c
@pytest.mark.parametrize("bad", [None, 1.5, True])
def test_bad_times_of_samples_and_events_refused_as_in_python(bad, monkeypatch):
    from ckpt_viz.events import Event
    from ckpt_viz.trace import MemorySample

    samples = [MemorySample(seq=i, t_ns=10 + i, bytes_by_category={"activations": i}) for i in range(100)]
    events = [Event(seq=i, t_ns=10 + i, kind="forward_started") for i in range(100)]
    if bad is not None:
        samples[70] = MemorySample(seq=70, t_ns=bad, bytes_by_category={"activations": 70})
        events[80] = Event(seq=80, t_ns=bad, kind="forward_started")
    for trace in (Trace(events=[], memory=samples), Trace(events=events)):
        c, python = _saved(trace, monkeypatch, True), _saved(trace, monkeypatch, False)
        assert c == python
        assert (bad is None) == isinstance(c, bytes)
        if bad is not None:
            assert "memory[70].t_ns" in c or "events[80].t_ns" in c


@needs_c
@pytest.mark.parametrize("odd", [0.0, 0.001, 0.02])
@pytest.mark.parametrize("seqs", ["counting", "gaps", "not_an_event"])
def test_lists_of_events_save_as_in_python(odd, seqs, monkeypatch):
    from ckpt_viz.events import make_event

    rows = _random_rows(random.Random(7), 1500, odd, parts_only=seqs == "gaps")
    events = [make_event(i * (2 if seqs == "gaps" else 1) + 5, *row) for i, row in enumerate(rows)]
    if seqs == "not_an_event":
        events[900] = rows[900]
    trace = Trace(events=events)
    c, python = _saved(trace, monkeypatch, True), _saved(trace, monkeypatch, False)
    assert c == python
    if seqs == "not_an_event":
        assert "events[900] is" in c
    if seqs == "counting" and not odd:
        assert document._packed(events) is not None and b'"seq":{"start":5}' in c
