"""ckpt_viz.pipelining on real torch.distributed.pipelining schedules: 2 ranks, gloo, spawned (no torchrun).

Schedules: GPipe, 1F1B (DYNAMIC and STATIC metadata), Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble,
LoopedBFS and DualPipeV, two steps each.

One spawn runs every case of `pipelining_worker.CASES` in sequence (the import of torch.distributed.pipelining
and the process-group set-up are paid once); each rank saves its trace and its gradients per case, and the
tests here load them. Traps of shared/spec/distributed.md §5, and the test that covers each:
  1. metadata inference's backward outside any action: test_gradients_match_reference (step 0 of the DYNAMIC
     cases) and test_metadata_inference_is_tagged_and_computes_dx_only;
  2. later stages' STATIC example inputs without requires_grad: the "1F1B-static" case of the gradient test;
  3. the last stage's outputs detached in I: the zero-bubble cases of the gradient test (W walks loss -> output);
  4. stage 0 doing everything in W: test_stage0_replays_in_w_under_zero_bubble;
  5. dw_runner / bwd_cache bookkeeping: test_stage_bookkeeping_is_consumed (and the V schedule's hand-off).
"""
from __future__ import annotations

import collections
import os
import socket

import pipelining_worker as worker
import pytest
import torch

from ckpt_viz import Trace
from ckpt_viz.errors import CheckpointUsageError

# serial: the 2-rank spawn (conftest's out_dir, shared with test_merge.py) measures the ranks' clock offsets from
# round trips, and test_rank_header bounds them (under 50 ms); the tests here only read what the spawn saved
pytestmark = [pytest.mark.slow, pytest.mark.serial]

WORLD = 2
CASES = list(worker.CASES)
REENTRANT = [c for c in CASES if c not in worker.NONREENTRANT]
ZERO_BUBBLE = ["InterleavedZeroBubble", "ZBVZeroBubble"]
# the backward actions each schedule runs (all others: only B); DualPipeV mixes B with I and W
BACKWARD_ACTIONS = {"InterleavedZeroBubble": {"I", "W"}, "ZBVZeroBubble": {"I", "W"}, "DualPipeV": {"B", "I", "W"}}


def _traces(folder: str, case: str) -> list[Trace]:
    """The ranks' traces of `case`, by rank: one run-id folder holding rank-0.json ... rank-<WORLD-1>.json."""
    (run_id,) = os.listdir(os.path.join(folder, case))
    run = os.path.join(folder, case, run_id)
    assert sorted(os.listdir(run)) == [f"rank-{r}.json" for r in range(WORLD)]
    return [Trace.load(os.path.join(run, f"rank-{r}.json")) for r in range(WORLD)]


def _checkpoint_events(trace: Trace) -> list:
    return [e for e in trace if e.mode == "reentrant" and not e.kind.startswith("session_")]


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_reference(out_dir: str, case: str) -> None:
    reference = worker.reference(case, WORLD)
    got: list[dict[str, torch.Tensor]] = [{} for _ in range(worker.STEPS)]
    for rank in range(WORLD):
        for step, grads in enumerate(torch.load(os.path.join(out_dir, f"{case}-rank{rank}.pt"))):
            assert not set(grads) & set(got[step]), "two ranks reported the same parameter"
            got[step].update(grads)
    for step in range(worker.STEPS):  # step 0 runs metadata inference (DYNAMIC) before its actions
        assert set(got[step]) == set(reference[step])
        for name, expected in reference[step].items():
            torch.testing.assert_close(got[step][name], expected, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, n=name, s=step: f"step {s}, {n}: {m}")


@pytest.mark.parametrize("case", REENTRANT)
def test_checkpoint_phases_follow_the_action(out_dir: str, case: str) -> None:
    allowed = {"F": {"ordinary"}, "I": {"dx"}, "W": {"dw"}, "B": {"dx", "dw"}, "META": {"ordinary", "dx"}}
    for rank, trace in enumerate(_traces(out_dir, case)):
        seen = collections.Counter()
        for event in _checkpoint_events(trace):
            action = event.tags.get("action")
            if action is None:  # only a garbage-collected node may fall between actions
                assert event.kind == "node_collected", event
                continue
            assert event.tags["rank"] == rank
            assert event.phase in allowed[action], (action, event)
            seen[action, event.phase] += 1
        backward = {action for action, _ in seen} - {"F", "META"}
        assert backward == BACKWARD_ACTIONS.get(case, {"B"})
        for action in backward:  # DX and DW both ran inside every kind of backward action used
            assert seen[action, "dx" if action != "W" else "dw"] > 0
        if "B" in backward:
            assert seen["B", "dw"] > 0


@pytest.mark.parametrize("case", REENTRANT)
def test_each_region_replays_once_per_microbatch(out_dir: str, case: str) -> None:
    for trace in _traces(out_dir, case):
        created = collections.Counter()
        replayed = collections.Counter()
        for event in trace:
            tags = event.tags
            if tags.get("action") == "META":
                continue
            key = (tags.get("step"), tags.get("stage"), tags.get("microbatch"))
            if event.kind == "handle_created":
                assert tags["action"] == "F"
                created[key] += 1
            elif event.kind == "replay_started":
                replayed[key] += 1
        expected = {(step, stage, mb) for step in range(worker.STEPS) for stage in trace.meta["distributed"]["stages"]
                    for mb in range(worker.MICROBATCHES)}
        assert set(created) == expected and set(created.values()) == {1}  # one checkpoint per stage chunk
        assert replayed == created


@pytest.mark.parametrize("case", [c for c in REENTRANT if not c.endswith("-static")])
def test_metadata_inference_is_tagged_and_computes_dx_only(out_dir: str, case: str) -> None:
    for trace in _traces(out_dir, case):
        meta = [e for e in _checkpoint_events(trace) if e.tags.get("action") == "META"]
        assert {e.tags["microbatch"] for e in meta} == {-1}
        assert {e.tags["stage"] for e in meta if e.kind == "handle_created"} == set(trace.meta["distributed"]["stages"])
        assert {e.phase for e in meta} <= {"ordinary", "dx"}
        released = [e.reason for e in meta if e.kind == "released"]
        assert released and set(released) == {"explicit_release"}
    static = _traces(out_dir, "1F1B-static")
    assert not any(e.tags.get("action") == "META" for t in static for e in t)


@pytest.mark.parametrize("case", sorted(worker.NONREENTRANT))
def test_nonreentrant_checkpoints_inside_stages(out_dir: str, case: str) -> None:
    """torch-style non-reentrant checkpoints in a stage: one handle per micro-batch in F, recomputed inside the
    backward actions, once per backward pass that reaches it (I, W, and B's two passes); the gradients are
    checked by test_gradients_match_reference."""
    backward = BACKWARD_ACTIONS.get(case.removesuffix("-nonreentrant"), {"B"})
    for trace in _traces(out_dir, case):
        created, replays = collections.Counter(), collections.Counter()
        for event in trace:
            tags = event.tags
            if event.mode != "nonreentrant" or tags.get("action") == "META":
                continue
            key = (tags["step"], tags["stage"], tags["microbatch"])
            if event.kind == "handle_created":
                assert tags["action"] == "F"
                created[key] += 1
            elif event.kind == "replay_started":
                assert tags["action"] in backward
                replays[key, tags["action"]] += 1
        expected = {(step, stage, mb) for step in range(worker.STEPS) for stage in trace.meta["distributed"]["stages"]
                    for mb in range(worker.MICROBATCHES)}
        assert set(created) == expected and set(created.values()) == {1}
        assert {key for key, _ in replays} == expected
        assert all(n == 1 for (_, a), n in replays.items() if a != "B")
        # B is two passes (DX, then DW): stage 0's DX reaches nothing (1 recompute), a later stage's both (2)
        assert {((key[1] == 0), n) for (key, a), n in replays.items() if a == "B"} <= {(True, 1), (False, 2)}
        if backward == {"I", "W"}:  # stage 0 computes nothing in I (its input needs no grad)
            for stage in trace.meta["distributed"]["stages"]:
                assert {a for (_, s, _), a in replays if s == stage} == ({"W"} if stage == 0 else {"I", "W"})


@pytest.mark.parametrize("case", ZERO_BUBBLE)
def test_stage0_replays_in_w_under_zero_bubble(out_dir: str, case: str) -> None:
    replays = [e for t in _traces(out_dir, case) for e in t
               if e.kind == "replay_started" and e.tags.get("action") in ("I", "W")]
    stage0 = collections.Counter((e.tags["action"], e.phase) for e in replays if e.tags["stage"] == 0)
    later = collections.Counter((e.tags["action"], e.phase) for e in replays if e.tags["stage"] != 0)
    assert stage0 == {("W", "dw"): worker.STEPS * worker.MICROBATCHES}
    assert set(later) == {("I", "dx")}


@pytest.mark.parametrize("case", CASES)
def test_stage_bookkeeping_is_consumed(out_dir: str, case: str) -> None:
    for trace in _traces(out_dir, case):
        for stage, left in trace.meta["leftover"].items():
            expected = {"slots": 0, "dw_runner": 0, "bwd_cache_tensors": 0, "fwd_cache": 0, "backward_state": 0}
            assert left == expected, f"stage {stage}"


def test_traced_stage_module_is_refused() -> None:
    from ckpt_viz.pipelining import PipelineStage
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(CheckpointUsageError) as info:
        PipelineStage(traced, 0, 2, torch.device("cpu"))
    message = str(info.value)
    assert message.startswith("ckpt_viz.pipelining.PipelineStage: stage 0's module is a traced torch.fx.GraphModule")
    assert message.splitlines()[-1].startswith("Tip: ")


def test_pipeline_frontend_is_refused() -> None:
    from ckpt_viz.pipelining import pipeline
    with pytest.raises(CheckpointUsageError) as info:
        pipeline(worker.build(2), mb_args=(torch.randn(2, worker.WIDTH),))
    message = str(info.value)
    assert message.startswith("ckpt_viz.pipelining.pipeline: torch's tracing frontend")
    assert message.splitlines()[-1].startswith("Tip: ")


@pytest.mark.parametrize("case", CASES)
def test_rank_header(out_dir: str, case: str) -> None:
    headers = [t.meta["distributed"] for t in _traces(out_dir, case)]
    (run_id,) = {h["run_id"] for h in headers}
    assert os.listdir(os.path.join(out_dir, case)) == [run_id]
    for rank, header in enumerate(headers):
        assert (header["rank"], header["world_size"], header["backend"]) == (rank, WORLD, "gloo")
        assert header["host"] == socket.gethostname() and header["pid"] != os.getpid()
        per_rank, v = worker.CASES[case][1:3]
        assert header["stages"] == worker.stage_indices(rank, WORLD, per_rank, v)
        assert header["microbatches"] == worker.MICROBATCHES
        assert header["schedule"] == worker.CASES[case][0]
        clock = header["clock"]
        assert clock["wall_ns"] > 0 and clock["mono_ns"] > 0
        if rank == 0:
            assert clock["offset_to_rank0_ns"] == 0 and clock["rtt_ns"] == 0
        else:  # one host: the monotonic clock is shared, so the true offset is 0, within half a round trip
            assert 0 < clock["rtt_ns"] < 50_000_000
            assert abs(clock["offset_to_rank0_ns"]) <= clock["rtt_ns"] // 2 + 1
    # anchors were read right after one barrier: their monotonic readings (one clock on one host) are close
    assert abs(headers[0]["clock"]["mono_ns"] - headers[1]["clock"]["mono_ns"]) < 1_000_000_000


@pytest.mark.parametrize("case", ["Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "LoopedBFS"])
def test_executed_order_equals_planned_order(out_dir: str, case: str) -> None:
    for rank, trace in enumerate(_traces(out_dir, case)):
        executed: list[str] = []
        for event in trace:
            tags = event.tags
            if tags.get("step") == 1 and tags.get("action") in ("F", "I", "W", "B"):
                key = f"{tags['stage']}{tags['action']}{tags['microbatch']}"
                if not executed or executed[-1] != key:
                    executed.append(key)
        planned = [a for a in trace.meta["distributed"]["planned_order"][str(rank)] if a is not None]
        assert executed == planned
