"""The checks of a trace document in C (ckpt_viz.trace.fastcheck, NOTE [ Checks in C ]) against the Python checks.

Every corrupt document of tests/trace is checked both ways and must give the same message; random edits of
good documents too; good documents pass both ways and load to the same columns. The C functions are also
compared one by one with a Python statement of what each answers, on random and edge-case columns.
"""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from old_layout import as_schema1
from test_hostile import HUGE
from test_hostile import _doc as hostile_doc
from test_packed import BAD_PACKED, runs_trace
from test_trace import BAD_DOCS, BAD_SCHEMA1_DOCS, JSON_VALUES, _paths, make_trace

from ckpt_viz.trace import Trace, fastcheck
from ckpt_viz.trace.io import _put, parts_from_dict
from ckpt_viz.trace.schema import InvalidDocument, check_document
from ckpt_viz.trace.types import MEMORY_CATEGORIES

C = fastcheck._c()
pytestmark = pytest.mark.skipif(C is None, reason="no C compiler: the Python checks alone are used")
I63 = 2**63


def _outcome(doc: Any, use_c: bool, **options: Any) -> tuple[str, str] | None:
    """(what, tip) of the first problem check_document finds, or None; with or without the C checks."""
    saved = fastcheck._C
    fastcheck._C = C if use_c else None
    try:
        check_document(copy.deepcopy(doc), **options)
    except InvalidDocument as bad:
        return bad.what, bad.tip
    except (KeyError, TypeError, IndexError, AttributeError) as err:
        # Only with built_here=True (a save's document, whose layout to_dict made) on an edited layout.
        assert options.get("built_here"), err
        return _CRASH
    finally:
        fastcheck._C = saved
    return None


_CRASH = ("crash", "")


def _both(doc: Any, **options: Any) -> tuple[str, str] | None:
    without = _outcome(doc, False, **options)
    if without is not _CRASH:  # where the Python checks fail on a layout no save makes, C may see further
        assert _outcome(doc, True, **options) == without
    return without


def _good(tmp_path: Path, trace: Trace) -> dict[str, Any]:
    trace.save(tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text())


@pytest.mark.parametrize("schema", [1, 2])
@pytest.mark.parametrize("mutate, phrase", BAD_DOCS + BAD_SCHEMA1_DOCS,
                         ids=[phrase[:40] for _, phrase in BAD_DOCS + BAD_SCHEMA1_DOCS])
def test_every_bad_field_gives_the_same_message_with_c(tmp_path: Path, mutate: Any, phrase: str, schema: int) -> None:
    doc = _good(tmp_path, make_trace())
    if schema == 1:
        doc = as_schema1(doc)
    mutate(doc)
    found = _both(doc)
    if schema == 1 or (mutate, phrase) not in BAD_SCHEMA1_DOCS:  # in schema 2 those are other edits, or none
        assert found is not None and phrase in found[0]


@pytest.mark.parametrize("good, mutate, phrase", BAD_PACKED, ids=[p[:40] for _, _, p in BAD_PACKED])
def test_every_bad_packed_column_gives_the_same_message_with_c(tmp_path: Path, good: Any, mutate: Any,
                                                               phrase: str) -> None:
    doc = good(tmp_path)
    mutate(doc)
    found = _both(doc)
    assert found is not None and phrase in found[0]


@pytest.mark.parametrize("mutate, phrase", HUGE, ids=[p[:40] for _, p in HUGE])
def test_every_number_out_of_range_gives_the_same_message_with_c(tmp_path: Path, mutate: Any, phrase: str) -> None:
    doc = hostile_doc(tmp_path)
    mutate(doc)
    found = _both(doc)
    assert found is not None and phrase in found[0]


def test_a_non_finite_float_and_an_event_cap_give_the_same_message_with_c(tmp_path: Path) -> None:
    doc = _good(tmp_path, make_trace(200))
    assert _both(doc, max_events=100)[0].startswith("it holds 200 events, over the cap of 100")
    doc["events"]["columns"]["data"]["values"][4][1][3] = math.inf
    assert "is inf (a number), expected a finite number" in _both(doc)[0]
    doc = _good(tmp_path, runs_trace())
    doc["events"]["columns"]["session_id"]["values"][1] = math.nan
    assert "session_id is nan (a number), expected a finite number" in _both(doc)[0]


@pytest.mark.parametrize("make", [lambda: make_trace(300), lambda: runs_trace(40), lambda: make_trace(0)],
                         ids=["varied", "runs", "empty"])
def test_good_documents_pass_both_ways_and_load_the_same(tmp_path: Path, make: Any) -> None:
    doc = _good(tmp_path, make())
    assert _both(doc) is None and _both(doc, built_here=True) is None
    loaded = {}
    for use_c in (True, False):
        fastcheck._C, saved = (C if use_c else None), fastcheck._C
        try:
            loaded[use_c] = Trace(**parts_from_dict(copy.deepcopy(doc)))
        finally:
            fastcheck._C = saved
    assert list(loaded[True].events) == list(loaded[False].events)
    assert list(loaded[True].memory) == list(loaded[False].memory) and loaded[True].meta == loaded[False].meta


# Values that sit on an edge of some check: types JSON tells apart, the ends of the ranges, non-finite floats.
EDGES = [None, True, False, 0, 1, -1, 2, 2**63 - 1, 2**63, -2**63, 2**64, 10**40, 0.0, -0.0, 1.5, 1e40,
         math.inf, -math.inf, math.nan, "", "x", "0", [], [0], {}, {"activations": 1}]
EDIT = st.sampled_from(EDGES) | JSON_VALUES


def _edit(doc: dict[str, Any], path: tuple[Any, ...], data: st.DataObject) -> None:
    node: Any = doc
    for part in path[:-1]:
        node = node[part]
    if data.draw(st.booleans()) and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(EDIT)


_DOCS = {}


def _doc_of(name: str) -> dict[str, Any]:
    if name not in _DOCS:
        trace = {"varied": lambda: make_trace(60), "runs": lambda: runs_trace(12)}[name]()
        _DOCS[name] = json.loads(json.dumps(trace.to_dict()))
    return copy.deepcopy(_DOCS[name])


@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_edits_give_the_same_outcome_with_c(data: st.DataObject) -> None:
    doc = _doc_of(data.draw(st.sampled_from(["varied", "runs"])))
    for _ in range(data.draw(st.integers(1, 3))):  # up to three problems: the same one must be named first
        paths = _paths(doc)[1:]
        if not paths:
            break
        _edit(doc, data.draw(st.sampled_from(paths)), data)
    _both(doc)
    _both(doc, built_here=True)


# ---------------------------------------------------------------- each function against its statement

COLUMNS = st.lists(st.sampled_from(EDGES[:20]) | st.integers(-5, 300), max_size=40)


def _is_int(v: Any) -> bool:
    return type(v) is int


@settings(max_examples=300, deadline=None)
@given(column=COLUMNS, low=st.sampled_from([0, 1, -5]), high=st.sampled_from([0, 3, 300, I63, I63 - 1]),
       none_ok=st.booleans())
def test_each_c_function_answers_what_it_says(column: list[Any], low: int, high: int, none_ok: bool) -> None:
    assert fastcheck.ints(column, low, high, none_ok) == all(
        (v is None and none_ok) or (_is_int(v) and low <= v < high) for v in column)
    counts = fastcheck.index_counts(column, high) if high < 1000 else None
    if high < 1000:
        fine = all(_is_int(v) and 0 <= v < high for v in column)
        assert counts == ([column.count(k) for k in range(high)] if fine else None)
    assert fastcheck.times(column) == (all(_is_int(v) and v >= 0 for v in column) and sum(
        v for v in column if _is_int(v)) < I63)
    count = sum(v for v in column if _is_int(v) and v > 0)
    assert fastcheck.runs(column, count) == (count < I63 and all(_is_int(v) and 1 <= v <= count for v in column))
    allowed = {int, str, type(None)} if none_ok else {float, bool}
    assert fastcheck.kinds(column, allowed) == all(
        type(v) in allowed and (type(v) is not float or math.isfinite(v)) for v in column)
    assert fastcheck.finite(column) == all(type(v) is not float or math.isfinite(v) for v in column)


@settings(max_examples=200, deadline=None)
@given(stages=st.lists(st.sampled_from([{}, {"0": {}}, {"0": {"activations": 5}}, {"1": {"other": 0}},
                                         {"0": {"activations": -1}}, {"0": {"weights": 1}}, {"0": 5},
                                         {"0": {"activations": 2**63}}, {"0": {"activations": True}},
                                         {"0": {"activations": 1.0}}, []]), max_size=6))
def test_by_stage_answers_what_it_says(stages: list[Any]) -> None:
    def fine(s: Any) -> bool:
        return type(s) is dict and all(type(r) is dict and all(
            k in MEMORY_CATEGORIES and _is_int(v) and 0 <= v < I63 for k, v in r.items()) for r in s.values())
    assert fastcheck.by_stage(stages, set(MEMORY_CATEGORIES)) == all(map(fine, stages))


def test_the_c_functions_keep_reference_counts_and_run_clean_under_dev_mode() -> None:
    big = 10**12 + 7
    column = [big, None, "s", 1.5, {}, big]
    before = [sys.getrefcount(v) for v in column]
    for _ in range(1000):
        fastcheck.ints(column, 0, I63, True), fastcheck.times(column), fastcheck.runs(column, 3)
        fastcheck.kinds(column, {int, str}), fastcheck.finite(column), fastcheck.by_stage(column, {"a"})
        fastcheck.index_counts([0, 1, 1], 2)
    assert [sys.getrefcount(v) for v in column] == before
    text = b'{"events": {"columns": {"t_ns_delta": [1, 2]}}}' + bytes(8)
    held = sys.getrefcount(text)
    for _ in range(1000):
        fastcheck.split_text(text, json.loads), fastcheck.split_text(text[:-12], json.loads)
        C.find_stages(b'"by_stage": [{"0": {"other": 1}}]', 0, (b"other",)), C.find_ints(text[:-14])
        C.int_list(bytes(16))
    assert sys.getrefcount(text) == held
    counts = fastcheck.index_counts([0, 1, 1, 2**40], 3)
    assert counts is None and fastcheck.index_counts([0, 1, 1], 3) == [1, 2, 0]
    code = ("from ckpt_viz.trace import fastcheck as f; import math; "
            "assert f.ints([1, None], 0, 5, True) and not f.ints([True], 0, 5); "
            "assert f.index_counts([0, 2], 3) == [1, 0, 1] and f.index_counts([3], 3) is None; "
            "assert f.times([1, 2]) and not f.times([2**62, 2**62]); assert f.runs([1, 2], 3); "
            "assert f.kinds(['a', 1.5], {str, float}) and not f.finite([math.nan]); "
            "assert f.by_stage([{'0': {'other': 1}}], {'other'}); "
            "import json; t = b'{\"events\": {\"columns\": {\"t_ns_delta\": [1, 2]}}}'; "
            "r = f.split_text(t, json.loads); "
            "d = r[1][('events', 'columns', 't_ns_delta')]; assert d[1].tolist() == [1, 2] and d[0] in r[0].decode(); "
            "assert f.split_text(t[:-9], json.loads) is None and f.times(d[1]); "
            "assert f._c().find_stages(b'\"by_stage\": [{\"0\": {\"other\": 1}}]', 0, (b'other',)) == (12, 33, 1); "
            "print('ok')")
    done = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok" and "Warning" not in done.stderr, done.stderr


def test_without_the_c_module_every_answer_is_not_sure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastcheck, "_C", None)
    assert not fastcheck.ints([1], 0, 5) and fastcheck.index_counts([0], 1) is None and not fastcheck.times([1])
    assert not fastcheck.runs([1], 1) and not fastcheck.kinds([1], {int}) and not fastcheck.finite([1])
    assert not fastcheck.by_stage([], {"a"})


# ---------------------------------------------------------------- t_ns differences read in C (NOTE rule 4)

def _parsed_with_split(text: bytes) -> Any:
    """What the load's first try makes of `text`: the document with the columns read in C put in, or None
    (not sure: the load parses the text as it is)."""
    split = fastcheck.split_text(text, json.loads)
    if split is None:
        return None
    rest, placed = split
    try:
        doc = json.loads(rest)
    except ValueError:
        return None
    if not all(_put(doc, path, placeholder, column) for path, (placeholder, column) in placed.items()):
        return None
    for path, (_, column) in placed.items():  # compare as the lists they stand for
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = column.tolist() if path[-1] == "t_ns_delta" else column if path[-1] == "bytes_by_category" \
            else list(column)
    return doc


SPLIT_CASES = [
    b'{"events": {"columns": {"t_ns_delta": [1, 2, 3]}}}',
    b'{ "format" : "x" ,\n "events" :{ "count":3,"columns":{"seq":{"start":0},'
    b'"t_ns_delta":[ 0 , -0,\t-5 ,\r\n9223372036854775807 ] } } }',
    b'{"meta": {"a]": "}{[\\"", "b": [[{}], {"c": "\\\\"}]}, '
    b'"events": {"tables": {"x": "t_ns_delta"}, "columns": {"t_ns_delta": []}}}',
    b'{"events": {"columns": {"t_ns_delta": [1], "t_ns_delta": [2]}}}',  # a repeated key: the parser takes the last
    b'{"events": {"columns": {"t_ns_delta": [1]}}, "events": {"columns": {"t_ns_delta": [5]}}}',
    b'{"events": {"columns": {"t_ns\\u005fdelta": [7], "t_ns_delta": [1]}}}',
    b'{"events": {"columns": {"t_ns_delta": [1], "t_ns\\u005fdelta": [7]}}}',
]
NOT_SPLIT = [
    b'{"events": {"columns": {"t_ns_delta": [1.0]}}}', b'{"events": {"columns": {"t_ns_delta": [1e3]}}}',
    b'{"events": {"columns": {"t_ns_delta": [01]}}}', b'{"events": {"columns": {"t_ns_delta": [9223372036854775808]}}}',
    b'{"events": {"columns": {"t_ns_delta": [1,]}}}', b'{"events": {"columns": {"t_ns_delta": [1 2]}}}',
    b'{"events": {"columns": {"t_ns_delta": ["1"]}}}', b'{"events": {"columns": {"t_ns_delta": [1, null]}}}',
    b'{"events": {"columns": {"t_ns_delta": [-]}}}', b'{"events": {"columns": {"t_ns_delta": [1', b'{"events": {"col',
    b'{"events": [{"columns": {"t_ns_delta": [1]}}]}', b'[{"events": {"columns": {"t_ns_delta": [1]}}}]', b'',
    b'{"events": {"columns": {"t_ns_delta": {"a": [1]}}}}',
]


@pytest.mark.parametrize("text", SPLIT_CASES + NOT_SPLIT)
def test_t_ns_read_in_c_gives_what_the_parser_gives_or_nothing(text: bytes) -> None:
    found = _parsed_with_split(text)
    if text in NOT_SPLIT:
        assert found is None
    elif text in SPLIT_CASES[:3]:  # the others repeat a key: read in C, or not, but never read otherwise
        assert found is not None
    if found is not None:
        assert found == json.loads(text)


INTS = st.lists(st.integers(1 - 2**63, 2**63 - 1) | st.integers(0, 300), max_size=20)


@settings(max_examples=300, deadline=None)
@given(doc=st.fixed_dictionaries({"events": st.fixed_dictionaries(
    {"columns": st.fixed_dictionaries({"t_ns_delta": INTS}, optional={
        "seq": JSON_VALUES, "context": INTS | JSON_VALUES, "data": JSON_VALUES, "handle_id": JSON_VALUES})},
    optional={"tables": JSON_VALUES, "count": JSON_VALUES})}, optional={"meta": JSON_VALUES, "format": st.text()}),
    indent=st.sampled_from([None, 0, 2]), ascii=st.booleans(), order=st.randoms())
def test_t_ns_read_in_c_matches_the_parser_on_any_layout(doc: dict[str, Any], indent: Any, ascii: bool,
                                                          order: Any) -> None:
    columns = doc["events"]["columns"]
    names = list(columns)
    order.shuffle(names)
    doc["events"]["columns"] = {name: columns[name] for name in names}
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii).encode()
    found = _parsed_with_split(text)
    assert found == json.loads(text)  # every such document is read in C: no key repeats
    placed = fastcheck.split_text(text, json.loads)[1]
    context = columns.get("context")
    assert (("events", "columns", "context") in placed) == (type(context) is list and all(
        type(v) is int for v in context))


def test_a_loaded_trace_reads_the_same_with_t_ns_read_in_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = make_trace(5000)
    trace.save(tmp_path / "t.json.gz")
    fast = Trace.load(tmp_path / "t.json.gz")
    assert type(fast.events.columns["t_ns"]._deltas).__name__ == "array"  # read in C
    monkeypatch.setattr(fastcheck, "_C", None)
    plain = Trace.load(tmp_path / "t.json.gz")
    assert type(plain.events.columns["t_ns"]._deltas) is list
    a, b = fast.events.columns["t_ns"], plain.events.columns["t_ns"]
    assert len(a) == len(b) and a[0] == b[0] and a[4999] == b[4999] and a[-1] == b[-1] and a[10:20] == b[10:20]
    assert [a[i] for i in range(0, 5000, 7)] == [b[i] for i in range(0, 5000, 7)] and list(a) == list(b) and a == b
    assert list(fast.events) == list(plain.events) == list(trace.events)
    assert type(fast.events.columns["context"]) is list and fast.events.columns["context"] == plain.events.columns[
        "context"]  # read in C, the same list
    fast.save(tmp_path / "again-fast.json.gz")
    plain.save(tmp_path / "again-plain.json.gz")
    assert (tmp_path / "again-fast.json.gz").read_bytes() == (tmp_path / "again-plain.json.gz").read_bytes()


@pytest.mark.parametrize("mutate, phrase", [
    *BAD_DOCS,
    (lambda d: d["events"]["columns"]["t_ns_delta"].__setitem__(3, -10**18), "events[3].t_ns is"),
    (lambda d: d["events"]["columns"]["t_ns_delta"].__setitem__(3, 2**63 - 1), "events[3].t_ns is"),
    (lambda d: d["events"]["columns"]["t_ns_delta"].pop(), "has 39 values but events.count is 40"),
], ids=lambda v: v[:30] if isinstance(v, str) else None)
def test_a_bad_file_gets_the_same_error_with_t_ns_read_in_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            mutate: Any, phrase: str) -> None:
    doc = _good(tmp_path, make_trace())
    mutate(doc)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    messages = []
    for c in (C, None):
        monkeypatch.setattr(fastcheck, "_C", c)
        with pytest.raises(Exception) as info:
            Trace.load(tmp_path / "t.json")
        messages.append(str(info.value))
    assert messages[0] == messages[1] and phrase in messages[0]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.sampled_from(EDGES[:20]), max_size=12), runs=st.lists(st.sampled_from(
    [0, 1, 2, 5, -1, True, 1.0, None, 2**70]), max_size=12))
def test_unpack_gives_the_python_unpack_or_nothing(values: list[Any], runs: list[Any]) -> None:
    fast = fastcheck.unpack(values, runs)
    if len(values) == len(runs) and all(type(r) is int and 0 <= r < 2**40 for r in runs):
        plain = [v for v, r in zip(values, runs) for _ in range(r)]
        assert fast is not None and len(fast) == len(plain)
        assert all(a is b for a, b in zip(fast, plain))  # the same objects, repeated
    else:
        assert fast is None
    shared = object()
    before = sys.getrefcount(shared)
    unpacked = fastcheck.unpack([shared, 1], [3, 2])
    assert sys.getrefcount(shared) == before + 3
    del unpacked
    assert sys.getrefcount(shared) == before



def _stages_fine(stages: list[Any]) -> bool:
    return all(type(s) is dict and all(type(r) is dict and all(
        k in MEMORY_CATEGORIES and _is_int(v) and 0 <= v < I63 for k, v in r.items()) for r in s.values())
        for s in stages)


def _memory_doc(stages: Any) -> dict[str, Any]:
    return {"events": {"columns": {"t_ns_delta": [1, 2]}}, "memory": {"count": 3, "columns": {
        "seq": [0, 1, 2], "by_stage": stages}, "bytes_by_category": {}}, "graphs": []}


STAGES = st.lists(st.dictionaries(st.sampled_from(["0", "1", "st\u00e9ge", "a b", "\u00e9", '"', "\\", "\x7f",
                                                  "a\\u0062"]),
                                  st.dictionaries(st.sampled_from([*MEMORY_CATEGORIES, "weights", "activations "]),
                                                  st.sampled_from([0, 1, 2**63 - 1, 2**63, -1, 1.0, True, None, "1"]),
                                                  max_size=3) | st.sampled_from([5, [], None]), max_size=3), max_size=5)


@settings(max_examples=400, deadline=None)
@given(stages=STAGES, indent=st.sampled_from([None, 0, 1]), ascii=st.booleans())
def test_by_stage_cut_out_in_c_reads_as_the_parser_reads_it(stages: list[Any], indent: Any, ascii: bool) -> None:
    text = json.dumps(_memory_doc(stages), indent=indent, ensure_ascii=ascii).encode()
    found = _parsed_with_split(text)
    assert found == json.loads(text)
    split = fastcheck.split_text(text, json.loads)
    cut = ("memory", "columns", "by_stage") in split[1]
    plain = all(key.isascii() and key.isprintable() and '"' not in key and "\\" not in key
                for s in stages if type(s) is dict for key in s)
    assert cut == (plain and _stages_fine(json.loads(text)["memory"]["columns"]["by_stage"]))


@pytest.mark.parametrize("text, cut", [
    (b'"by_stage": []', True),
    (b'"by_stage" :\n[ { } , {"0":{}} ,{"x y":{"other":0,"activations":9223372036854775807}}]', True),
    (b'"by_stage": [{"0": {"other": -0}}]', False), (b'"by_stage": [{"0": {"other": 01}}]', False),
    (b'"by_stage": [{"0": {"other": 1e3}}]', False), (b'"by_stage": [{"0": {"other": 9223372036854775808}}]', False),
    (b'"by_stage": [{"0": {"oth\\u0065r": 1}}]', False), (b'"by_stage": [{"\\u0030": {"other": 1}}]', False),
    (b'"by_stage": [{"0": {"other": 1}}', False), (b'"by_stage": [{"0": {"other": 1},}]', False),
    (b'"by_stage": null', False), (b'"by_stage": [{"0": {"other": 1}}], "by_stage": [{"1": {}}]', None),
])
def test_by_stage_is_cut_out_only_in_the_plain_form(text: bytes, cut: bool | None) -> None:
    doc = b'{"memory": {"columns": {' + text + b'}}}'
    split = fastcheck.split_text(doc, json.loads)
    found = _parsed_with_split(doc)
    if cut is not None:
        assert (split is not None and ("memory", "columns", "by_stage") in split[1]) == cut
    if found is not None:
        assert found == json.loads(doc)


def test_a_loaded_traces_by_stage_is_read_when_a_sample_is(tmp_path: Path) -> None:
    trace = make_trace(300)
    trace.save(tmp_path / "t.json.gz")
    loaded = Trace.load(tmp_path / "t.json.gz")
    stages = loaded.memory.columns["by_stage"]
    assert type(stages).__name__ == "JSONColumn" and stages._list is None and len(stages) == len(trace.memory)
    assert loaded.memory[4] == trace.memory[4] and stages._list is not None
    assert list(loaded.memory) == list(trace.memory)
    again = Trace.load(tmp_path / "t.json.gz")
    again.save(tmp_path / "again.json.gz")  # unread: written from its text's objects
    assert Trace.load(tmp_path / "again.json.gz").memory == trace.memory


CATEGORY_COLUMNS = st.dictionaries(st.sampled_from(["activations", "other", "w\u00e9", "a\\u0062", '"', "x y"]),
                                   st.lists(st.sampled_from([0, 0, 7, 7, 2**63 - 1, -3, None, 1.5, True, "1", 2**63]),
                                            max_size=6) | st.sampled_from([None, {}, 5]), max_size=4)


@settings(max_examples=300, deadline=None)
@given(columns=CATEGORY_COLUMNS, indent=st.sampled_from([None, 0, 1]), ascii=st.booleans())
def test_bytes_by_category_read_in_c_reads_as_the_parser_reads_it(columns: Any, indent: Any, ascii: bool) -> None:
    doc = {"memory": {"count": 6, "bytes_by_category": columns}}
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii).encode()
    found = _parsed_with_split(text)
    assert found is None or found == json.loads(text)
    plain = all(type(v) is list and all(x is None or (type(x) is int and -2**63 < x < 2**63) for x in v)
                and k.isascii() and k.isprintable() and '"' not in k and "\\" not in k for k, v in columns.items())
    split = fastcheck.split_text(text, json.loads)
    assert (split is not None and ("memory", "bytes_by_category") in split[1]) == plain
    if plain:
        read = split[1][("memory", "bytes_by_category")][1]
        assert read == columns and all(type(x) is type(y) for k in columns for x, y in zip(read[k], columns[k]))


def test_a_loaded_traces_byte_counts_read_in_c_read_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = make_trace(300)
    trace.save(tmp_path / "t.json.gz")
    fast = Trace.load(tmp_path / "t.json.gz")
    by_category = fast.memory.columns["bytes_by_category"]
    assert len({id(v) for v in by_category["parameters"]}) == 1  # a constant category: one object
    monkeypatch.setattr(fastcheck, "_C", None)
    plain = Trace.load(tmp_path / "t.json.gz")
    assert by_category == plain.memory.columns["bytes_by_category"] and list(fast.memory) == list(trace.memory)
