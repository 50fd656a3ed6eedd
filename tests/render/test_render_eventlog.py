"""filter_events / event_rows / rows_text / rows_csv on hand-built traces (and a loaded one)."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import msgspec

from ckpt_viz.analysis.words import describe_event
from ckpt_viz.render.eventlog import ROW_COLUMNS, csv_cell, event_fields, event_rows, filter_events, rows_csv, rows_text
from ckpt_viz.trace import Trace
from traces import nonreentrant_trace, refused_trace, split_trace


def _seqs(events: list) -> list[int]:
    return [e.seq for e in events]


def test_no_filter_keeps_everything() -> None:
    trace = split_trace()
    assert filter_events(trace) == list(trace.events)


def test_each_filter_alone() -> None:
    trace = split_trace()
    assert _seqs(filter_events(trace, kinds={"released"})) == [20, 23]
    assert _seqs(filter_events(trace, handles=[1], kinds=["replay_started", "released"])) == [9, 20]
    assert _seqs(filter_events(trace, phases={"dw"})) == [16, 17, 18, 19, 20, 21, 22, 23, 24, 25]
    assert _seqs(filter_events(trace, start=10, stop=13)) == [10, 11, 12]
    assert _seqs(filter_events(trace, text="DW_COMPLETE")) == [20, 23]  # case-insensitive
    assert _seqs(filter_events(trace, text="train.py:22")) == [16, 17]  # the site is searched too
    assert _seqs(filter_events(trace, text="microbatch=1", kinds={"handle_created"})) == [3]


def test_filters_combine_and_can_match_nothing() -> None:
    trace = split_trace()
    assert _seqs(filter_events(trace, handles={0}, phases={"dx"}, start=0, stop=14)) == [6, 12, 13]
    assert filter_events(trace, kinds={"released"}, handles={7}) == []
    assert filter_events(trace, start=30) == []
    assert _seqs(filter_events(nonreentrant_trace(), handles={0}, kinds={"session_cleared"})) == []  # no handle


def test_a_loaded_trace_filters_to_the_same_events(tmp_path: Path) -> None:
    trace = refused_trace()
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert filter_events(loaded, kinds={"replay_refused", "error"}) == [trace.events[9], trace.events[10]]


def test_rows_are_flat_strings_for_a_table() -> None:
    trace = split_trace()
    rows = event_rows([trace.events[0], trace.events[19]])
    assert {k: v for k, v in rows[0].items() if k != "details"} == {
        "seq": 0, "kind": "handle_created", "handle": "h0", "phase": "ordinary", "session": "",
        "tags": "stage=0 microbatch=0", "site": "model.py:10"}
    # every field of the kind, in its declared order, the defaults too
    assert rows[0]["details"].startswith("function=Block.forward  label=None  runtime=ckpt_viz  split=True  "
                                         "input_count=1  param_input_mask=[]  collector=scope")
    assert rows[1]["details"] == (
        "targets=[]  explicit_params=[]  activations=[]  discarded_activations=[0]  "
        "captured=[{shape:[4,4],accumulated:True,name:blocks.1.weight},{shape:[4],accumulated:False,name:None}]")
    session_row = event_rows([nonreentrant_trace().events[15]])[0]
    assert session_row["handle"] == "" and session_row["session"] == "s" and session_row["phase"] == ""
    long = event_rows([refused_trace().events[10]])[0]["details"]
    assert "message=ckpt_viz.checkpoint (backward): Cannot replay a released reentrant checkpoint h0" in long


def test_details_are_whole_and_the_plain_text_keeps_every_column_of_the_table() -> None:
    trace = refused_trace()
    message = "first line of a long message " * 6 + "\nsecond line"
    long = msgspec.structs.replace(trace.events[10], message=message)
    rows = event_rows([trace.events[8], trace.events[9], long])
    assert f"message={message.splitlines()[0].strip()} | second line  code=" in rows[2]["details"]  # nothing cut
    assert event_fields(long)["message"] == f"{message.splitlines()[0].strip()} | second line"
    text = rows_text(rows, marker=9)
    lines = text.splitlines()
    assert lines[0].split() == [c for c in ROW_COLUMNS if c != "session" and c != "tags"]  # empty columns dropped
    for row, line in zip(rows, lines[1:]):
        for column in ROW_COLUMNS:
            assert str(row[column]) in line, (column, line)
    assert lines[2].startswith(">") and not lines[1].startswith(">")


def test_csv_cells_a_spreadsheet_would_run_get_a_quote_and_nothing_else_changes() -> None:
    assert [csv_cell(v) for v in ("=HYPERLINK(\"http://x\")", "+1", "-2", "@SUM(A1)", "\t=1", "\r=1")] == [
        "'=HYPERLINK(\"http://x\")", "'+1", "'-2", "'@SUM(A1)", "'\t=1", "'\r=1"]
    assert [csv_cell(v) for v in ("train.py:7", "a=b", "", None, -3, 2.5, True)] == [
        "train.py:7", "a=b", "", "", "-3", "2.5", "True"]
    trace = refused_trace()
    hostile = msgspec.structs.replace(trace.events[10], site="=cmd|' /C calc'!A0", message="@evil")
    rows = event_rows([trace.events[0], hostile])
    table = list(csv.reader(io.StringIO(rows_csv(rows).decode("utf-8"))))
    assert table[0] == list(rows[0])  # the header: the row keys
    assert table[1] == [csv_cell(v) for v in rows[0].values()]
    site = table[2][list(rows[1]).index("site")]
    assert site == "'=cmd|' /C calc'!A0"
    assert not any(cell.startswith(("=", "+", "-", "@")) for line in table for cell in line)


def test_the_cursor_line_is_in_words() -> None:
    trace = split_trace()
    names = {0: "blocks.0", 1: "blocks.1"}
    first = describe_event(trace.events[0], names)
    assert first == "seq 0 · handle created · h0 blocks.0 · split DX/DW · stage 0 · micro-batch 0 · model.py:10"
    assert "collector" not in first and "input_count" not in first and "=" not in first
    assert describe_event(trace.events[9], names) == (
        "seq 9 · replay started · h1 blocks.1 · DX pass · for a backward · train.py:21")
    assert describe_event(trace.events[16]) == "seq 16 · phase set · h0 · DW pass · phase set to DW · train.py:22"
    assert describe_event(trace.events[20]) == "seq 20 · released · h1 · DW pass · because DW finished · train.py:23"
    refused = refused_trace()
    assert describe_event(refused.events[9]) == (
        "seq 9 · replay refused · h0 · refused because it was already released · train.py:9")
    assert describe_event(refused.events[10]).startswith("seq 10 · error · h0 · HandleReleasedError · ")
