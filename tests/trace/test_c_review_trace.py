"""REVIEW's adversarial tests of the trace C (packrec.c; NOTE [ C speed-ups ] in ckpt_viz/cext.py)."""
from __future__ import annotations

import sys

import pytest

from ckpt_viz.trace import document

_C = document.extension(document._PACKREC)
needs_c = pytest.mark.skipif(_C is None, reason="no C compiler: the Python path is the only one")


def _flat(n: int) -> list:
    # n events' fields after seq (events.ROW_FIELDS order), 3 contexts, odd but accepted values
    out: list = []
    for i in range(n):
        out += [1_000 + i, ("a", "b", "c")[i % 3], i // 4, None, "fwd", "s", {"x": 1}, None, 7, {"k": i}]
    return out


@needs_c
def test_pack_huge_max_contexts_is_the_same_as_n():
    flat = _flat(100)
    assert _C.pack(flat, len(flat), sys.maxsize) == _C.pack(flat, len(flat), 100)


@needs_c
def test_pack_bools_and_huge_ints_where_ints_are():
    flat = _flat(100)
    for i in range(0, 1000, 10):
        flat[i + 2] = True if i % 20 else 1  # handle_id: True == 1 would merge runs (pack_runs keeps the column)
        flat[i + 5] = 2 ** 80 if i % 30 else -(2 ** 70)  # session_id beyond 64 bits
    handles, sessions = _C.pack(flat, len(flat), 100)[3:5]
    assert handles == flat[2::10] and all(a is b for a, b in zip(handles, flat[2::10]))
    assert type(sessions) is dict or sessions == flat[5::10]


@needs_c
def test_pack_bool_thread_or_t_ns_goes_to_python():
    for at in (0, 8):  # t_ns, thread_id: a bool is not the exact int the C takes
        flat = _flat(100)
        flat[50 + at] = True
        assert _C.pack(flat, len(flat), 100) is None


@needs_c
def test_pack_refcounts_unchanged():
    flat = _flat(200)
    mine = [v for v in flat if type(v) is dict]  # objects only this test holds (not shared small ints, None)
    before = [sys.getrefcount(v) for v in mine]
    for _ in range(3):
        _C.pack(flat, len(flat), 200)
    assert [sys.getrefcount(v) for v in mine] == before
