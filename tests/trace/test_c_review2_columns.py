"""REVIEW2's reproducers for ckpt_viz/trace/csrc/columnpass.c: each C function against its Python twin
(ckpt_viz/trace/columnpass.py) where the C took a shortcut the twin does not, and where Python code run by the
cyclic GC inside the C (a finalizer, as PyList_New can collect) changes the lists the C is reading."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ckpt_viz.trace import columnpass

C = columnpass.native()
pytestmark = pytest.mark.skipif(C is None, reason="no C compiler: the Python twins alone are used")


class _EqualsNone:
    """A value equal to None (its own __eq__): groupby, which the twin uses, puts it in None's run."""

    def __eq__(self, other: object) -> bool:
        return other is None or other is self

    __hash__ = object.__hash__


@pytest.mark.parametrize("column", [[None, "odd"], ["odd", None], [1, "odd"]])
def test_run_starts_hands_back_any_value_but_an_int_or_none(column: list[object]) -> None:
    column = [_EqualsNone() if v == "odd" else v for v in column]
    assert C.run_starts(column) is None  # not sure: the twin compares with the value's own __eq__


def test_run_starts_equals_its_twin_on_a_value_equal_to_none() -> None:
    column = [None, _EqualsNone()]
    native = columnpass._NATIVE[:]
    try:
        fast = columnpass.run_starts(column)
        columnpass._NATIVE[:] = [None]
        plain = columnpass.run_starts(column)
    finally:
        columnpass._NATIVE[:] = native
    assert fast == plain == [0]


# A finalizer that runs inside the C call (the cyclic GC collects when PyList_New allocates, once the list
# free list is empty) and empties the argument lists: the C must not read them through pointers or sizes
# taken before (a read of freed memory: a crash under PYTHONMALLOC=debug), and answers None or the twin's result.
_GC_SCRIPT = textwrap.dedent("""
    import gc, sys
    from ckpt_viz.trace import columnpass, fastcheck
    CASE = sys.argv[1]
    cp, lc = columnpass.native(), fastcheck._c()
    inside = False
    ran_inside = 0

    class Finalizer:
        def __init__(self, lists):
            self.lists, self.me = lists, self   # a cycle: only the GC frees it
        def __del__(self):
            global ran_inside
            if inside:
                ran_inside += 1
            for l in self.lists:
                l.clear()

    for attempt in range(20):
        table = [object() for _ in range(50)]
        where = list(range(50)) * 4
        ones = [1] * 50
        if CASE == "take": lists, call = [table, where], lambda: cp.take(table, where)
        elif CASE == "gather": keys = [0] * 200; lists, call = [keys, where], lambda: cp.gather([table], keys, where)
        elif CASE == "rows": lists, call = [where], lambda: cp.rows(where, 60)
        elif CASE == "shifted": lists, call = [where], lambda: cp.shifted(where, 5)
        elif CASE == "identity_counts": lists, call = [table], lambda: cp.identity_counts(table)
        elif CASE == "unpack": lists, call = [table, ones], lambda: lc.unpack(table, ones)
        gc.disable()
        Finalizer(lists)
        keep = [[] for _ in range(200)]  # empties the list free list: the next list is a GC allocation
        gc.set_threshold(1)
        gc.enable()
        inside = True
        result = call()
        inside = False
        gc.set_threshold(700)
        del keep
    print("ran inside", ran_inside)
""")


@pytest.mark.parametrize("case", ["take", "gather", "rows", "shifted", "identity_counts", "unpack"])
def test_a_list_emptied_by_a_finalizer_inside_the_c_is_not_read_after(case: str) -> None:
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    done = subprocess.run([sys.executable, "-X", "dev", "-c", _GC_SCRIPT, case], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("ran inside") and int(done.stdout.split()[-1]) > 0, done.stdout
