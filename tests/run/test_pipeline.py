"""Pipeline scenarios: schedules as data, the tick simulation, and the recorded executor.

1. Schedules: the hand-worked orders for S=2/M=4, every action once and in a legal order.
2. Tick simulation: dependencies, one action per stage at a time, Zero Bubble makespans.
3. In-flight micro-batches: GPipe holds M, 1F1B min(S - s, M), ZB-H1 at most S.
4. run_pipeline: executed and tagged order equals the schedule; gradients equal the
   unpipelined model; every handle replays once and is released by DW.
5. Errors: unknown schedule, indivisible batch, missing stages, deadlock.
"""
from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch

from ckpt_viz.errors import CkptVizError
from ckpt_viz.run.pipeline import SCHEDULES, TICKS, Action, in_flight, make_schedule, run_pipeline, simulate
from ckpt_viz.run.scenarios import run_scenario
from ckpt_viz.run.zoo import ModelSpec, PipelineModel, build_builtin
from ckpt_viz.trace import Trace
from models import replays_per_handle

COMBOS = [(1, 3), (2, 1), (2, 2), (2, 4), (3, 2), (3, 4), (4, 8)]


def _short(actions: list[Action]) -> str:
    return " ".join(f"{a.kind}{a.microbatch}" for a in actions)


def _three_stages() -> ModelSpec:
    """3 stages of 2 MLP blocks: stage 0 both blocks checkpointed, stage 1 as one region, stage 2 only block 1."""
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = PipelineModel(6, n_stages=3, blocks_per_stage=2)
        x = torch.randn(8, 6)
    return ModelSpec("three", model, (x,), checkpoint=("stages.0.0", "stages.0.1", "stages.1", "stages.2.1"),
                     stages=("stages.0", "stages.1", "stages.2"))


# (spec factory, microbatches, checkpointed regions per stage)
CASES = {
    "builtin-M2": (lambda: build_builtin("pipeline"), 2, [2, 2]),
    "builtin-M4": (lambda: build_builtin("pipeline"), 4, [2, 2]),
    "three-M4": (_three_stages, 4, [2, 1, 1]),
    "three-M2": (_three_stages, 2, [2, 1, 1]),
}


# 1. Schedules ---------------------------------------------------------------------------------------------

def test_schedules_for_two_stages_four_microbatches() -> None:
    gpipe, one_f_one_b, zb = (make_schedule(n, 2, 4) for n in SCHEDULES)
    assert [_short(gpipe[s]) for s in (0, 1)] == ["F0 F1 F2 F3 B0 B1 B2 B3"] * 2
    assert [_short(one_f_one_b[s]) for s in (0, 1)] == ["F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"]
    # Worked by hand from NOTE [ Schedules ], rule 3: stage 0 hits the cap of 2 before F2 and F3;
    # stage 1 fills the ticks where F2/F3 has not arrived yet with DW0/DW1.
    assert [_short(zb[s]) for s in (0, 1)] == [
        "F0 F1 DX0 DW0 F2 DX1 DW1 F3 DX2 DW2 DX3 DW3",
        "F0 DX0 F1 DX1 DW0 F2 DX2 DW1 F3 DX3 DW2 DW3",
    ]


def test_zb_h1_keeps_the_f_and_dx_order_of_1f1b() -> None:
    for stages, microbatches in COMBOS:
        one_f_one_b, zb = make_schedule("1F1B", stages, microbatches), make_schedule("ZB-H1", stages, microbatches)
        for s in range(stages):
            expected = [("DX" if a.kind == "B" else a.kind, a.microbatch) for a in one_f_one_b[s]]
            assert [(a.kind, a.microbatch) for a in zb[s] if a.kind != "DW"] == expected, (stages, microbatches, s)


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("stages,microbatches", COMBOS)
def test_every_stage_takes_every_action_once_in_a_legal_order(name: str, stages: int, microbatches: int) -> None:
    plan = make_schedule(name, stages, microbatches)
    assert sorted(plan) == list(range(stages))
    backward = ("DX", "DW") if name == "ZB-H1" else ("B",)
    for s, actions in plan.items():
        assert all(a.stage == s for a in actions)
        assert sorted((a.kind, a.microbatch) for a in actions) == sorted(
            (kind, m) for kind in ("F", *backward) for m in range(microbatches))
        position = {(a.kind, a.microbatch): i for i, a in enumerate(actions)}
        for m in range(microbatches):
            assert position["F", m] < position[backward[0], m] <= position[backward[-1], m]
        assert [a.microbatch for a in actions if a.kind == "F"] == list(range(microbatches))
        assert [a.microbatch for a in actions if a.kind == backward[-1]] == list(range(microbatches))


def test_schedule_names_are_case_insensitive_and_deterministic() -> None:
    assert make_schedule("zb-h1", 3, 4) == make_schedule("ZB-H1", 3, 4) == make_schedule("Zb-H1", 3, 4)
    assert make_schedule("gpipe", 2, 3) == make_schedule("GPipe", 2, 3)
    assert make_schedule("1f1b", 3, 5) == make_schedule("1F1B", 3, 5)


# 2. Tick simulation ----------------------------------------------------------------------------------------

def _deps(action: Action, stages: int, backward: tuple[str, ...]) -> list[tuple[str, int, int]]:
    s, m = action.stage, action.microbatch
    if action.kind == "F":
        return [("F", s - 1, m)] if s > 0 else []
    if action.kind == "DW":
        return [("DX", s, m)]
    return [("F", s, m)] + ([(backward[0], s + 1, m)] if s < stages - 1 else [])


def _assert_dependencies(rows: list[list], stages: int, backward: tuple[str, ...]) -> None:
    """rows: [kind, stage, microbatch, start tick]; every dependency ends by the start, stages never overlap."""
    assert [r[3] for r in rows] == sorted(r[3] for r in rows), "listed in tick order"
    end = {(k, s, m): t + TICKS[k] for k, s, m, t in rows}
    assert len(end) == len(rows), "each action once"
    for kind, s, m, tick in rows:
        for dep in _deps(Action(kind, s, m), stages, backward):
            assert end[dep] <= tick, f"{kind}{m}@stage{s} starts at {tick} before {dep} ends at {end[dep]}"
    for s in range(stages):
        spans = sorted((t, t + TICKS[k]) for k, st, _, t in rows if st == s)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), f"stage {s} runs two actions at once"


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("stages,microbatches", COMBOS)
def test_simulation_respects_dependencies_and_stage_order(name: str, stages: int, microbatches: int) -> None:
    plan = make_schedule(name, stages, microbatches)
    order = simulate(plan)
    for s in range(stages):
        assert [a for a, _ in order if a.stage == s] == plan[s]
    rows = [[a.kind, a.stage, a.microbatch, t] for a, t in order]
    _assert_dependencies(rows, stages, ("DX",) if name == "ZB-H1" else ("B",))


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (2, 4), (3, 4), (4, 8)])
def test_makespan_matches_the_zero_bubble_accounting(stages: int, microbatches: int) -> None:
    # With F = DX = DW = 1 tick and B = 2: 1F1B (and GPipe) leave (S-1)(F+B+W) idle per stage,
    # ZB-H1 only (S-1)(F+B-W) (the paper's numbers, for M >= S).
    def makespan(name: str) -> int:
        return max(t + TICKS[a.kind] for a, t in simulate(make_schedule(name, stages, microbatches)))

    work = 3 * microbatches
    assert makespan("GPipe") == work + 3 * (stages - 1)
    assert makespan("1F1B") == work + 3 * (stages - 1)
    assert makespan("ZB-H1") == work + (stages - 1)


# 3. In-flight micro-batches --------------------------------------------------------------------------------

@pytest.mark.parametrize("stages,microbatches", COMBOS)
def test_in_flight_peaks(stages: int, microbatches: int) -> None:
    for s in range(stages):
        gpipe = in_flight(make_schedule("GPipe", stages, microbatches)[s], s)
        one_f_one_b = in_flight(make_schedule("1F1B", stages, microbatches)[s], s)
        zb = in_flight(make_schedule("ZB-H1", stages, microbatches)[s], s)
        assert max(gpipe) == microbatches and gpipe[-1] == 0
        assert max(one_f_one_b) == min(stages - s, microbatches) and one_f_one_b[-1] == 0
        assert max(zb) <= stages and zb[-1] == 0
    assert max(in_flight(make_schedule("ZB-H1", stages, microbatches)[0], 0)) == min(stages, microbatches)


def test_in_flight_counts_rows_and_actions_alike() -> None:
    rows = [["F", 0, 0, 0], ["F", 1, 0, 1], ["F", 0, 1, 1], ["DX", 0, 0, 3], ["DW", 0, 0, 4], ["B", 0, 1, 5]]
    assert in_flight(rows, 0) == [1, 2, 2, 1, 0]
    assert in_flight([Action(*r[:3]) for r in rows], 0) == [1, 2, 2, 1, 0]
    assert in_flight(rows, 1) == [1]


# 4. run_pipeline -------------------------------------------------------------------------------------------

def _tagged_order(trace: Trace) -> list[tuple[str, int, int]]:
    """The executed actions read back from the tags, collapsing runs of events of one action."""
    order: list[tuple[str, int, int]] = []
    for event in trace.events:
        assert {"stage", "microbatch", "action"} <= set(event.tags), f"untagged event {event.kind}"
        key = (event.tags["action"], event.tags["stage"], event.tags["microbatch"])
        if not order or order[-1] != key:
            order.append(key)
    return order


def _run(case: str, schedule: str) -> tuple[ModelSpec, Trace, list[torch.Tensor], int]:
    factory, microbatches, _ = CASES[case]
    spec = factory()
    trace = run_pipeline(spec, schedule=schedule, microbatches=microbatches)
    return spec, trace, [p.grad.clone() for p in spec.model.parameters()], microbatches


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES)
def test_executed_order_is_the_schedule(case: str, schedule: str) -> None:
    spec, trace, _, microbatches = _run(case, schedule)
    stages = len(spec.stages)
    plan = make_schedule(schedule, stages, microbatches)
    rows = trace.meta["actions"]
    tagged = _tagged_order(trace)
    assert [tuple(r[:3]) for r in rows] == tagged, "the tags replay meta['actions'] exactly"
    for s in range(stages):
        want = [(a.kind, a.stage, a.microbatch) for a in plan[s]]
        assert [tuple(r[:3]) for r in rows if r[1] == s] == want
        assert [k for k in tagged if k[1] == s] == want
    _assert_dependencies(rows, stages, ("DX",) if schedule == "ZB-H1" else ("B",))
    assert rows == [[a.kind, a.stage, a.microbatch, t] for a, t in simulate(plan)]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES)
def test_gradients_equal_the_unpipelined_model(case: str, schedule: str) -> None:
    factory, microbatches, _ = CASES[case]
    spec = factory()
    reference = copy.deepcopy(spec.model)
    batch = spec.inputs[0]
    run_pipeline(spec, schedule=schedule, microbatches=microbatches)
    got = [p.grad for p in spec.model.parameters()]
    assert all(g is not None for g in got)

    # 1. Same per-micro-batch computation, no checkpoint, micro-batches accumulated in order: bit-exact.
    for x in batch.split(batch.shape[0] // microbatches):
        spec.loss(reference(x)).backward()
    for (name, p), g in zip(reference.named_parameters(), got):
        assert torch.equal(g, p.grad), f"{name} differs from the per-micro-batch reference"

    # 2. The full batch in one go, loss summed over the batch: the weight-gradient GEMMs sum
    # over all rows at once instead of micro-batch by micro-batch, so only close, not bit-exact.
    for p in reference.parameters():
        p.grad = None
    full_loss = spec.loss(reference(batch))
    full_loss.backward()
    for (name, p), g in zip(reference.named_parameters(), got):
        torch.testing.assert_close(g, p.grad, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES)
def test_every_handle_replays_once_and_dw_releases_it(case: str, schedule: str) -> None:
    _, trace, _, microbatches = _run(case, schedule)
    regions = CASES[case][2]
    created = trace.of_kind("handle_created")
    ids = [e.handle_id for e in created]
    assert len(set(ids)) == len(ids) == sum(regions) * microbatches
    for s, n in enumerate(regions):
        for m in range(microbatches):
            tags = [e.tags for e in created if e.tags["stage"] == s and e.tags["microbatch"] == m]
            assert len(tags) == n and all(t["action"] == "F" for t in tags)
    assert replays_per_handle(trace) == {i: 1 for i in ids}
    released = trace.of_kind("released")
    assert sorted(e.handle_id for e in released) == sorted(ids)
    assert {e.reason for e in released} == {"dw_complete"}

    # Stage 0's input needs no grad, so its DX has nothing to do and it replays in DW; later stages replay in DX.
    dx, dw = ("DX", "DW") if schedule == "ZB-H1" else ("B", "B")
    owner = {e.handle_id: (e.tags["stage"], e.tags["microbatch"]) for e in created}
    for event in trace.of_kind("replay_started"):
        s, m = owner[event.handle_id]
        assert (event.tags["stage"], event.tags["microbatch"]) == (s, m)
        assert event.tags["action"] == (dw if s == 0 else dx)
        assert event.phase == ("dw" if s == 0 else "dx")
    for event in released:
        assert (event.tags["action"], *owner[event.handle_id]) == (dw, event.tags["stage"], event.tags["microbatch"])


@pytest.mark.parametrize("case", CASES)
def test_executed_in_flight_on_stage_0(case: str) -> None:
    stages, microbatches = len(CASES[case][0]().stages), CASES[case][1]
    peaks = {}
    for schedule in SCHEDULES:
        _, trace, _, _ = _run(case, schedule)
        peaks[schedule] = max(in_flight(trace.meta["actions"], 0))
    assert peaks["GPipe"] == microbatches
    assert peaks["1F1B"] <= stages and peaks["1F1B"] == min(stages, microbatches)
    assert peaks["ZB-H1"] <= stages and peaks["ZB-H1"] == min(stages, microbatches)


def test_meta_and_run_scenario_dispatch() -> None:
    spec = build_builtin("pipeline")
    trace = run_pipeline(spec, schedule="zb-h1", microbatches=4)
    meta = trace.meta
    assert (meta["model"], meta["mode"], meta["schedule"], meta["stages"], meta["microbatches"]) == (
        "pipeline", "pipeline", "ZB-H1", ["stages.0", "stages.1"], 4)
    assert len(meta["actions"]) == 2 * 3 * 4
    json.dumps(meta)  # plain data: a saved trace can hold it
    reference = copy.deepcopy(spec.model)
    # summed in another order
    torch.testing.assert_close(meta["loss"], float(spec.loss(reference(spec.inputs[0])).detach()))

    via = run_scenario(build_builtin("pipeline"), "pipeline", schedule="ZB-H1", microbatches=4)
    assert via.meta["actions"] == meta["actions"] and [e.kind for e in via.events] == [e.kind for e in trace.events]


def test_graph_snapshots_one_per_backward_call() -> None:
    # Stage 0's DX has no input needing grad, so it calls no autograd function: (S-1)*M DX grads + S*M DW backwards.
    trace = run_pipeline(build_builtin("pipeline"), schedule="ZB-H1", microbatches=4, graphs=True)
    labels = [g.label.split(" #")[0] for g in trace.graphs]
    assert labels.count("before autograd.grad") == 4 and labels.count("before autograd.backward") == 8
    assert run_pipeline(build_builtin("pipeline"), microbatches=4).graphs == []


# 5. Errors -------------------------------------------------------------------------------------------------

def test_unknown_schedule_lists_the_valid_ones() -> None:
    with pytest.raises(CkptVizError, match=r"^ckpt_viz\.pipeline: unknown schedule 'ZB-H2'; "
                                           r"expected one of GPipe, 1F1B, ZB-H1") as info:
        make_schedule("ZB-H2", 2, 2)
    assert str(info.value).splitlines()[-1].startswith("Tip:")
    with pytest.raises(CkptVizError, match="unknown schedule 'interleaved'"):
        run_pipeline(build_builtin("pipeline"), schedule="interleaved")


def test_indivisible_batch() -> None:
    with pytest.raises(CkptVizError, match=r"^ckpt_viz\.pipeline: cannot split a batch of 64 into 3 equal") as info:
        run_pipeline(build_builtin("pipeline"), microbatches=3)
    assert str(info.value).splitlines()[-1] == "Tip: pick microbatches dividing 64, e.g. 1, 2, 4, 8, 16, 32, 64."
    with pytest.raises(CkptVizError, match="microbatches must be a positive int, got 0"):
        run_pipeline(build_builtin("pipeline"), microbatches=0)


def test_missing_or_unknown_stages() -> None:
    plain = build_builtin("mlp")
    assert plain.stages == ()
    with pytest.raises(CkptVizError, match=r"^ckpt_viz\.pipeline: the built-in model 'mlp' has no pipeline stages, so "
                       r"mode 'pipeline' cannot run it\.\nTip: pick the built-in model 'pipeline'"):
        run_pipeline(plain)
    with pytest.raises(CkptVizError, match="'mlp' has no pipeline stages"):
        run_scenario(build_builtin("mlp"), "pipeline")
    spec = build_builtin("pipeline")
    spec.stages = ("stages.0", "stages.9")
    with pytest.raises(CkptVizError, match=r"no stage submodule 'stages\.9'") as info:
        run_pipeline(spec)
    assert str(info.value).splitlines()[-1].startswith("Tip:")


def test_deadlocked_schedule_is_reported() -> None:
    with pytest.raises(CkptVizError, match=r"deadlocks at tick 0; .*stage 0: Action\(kind='B'"):
        simulate({0: [Action("B", 0, 0), Action("F", 0, 0)]})
    with pytest.raises(CkptVizError, match="deadlocks at tick 1"):  # stage 1 lists B before its F
        simulate({0: [Action("F", 0, 0), Action("B", 0, 0)], 1: [Action("B", 1, 0), Action("F", 1, 0)]})


def test_pipeline_built_ins_and_their_micro_batch_counts() -> None:
    """The app offers mode "pipeline" for the built-ins with stages only, and only micro-batch counts that run."""
    from ckpt_viz.catalog import BUILTIN_MODEL_NAMES
    from ckpt_viz.run.pipeline import microbatch_choices

    assert {n for n in BUILTIN_MODEL_NAMES if microbatch_choices(build_builtin(n))} == {"pipeline"}
    spec = build_builtin("pipeline")
    batch = spec.inputs[0].shape[0]
    choices = microbatch_choices(spec)
    assert choices == tuple(m for m in range(1, 17) if batch % m == 0) and 4 in choices
    for m in (choices[0], choices[-1]):
        assert run_pipeline(build_builtin("pipeline"), schedule="1F1B", microbatches=m).meta["microbatches"] == m
    odd = next(m for m in range(1, 17) if m not in choices)
    with pytest.raises(CkptVizError, match=f"into {odd} equal micro-batches"):
        run_pipeline(build_builtin("pipeline"), microbatches=odd)


def test_default_micro_batches_tell_gpipe_from_1f1b() -> None:
    """At the default micro-batch count the schedules differ (at 2 micro-batches on 2 stages they are one run)."""
    orders = {name: run_pipeline(build_builtin("pipeline"), schedule=name).meta["actions"]
              for name in ("GPipe", "1F1B")}
    assert [r[:3] for r in orders["GPipe"]] != [r[:3] for r in orders["1F1B"]]


def test_by_stage_memory_counts_each_stages_parameters() -> None:
    spec = build_builtin("pipeline")
    sizes = {str(s): sum(p.numel() * p.element_size() for p in spec.model.get_submodule(name).parameters())
             for s, name in enumerate(spec.stages)}
    trace = run_pipeline(spec, schedule="1F1B", microbatches=2, memory=True)
    for sample in trace.memory:
        assert {s: row["parameters"] for s, row in sample.by_stage.items()} == sizes
