"""ckpt_viz.trace.columnpass: the C passes (csrc/columnpass.c) give exactly what their Python twins give, on random
and edge inputs, and hand anything unusual back to Python (NOTE [ Column passes ])."""
from __future__ import annotations

import itertools
import random
import sys
from collections import Counter
from operator import getitem, itemgetter

import pytest

from ckpt_viz.trace import columnpass

C = columnpass.native()
needs_c = pytest.mark.skipif(C is None, reason="no C compiler: the Python code is used (NOTE [ C speed-ups ])")


@pytest.fixture(params=["c", "python"])
def impl(request, monkeypatch):
    """columnpass as it runs with the C module, and with the Python code only."""
    if request.param == "c" and C is None:
        pytest.skip("no C compiler")
    if request.param == "python":
        monkeypatch.setattr(columnpass, "_NATIVE", [None])
    return columnpass


def _plain_rows(shape, shapes):
    counters = [itertools.count() for _ in range(shapes)]
    return list(map(next, map(counters.__getitem__, shape)))


def _plain_runs(column):
    lens = list(map(len, map(list, map(itemgetter(1), itertools.groupby(column)))))
    return list(itertools.accumulate(lens, initial=0))[:-1]


@pytest.mark.parametrize("seed", range(5))
def test_random_columns_give_the_plain_results(impl, seed):
    rng = random.Random(seed)
    n = rng.choice([0, 1, 2, 17, 5_000])
    shapes = rng.randint(1, 40)
    shape = [rng.randrange(shapes) for _ in range(n)]
    assert impl.rows(shape, shapes) == _plain_rows(shape, shapes)
    rows = _plain_rows(shape, shapes)
    tables = [[rng.choice([None, "a", 3, (1, 2)]) for _ in range(shape.count(k) + 1)] for k in range(shapes)]
    tables[0] = bytes(rng.randrange(256) for _ in range(len(tables[0])))  # a shape of no key reads zeros
    assert impl.gather(tables, shape, rows) == list(map(getitem, map(tables.__getitem__, shape), rows))
    table = [rng.choice(["a", None, 7]) for _ in range(shapes)]
    assert impl.take(table, shape) == [table[k] for k in shape]
    handles = [rng.choice([None, 0, 1, 2, 10**20]) for _ in range(n)]  # runs, a big int, None between
    assert impl.run_starts(handles) == _plain_runs(handles)
    kinds = [rng.choice(["a", "b", "c", "".join(["a", ""])]) for _ in range(n)]  # equal strings, other objects
    counted = impl.identity_counts(kinds)
    assert counted == Counter(kinds) and list(counted) == list(Counter(kinds))


def test_edge_cases_give_the_python_results_and_errors(impl):
    assert impl.rows([], 0) == []
    assert impl.rows([0, 0, 1, 0], 2) == [0, 1, 0, 2]
    with pytest.raises(IndexError):  # a shape id past the shapes: the Python error
        impl.rows([0, 3], 2)
    with pytest.raises(IndexError):
        impl.gather([[1]], [0], [1])
    assert impl.gather([[1, 2], b"\x00\x07"], [1, 0, 1], [1, 0, -2]) == [7, 1, 0]  # negative index as Python
    assert impl.gather([[1], (5, 6)], [1], [1]) == [6]  # a tuple table: Python does it
    assert impl.take(["a", "b"], [1, -1, 0]) == ["b", "b", "a"]  # negative index as Python
    assert impl.take(("a", "b"), [1]) == ["b"]
    with pytest.raises(IndexError):
        impl.take(["a"], [0, 1])
    assert impl.run_starts([]) == []
    assert impl.run_starts([None, None, 1, 1.0, True, "x", "x"]) == [0, 2, 5]  # equal, not identical: one run
    assert impl.run_starts([int("300"), int("300"), None, int("301")]) == [0, 2, 3]
    assert impl.identity_counts([]) == Counter()
    many = [f"k{i % 300}" for i in range(900)]  # more distinct objects than C keeps
    assert impl.identity_counts(many) == Counter(many)
    with pytest.raises(TypeError):
        impl.identity_counts([[1], [1]])


@needs_c
def test_c_hands_unusual_inputs_back_and_keeps_counts_of_references():
    assert C.rows((0, 1), 2) is None and C.rows([0, -1], 2) is None and C.rows([0, "a"], 2) is None
    assert C.gather([[1]], [0], [5]) is None and C.gather([[1]], [0, 0], [0]) is None
    assert C.take(["a"], [1]) is None and C.take(["a"], [0.0]) is None and C.take(["a"], range(1)) is None
    assert C.run_starts([1, "a"]) is None and C.run_starts([1.0, float("1")]) is None
    assert C.identity_counts([object() for _ in range(300)]) is None
    value = object()
    before = sys.getrefcount(value)
    got = C.gather([[value] * 3], [0, 0], [0, 2])
    held = sys.getrefcount(value)
    assert held == before + 2 and got[0] is value and got[1] is value
    del got
    pairs = C.identity_counts([value, value, None])
    held = sys.getrefcount(value)
    assert held == before + 1 and pairs[0][0] is value and pairs[0][1] == 2 and pairs[1] == (None, 1)
    del pairs
    assert sys.getrefcount(value) == before
    big = 10**20
    before = sys.getrefcount(big)
    starts = C.run_starts([big, big, None])
    assert starts == [0, 2] and sys.getrefcount(big) == before
    rows = C.rows([0] * 1000 + [1] * 1000, 2)
    assert rows == list(range(1000)) * 2 and rows[500] is rows[1500]  # one int object per row number


def _plain_signatures(starts, n, a, b):
    numbers: dict = {}
    ends = [*starts[1:], n]
    return [numbers.setdefault((tuple(a[s:e]), tuple(b[s:e])), k) for k, (s, e) in enumerate(zip(starts, ends))]


@pytest.mark.parametrize("seed", range(6))
def test_run_signatures_number_the_runs_like_tuples_do(impl, seed):
    rng = random.Random(seed)
    n = rng.choice([0, 1, 2, 40, 3_000])
    starts = sorted(rng.sample(range(n), rng.randint(1, n))) if n else []
    if starts and rng.random() < 0.7:
        starts[0] = 0
    small = rng.choice([[0, 1], [-1, 5, 2**62, -(2**63)], list(range(30))])
    a = [rng.choice(small) for _ in range(n + rng.randint(0, 2))]
    b = [rng.choice([1, 2]) for _ in range(n)]
    assert impl.run_signatures(starts, n, a, b) == _plain_signatures(starts, n, a, b)


def test_run_signatures_hand_unusual_inputs_to_python(impl):
    assert impl.run_signatures([], 0, [], []) == []
    assert impl.run_signatures([0, 2, 4], 6, [1, 2, 1, 2, 1, 3], [0] * 6) == [0, 0, 2]
    for starts, n, a, b in [([0], 3, [1, "a", 2], [0, 0, 0]), ([0, 0], 2, [1, 2], [1, 2]),
                            ([0, 1], 2, [10**20, 10**20], [0, 0]), ([0, 1], 2, [(1, "dx"), (1, "dx")], [0, 0]),
                            ([0, 1], 2, [True, 1], [0, 0]), ([0, 5], 2, [1, 1], [0, 0]), ([0, 1], 2, [1, 1], range(2))]:
        assert impl.run_signatures(starts, n, a, b) == _plain_signatures(starts, n, list(a), list(b))
    if C is not None:
        assert C.run_signatures([0], 3, [1, "a", 2], [0, 0, 0]) is None
        assert C.run_signatures([0, 1], 2, [10**20, 10**20], [0, 0]) is None
    with pytest.raises(TypeError):
        impl.run_signatures([0, 1], 2, [1, {}], [0, [1]])


@pytest.mark.parametrize("seed", range(4))
def test_shifted_adds_like_python(impl, seed):
    rng = random.Random(seed)
    column = [rng.choice([0, 7, -5, 2**61, -(2**61), 10**6]) for _ in range(rng.choice([0, 1, 500]))]
    k = rng.choice([0, 3, -(2**61), 10**9])
    assert impl.shifted(column, k) == [v + k for v in column]


def test_shifted_hands_unusual_values_to_python(impl):
    for column, k in [([1, 2**62], 1), ([1], 2**62), ([1], 2**70), ([True, 1], 1), ([1.5], 1), ([1], -(2**63))]:
        assert impl.shifted(column, k) == [v + k for v in column]
    if C is not None:
        assert C.shifted([1, True], 1) is None and C.shifted([2**62], 0) is None
    with pytest.raises(TypeError):
        impl.shifted([1, "a"], 1)
