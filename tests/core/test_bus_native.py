"""The bus's C twins (ckpt_viz/csrc/busfast.c) against the Python they stand for: the same kept rows, sites, errors.

Each scenario runs once with `bus.use_native(True)` and once with `bus.use_native(False)` (bus NOTE [ Cost with
nobody listening ], rule 6) and the kept values must be equal field by field (t_ns aside: a clock reading, checked
to be a fresh int from the same monotonic clock, in order).
"""
from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Any

import pytest

from ckpt_viz import bus, cext, sites
from ckpt_viz.events import KeptRow
from ckpt_viz.trace.rows import RecordedEvents


@pytest.fixture
def native():
    """C where it can be built; the test is skipped where it cannot (the Python path is then the only one)."""
    if not bus.use_native(True):
        pytest.skip("no C compiler here: the Python emit is the only one")
    yield
    bus.use_native(True)


def _with(use_c: bool) -> bool:
    got = bus.use_native(use_c)
    assert got is use_c
    return got


class _Story:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def add(self, event: Any) -> None:
        self.rows.append((event.seq, event.kind, event.site))


class _Session:
    def __repr__(self) -> str:
        return "<session 1>"


class _Handle:
    mode = "reentrant"
    _story = None

    def __init__(self, handle_id: int, phase: str = "ordinary", session_id: Any = None) -> None:
        self.handle_id, self.phase, self.session_id = handle_id, phase, session_id


def _site_here() -> str | None:  # a user line: this test file is not skipped
    return bus.call_site(1)


def _emits(recorded: RecordedEvents) -> list[Any]:
    """Every case the C path takes or hands back, in one channel; what each call returned."""
    data = {"x": 1}
    out: list[Any] = []
    out.append(bus.emit_row("phase_set", 3, "reentrant", "dx", None, "given.py:1", True, data))
    out.append(bus.emit_row("phase_set", 3, "reentrant", "dx", None, None, True, data))  # site captured here
    out.append(bus.emit_row("phase_set", 3, "reentrant", "dx", None, None, False, data))
    out.append(bus.emit_row("phase_set", None, None, None, None, None, 0, {}))
    for session in ("s", 7, 2.5, True, ("mb", 1), _Session()):  # the last two: repr() in Python
        out.append(bus.emit_row("session_bound", 1, "reentrant", "dw", session, None, True, {}))
    out.append(bus.emit_row("released", 1, "reentrant", "dw", None, None, True, data, bus.current_scope()))
    out.append(bus.emit_row("released", 1, "reentrant", "dw", None, None, True, data, bus.Scope()))  # not ours
    out.append(bus.emit_row("released", 1, "reentrant", "dw", None, site=None, capture_site=True, data=data))
    with bus.tag(stage=1):
        out.append(bus.emit_row("tag_seen", 2, "reentrant", "ordinary", None, None, True, {}))
        with bus.tag():
            out.append(bus.emit_row("tag_seen", 2, "reentrant", "ordinary", None, None, True, {}))
    handle = _Handle(5, "dx", "s0")
    out.append(bus.emit_for(handle, "replay_started", None, True, {"trigger": "backward"}))
    handle._story = _Story()
    out.append(bus.emit_for(handle, "replay_finished", "given.py:2", True, {}))
    out.append(bus.emit_for(handle, "released", None, True, {}, bus.current_scope()))
    out.append(handle._story.rows)
    out.append(bus.emit("error", handle_id=9, data={"where": "x"}))
    out.append(_site_here())
    return out


def _run(use_c: bool, *, after: bool = False, nested: bool = False, subscriber: bool = False) -> tuple:
    _with(use_c)
    recorded = RecordedEvents()
    seen: list[Any] = []
    channel = bus.open_channel(rows=recorded.keep, seq_of=recorded.seq_of, after=seen.append if after else None)
    inner_rows = RecordedEvents()
    inner = bus.open_channel(rows=inner_rows.keep, seq_of=inner_rows.seq_of) if nested else None
    unsubscribe = bus.subscribe(seen.append) if subscriber else None
    start = time.monotonic_ns()
    try:
        returned = _emits(recorded)
    finally:
        if unsubscribe is not None:
            unsubscribe()
        if inner is not None:
            inner.close()
        channel.close()
    end = time.monotonic_ns()
    fields = recorded.fields()
    t_ns = fields.pop("t_ns")
    assert all(start <= t <= end for t in t_ns) and t_ns == sorted(t_ns)
    assert set(fields["thread_id"]) == {threading.get_ident()}
    rows = [(type(r).__name__, r.seq, r.kind, r.site, r.session_id, r.tags) if r is not None and hasattr(r, "kind")
            else r for r in returned]
    return fields, rows, [(e.kind, e.site) for e in seen], inner_rows.fields() if nested else None


def _without_t_ns(result: tuple) -> tuple:
    fields, rows, seen, inner = result
    if inner is not None:
        inner = {k: v for k, v in inner.items() if k != "t_ns"}
    return fields, rows, seen, inner


@pytest.mark.parametrize("case", [{}, {"after": True}, {"nested": True}, {"subscriber": True}],
                         ids=["sole", "memory", "nested", "subscriber"])
def test_c_keeps_what_python_keeps(native, case: dict[str, bool]) -> None:
    python = _without_t_ns(_run(False, **case))
    c = _without_t_ns(_run(True, **case))
    assert c == python
    fields, rows, _, _ = c
    assert fields["kind"][:3] == ["phase_set"] * 3 and fields["site"][0] == "given.py:1"
    assert fields["site"][1].startswith("tests/core/test_bus_native.py:") and fields["site"][2] is None
    assert fields["session_id"][4:10] == ["s", 7, 2.5, True, repr(("mb", 1)), "<session 1>"]
    assert fields["tags"][-6:-4] == [{"stage": 1}, {"stage": 1}]
    assert rows[-1].startswith("tests/core/test_bus_native.py:")
    if not case:
        assert rows[0][0] == "KeptRow" and [r[1] for r in rows[:4]] == [0, 1, 2, 3]
        assert rows[-3] == [(len(fields["kind"]) - 3, "replay_finished", "given.py:2"),
                            (len(fields["kind"]) - 2, "released", fields["site"][-2])]


def test_c_returns_a_kept_row_that_reads_like_an_event(native) -> None:
    recorded = RecordedEvents()
    channel = bus.open_channel(rows=recorded.keep, seq_of=recorded.seq_of)
    try:
        def emit(handle_id: int) -> Any:
            return bus.emit_row("phase_set", handle_id, "reentrant", "dx", None, None, True, {"a": handle_id})

        first = emit(1)
        python_calls: list[str] = []
        sys.setprofile(lambda frame, event, arg: python_calls.append(frame.f_code.co_name) if event == "call" else None)
        try:  # the usual case runs no Python at all (the site of that line was cached by the first emit)
            second = emit(2)
        finally:
            sys.setprofile(None)
        assert python_calls == ["emit"]
    finally:
        channel.close()
    assert type(first) is KeptRow and isinstance(first, tuple) and len(first) == 2
    assert (first.seq, second.seq) == (0, 1) and first.handle_id == 1 and second.data == {"a": 2}
    assert first.event() == recorded[0] and second.site == recorded[1].site
    assert bus.emit_row("phase_set", 1, None, None, None, None, True, {}) is None  # closed: nobody listens


def test_call_site_walks_as_python_does(native, tmp_path) -> None:
    def at(depth: int) -> tuple[Any, Any]:
        return sites.call_site(depth), bus.call_site(depth)

    python, c = at(1)
    assert python == c and python.startswith("tests/core/test_bus_native.py:")
    python, c = at(2)
    assert python == c
    # a file the walk has not seen: the C walk hands it to Python, which fills the caches; then C reads them
    code = compile("def f(depth):\n    return (sites.call_site(depth), bus.call_site(depth))\n",
                   str(tmp_path / "fresh_user_file.py"), "exec")
    namespace: dict[str, Any] = {"sites": sites, "bus": bus}
    exec(code, namespace)
    assert namespace["f"](1) == namespace["f"](1)
    assert namespace["f"](1)[1].endswith("fresh_user_file.py:2")
    for depth in (0, 2, 3):
        assert at(depth)[0] == at(depth)[1]
    with pytest.raises(ValueError) as python_error:
        sites.call_site(10_000)
    with pytest.raises(ValueError) as c_error:
        bus.call_site(10_000)
    assert str(c_error.value) == str(python_error.value)
    with pytest.raises(TypeError):
        bus.call_site(1, 2)


def test_errors_pass_through_as_in_python(native) -> None:
    def broken_keep(values: tuple) -> None:
        raise RuntimeError("keep failed")

    for use_c in (False, True):
        _with(use_c)
        channel = bus.open_channel(rows=broken_keep, seq_of=lambda values: None)
        try:
            with pytest.raises(RuntimeError, match="keep failed"):
                bus.emit_row("phase_set", 1, None, None, None, None, True, {})
        finally:
            channel.close()
        recorded = RecordedEvents()
        channel = bus.open_channel(rows=recorded.keep, seq_of=recorded.seq_of)
        try:
            with pytest.raises(AttributeError):
                bus.emit_for(object(), "phase_set", None, True, {})
            story_handle = _Handle(1)
            story_handle._story = object()  # no add(): the story's error comes out
            with pytest.raises(AttributeError, match="add"):
                bus.emit_for(story_handle, "phase_set", None, True, {})
        finally:
            channel.close()
    bus.use_native(True)
    with pytest.raises(TypeError, match="Tip:"):
        bus.emit_for(_Handle(1), "phase_set")


def test_c_emits_hold_no_stray_references(native) -> None:
    kept: list[Any] = []
    channel = bus.open_channel(rows=kept.extend, seq_of=lambda values: None)
    handle, data, kind, story = _Handle(4, "dw", "s"), {"k": 1}, "phase_" + "set", _Story()
    try:
        for _ in range(3):  # warm: caches filled, site strings made
            bus.emit_row(kind, 1, "reentrant", "dx", None, None, True, data)
            bus.emit_for(handle, kind, None, True, data)
        kept.clear()
        story.rows.clear()
        gc.collect()
        before = [sys.getrefcount(o) for o in (handle, data, kind, channel)]
        for _ in range(200):
            bus.emit_row(kind, 1, "reentrant", "dx", None, None, True, data)
            bus.emit_for(handle, kind, None, True, data)
            row = bus.emit_for(handle, kind, "given.py:3", False, data)
        assert isinstance(row, KeptRow)
        del row
        handle._story = story
        bus.emit_for(handle, kind, None, True, data)
        handle._story = None
        kept.clear()
        story.rows.clear()
        gc.collect()
        assert [sys.getrefcount(o) for o in (handle, data, kind, channel)] == before
    finally:
        channel.close()


def test_no_c_with_cext_off(monkeypatch) -> None:
    monkeypatch.setenv("CKPT_VIZ_CEXT", "0")
    monkeypatch.setattr(cext, "_TRIED", {})
    try:
        assert bus.use_native(True) is False
        assert bus.emit_row is bus._emit_row_py and bus.emit_for is bus._emit_for_py
        assert bus.call_site is sites.call_site
    finally:
        monkeypatch.undo()
        bus.use_native(True)
