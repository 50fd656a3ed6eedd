"""Threads and a closing recording (bus.py NOTE [ Recording scopes ], rules 1 and 4).

Streamlit runs each app session on a thread of its own: concurrent users must never see each
other's events. And a thread handed a recording (`Recording.attach()`) may still be emitting when
the recording's block closes: its event must then go nowhere (no error, no event of another
recording) and the closed trace must not change afterwards.

Found (LEAK, session 9): no emitter raises, no event reaches another thread's or the next
recording, and the seqs stay 0..n-1; but an emitter that already read the recording's sink
before `Channel.close()` kept its event after the block ended, so the closed trace grew by one
or two events. `Channel.close()` now waits for a delivery in progress (it takes the channel's lock),
so the closed trace never grows.
"""
from __future__ import annotations

import threading

import pytest

import ckpt_viz
from ckpt_viz import bus
from ckpt_viz.events import Error

ROUNDS = 20
EMITTERS = 3


class _Session:
    """A session id with a Python __repr__ (like run.harness.RunSession): the bus calls back into Python for it."""

    def __repr__(self) -> str:
        return "step"


def _emit_until(stop: threading.Event, marker: str, errors: list, counter: list) -> None:
    session = _Session()
    try:
        while not stop.is_set():
            bus.emit(Error, capture_site=False, session_id=session, where=marker, type="note")
            counter[0] += 1
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_each_threads_recording_sees_only_its_own_events() -> None:
    """Eight sessions recording at once, each on its own thread: no event crosses between them."""
    results: dict[int, list] = {}
    errors: list = []
    barrier = threading.Barrier(8)

    def session(n: int) -> None:
        try:
            with ckpt_viz.record() as rec:
                barrier.wait()
                for _ in range(300):
                    bus.emit(Error, capture_site=False, where=str(n), type="note")
            results[n] = [int(e.where) for e in rec.trace.events]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=session, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {n: set(markers) for n, markers in results.items()} == {n: {n} for n in range(8)}
    assert all(len(markers) == 300 for markers in results.values())


def _attached(rec: ckpt_viz.Recording, started: threading.Barrier, stop: threading.Event, marker: str,
              errors: list, counter: list) -> None:
    with rec.attach():
        started.wait()
        _emit_until(stop, marker, errors, counter)


def _close_under_fire(rounds: int) -> dict[str, list]:
    """Close a recording while attached threads emit as fast as they can, `rounds` times; what went wrong."""
    found: dict[str, list] = {"errors": [], "crossed": [], "gaps": [], "grew": []}
    for round_index in range(rounds):
        stop, errors = threading.Event(), []
        counters = [[0] for _ in range(EMITTERS)]
        started = threading.Barrier(EMITTERS + 1)
        with ckpt_viz.record() as rec:
            threads = [threading.Thread(target=_attached, args=(rec, started, stop, f"old{k}", errors, counters[k]))
                       for k in range(EMITTERS)]
            for t in threads:
                t.start()
            started.wait()
            while sum(c[0] for c in counters) < 20:  # let them run inside the block for a while
                pass
        closed_len = len(rec.trace.events)
        with ckpt_viz.record() as next_rec:  # the emitters are still running, on the old scope
            for _ in range(20):
                bus.emit(Error, capture_site=False, where="new", type="note")
        stop.set()
        for t in threads:
            t.join()
        found["errors"].extend(errors)
        markers = {e.where for e in next_rec.trace.events}
        if markers != {"new"}:
            found["crossed"].append((round_index, sorted(markers)))
        if [e.seq for e in rec.trace.events] != list(range(len(rec.trace.events))):
            found["gaps"].append(round_index)
        if len(rec.trace.events) != closed_len:
            found["grew"].append((round_index, closed_len, len(rec.trace.events)))
    return found


@pytest.fixture(scope="module")
def closed_under_fire() -> dict[str, list]:
    return _close_under_fire(ROUNDS)


def test_an_emitter_racing_the_close_never_raises_nor_reaches_the_next_recording(
        closed_under_fire: dict[str, list]) -> None:
    assert closed_under_fire["errors"] == []
    assert closed_under_fire["crossed"] == [], "an old thread's event reached the recording opened next"
    assert closed_under_fire["gaps"] == [], "a closed trace's seqs are not 0..n-1"


def test_a_closed_trace_does_not_grow_after_its_block(closed_under_fire: dict[str, list]) -> None:
    grew = closed_under_fire["grew"]
    assert grew == [], f"the closed trace grew after its block ended in {len(grew)}/{ROUNDS} rounds: {grew[:5]}"
