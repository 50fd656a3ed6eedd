"""Partial distributed runs, merged meta and bounded rank headers (issue 28 items 4 and 5; issue 25 finding 7).

Torch-free: the rank files of a real ZBVZeroBubble run kept in tests/data/distributed, edited per test. The
real killed runs (SIGTERM, SIGKILL, an exception) are the corpus of tests/data/mistakes (test_mistakes.py).
"""
from __future__ import annotations

import copy
import os
import shutil

import pytest

from ckpt_viz import Trace, TraceError
from ckpt_viz.cli import main
from ckpt_viz.cli.merge import MAX_WORLD_SIZE, merge_run, merge_traces

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "distributed")


def _ranks() -> dict[int, Trace]:
    return {r: Trace.load(os.path.join(DATA, f"rank-{r}.json.gz")) for r in range(2)}


def _refusal(traces: dict[int, Trace], **kwargs) -> str:
    with pytest.raises(TraceError) as info:
        merge_traces(traces, "run-folder", files={r: f"run-folder/rank-{r}.json" for r in traces}, **kwargs)
    text = str(info.value)
    assert text.startswith("ckpt-viz merge: ") and text.splitlines()[-1].startswith("Tip: ")
    return text


# 1. --partial ---------------------------------------------------------------------------------------------------

def test_partial_merge_marks_the_missing_rank(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(os.path.join(DATA, "rank-1.json.gz"), run)
    assert "pass --partial to merge the ranks present" in _refusal({1: _ranks()[1]})
    merged, _ = merge_run(str(run), partial=True)
    assert merged.meta["distributed"]["missing_ranks"] == [0]
    assert merged.meta["partial"] == {"missing_ranks": [0], "ranks": {}}
    assert {e.tags["rank"] for e in merged} == {1} and len(merged) == len(_ranks()[1])
    alignment = merged.meta["distributed"]["clock_alignment"]  # rank 1's offset is to rank 0's clock all the same
    assert alignment == {"1": "offset against rank 0 with a drift fit (two anchors)"}
    assert [e.seq for e in merged] == list(range(len(merged)))


def test_partial_merge_command_says_what_is_missing(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(os.path.join(DATA, "rank-0.json.gz"), run)
    assert main(["merge", str(run)]) == 2
    assert "--partial" in capsys.readouterr().err
    assert main(["merge", "--partial", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("merged 1 rank of run ") and "PARTIAL: ranks [1] of 2 left no file" in out
    assert Trace.load(run / "merged.json").meta["distributed"]["missing_ranks"] == [1]


def test_partial_ranks_say_how_they_ended() -> None:
    traces = _ranks()
    traces[1].meta["partial"] = {"reason": "signal", "signal": "SIGTERM", "error": None, "step": 0}
    merged = merge_traces(traces)
    assert merged.meta["partial"] == {"missing_ranks": [], "ranks": {"1": traces[1].meta["partial"]}}
    assert merged.meta["distributed"]["missing_ranks"] == []
    assert "partial" not in merge_traces(_ranks()).meta  # a whole run is not marked


# 2. headers: types, bounds (issue 25 finding 7) ----------------------------------------------------------------

@pytest.mark.parametrize(("field", "value", "expected"), [
    ("world_size", "2", "an int from 1 to 65536"),
    ("world_size", True, "an int from 1 to 65536"),
    ("world_size", 10**7, "an int from 1 to 65536"),
    ("world_size", 0, "an int from 1 to 65536"),
    ("rank", "1", "an int from 0 to 1"),
    ("run_id", "../elsewhere", "a plain name"),
    ("run_id", ["x"], "a plain name"),
    ("clock", "now", "an object"),
    ("clock.mono_ns", "1", "an int (nanoseconds) or null"),
    ("clock_end.offset_to_rank0_ns", 1.5, "an int (nanoseconds) or null"),
    ("schedule", 3, "a string or null"),
    ("microbatches", -1, "an int >= 0 or null"),
    ("stages", ["0"], "a list of stage indices or null"),
    ("planned_order", {"0": "0F0"}, "an object of lists of action names, or null"),
])
def test_wrong_header_fields_are_refused_naming_field_and_file(field: str, value, expected: str) -> None:
    traces = _ranks()
    header = traces[1].meta["distributed"]
    *path, last = field.split(".")
    for key in path:
        header = header[key]
    header[last] = value
    if field in ("world_size", "run_id"):  # the same on both ranks, so the check of this field is what refuses
        traces[0].meta["distributed"][field] = copy.deepcopy(value)
    text = _refusal(traces)
    assert "run-folder/rank-" in text and f"meta.distributed.{field} is " in text and f"expected {expected}" in text


def test_a_rank_beyond_the_world_size_is_refused() -> None:
    traces = _ranks()
    for trace in traces.values():
        trace.meta["distributed"]["world_size"] = 1
    assert "meta.distributed.rank is int 1, expected an int from 0 to 0" in _refusal(traces)


def test_a_huge_world_size_is_refused_before_anything_is_built() -> None:
    traces = _ranks()
    for trace in traces.values():
        trace.meta["distributed"]["world_size"] = MAX_WORLD_SIZE
    merged = merge_traces(traces, partial=True)  # the largest allowed: its missing ranks are listed
    assert merged.meta["distributed"]["missing_ranks"] == list(range(2, MAX_WORLD_SIZE))
    assert "ranks [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ...] (65534 in all) are missing" in _refusal(traces)


# 3. merged meta: every field combined or per rank (issue 28 item 5) ----------------------------------------------

def _checks(checked: int, skipped: int, regions: dict[str, int], policy: str = "sampled") -> dict:
    return {"policy": policy, "first_checks": 2, "budget": 0.05, "checked": checked, "skipped": skipped,
            "skipped_regions": regions}


def test_replay_checks_are_summed_over_the_ranks() -> None:
    traces = _ranks()
    traces[0].meta["replay_checks"] = _checks(17, 17, {"Block": 10, "MLP": 7})
    traces[1].meta["replay_checks"] = _checks(41, 61, {"Block": 50, "Head": 11})
    checks = merge_traces(traces).meta["replay_checks"]
    assert checks == {"policy": "sampled", "checked": 58, "skipped": 78, "first_checks": 2, "budget": 0.05,
                      "skipped_regions": {"Block": 60, "MLP": 7, "Head": 11},
                      "by_rank": {"0": {"checked": 17, "skipped": 17}, "1": {"checked": 41, "skipped": 61}}}
    traces[1].meta["replay_checks"]["policy"] = "all"
    assert merge_traces(traces).meta["replay_checks"]["policy"] == "mixed"


def test_sources_are_joined_and_stages_united() -> None:
    traces = _ranks()
    traces[0].meta["sources"] = {"a.py:1": "x = 1"}
    traces[1].meta["sources"] = {"b.py:2": "y = 2"}
    meta = merge_traces(traces).meta
    assert meta["sources"] == {"a.py:1": "x = 1", "b.py:2": "y = 2"}
    assert meta["stages"] == [0, 1, 2, 3]  # rank 0 held [0, 3], rank 1 [1, 2]


def test_schedule_and_microbatches_come_from_the_headers() -> None:
    traces = _ranks()
    traces[0].meta["schedule"], traces[1].meta["schedule"] = "mine", "theirs"
    meta = merge_traces(traces).meta
    assert (meta["schedule"], meta["microbatches"]) == ("ScheduleZBVZeroBubble", 4)
    assert "schedule" not in meta.get("by_rank", {})


def test_fields_the_ranks_agree_on_are_kept_and_the_others_kept_per_rank() -> None:
    traces = _ranks()
    meta = merge_traces(traces).meta
    for key in ("model", "mode", "versions"):  # the same on every rank: kept as it is
        assert meta[key] == traces[0].meta[key] == traces[1].meta[key]
    assert "by_rank" not in meta
    traces[1].meta["versions"] = {**traces[1].meta["versions"], "torch": "2.12.0"}
    traces[0].meta["leftover"] = {"0": {"slots": 0}}
    traces[1].meta["leftover"] = {"1": {"slots": 1}}
    traces[1].meta["description"] = "only rank 1 has one"
    meta = merge_traces(traces).meta
    for key in ("versions", "leftover", "description"):  # never rank 0's alone
        assert key not in meta
        assert meta["by_rank"][key] == {str(r): t.meta[key] for r, t in traces.items() if key in t.meta}
    assert meta["model"] == "pipelining_torchrun"


def test_every_meta_field_of_a_merge_is_accounted_for() -> None:
    """Each field a rank file has appears in the merged meta, combined, or under by_rank (none is dropped)."""
    traces = _ranks()
    traces[0].meta.update(replay_checks=_checks(1, 0, {}), sources={"a.py:1": "a"}, partial=None, odd=1)
    traces[1].meta.update(replay_checks=_checks(2, 0, {}), sources={"b.py:1": "b"}, odd=2)
    meta = merge_traces(traces).meta
    for key in {k for t in traces.values() for k in t.meta}:
        assert key in meta or key in meta.get("by_rank", {}), key


# 4. run ids and where rank files go (issue 25 finding 7) ----------------------------------------------------------

def test_plain_run_id() -> None:
    from ckpt_viz.distributed import plain_run_id

    assert plain_run_id("3f2a-run.1_x") == "3f2a-run.1_x"
    for hostile in ("../../etc", "/tmp/abs", "..", ".", "", "a/b", "x" * 300, "ü"):
        name = plain_run_id(hostile)
        assert name == plain_run_id(hostile)  # every rank makes the same name
        assert "/" not in name and name not in (".", "..") and len(name) <= 128 and name[0].isalnum()
    assert plain_run_id("../../etc") == "etc" and plain_run_id("job/17") == "job_17"


def test_save_rank_trace_never_writes_outside_its_folder(tmp_path) -> None:
    from ckpt_viz.distributed import save_rank_trace
    from ckpt_viz.errors import CheckpointUsageError

    trace = _ranks()[1]
    header = dict(trace.meta["distributed"], run_id="run-a")
    path = save_rank_trace(trace, tmp_path / "out", header)
    assert path == os.path.join(str(tmp_path / "out"), "run-a", "rank-1.json") and os.path.isfile(path)
    for bad in ({"run_id": "../escape"}, {"run_id": str(tmp_path / "abs")}, {"rank": "../1"}, {"rank": True}):
        with pytest.raises(CheckpointUsageError, match=r"^ckpt_viz.distributed.save_rank_trace: the header's"):
            save_rank_trace(trace, tmp_path / "out", {**header, **bad})
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "out" / "linked")
    with pytest.raises(CheckpointUsageError, match="leads outside"):
        save_rank_trace(trace, tmp_path / "out", {**header, "run_id": "linked"})
    assert os.listdir(tmp_path / "elsewhere") == [] and not (tmp_path / "escape").exists()
