"""`ckpt-viz merge`: the rank files of the 2-rank gloo runs (conftest's spawn) as one trace with a rank dimension.

Also the merge's refusals (missing, partial, mixed runs) and its clock check, on the rank files of a real
ZBVZeroBubble run kept in tests/data/distributed (torch-free).
"""
from __future__ import annotations

import collections
import gzip
import json
import os
import shutil
import sys

import pytest

from ckpt_viz import Trace, TraceError
from ckpt_viz.analysis.actions import actions, planned_vs_executed
from ckpt_viz.analysis.memory import memory, rank_memory
from ckpt_viz.cli import main
from ckpt_viz.cli.merge import _describe, merge_run, merge_traces
from ckpt_viz.render.perfetto import render_perfetto

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "render"))
from test_perfetto import nesting_errors

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "distributed")
SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"]
RUNTIME = ["Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"]  # their planned order is exact (spec §5.8)


# serial: the merge of the real 2-rank run (conftest's out_dir, shared with test_pipelining.py) checks its clocks
# (every receive after its send), aligned from round trips that a busy machine stretches unevenly
pytestmark = pytest.mark.serial


def _rank_traces(folder: str) -> dict[int, Trace]:
    return {r: Trace.load(os.path.join(folder, f"rank-{r}.json.gz")) for r in range(2)}


@pytest.mark.slow
@pytest.mark.parametrize("case", SCHEDULES)
def test_merged_trace_of_a_real_run(out_dir: str, case: str, tmp_path) -> None:
    folder = os.path.join(out_dir, case)
    output = tmp_path / "merged.json"
    assert main(["merge", folder, "-o", str(output)]) == 0
    merged = Trace.load(output)
    (run_id,) = os.listdir(folder)
    ranks = {r: Trace.load(os.path.join(folder, run_id, f"rank-{r}.json")) for r in range(2)}
    assert [e.seq for e in merged] == list(range(len(merged)))
    assert len(merged) == sum(len(t) for t in ranks.values())
    for rank, trace in ranks.items():  # every rank's events, in its own order, tagged with its rank
        mine = [e for e in merged if e.tags["rank"] == rank]
        assert [(e.kind, e.tags.get("action"), e.tags.get("microbatch")) for e in mine] == [
            (e.kind, e.tags.get("action"), e.tags.get("microbatch")) for e in trace]
        assert [e.t_ns for e in mine] == sorted(e.t_ns for e in mine)
    handles = {r: {e.handle_id for e in t if e.handle_id is not None} for r, t in ranks.items()}
    assert len({e.handle_id for e in merged if e.handle_id is not None}) == sum(map(len, handles.values()))
    dist = merged.meta["distributed"]
    assert (dist["run_id"], dist["world_size"], dist["merged"]) == (run_id, 2, True)
    assert dist["alignment"]["edges_checked"] > 0 and dist["alignment"]["receives_before_send"] == 0
    assert (merged.meta["mode"], merged.meta["schedule"]) == ("pipeline", ranks[0].meta["distributed"]["schedule"])
    # the Perfetto export: one process per rank, every replay nested inside the action slice it ran in
    doc = render_perfetto(merged)
    assert nesting_errors(doc) == []
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1}
    action_slices = [e for e in slices if "action" in e["args"]]
    replays = [e for e in slices if e["name"].startswith("replay")]
    assert len(replays) == merged.count("replay_started") > 0
    for replay in replays:
        around = [a for a in action_slices if (a["pid"], a["tid"]) == (replay["pid"], replay["tid"])
                  and a["ts"] <= replay["ts"] and replay["ts"] + replay["dur"] <= a["ts"] + a["dur"] + 1e-6]
        assert around and around[-1]["args"]["action"] in ("I", "W", "B", "META"), replay
        assert (around[-1]["args"]["action"] == "META") == (around[-1]["args"]["microbatch"] == -1)
    # the timeline reads the same actions: one per (rank, step, stage, microbatch, action)
    rows = actions(merged)
    keys = collections.Counter((r.rank, r.step, r.stage, r.microbatch, r.torch_action) for r in rows)
    assert set(keys.values()) == {1} and len(rows) == len([a for a in action_slices if a["args"]["action"] != "META"])
    if case in RUNTIME:
        assert [row.same for row in planned_vs_executed(merged)] == [True, True]


def test_merge_of_the_kept_run_and_its_folder_forms(tmp_path) -> None:
    run = tmp_path / "traces" / "run-a"
    shutil.copytree(DATA, run)
    merged, where = merge_run(str(tmp_path / "traces"))  # the --out folder holding one run folder
    assert where == str(run)
    assert {e.tags["rank"] for e in merged} == {0, 1}
    assert merged.meta["distributed"]["alignment"]["receives_before_send"] == 0
    assert merged.meta["model"] == "pipelining_torchrun"
    assert len(merged.memory) and all(s.by_stage for s in merged.memory[-3:])


def test_merged_memory_keeps_each_ranks_samples(tmp_path) -> None:
    """NOTE [ Merging rank traces ], rule 4: every rank's samples as recorded, renumbered, with their rank; the
    run's reading is the sum of every rank's latest one, each rank's own reading its file's."""
    traces = _rank_traces(DATA)
    merged = merge_traces(_rank_traces(DATA))
    merged.save(tmp_path / "merged.json")
    for trace in (merged, Trace.load(tmp_path / "merged.json")):
        assert len(trace.memory) == sum(len(t.memory) for t in traces.values())
        assert [s.seq for s in trace.memory] == sorted(s.seq for s in trace.memory)
        for rank, own in traces.items():
            mine = [s for s in trace.memory if s.rank == rank]
            assert [(s.bytes_by_category, s.by_stage) for s in mine] == [
                (s.bytes_by_category, s.by_stage) for s in own.memory]
            assert {int(stage) for s in mine for stage in s.by_stage} <= set(own.meta["distributed"]["stages"])
            assert rank_memory(trace)[rank].totals == memory(own).totals
        latest = {}
        for s in trace.memory:  # the run's total after each sample: every rank's latest reading, summed
            latest[s.rank] = s.total_nbytes
        assert memory(trace).totals[-1] == sum(latest.values())
        assert memory(trace).peak.total <= sum(memory(t).peak.total for t in traces.values())
        assert memory(trace).peak.total >= max(memory(t).peak.total for t in traces.values())


def test_clock_check_catches_a_wrong_offset() -> None:
    traces = _rank_traces(DATA)
    traces[1].meta["distributed"]["clock"]["offset_to_rank0_ns"] -= 50_000_000  # rank 1's clock made 50 ms early
    traces[1].meta["distributed"].pop("clock_end", None)
    check = merge_traces(traces).meta["distributed"]["alignment"]
    assert check["receives_before_send"] > 0 and check["min_slack_ns"] < -30_000_000
    assert {v["receiver"][0] for v in check["violations"]} <= {"1", "2"}  # rank 1 holds stages 1 and 2 here


def test_clock_check_allows_what_the_offsets_round_trip_leaves_unknown() -> None:
    """NOTE [ Merging rank traces ], rule 2: a receive before its send by less than the ranks' offset uncertainty
    (half the offset measurement's round trip) is within what the clocks can say; by more, it is a clock error."""
    for rtt, counted in ((200_000_000, False), (20_000_000, True)):  # uncertainty 100 ms, then 10 ms; error 50 ms
        traces = _rank_traces(DATA)
        clock = traces[1].meta["distributed"]["clock"]
        clock["offset_to_rank0_ns"] -= 50_000_000
        clock["rtt_ns"] = rtt
        traces[1].meta["distributed"].pop("clock_end", None)
        merged = merge_traces(traces)
        check = merged.meta["distributed"]["alignment"]
        assert check["min_slack_ns"] < -30_000_000 and check["uncertainty_ns"]["1"] == rtt // 2
        if counted:
            assert check["receives_before_send"] > 0 and "clock check FAILED" in _describe(merged, "run", "out.json")
        else:
            assert check["receives_before_send"] == 0 and check["within_uncertainty"] > 0
            assert "within the clock offsets' uncertainty" in _describe(merged, "run", "out.json")


def test_merge_refuses_partial_mixed_and_missing_runs(tmp_path) -> None:
    def message(folder: str) -> str:
        with pytest.raises(TraceError) as info:
            merge_run(folder)
        text = str(info.value)
        assert text.startswith("ckpt-viz merge: ") and text.splitlines()[-1].startswith("Tip: ")
        return text

    assert "is not a folder" in message(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    assert "holds no rank files" in message(str(tmp_path / "empty"))
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(os.path.join(DATA, "rank-1.json.gz"), partial)
    assert "is partial: ranks [0] are missing" in message(str(partial))
    two = tmp_path / "two"
    shutil.copytree(DATA, two / "a")
    shutil.copytree(DATA, two / "b")
    assert "holds 2 runs (a, b)" in message(str(two))
    mixed = tmp_path / "mixed"
    shutil.copytree(DATA, mixed)
    with gzip.open(mixed / "rank-1.json.gz", "rt") as f:
        doc = json.load(f)
    doc["meta"]["distributed"]["run_id"] = "another-run"
    with gzip.open(mixed / "rank-1.json.gz", "wt") as f:
        json.dump(doc, f)
    assert "come from different runs" in message(str(mixed))


def test_merge_command_reports_the_clock_check(tmp_path, capsys) -> None:
    shutil.copytree(DATA, tmp_path / "run")
    assert main(["merge", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "merged 2 ranks of run" in out and "every receive comes after its send" in out
    assert Trace.load(tmp_path / "run" / "merged.json").meta["distributed"]["world_size"] == 2
    assert main(["merge", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("ckpt-viz merge: ")
