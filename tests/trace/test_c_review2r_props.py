"""REVIEW2r (second start of REVIEW2): property tests of the load's and the app's C against their Python twins
on hostile generated inputs. ckpt_viz/trace/csrc/load_checks.c's readers of number text (find_ints,
find_categories, find_stages) against json.loads; ckpt_viz/trace/csrc/columnpass.c's run_signatures, shifted,
identity_counts and run_starts against the Python code of ckpt_viz/trace/columnpass.py (the reference)."""
from __future__ import annotations

import json
import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_trace import make_trace

from ckpt_viz.trace import Trace, columnpass, fastcheck, io

LC = fastcheck._c()
CP = columnpass.native()
needs_c = pytest.mark.skipif(LC is None or CP is None, reason="no C compiler: the Python twins alone are used")
I63, I64 = 2**63, 2**64

# ---------------------------------------------------------------- number text, as JSON may spell it

_WS = st.sampled_from(["", " ", "\t", "\n", "\r", "  \n ", "\x0c", "\x0b", "\xa0"])  # the last three: not JSON
_NUMBER = st.one_of(
    st.integers(-(I64 + 5), I64 + 5).map(str),
    st.sampled_from(["-0", "0", "00", "01", "-01", "-", "+1", "1.", "1.0", "1e3", "1E3", "1e-3", "-0.0", "0x1",
                     "9" * 19, "9" * 20, "9" * 400, "1" + "0" * 18, "9223372036854775807", "9223372036854775808",
                     "-9223372036854775808", "-9223372036854775809", "18446744073709551616", "NaN", "Infinity",
                     "-Infinity", "true", "false", "null", "nul", "nulll", '"1"', "[1]", "1\x00", "\u0661"]))


def _array(draw: Any, items: Any) -> str:
    parts = draw(st.lists(st.tuples(_WS, items, _WS), max_size=6))
    sep = draw(st.sampled_from([",", ", ", " ,", ",,", ""]))
    return "[" + draw(_WS) + sep.join(f"{a}{v}{b}" for a, v, b in parts) + draw(_WS) + "]"


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return ValueError


@needs_c
@settings(max_examples=600, deadline=None)
@given(st.data())
def test_find_ints_reads_an_array_as_json_does_or_not_at_all(data: Any) -> None:
    column = _array(data.draw, _NUMBER)
    text = '{"events": {"columns": {"t_ns_delta": ' + column + ', "context": ' + column + "}}}"
    found = LC.find_ints(text.encode("utf-8"))
    expected = _parsed(column)
    for start, stop, raw in found.values():
        assert text.encode()[start:stop] == column.encode()
        assert expected is not ValueError, column  # C read a column the parser refuses
        assert all(type(v) is int for v in expected), column  # ... or one the parser reads as floats
        values = LC.int_list(raw)
        assert values == expected and [type(v) for v in values] == [int] * len(expected), column


@needs_c
@settings(max_examples=600, deadline=None)
@given(st.data())
def test_find_categories_reads_lists_as_json_does_or_not_at_all(data: Any) -> None:
    names = data.draw(st.lists(st.sampled_from(["activations", "other", "", "a b", "é", "a\\\"b", "x\x01"]),
                               max_size=3))
    members = [f'"{name}"{data.draw(_WS)}:{data.draw(_WS)}{_array(data.draw, _NUMBER)}' for name in names]
    body = "{" + data.draw(_WS) + ",".join(members) + data.draw(_WS) + "}"
    text = '{"memory": {"bytes_by_category"' + data.draw(_WS) + ":" + data.draw(_WS) + body + "}}"
    raw = text.encode("utf-8")
    found = LC.find_categories(raw, raw.rfind(b'"bytes_by_category"'))
    if found is None:
        return
    start, stop, columns = found
    expected = _parsed(body)
    assert raw[start:stop] == body.encode("utf-8")
    assert expected is not ValueError, body
    assert columns == expected and list(columns) == list(expected), body
    assert all(type(v) in (int, type(None)) for column in columns.values() for v in column), body
    assert all(type(v) in (int, type(None)) for column in expected.values() for v in column), body


@needs_c
@settings(max_examples=600, deadline=None)
@given(st.data())
def test_find_stages_cuts_only_what_json_reads_to_checked_objects(data: Any) -> None:
    def reading() -> str:
        name = data.draw(st.sampled_from(["activations", "other", "bogus", "", "activations "]))
        return f'"{name}"{data.draw(_WS)}:{data.draw(_WS)}{data.draw(_NUMBER)}'

    def stage() -> str:
        name = data.draw(st.sampled_from(["0", "", "a\\u0041", "\u00e9", "x\x7f", "by_stage"]))
        body = ",".join(reading() for _ in range(data.draw(st.integers(0, 2))))
        return f'"{name}":{data.draw(_WS)}{{{data.draw(_WS)}{body}}}'

    samples = ["{" + ",".join(stage() for _ in range(data.draw(st.integers(0, 2)))) + "}"
               for _ in range(data.draw(st.integers(0, 3)))]
    column = "[" + data.draw(_WS) + ",".join(samples) + data.draw(_WS) + "]"
    raw = ('{"by_stage":' + data.draw(_WS) + column + "}").encode("utf-8")
    found = LC.find_stages(raw, 1, fastcheck._CATEGORY_BYTES)
    if found is None:
        return
    start, stop, count = found
    expected = _parsed(column)
    assert expected is not ValueError and raw[start:stop] == column.encode(), column
    assert count == len(expected)
    for per_stage in expected:  # what the Python checks pass (schema._check_by_stage)
        for reading_ in per_stage.values():
            assert type(reading_) is dict
            for category, nbytes in reading_.items():
                assert category in fastcheck.MEMORY_CATEGORIES and type(nbytes) is int and 0 <= nbytes < I63


# ---------------------------------------------------------------- the orjson path of a load (io.py, not C)

def _load_both(doc: dict[str, Any]) -> tuple[Trace, Trace]:
    path = Path(tempfile.mkdtemp()) / "t.json"
    path.write_text(json.dumps(doc))
    fast = Trace.load(path)
    saved = io._orjson
    io._orjson = None  # the stdlib path: json.loads, the reference
    try:
        plain = Trace.load(path)
    finally:
        io._orjson = saved
    return fast, plain


@pytest.mark.skipif(io._orjson is None, reason="no orjson: the stdlib parser alone is used")
@pytest.mark.xfail(strict=True, reason="REVIEW2r finding: orjson reads an int past 64 bits as a float; the load "
                                       "keeps it where a float is allowed (session_id, data, tags) instead of "
                                       "handing the file to the stdlib parser")
@pytest.mark.parametrize("big", [10**30, I64, -(I63 + 1)])
def test_an_int_past_64_bits_loads_as_the_same_int_with_or_without_orjson(tmp_path: Path, big: int) -> None:
    trace = make_trace()
    trace.save(tmp_path / "good.json")
    doc = json.loads((tmp_path / "good.json").read_text())
    doc["events"]["columns"]["session_id"][2] = big
    fast, plain = _load_both(doc)
    assert plain.events[2].session_id == big and type(plain.events[2].session_id) is int
    assert type(fast.events[2].session_id) is int and fast.events[2].session_id == big


# ---------------------------------------------------------------- columnpass.c's passes after identity_counts

def _twin(name: str, *args: Any) -> Any:
    native = columnpass._NATIVE[:]
    columnpass._NATIVE[:] = [None]
    try:
        return getattr(columnpass, name)(*args)
    finally:
        columnpass._NATIVE[:] = native


_INT_LIKE = st.one_of(st.integers(-3, 3), st.integers(-(I64 + 2), I64 + 2), st.sampled_from(
    [True, False, None, 1.0, 0.0, -0.0, math.nan, 2**62, -(2**62), 2**62 - 1, -(2**62) + 1, I63 - 1, -I63]))


@needs_c
@settings(max_examples=500, deadline=None)
@given(st.data())
def test_run_signatures_equals_its_twin(data: Any) -> None:
    n = data.draw(st.integers(0, 12))
    small = st.one_of(st.integers(0, 2), _INT_LIKE)
    a = data.draw(st.lists(data.draw(st.sampled_from([st.integers(0, 2), small])), min_size=n, max_size=n + 2))
    b = data.draw(st.lists(data.draw(st.sampled_from([st.integers(0, 2), small])), min_size=n, max_size=n + 2))
    starts = data.draw(st.one_of(
        st.sets(st.integers(0, max(n - 1, 0)), max_size=n).map(sorted),
        st.lists(st.one_of(st.integers(-2, n + 2), st.sampled_from([True, 1.0, I64])), max_size=5)))
    if not starts or starts[0] != 0:
        starts = data.draw(st.sampled_from([starts, [0, *starts]]))
    n_arg = data.draw(st.sampled_from([n, n, len(a) + 1, -1]))
    fast = CP.run_signatures(starts, n_arg, a, b)
    try:
        plain = _twin("run_signatures", starts, n_arg, a, b)
    except (TypeError, IndexError) as err:
        assert fast is None, err  # C answered where the twin raises
        return
    if fast is not None:
        assert fast == plain and [type(v) for v in fast] == [type(v) for v in plain], (starts, n_arg, a, b)
    assert columnpass.run_signatures(starts, n_arg, a, b) == plain


@needs_c
@settings(max_examples=500, deadline=None)
@given(column=st.lists(_INT_LIKE, max_size=8),
       k=st.one_of(st.integers(-3, 3), st.sampled_from([2**62 - 1, -(2**62) + 1, 2**62, -(2**62), I63 - 1, -I63])))
def test_shifted_equals_its_twin(column: list[Any], k: int) -> None:
    try:
        plain = _twin("shifted", column, k)
    except TypeError:
        with pytest.raises(TypeError):
            columnpass.shifted(column, k)
        return
    fast = columnpass.shifted(column, k)
    assert len(fast) == len(plain)
    for x, y in zip(fast, plain):
        assert type(x) is type(y) and (x == y or (x != x and y != y))


@needs_c
@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([1, True, 1.0, 0, False, -0.0, 0.0, None, "a", math.nan, (1,), 2**70]),
                max_size=12))
def test_identity_counts_equals_counter_with_its_keys_and_order(values: list[Any]) -> None:
    expected = Counter(values)
    got = columnpass.identity_counts(values)
    assert list(got.items()) == list(expected.items())
    assert [type(k) for k in got] == [type(k) for k in expected]  # 1 stays 1 (not True) where it came first


@needs_c
@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([1, True, 1.0, 0, False, None, 2**70, 2**70 + 0, -1, math.nan]), max_size=12))
def test_run_starts_equals_groupby(values: list[Any]) -> None:
    assert columnpass.run_starts(values) == _twin("run_starts", values)
