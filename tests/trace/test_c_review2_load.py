"""REVIEW2's reproducers for ckpt_viz/trace/csrc/load_checks.c (NOTE [ Checks in C ] in ckpt_viz.trace.fastcheck):
arguments at their edges, and the cut-out columns of a load (split_text) on hostile texts, against the parser."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_viz.trace import fastcheck
from ckpt_viz.trace.io import _put

C = fastcheck._c()
pytestmark = pytest.mark.skipif(C is None, reason="no C compiler: the Python checks alone are used")
I63 = 2**63


@pytest.mark.parametrize("at", [2**63 - 5, 2**63 - 1, -1, -(2**63)])
def test_find_stages_and_categories_refuse_a_position_past_the_text(at: int) -> None:
    # at + 10 overflowed past 2**63 and passed the bound: memcmp read far outside the text (segfault).
    code = (f"from ckpt_viz.trace import fastcheck as f; c = f._c(); "
            f"assert c.find_stages(b'\"by_stage\": []', {at}, ()) is None; "
            f"assert c.find_categories(b'\"bytes_by_category\": {{}}', {at}) is None; print('ok')")
    done = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", (done.returncode, done.stderr[-1000:])


@pytest.mark.parametrize("low, high", [(I63, I63), (-I63, -I63), (I63 - 1, I63), (-I63, -I63 + 1)])
def test_ints_at_the_ends_of_its_range_answers_rather_than_raises(low: int, high: int) -> None:
    column = [low] if low < high else []
    assert fastcheck.ints(column, low, high) == (low < high)
    assert fastcheck.ints([None], low, high, none_ok=True) is True or low >= high


# ---------------------------------------------------------------- split_text on hostile texts

_GOOD = json.dumps({"format": "ckpt_viz.trace", "events": {"count": 3, "columns": {
    "seq": {"start": 0}, "t_ns_delta": [5, 0, 12], "context": [0, 1, 0]}},
    "memory": {"count": 2, "columns": {"by_stage": [{"0": {"activations": 1}}, {}]},
               "bytes_by_category": {"activations": [1, None], "other": [0, 0]}}}).encode()
_BYTES = b' \t\n\r\x0c\x00"\\[]{},:-+0123456789.eEnulltruefalseNaNInfinity\xc3\xa9\xff'


@settings(max_examples=1500, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, len(_GOOD)), st.sampled_from(["insert", "delete", "replace"]),
                                st.sampled_from([bytes([b]) for b in _BYTES] + [b"-0", b"1e3", b"9" * 25, b'\\"',
                                                                                  b"null", b"[", b"]"])),
                      min_size=1, max_size=3))
def test_cut_columns_never_make_a_text_the_parser_refuses_load_nor_read_otherwise(edits: list) -> None:
    text = bytearray(_GOOD)
    for at, how, piece in edits:
        at = min(at, len(text))
        if how == "insert":
            text[at:at] = piece
        elif how == "delete":
            del text[at:at + len(piece)]
        else:
            text[at:at + len(piece)] = piece
    text = bytes(text)
    try:
        expected = json.loads(text)
    except ValueError:
        expected = ValueError
    split = fastcheck.split_text(text, json.loads)
    if split is None:
        return
    rest, placed = split
    try:
        doc = json.loads(rest)
    except ValueError:
        return  # refused as the text is: the load parses the text itself, and refuses it with the parser's error
    if not all(_put(doc, path, placeholder, column) for path, (placeholder, column) in placed.items()):
        return
    assert expected is not ValueError, text  # the C made a text the parser refuses loadable
    for path in placed:
        node = doc
        for key in path[:-1]:
            node = node[key]
        column = node[path[-1]]
        node[path[-1]] = column.tolist() if path[-1] == "t_ns_delta" else column if path[-1] == "bytes_by_category" \
            else list(column)
    assert doc == expected


def test_by_stage_with_a_category_whose_eq_runs_python_does_not_read_freed_dicts() -> None:
    # PySet_Contains calls __eq__ of a set member whose hash matches: Python code inside the C's walk of borrowed
    # dicts (here it empties them: the C then read a freed dict). A set of anything but exact strings: not sure.
    code = """if 1:
        from ckpt_viz.trace import fastcheck as f
        stages = [{"0": {"activations": 1, "other": 2, "parameters": 3}}]
        class Evil:
            def __hash__(self): return hash("activations")
            def __eq__(self, other):
                stages[0].clear()
                return False
        for _ in range(3):
            stages[:] = [{"0": {"activations": 1, "other": 2, "parameters": 3}}]
            assert f.by_stage(stages, {Evil(), "activations", "other", "parameters"}) is False
        print("ok")
    """
    env = {**__import__("os").environ, "PYTHONMALLOC": "debug"}
    done = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.stdout.strip() == "ok", (done.returncode, done.stderr[-1000:])
