"""The search: the least recompute under a budget, exact; the curve; the words.

1. The solver's model is `predict` itself (the same windows): checked on every subset.
2. On a 12-block model, every subset is evaluated with `predict`: no subset that meets a budget
   recomputes less than the recommendation, and the dynamic programme and the MILP give the
   exhaustive curve.
3. On the 4-block mlp, every subset is run: the recommendation meets the budget when run, and
   no subset whose run meets it recomputes less.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import ckpt_viz.plan.search as search
from ckpt_viz.errors import CkptVizError
from ckpt_viz.plan.measure import measure_spec
from ckpt_viz.plan.model import predict, timeline
from ckpt_viz.plan.profile import profile_spec
from ckpt_viz.plan.schema import KINDS, SCHEDULES, Policy
from ckpt_viz.plan.search import block_ranges, curve, describe, linear_model, parse_bytes, recommend
from ckpt_viz.run.zoo import MLPBlock, ModelSpec, Stack, build_builtin


def _all(names: list[str]) -> list[frozenset[str]]:
    return [frozenset(n for n, b in zip(names, bits) if b) for bits in itertools.product((0, 1), repeat=len(names))]


@pytest.fixture(scope="module")
def mlp() -> tuple[ModelSpec, object]:
    spec = build_builtin("mlp")
    return spec, profile_spec(spec)


@pytest.fixture(scope="module")
def twelve() -> object:
    """12 residual MLP blocks of different hidden widths, so blocks differ in what they save and cost."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Stack([MLPBlock(16, 32 + 16 * (i % 5)) for i in range(12)], 16)
        x = torch.randn(256, 16)
    spec = ModelSpec("twelve", model, (x,), checkpoint=tuple(f"blocks.{i}" for i in range(12)))
    return profile_spec(spec)


@pytest.mark.parametrize("kind", KINDS)
def test_the_solvers_model_is_predict(mlp: tuple, kind: str) -> None:
    _, profile = mlp
    model = linear_model(timeline(profile, kind))
    names = list(model.blocks)
    for blocks in _all(names):
        x = np.array([[1.0 if n in blocks else 0.0 for n in names]])
        assert model.peaks(x)[0] == predict(profile, Policy(blocks, kind)).peak, sorted(blocks)


@pytest.mark.slow
def test_no_subset_of_twelve_blocks_recomputes_less(twelve: object) -> None:
    profile = twelve
    names = [b.name for b in profile.blocks]
    every = [(predict(profile, Policy(blocks)), blocks) for blocks in _all(names)]
    peaks = sorted({p.peak for p, _ in every})
    for budget in (peaks[0], peaks[len(peaks) // 4], peaks[len(peaks) // 2], peaks[-1] - 1):
        rec = recommend(profile, budget)
        assert rec.prediction is not None and rec.prediction.peak <= budget
        best = min(p.recompute_ns for p, _ in every if p.peak <= budget)
        assert rec.prediction.recompute_ns == best, (budget, sorted(rec.prediction.policy.blocks))
    assert recommend(profile, peaks[0] - 1).prediction is None  # under the lowest peak: no policy


@pytest.mark.parametrize("kind", KINDS)
def test_dp_and_milp_give_the_exhaustive_curve(twelve: object, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exhaustive = curve(twelve, kind=kind)
    assert len(exhaustive) >= 3  # a real trade-off, not one point
    monkeypatch.setattr(search, "EXHAUSTIVE_MAX", 0)
    ordered = curve(twelve, kind=kind)
    monkeypatch.setattr(search, "_ordered_form", lambda *_: None)  # the MILP, whatever the form
    milp = curve(twelve, kind=kind)
    want = [(p.peak, p.recompute_ns) for p in exhaustive]
    assert [(p.peak, p.recompute_ns) for p in ordered] == want
    assert [(p.peak, p.recompute_ns) for p in milp] == want


def test_curve_is_a_pareto_front(twelve: object) -> None:
    points = curve(twelve)
    assert points[-1].blocks == frozenset() and points[-1].recompute_ns == 0  # nothing checkpointed: top peak
    for a, b in itertools.pairwise(points):
        assert a.peak < b.peak and a.recompute_ns > b.recompute_ns


@pytest.mark.slow
def test_mlp_recommendation_meets_the_budget_when_run(mlp: tuple) -> None:
    spec, profile = mlp
    names = [b.name for b in profile.blocks]
    measured = {blocks: measure_spec(spec, "nonreentrant" if blocks else "none", tuple(sorted(blocks))).peak
                for blocks in _all(names)}
    cost = {blocks: predict(profile, Policy(blocks)).recompute_ns for blocks in measured}
    for budget in sorted(set(measured.values())):
        rec = recommend(profile, budget)
        assert rec.prediction is not None
        chosen = rec.prediction.policy.blocks
        assert measured[chosen] <= budget
        assert not [b for b in measured if measured[b] <= budget and cost[b] < cost[chosen]]


def test_words_name_the_blocks_the_peak_and_the_cost(mlp: tuple) -> None:
    _, profile = mlp
    rec = recommend(profile, parse_bytes("1.2MiB"))
    assert rec.prediction is not None
    assert rec.words.startswith("checkpoint blocks.")
    assert "peak" in rec.words and "MiB" in rec.words and "% step time" in rec.words
    assert rec.method == "exhaustive over 2^4 subsets"
    low = recommend(profile, 1000)
    assert low.prediction is None and "No policy" in low.words and "lowest any policy reaches" in low.words


def test_block_ranges_and_parse_bytes() -> None:
    order = [f"model.layers.{i}" for i in range(8)] + ["lm_head"]
    assert block_ranges({"model.layers.2", "model.layers.3", "model.layers.4", "model.layers.7", "lm_head"},
                        order) == "model.layers.2-4, model.layers.7, lm_head"
    assert parse_bytes("1.5GiB") == 3 << 29
    assert parse_bytes("96 MiB") == 96 << 20
    assert parse_bytes("2e9") == 2_000_000_000
    for bad in ("lots", "-1GiB", "0", "1.5 GiBs"):
        with pytest.raises(CkptVizError, match=r"(?s)ckpt_viz.plan.parse_bytes: .*Tip:"):
            parse_bytes(bad)


def test_unknown_blocks_and_bad_budgets_are_refused(mlp: tuple) -> None:
    _, profile = mlp
    with pytest.raises(CkptVizError, match=r"(?s)no block .blocks.9.*Tip:"):
        recommend(profile, 10**6, candidates=["blocks.9"])
    with pytest.raises(CkptVizError, match=r"budget must be a positive number of bytes, got -5"):
        recommend(profile, -5)
    with pytest.raises(CkptVizError, match=r"no block 'layers.0'"):
        predict(profile, Policy(frozenset({"layers.0"})))
    assert describe(None, budget=10, floor=20).startswith("No policy over these blocks meets the budget")


def test_candidates_limit_the_choice(twelve: object) -> None:
    allowed = {f"blocks.{i}" for i in (2, 3, 4)}
    points = curve(twelve, candidates=allowed)
    assert all(p.blocks <= allowed for p in points)
    assert len(points) <= 8



@pytest.fixture(scope="module")
def pipeline() -> tuple[ModelSpec, object]:
    """2 pipeline stages of 3 MLP blocks on a batch large enough that checkpointing lowers the peak."""
    from ckpt_viz.run.zoo import PipelineModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = PipelineModel(16, n_stages=2, blocks_per_stage=3)
        x = torch.randn(512, 16)
    spec = ModelSpec("pipeline6", model, (x,), checkpoint=tuple(f"stages.{s}.{b}" for s in range(2) for b in range(3)),
                     stages=("stages.0", "stages.1"))
    return spec, profile_spec(spec, microbatch=4)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_recommendation_is_the_least_recompute_of_every_subset(pipeline: tuple, schedule: str) -> None:
    # 4. A pipeline is planned under its schedule: every subset is predicted through the schedule's actions, and
    #    the recommendation is the least recompute among the subsets whose predicted peak meets the budget.
    _, profile = pipeline
    names = [b.name for b in profile.blocks]
    every = {blocks: predict(profile, Policy(blocks, "split-reentrant", schedule=schedule, microbatches=4))
             for blocks in _all(names)}
    peaks = sorted({p.peak for p in every.values()})
    rec = recommend(profile, 1 << 62, schedule=schedule, microbatches=4)
    assert len(rec.curve) >= 2, rec.curve  # checkpointing trades memory for recompute here
    assert [(c.peak, c.recompute_ns) for c in rec.curve] == [
        (c.peak, c.recompute_ns) for c in curve(profile, schedule=schedule, microbatches=4)]
    for budget in (peaks[0], peaks[len(peaks) // 3], peaks[-1] - 1):
        rec = recommend(profile, budget, schedule=schedule, microbatches=4)
        assert rec.prediction is not None and rec.prediction.peak <= budget
        assert rec.prediction.policy.schedule == schedule and rec.prediction.stages
        best = min(p.recompute_ns for p in every.values() if p.peak <= budget)
        assert rec.prediction.recompute_ns == best, (budget, sorted(rec.prediction.policy.blocks))
        assert f"under {schedule} with 4 micro-batches" in rec.words
    assert recommend(profile, peaks[0] - 1, schedule=schedule, microbatches=4).prediction is None


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_recommendation_meets_the_budget_when_run(pipeline: tuple, schedule: str) -> None:
    spec, profile = pipeline
    top = recommend(profile, 1 << 62, schedule=schedule, microbatches=4)
    for point in top.curve:  # each point's peak as the budget: the point (or one as good) is chosen, and run
        rec = recommend(profile, point.peak, schedule=schedule, microbatches=4)
        assert rec.prediction is not None
        blocks = tuple(sorted(rec.prediction.policy.blocks))
        measured = measure_spec(spec, "pipeline", blocks, schedule=schedule, microbatches=4).peak
        assert measured <= point.peak, (blocks, measured, point.peak)


def test_a_pipeline_plan_over_too_many_blocks_is_refused_with_a_way_out() -> None:
    from ckpt_viz.run.zoo import PipelineModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = PipelineModel(4, n_stages=2, blocks_per_stage=7)
        x = torch.randn(8, 4)
    names = tuple(f"stages.{s}.{b}" for s in range(2) for b in range(7))
    spec = ModelSpec("pipeline14", model, (x,), checkpoint=names, stages=("stages.0", "stages.1"))
    profile = profile_spec(spec, microbatch=2, costs=False)
    with pytest.raises(CkptVizError, match=r"(?s)recommend: .*14 candidate blocks are 2\^14 subsets.*Tip: name at "
                                           r"most 12 candidate blocks"):
        recommend(profile, 10**9, schedule="1F1B")
    assert len(curve(profile, schedule="1F1B", candidates=names[:3])) >= 1  # fewer candidates: planned
